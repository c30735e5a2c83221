"""components.qformer.init=pretrained_here (qkvqa.qff.pretrain_here): what the MLM pretraining changes, its cache key,
its reuse check, and the builder's refusal of an unresolved init; tiny Q-Formers on the synthetic world."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qkvqa.config.load import compose
from qkvqa.errors import ConfigError, DataError
from qkvqa.qff.builder import build_qff_component
from qkvqa.qff.pretrain_here import RECORD, base_spec, build, resolve_qformer_spec, text_parameters

pytestmark = [pytest.mark.usefixtures("single_thread"), pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def config(world: dict, cache: Path, *extra: str):
    return compose(
        "demo/qff_per_layer",
        [],
        [
            f"paths.world_dir={world['dir']}",
            f"paths.cache_dir={cache}",
            "components.qformer.init=pretrained_here",
            "qff.text_pretrain.steps=40",
            "qff.text_pretrain.batch_size=16",
            *extra,
        ],
    )


def named(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.base.state_dict().items()}


def test_the_text_layers_move_and_nothing_else_does(world, tmp_path):
    cfg = config(world, tmp_path / "cache")
    spec = resolve_qformer_spec(cfg)
    assert spec["init"] == "checkpoint" and spec["tiny"] is False
    assert Path(spec["pretrained"]).parent == tmp_path / "cache" / "qformer_init"
    pretrained = build_qff_component(spec, cfg.qff).model
    random = build_qff_component(base_spec(cfg), cfg.qff).model
    after, before = named(pretrained), named(random)
    assert after.keys() == before.keys()
    text = {id(p) for p in text_parameters(random)}
    text_keys = {k for k, p in random.base.named_parameters() if id(p) in text}
    moved = {k for k in text_keys if not torch.equal(after[k], before[k])}
    assert "embeddings.word_embeddings.weight" in moved
    assert any(".attention." in k for k in moved) and any(".intermediate." in k for k in moved)
    # each pretrained text weight moved by a clear relative margin, not by rounding
    word = "embeddings.word_embeddings.weight"
    assert (after[word] - before[word]).norm() > 0.05 * before[word].norm()
    # the ViT, the queries, the image cross-attention and the query feed-forward are the random ones, bit for bit
    kept = [k for k in before if k not in text_keys]
    assert any(k.startswith("vision_model.") for k in kept) and "query_tokens" in kept
    assert any("crossattention" in k for k in kept) and any("intermediate_query" in k for k in kept)
    assert all(torch.equal(after[k], before[k]) for k in kept)


def test_the_mlm_loss_falls_by_a_wide_margin(world, tmp_path):
    cfg = config(world, tmp_path / "cache", "qff.text_pretrain.steps=150")
    _, record = build(cfg)
    figures = record["figures"]
    # held-aside texts, at the untrained model about chance (ln |vocab|); measured 1.6-2.1 nats lower after 150 steps
    assert figures["probe_loss_before"] > 0.9 * figures["chance_loss"]
    assert figures["probe_loss_after"] < figures["probe_loss_before"] - 0.8
    assert figures["train_loss_last_tenth"] < figures["train_loss_first_tenth"] - 0.8


def test_the_cache_is_reused_and_rebuilt_when_an_input_changes(world, tmp_path):
    cache = tmp_path / "cache"
    few = "qff.text_pretrain.steps=2"  # what is checked is the key, not the training: two steps are enough
    first, _ = build(config(world, cache, few))
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again, _ = build(config(world, cache, few))
    assert again == first and (first / "model.safetensors").stat().st_mtime_ns == stamp  # reused, not rebuilt
    # another setting, another seed, another base or another corpus: another directory
    assert build(config(world, cache, "qff.text_pretrain.steps=3"))[0] != first
    assert build(config(world, cache, few, "qff.text_pretrain.seed=1"))[0] != first
    assert build(config(world, cache, few, "components.qformer.options.seed=1"))[0] != first
    kb = Path(world["dir"]) / "evqa" / "encyclopedic_kb_wiki.json"
    edited = json.loads(kb.read_text(encoding="utf-8"))
    url = next(iter(edited))
    edited[url]["section_texts"][0] += " A newly written sentence."
    copy = tmp_path / "kb_edited.json"
    copy.write_text(json.dumps(edited), encoding="utf-8")
    other, record = build(config(world, cache, few, f"data.kb_source={copy}"))
    assert other != first and record["inputs"]["corpus"]["kb"]["name"] == "kb_edited.json"
    assert len(list((cache / "qformer_init").iterdir())) == 5


def test_a_damaged_cache_is_refused(world, tmp_path):
    cache = tmp_path / "cache"
    few = "qff.text_pretrain.steps=2"
    out, _ = build(config(world, cache, few))
    weights = out / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(DataError, match="corrupt"):
        build(config(world, cache, few))
    # an edited record (other inputs) is not reused either: built again in place
    record = json.loads((out / RECORD).read_text())
    record["inputs"]["settings"]["steps"] = 1
    (out / RECORD).write_text(json.dumps(record))
    rebuilt, found = build(config(world, cache, few))
    assert rebuilt == out and found["inputs"]["settings"]["steps"] == 2


def test_an_unresolved_init_is_refused_and_a_trained_checkpoint_ignores_it(world, tmp_path):
    cfg = config(world, tmp_path / "cache")
    with pytest.raises(ConfigError, match="resolve_qformer_spec"):
        build_qff_component(cfg.components.qformer, cfg.qff)
    with pytest.raises(ConfigError, match="components.qformer.init='bogus' is not one of"):
        config(world, tmp_path / "cache", "components.qformer.init=bogus")
    with pytest.raises(ConfigError, match="out of range"):
        config(world, tmp_path / "cache", "qff.text_pretrain.steps=0")


def test_the_command_builds_it_and_says_where(world, tmp_path):
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(tmp_path),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
        "QKVQA_TINY_DIR": str(tmp_path / "tiny"),
        "PYTHONPATH": str(REPO / "src"),
    }
    args = [
        sys.executable,
        "-m",
        "qkvqa.cli.main",
        "pretrain-qformer",
        "experiment=demo/qff_per_layer",
        f"paths.world_dir={world['dir']}",
        f"paths.cache_dir={tmp_path / 'cache'}",
        "qff.text_pretrain.steps=2",
    ]
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    printed = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(printed["pretrained"]).is_dir() and printed["steps"] == 2
    assert "pretrain the Q-Former's text layers" in done.stderr  # progress lines in a log
