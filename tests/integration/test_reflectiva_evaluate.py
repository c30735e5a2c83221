"""An evaluation on the synthetic world with kind reflectiva (tiny, converted from the original LLaVA layout): the
pipeline hands each question's image and CDA context to ReflectiVA's conversation and records answers."""

from __future__ import annotations

import json

import pytest

from qkvqa.cli.main import main
from qkvqa.run.rundir import clear_run_env


@pytest.mark.slow
def test_evaluate_with_the_converted_llava_generator(eval_env, monkeypatch):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    clear_run_env()
    assert (
        main(
            [
                "evaluate",
                "experiment=world_eval",
                "run_id=reflectiva",
                "eval.judge=em_only",
                "components.generator.kind=reflectiva",
                "data.max_questions=6",
            ]
        )
        == 0
    )
    run_dir = eval_env["runs"] / "reflectiva"
    rows = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    answered = [r for r in rows if not r.get("skipped")]
    assert answered and all(isinstance(r["prediction"], str) and r["context_text"] for r in answered)
    scores = json.loads((run_dir / "scores.json").read_text())
    assert scores["protocol"]["generation"]["kind"] == "reflectiva"
