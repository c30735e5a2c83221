"""Model checks of `qkvqa doctor` on real model directories (tiny models written through save_pretrained), paths.weights_dir
and preset=local_weights, the pinned revision, and the one-line warning of real models on `device: auto` without a GPU."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from qkvqa.components.hub import HUB_FILES, download_command, downloaded_revision, is_hub_id
from qkvqa.config.load import compose

pytestmark = pytest.mark.usefixtures("single_thread")
COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


@pytest.fixture
def bem_dir(tmp_path) -> Path:
    """A tiny BEM written by its own writer (config.json, safetensors, vocab), copied out as a downloaded directory."""
    from qkvqa.components.registry import ComponentSpec, tiny_model
    from qkvqa.metrics.bem import write_tiny_bem

    written = tiny_model(ComponentSpec(kind="bem", tiny=True), write_tiny_bem, ())
    out = tmp_path / "weights" / "kortukov" / "answer-equivalence-bem"
    shutil.copytree(written, out)
    return out


def _record_download(directory: Path, commit: str) -> None:
    """What `huggingface-cli download --local-dir` leaves: .cache/huggingface/download/FILE.metadata, commit first."""
    meta = directory / ".cache" / "huggingface" / "download"
    meta.mkdir(parents=True, exist_ok=True)
    (meta / "config.json.metadata").write_text(f'{commit}\n"etag"\n1733000000.0\n', encoding="utf-8")


def _cfg(*overrides: str):
    return compose("demo/evaluate", [], ["paths.world_dir=/nonexistent", *overrides])


@pytest.mark.slow
def test_weights_dir_reads_every_hub_id_from_the_download_layout():
    cfg = compose(
        "eval/evqa_qwen",
        ["local_weights"],
        ["paths.weights_dir=/w", "components.image_encoder.options.tokenizer=openai/clip-vit-large-patch14"],
    )
    assert cfg.components.generator.pretrained == "/w/Qwen/Qwen2.5-VL-7B-Instruct"  # the experiment named the hub id
    assert cfg.components.image_encoder.pretrained == "/w/BAAI/EVA-CLIP-8B"
    assert cfg.components.image_encoder.options.tokenizer == "/w/openai/clip-vit-large-patch14"
    assert cfg.components.judge.pretrained == "/w/kortukov/answer-equivalence-bem"
    assert cfg.qff.checkpoint == "checkpoints/evqa_qff/qff"  # a path stays a path
    assert (
        compose("eval/evqa_qwen", ["local_weights"], []).components.reranker.pretrained
        == "weights/BAAI/bge-reranker-v2-m3"
    )  # the preset's default folder
    plain = compose("eval/evqa_qwen", [], [])
    assert plain.components.generator.pretrained == "Qwen/Qwen2.5-VL-7B-Instruct"  # without it: hub ids
    assert plain.components.image_encoder.revision  # real_models names a revision


def test_hub_ids_and_download_commands():
    assert is_hub_id("BAAI/EVA-CLIP-8B") and is_hub_id("bert-base-uncased")
    assert not is_hub_id("weights/BAAI/EVA-CLIP-8B") and not is_hub_id("/abs/model") and not is_hub_id("x/y.pth")
    command = download_command("BAAI/EVA-CLIP-8B")
    assert command.startswith("huggingface-cli download BAAI/EVA-CLIP-8B --include ")
    assert command.endswith("--local-dir weights/BAAI/EVA-CLIP-8B") and "'*.safetensors'" in command
    assert ".pt" not in " ".join(HUB_FILES["BAAI/EVA-CLIP-8B"])  # never the raw 33 GB checkpoint


@pytest.mark.slow
def test_a_model_directory_is_described_and_its_revision_checked(bem_dir, tmp_path):
    from qkvqa.doctor.models import model_checks

    _record_download(bem_dir, COMMIT_A)
    assert downloaded_revision(bem_dir) == COMMIT_A
    base = [
        "eval.judge=bem",
        "components.judge.tiny=false",
        f"paths.weights_dir={tmp_path / 'weights'}",
        "components.judge.pretrained=kortukov/answer-equivalence-bem",
    ]
    row = model_checks(_cfg(*base, f"components.judge.revision={COMMIT_A}"), ["judge"])[0]
    assert row.status == "ok", row.detail
    assert "BertForSequenceClassification" in row.detail and f"revision {COMMIT_A[:12]}" in row.detail
    row = model_checks(_cfg(*base, f"components.judge.revision={COMMIT_B}"), ["judge"])[0]
    assert row.status == "fail" and f"{COMMIT_A[:12]} downloaded, {COMMIT_B[:12]} pinned" in row.detail
    row = model_checks(_cfg(*base), ["judge"])[0]
    assert row.status == "ok" and "not pinned" in row.detail


@pytest.mark.slow
def test_a_missing_weight_shard_and_a_wrong_architecture_fail(bem_dir, tmp_path):
    import json

    from qkvqa.doctor.models import model_checks

    overrides = ["eval.judge=bem", "components.judge.tiny=false", f"components.judge.pretrained={bem_dir}"]
    weights = next(bem_dir.glob("*.safetensors"))
    (bem_dir / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"a": weights.name, "b": "model-00002-of-00002.safetensors"}}), encoding="utf-8"
    )
    row = model_checks(_cfg(*overrides), ["judge"])[0]
    assert row.status == "fail" and "model-00002-of-00002.safetensors" in row.detail
    (bem_dir / "model.safetensors.index.json").unlink()
    config = json.loads((bem_dir / "config.json").read_text())
    config["architectures"] = ["LlamaForCausalLM"]
    (bem_dir / "config.json").write_text(json.dumps(config))
    row = model_checks(_cfg(*overrides), ["judge"])[0]
    assert row.status == "fail" and "architecture LlamaForCausalLM" in row.detail


@pytest.mark.slow
def test_load_instantiates_on_the_meta_device_and_checks_parameter_names(bem_dir):
    from qkvqa.doctor.models import load_checks

    cfg = _cfg("eval.judge=bem", "components.judge.tiny=false", f"components.judge.pretrained={bem_dir}")
    row = load_checks(cfg, ["judge"])[0]
    assert row.status == "ok", row.detail
    assert "meta device" in row.detail and "parameters in the checkpoint" in row.detail


@pytest.mark.slow
def test_load_builds_a_tiny_model_and_runs_the_forward():
    from qkvqa.doctor.models import load_checks

    cfg = _cfg("eval.judge=bem")
    row = load_checks(cfg, ["judge"], device="cpu")[0]
    assert row.status == "ok", row.detail
    assert "BEM card example scores" in row.detail


@pytest.mark.slow
def test_real_models_on_device_auto_without_a_gpu_warn_in_one_line():
    from qkvqa.components.hardware import cpu_fallback_warning

    cfg = _cfg(
        "components.generator.tiny=false",
        "components.generator.pretrained=Qwen/Qwen2.5-VL-7B-Instruct",
        "components.generator.device=auto",
    )
    no_gpu = {"available": False, "reason": "the NVIDIA driver 535.1 is older than torch 2.14.1 needs"}
    line = cpu_fallback_warning(cfg, ["generator", "reranker"], no_gpu)
    assert line is not None and "\n" not in line
    assert "components.generator (Qwen/Qwen2.5-VL-7B-Instruct)" in line and "535.1" in line
    assert "reranker" not in line  # tiny models never warn
    assert cpu_fallback_warning(cfg, ["generator"], {"available": True, "reason": None}) is None
    cfg.components.generator.device = "cpu"
    assert cpu_fallback_warning(cfg, ["generator"], no_gpu) is None  # device: cpu means it


def test_the_gpu_status_names_a_reason_when_no_gpu_is_usable():
    from qkvqa.components.hardware import MIN_DRIVER, gpu_status

    status = gpu_status()
    assert status["available"] or status["reason"]
    assert MIN_DRIVER["13"] > MIN_DRIVER["12"]


def test_revision_is_recorded_with_the_run_config():
    cfg = compose("eval/evqa_qwen", [], [f"components.qformer.revision={COMMIT_A}"])
    plain = OmegaConf.to_container(cfg, resolve=True)
    assert plain["components"]["qformer"]["revision"] == COMMIT_A  # config.yaml is this container


@pytest.fixture
def hub_cache(bem_dir, tmp_path, monkeypatch) -> Path:
    """An HF hub cache as huggingface_hub lays it out (models--OWNER--NAME/snapshots/COMMIT, refs/main) holding the
    tiny BEM at COMMIT_A."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    repo = cache / "models--kortukov--answer-equivalence-bem"
    shutil.copytree(bem_dir, repo / "snapshots" / COMMIT_A)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT_A, encoding="utf-8")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # where this process's hub cache is
    return cache


