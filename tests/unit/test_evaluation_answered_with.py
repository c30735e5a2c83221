"""Issue 44 class 1: a resumed evaluation, after the QFF at the same `qff.checkpoint` path was replaced, mixed answers
from two models and exited 0. The weights that make the answers are fingerprinted before the first answer, and a
resume with other weights at the same path is refused in one line naming the key."""

from __future__ import annotations

import json

import pytest

from qkvqa.config.load import compose
from qkvqa.errors import StaleArtifactError
from qkvqa.pipeline.evaluate import ANSWERED_WITH, answering_weights, check_answering_weights


def _qff(folder, weights: bytes):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(weights)
    (folder / "config.json").write_text("{}")
    return folder


@pytest.mark.slow
def test_a_qff_replaced_at_the_same_path_is_refused_on_resume(tmp_path):
    qff = _qff(tmp_path / "train" / "qff", b"first model")
    cfg = compose(None, [], ["eval.filter=qff", f"qff.checkpoint={qff}"])
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    check_answering_weights(cfg, run_dir, answered=0)  # the first attempt, before its first answer
    first = json.loads((run_dir / ANSWERED_WITH).read_text())
    assert set(first) >= {"qff.checkpoint"}
    check_answering_weights(cfg, run_dir, answered=12)  # resumed with the same weights: fine
    _qff(qff, b"another model")  # replaced in place
    with pytest.raises(StaleArtifactError, match=r"^qff.checkpoint: the weights differ from those that made the 12 "):
        check_answering_weights(cfg, run_dir, answered=12)
    check_answering_weights(cfg, run_dir, answered=0)  # no answer yet: the new weights are simply recorded
    assert json.loads((run_dir / ANSWERED_WITH).read_text()) != first


def test_a_qff_checkpoint_file_is_fingerprinted_by_its_bytes(tmp_path):
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"weights one")
    cfg = compose(None, [], ["eval.filter=qff", f"qff.checkpoint={ckpt}"])
    before = answering_weights(cfg)["qff.checkpoint"]
    ckpt.write_bytes(b"weights two")
    assert answering_weights(cfg)["qff.checkpoint"] != before


def test_stage1_results_of_a_resumed_evaluation_are_refused_after_the_kb_text_changed(tmp_path):
    """The run's stage-1 results were keyed on the KB's URL checksum alone: text edited under the same URLs passed."""
    from types import SimpleNamespace

    from qkvqa.pipeline.evaluate import RETRIEVAL_FILE, RETRIEVAL_META, stage1

    store = SimpleNamespace(url_checksum="sha256:urls", manifest={"source": {"sha256": "new-content"}})
    benchmark = SimpleNamespace(kb_store=lambda: store)
    (tmp_path / RETRIEVAL_FILE).write_text("{}")
    meta = {"kb_url_checksum": "sha256:urls", "kb_content": "old-content", "metrics": {}}
    (tmp_path / RETRIEVAL_META).write_text(json.dumps(meta))
    with pytest.raises(StaleArtifactError, match="made over another KB"):
        stage1(compose(), benchmark, "test", tmp_path, rank_zero=True)
