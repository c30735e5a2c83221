"""Issue 45: examples/generic_causal_lm.py, a generator from outside the package named by import path, runs a tiny
evaluation from a causal LM on disk (no tiny writer of its own) and is named on the card with its source's hash."""

from __future__ import annotations

import csv
import hashlib
import io
import json
from pathlib import Path

import pytest

from qkvqa.cli.main import main
from qkvqa.errors import ConfigError
from qkvqa.run.rundir import clear_run_env
from tests.helpers.sweeps import grid_sweep

REPO = Path(__file__).resolve().parents[2]
KIND = "examples.generic_causal_lm:GenericCausalLM"


@pytest.fixture(scope="module")
def causal_lm(tmp_path_factory) -> Path:
    """A random tiny causal LM with a ChatML template, written as a user's checkpoint folder."""
    from qkvqa.generation.tiny import write_tiny_chatml_lm

    return write_tiny_chatml_lm(tmp_path_factory.mktemp("causal_lm") / "lm")


@pytest.mark.slow
def test_the_example_generator_loads_any_chat_causal_lm_and_checks_its_options(causal_lm):
    from qkvqa.config.load import compose
    from qkvqa.generation.backends import build_generator
    from qkvqa.generation.prompts import Prompt

    spec = {"kind": KIND, "pretrained": str(causal_lm), "device": "cpu", "options": {"stop_token": "<|im_end|>"}}
    generator = build_generator(spec)
    tokenizer = generator.chat.tokenizer
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in generator.chat.stop_token_ids
    assert generator.chat.render(Prompt(None, ("What is it?",))).endswith("<|im_start|>assistant\n")
    answers = generator.generate_prompts([Prompt(None, ("What is it?",)), Prompt(None, ("Where?",))], 3)
    assert len(answers) == 2 and all(isinstance(a, str) for a in answers)
    with pytest.raises(ConfigError, match="options.stop_token: '<none>' is not a token"):
        build_generator({**spec, "options": {"stop_token": "<none>"}})
    with pytest.raises(ConfigError, match=r"^components.generator.options.max_prompt_tokens=8 is out of range"):
        compose(None, [], [f"components.generator.kind={KIND}", "components.generator.options.max_prompt_tokens=8"])
    with pytest.raises(ConfigError, match=r"^components.generator.options: unknown key\(s\) \['stop_tokens'\]"):
        compose(None, [], [f"components.generator.kind={KIND}", "components.generator.options.stop_tokens=x"])


@pytest.mark.slow
def test_the_example_generator_runs_a_tiny_evaluation_and_the_card_names_it(eval_env, monkeypatch, causal_lm, capsys):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    clear_run_env()
    overrides = [
        f"components.generator={{kind: {KIND}, pretrained: {causal_lm}, tiny: false, device: cpu, dtype: fp32}}",
        "eval.judge=em_only",
        "eval.filter=retrieval",
    ]
    no_tiny = [f"components.generator.kind={KIND}", "eval.judge=em_only", "eval.filter=retrieval"]
    assert main(["evaluate", "experiment=world_eval", "run_id=example_no_tiny", *no_tiny]) != 0
    assert not (eval_env["runs"] / "example_no_tiny").exists()  # refused before stage 1: nothing ran
    clear_run_env()
    assert main(["evaluate", "experiment=world_eval", "run_id=example_generator", *overrides]) == 0
    run_dir = eval_env["runs"] / "example_generator"
    rows = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    answered = [r for r in rows if not r.get("skipped")]
    assert answered and all(isinstance(r["prediction"], str) and r["context"]["chunks"] for r in answered)
    card = json.loads((run_dir / "scores.json").read_text())["protocol"]
    source = REPO / "examples" / "generic_causal_lm.py"
    assert card["generation"]["kind"] == KIND
    assert card["models"]["generator"]["plugin"] == {
        "import_path": KIND,
        "source": str(source),
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
    }
    assert card["models"]["generator"]["weights"] == str(causal_lm)
    # the shipped chat_lm on the same weights, and `qkvqa compare` of the two runs: the kind is the swept key
    clear_run_env()
    baseline = [*overrides, "components.generator.kind=chat_lm"]
    assert main(["evaluate", "experiment=world_eval", "run_id=example_baseline", *baseline]) == 0
    capsys.readouterr()
    runs = [str(run_dir), str(eval_env["runs"] / "example_baseline")]
    assert main(["compare", *runs, "--format", "csv"]) == 0
    table = {r["run_id"]: r for r in csv.DictReader(io.StringIO(capsys.readouterr().out))}
    assert table["example_generator"]["components.generator.kind"] == KIND
    assert table["example_baseline"]["components.generator.kind"] == "chat_lm"


@pytest.mark.slow
def test_a_chunk_scorer_and_a_judge_by_import_path_run_a_tiny_evaluation(eval_env, monkeypatch):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    clear_run_env()
    scorer, judge = "tests.helpers.plugin_kinds:WordOverlapKind", "tests.helpers.plugin_kinds:SharedWordJudgeKind"
    overrides = [
        f"components.reranker={{kind: {scorer}, tiny: true, options: {{weight: 1.0}}}}",
        f"components.judge={{kind: {judge}, tiny: true, options: {{threshold: 0.5}}}}",
        "eval.judge=bem",
        "eval.filter=retrieval",
    ]
    assert main(["evaluate", "experiment=world_eval", "run_id=example_scorer_judge", *overrides]) == 0
    run_dir = eval_env["runs"] / "example_scorer_judge"
    scores = json.loads((run_dir / "scores.json").read_text())
    assert scores["benchmark"]["label"] == "shared words >= 0.5"
    models = scores["protocol"]["models"]
    assert models["reranker"]["plugin"]["import_path"] == scorer and models["judge"]["plugin"]["import_path"] == judge
    rows = [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]
    assert any(r.get("context", {}).get("chunks") for r in rows if not r.get("skipped"))


@pytest.mark.slow
def test_a_sweep_over_the_generator_kind_runs_the_example_beside_the_shipped_kind(
    eval_env, monkeypatch, causal_lm, tmp_path
):
    monkeypatch.chdir(REPO)  # the trials run `python -m qkvqa.cli` here: `examples` imports from the working folder
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    clear_run_env()
    args = [
        "evaluate",
        "experiment=world_eval",
        f"components.generator.pretrained={causal_lm}",
        "components.generator.tiny=false",
        "eval.judge=em_only",
        "eval.filter=retrieval",
    ]
    runs, trials = grid_sweep(
        tmp_path, "generator_kinds", "eval/accuracy", "components.generator.kind", ["chat_lm", KIND], args
    )
    for tid, trial in trials.items():
        card = json.loads((runs / f"generator_kinds-{tid}" / "scores.json").read_text())["protocol"]
        plugin = card["models"]["generator"].get("plugin")
        assert (plugin or {}).get("import_path") == (
            KIND if trial["params"]["components.generator.kind"] == KIND else None
        )