def test_a_hub_id_loads_at_its_revision_from_the_cache(hub_cache):
    from qkvqa.components.registry import ComponentSpec, build_component, resolve_pretrained
    from qkvqa.errors import MissingWeightsError

    spec = ComponentSpec(kind="bem", pretrained="kortukov/answer-equivalence-bem", revision=COMMIT_A, device="cpu")
    path = resolve_pretrained(spec)
    assert Path(path) == hub_cache / "models--kortukov--answer-equivalence-bem" / "snapshots" / COMMIT_A
    assert 0.0 <= build_component(spec).equivalent("q", "a", "a") <= 1.0  # from_pretrained reads that snapshot
    assert resolve_pretrained(
        ComponentSpec(kind="bem", pretrained="kortukov/answer-equivalence-bem", revision="main")
    ).endswith(COMMIT_A)  # a branch resolves through refs/
    with pytest.raises(MissingWeightsError, match=f"at revision {COMMIT_B}"):
        resolve_pretrained(ComponentSpec(kind="bem", pretrained="kortukov/answer-equivalence-bem", revision=COMMIT_B))


@pytest.mark.slow
def test_doctor_reads_a_hub_id_from_the_cache_with_its_commit(hub_cache):
    from qkvqa.doctor.models import model_checks

    base = [
        "eval.judge=bem",
        "components.judge.tiny=false",
        "components.judge.pretrained=kortukov/answer-equivalence-bem",
    ]
    row = model_checks(_cfg(*base, f"components.judge.revision={COMMIT_A}"), ["judge"])[0]
    assert row.status == "ok" and f"revision {COMMIT_A[:12]}" in row.detail, row.detail
    row = model_checks(_cfg(*base, f"components.judge.revision={COMMIT_B}"), ["judge"])[0]
    assert row.status == "fail" and f"at revision {COMMIT_B}" in row.detail


