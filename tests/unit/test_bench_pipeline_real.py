"""bench/pipeline_real.py at its toy size: the result's keys, OURS and the OMGM-style baseline agreeing on every
section score, positive ratios. Properties only; no speed figure is asserted."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # builds and runs three pipelines: `make test`, not the fast loop

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_pipeline_real", REPO / "bench" / "pipeline_real.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop(spec.name, None)


@pytest.fixture(scope="module")
def result(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench-out")
    # main() sets QKVQA_LOG_LEVEL=WARNING for its own command line; left in this process's environment, every later
    # test's child process inherited it and printed no INFO line (found under two xdist workers)
    saved = dict(os.environ)
    try:
        assert bench.main(["--config", "toy", "--no-l90", "--threads", "1", "--out-dir", str(out)]) == 0
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return json.loads((out / "pipeline_real.json").read_text()), (out / "pipeline_real.md").read_text()


def test_the_result_has_every_key_and_stage(result):
    data, _ = result
    for key in (
        "device",
        "config",
        "sizes",
        "stages",
        "ours_s_per_question",
        "omgm_style_s_per_question",
        "ratio",
        "vit_lru_hit_rate",
        "questions",
        "torch_threads",
        "generator_flop_model",
        "correctness",
    ):
        assert key in data, key
    assert data["config"] == "toy" and data["device"] == "cpu" and data["torch_threads"] >= 1
    assert set(data["sizes"]) == {"qff", "reranker", "generator"}
    for stage in ("retrieve", "filter", "select", "generate"):
        assert set(data["stages"][stage]) == {"ours_s_per_question", "omgm_style_s_per_question", "ratio"}


def test_both_pipelines_give_the_same_section_scores(result):
    data, md = result
    c = data["correctness"]
    assert c["passed"] and c["max_abs_section_score_difference"] <= 1e-4 == c["tolerance"]
    assert c["questions_compared"] == data["questions"] > 0
    assert c["score_spread"]["std"] > 10 * c["tolerance"]  # the guard is not vacuous
    assert "FAILED" not in md


def test_ratios_are_positive_and_consistent(result):
    data, md = result
    for stage in ("filter", "select", "generate"):
        v = data["stages"][stage]
        assert v["ours_s_per_question"] > 0 and v["omgm_style_s_per_question"] > 0 and v["ratio"] > 0
        assert math.isclose(v["ratio"], v["omgm_style_s_per_question"] / v["ours_s_per_question"])
    total = sum(data["stages"][s]["ours_s_per_question"] for s in ("filter", "select", "generate"))
    assert math.isclose(data["ours_s_per_question"], total) and data["ratio"] > 0
    assert 0.0 <= data["vit_lru_hit_rate"] <= 1.0
    # the OMGM-style loop runs the ViT once per section; ours at most once per article image
    assert data["vit_images_per_question"]["omgm_style"] >= data["vit_images_per_question"]["ours"]
    assert "| stage | ours s/question | OMGM-style s/question | ratio |" in md


def test_the_real_config_builds_on_the_meta_device(bench):
    report = bench.dry_run("real", "cuda", "bf16")
    params = report["params"]
    assert 0.9e9 < params["qff_vit"] < 1.1e9  # EVA ViT-g
    assert 7.5e9 < params["generator"] < 8.5e9  # Llama-3-8B
    assert 0.5e9 < params["reranker"] < 0.6e9  # XLM-R large
    flop = report["generator_flop_model"]
    assert flop["prefill_flops_per_question"] == 2 * flop["matmul_params"] * flop["prompt_tokens_mean"]
