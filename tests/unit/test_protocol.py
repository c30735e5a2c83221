"""The protocol card's comparability verdict and the weights fingerprint."""

from __future__ import annotations

import pytest

from qkvqa.config.load import compose
from qkvqa.config.paper_rows import paper_row
from qkvqa.pipeline.protocol import comparability_line, not_comparable_because, used_components, weights_fingerprint


def paper_scores(**overrides) -> dict:
    scores = {
        "dataset": "evqa",
        "n_questions": 5750,
        "n_skipped": 12,
        "exclude_skipped": False,
        "two_hop_rows": True,
        "question_set": {"max_questions": None, "sample_questions": None},
        "benchmark": {"label": "BEM (PyTorch reproduction)"},
        # stage 1 searched an imported OMGM summary index, as the paper's rows do
        "stage1_text": {"text": "llama3_summaries", "index": "index/omgm", "detail": "imported OMGM summary index"},
    }
    return {**scores, **overrides}


@pytest.mark.slow
def test_the_paper_protocol_is_comparable_and_each_deviation_is_named():
    cfg = compose("eval/evqa_qwen", [], [])
    used = used_components(cfg)
    assert {"image_encoder", "text_encoder", "qformer", "reranker", "generator", "judge"} == set(used)
    assert not_comparable_because(cfg, paper_scores(), used) == []
    card = {"paper": paper_row(cfg.paper).title, "comparable": True, "not_comparable_because": []}
    assert comparability_line(card) == f"comparable to paper {card['paper']}: yes" and "48.0" in card["paper"]
    for overrides, reason in [
        ({"n_questions": 4750, "two_hop_rows": False}, "single-hop rows only"),
        ({"exclude_skipped": True}, "12 unanswerable questions are left out"),
        ({"question_set": {"max_questions": 50, "sample_questions": None}}, "first 50"),
        ({"benchmark": {"label": "BEM approximate (two segments)"}}, "approximate"),
    ]:
        assert any(reason in r for r in not_comparable_because(cfg, paper_scores(**overrides), used)), reason
    other = compose("eval/evqa_qwen", [], ["data.protocol=custom"])
    assert any("data.protocol = custom" in r for r in not_comparable_because(other, paper_scores(), used))
    em = compose("eval/evqa_qwen", [], ["eval.judge=em_only"])
    assert any("exact match only" in r for r in not_comparable_because(em, paper_scores(), used_components(em)))


def test_table_6_wants_its_1k_subset():
    cfg = compose("table6/infoseek_1k", [], [])
    subset = {
        "dataset": "infoseek",
        "n_questions": 1000,
        "n_skipped": 0,
        "exclude_skipped": False,
        "question_set": {"max_questions": None, "sample_questions": 1000},
        "benchmark": {},
        "stage1_text": paper_scores()["stage1_text"],
    }
    assert verdict(cfg, subset) == []
    whole = {**subset, "question_set": {"max_questions": None, "sample_questions": None}}
    assert any("1K subset" in r for r in verdict(cfg, whole))


def verdict(cfg, scores):
    return not_comparable_because(cfg, scores, used_components(cfg))


def test_the_weights_fingerprint_follows_content_not_place(tmp_path):
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "model.safetensors").write_bytes(b"\0" * 100)
        (tmp_path / name / "config.json").write_text("{}")
    assert weights_fingerprint(str(tmp_path / "a")) == weights_fingerprint(str(tmp_path / "b")) is not None
    (tmp_path / "b" / "model.safetensors").write_bytes(b"\1" + b"\0" * 99)
    assert weights_fingerprint(str(tmp_path / "a")) != weights_fingerprint(str(tmp_path / "b"))
    assert weights_fingerprint("Salesforce/blip2-itm-vit-g") is None  # a hub id: nothing local to read


def _card_of_trained_qff(tmp_path, *overrides: str) -> tuple[dict, object]:
    """The protocol card of a demo evaluation with a trained QFF (a weights file under tmp_path) and `overrides`."""
    from qkvqa.pipeline.protocol import protocol_card

    class KB:
        store_dir, url_checksum = tmp_path / "kb", "sha256:0"

        def __len__(self):
            return 3

    trained = tmp_path / "run" / "qff"
    trained.mkdir(parents=True)
    (trained / "model.safetensors").write_bytes(b"\0" * 64)
    cfg = compose("demo/evaluate", [], [f"qff.checkpoint={trained}", *overrides])
    return protocol_card(cfg, paper_scores(n_questions=38), KB()), trained


def test_the_card_names_the_trained_qff_not_its_random_base(tmp_path):
    card, trained = _card_of_trained_qff(tmp_path)
    qff = card["models"]["qformer"]
    assert qff["weights"] == str(trained) and qff["base"] == "tiny (random)" and qff["fingerprint"]
    assert card["models"]["generator"]["weights"] == "tiny (random)"


@pytest.mark.slow
def test_a_protocol_name_is_checked_against_the_known_ones_and_the_dataset():
    from qkvqa.errors import ConfigError

    with pytest.raises(ConfigError, match="data.protocol='echosight_100K' is not one of evqa_2m, echosight_100k"):
        compose("eval/infoseek_qwen", [], ["data.protocol=echosight_100K"])
    with pytest.raises(ConfigError, match="'reflectiva_wiki100k' is a infoseek protocol, but data.dataset is 'evqa'"):
        compose("eval/evqa_qwen", [], ["data.protocol=reflectiva_wiki100k"])
    cfg = compose("eval/infoseek_qwen", ["infoseek_reflectiva_data"], [])
    assert cfg.data.protocol == "reflectiva_wiki100k" and cfg.retrieval.index_dir == "data/infoseek_reflectiva/index"


@pytest.mark.slow
def test_the_rendered_card_rounds_its_numbers_and_writes_no_raw_python_values(tmp_path):
    """The card in report.md said `data.protocol is None` and wrote floats with their binary noise (issue 34 item 2):
    every value goes through one rendering (null, true/false, 6 significant figures)."""
    import re

    from qkvqa.pipeline.protocol import render_card

    noisy = 0.1 + 0.2  # 0.30000000000000004
    card, _ = _card_of_trained_qff(tmp_path, f"qff.alpha={noisy!r}", "cda.theta=0.15")
    text = render_card(card)
    assert (
        card["filter"]["alpha"] == noisy
        and "| filter | kind qff, focus per_layer, alpha 0.3, question_norm per_token, scorer late_interaction, "
        "runtime_settings attention sdpa, section_batch_size"
        in text
    )
    assert repr(noisy) not in text and "theta 0.15" in text
    assert not re.search(r"\b(None|True|False)\b", text), text
    assert not re.search(r"\d\.\d{7,}", text), text  # no float written with its binary noise