def test_the_card_records_the_commit_and_fingerprint_a_hub_id_was_read_at(hub_cache):
    """A hub id's weights were fingerprinted as None, so a `main` that moved on the hub went unrecorded (issue 33
    item 2): the card now names the cache snapshot's commit and fingerprints its files; another snapshot is another
    commit and another fingerprint, and a hub id the cache does not hold stays None."""
    from qkvqa.pipeline.protocol import component_card

    def spec_of(pretrained, revision):  # a component's config section, as the card reads it
        return OmegaConf.create(
            {"kind": "bem", "pretrained": pretrained, "revision": revision, "tiny": False, "dtype": "fp32"}
        )

    repo = hub_cache / "models--kortukov--answer-equivalence-bem"
    card = component_card(spec_of("kortukov/answer-equivalence-bem", "main"))
    assert card["revision"] == "main" and card["resolved_revision"] == COMMIT_A
    assert card["fingerprint"] == weights_fingerprint_of(repo / "snapshots" / COMMIT_A) is not None
    shutil.copytree(repo / "snapshots" / COMMIT_A, repo / "snapshots" / COMMIT_B)
    weights = next((repo / "snapshots" / COMMIT_B).glob("*.safetensors"))
    weights.write_bytes(b"\1" + weights.read_bytes()[1:])  # the hub's main moved on: other weights
    (repo / "refs" / "main").write_text(COMMIT_B, encoding="utf-8")
    moved = component_card(spec_of("kortukov/answer-equivalence-bem", "main"))
    assert moved["resolved_revision"] == COMMIT_B and moved["fingerprint"] != card["fingerprint"]
    pinned = component_card(spec_of("kortukov/answer-equivalence-bem", COMMIT_A))
    assert pinned["resolved_revision"] == COMMIT_A and pinned["fingerprint"] == card["fingerprint"]
    absent = component_card(spec_of("kortukov/not-in-the-cache", "main"))
    assert absent["resolved_revision"] is None and absent["fingerprint"] is None


def weights_fingerprint_of(path: Path):
    from qkvqa.pipeline.protocol import weights_fingerprint

    return weights_fingerprint(str(path))


def test_a_real_model_on_device_auto_without_a_gpu_warns_once_when_built(tmp_path, caplog):
    """`qkvqa embed` / `retrieve` / `summarize` with EVA-CLIP-8B on a node without a usable GPU fell back to the CPU in
    silence (only evaluation warned): the build of any real model on `device: auto` now says so, once (issue 33
    item 3); a small local model (a tiny one saved to disk) and `device: cpu` say nothing."""
    import logging

    import torch

    from qkvqa.components import hardware
    from qkvqa.components.registry import ComponentSpec

    if torch.cuda.is_available():
        pytest.skip("a usable GPU is here: device auto picks it")
    hardware._JUDGED_ON_CPU.clear()
    small = tmp_path / "small"
    small.mkdir()
    (small / "model.safetensors").write_bytes(b"\0" * 1024)
    with caplog.at_level(logging.WARNING, logger=hardware.log.name):
        for _ in range(2):
            assert ComponentSpec(kind="evaclip_hf", pretrained="BAAI/EVA-CLIP-8B").torch_device().type == "cpu"
        ComponentSpec(kind="bem", pretrained=str(small)).torch_device()
        ComponentSpec(kind="llama3", pretrained="meta-llama/Meta-Llama-3-8B-Instruct", device="cpu").torch_device()
        ComponentSpec(kind="bem", tiny=True).torch_device()
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and "BAAI/EVA-CLIP-8B" in lines[0] and "device: auto" in lines[0], lines
    assert "device: cpu" in lines[0]  # the fix: a GPU node, or say cpu on purpose
