"""Extension points of the QFF used from outside qkvqa (issue 45, docs/extending.md): the example scorer in examples/
trains, reranks and evaluates from one config line, is recorded with the weights, and a mismatch is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkvqa.cli.main import main
from qkvqa.run.rundir import clear_run_env
from qkvqa.utils.io import sha256_file
from tests.helpers.qff_study import mine_world
from tests.helpers.sweeps import grid_sweep
from tests.integration.conftest import REPO

pytestmark = pytest.mark.slow

QUIET = ["trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1", "trainer.num_sanity_val_steps=0"]
SCORER = ["qff.scorer=examples.mean_cosine_scorer:MeanCosine", "qff.scorer_options.scale=2"]


@pytest.fixture(scope="module")
def mined(world, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("qff_plugins")
    return {"overrides": mine_world(world, work), "work": work}


@pytest.fixture(scope="module")
def trained(mined) -> Path:
    """2 steps with the example scorer, validated (its rerank included) on 4 val questions after step 2."""
    clear_run_env()
    argv = ["train", "experiment=demo/qff_per_layer", "run_id=plugin-scorer", *mined["overrides"], *QUIET, *SCORER]
    argv += ["trainer.max_steps=2", "trainer.val_check_interval=2", "qff.max_val_samples=4"]
    assert main(argv) == 0
    return mined["work"] / "runs" / "plugin-scorer"


def test_a_scorer_outside_the_package_trains_and_is_recorded_with_the_weights(trained):
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["global_step"] == 2 and 0 <= summary["val/article_r1"] <= 100
    scoring = json.loads((trained / "qff" / "qff_config.json").read_text())["scoring"]
    assert scoring["scorer"] == "examples.mean_cosine_scorer:MeanCosine"
    assert scoring["scorer_options"] == {"scale": 2.0}
    assert scoring["scorer_source_sha256"] == sha256_file(REPO / "examples" / "mean_cosine_scorer.py")


def test_rerank_and_evaluate_score_with_the_trained_scorer_and_refuse_another(trained, mined, capsys):
    stage1 = mined["work"] / "stage1_val.json"
    common = [
        "experiment=demo/qff_per_layer",
        f"qff.checkpoint={trained / 'qff'}",
        f"retrieval.results={stage1}",
        "data.max_questions=4",
        *mined["overrides"],
    ]
    clear_run_env()
    assert main(["rerank", "run_id=plugin-rerank", "split=val", *common, *SCORER]) == 0
    reranked = mined["work"] / "runs" / "plugin-rerank" / "reranked_val.json"
    made = json.loads(reranked.with_name("reranked_val.meta.json").read_text())["produced_by"]
    assert made["qff.scorer"]["scorer"] == "examples.mean_cosine_scorer:MeanCosine"
    # the scale doubles the cosine: every QFF score of the file is at most 2 and some exceed 1
    qff = [s for q in json.loads(reranked.read_text()).values() for s in q["qff_scores"]]
    assert max(qff) <= 2.0 + 1e-6 and max(qff) > 1.0

    clear_run_env()
    evaluate = ["evaluate", "run_id=plugin-eval", "eval.split=val", "eval.stop_after=filter", *common, *SCORER]
    assert main(evaluate) == 0
    card = json.loads((mined["work"] / "runs" / "plugin-eval" / "scores.json").read_text())["protocol"]["filter"]
    assert card["scorer"] == "examples.mean_cosine_scorer:MeanCosine" and card["scorer_options"] == {"scale": 2.0}
    assert card["runtime_settings"]["attention"] == "sdpa"

    # the shipped scorer, or another scale, against these weights: refused, naming the key and both values
    for extra, message in (
        ([], "qff.scorer: trained with 'examples.mean_cosine_scorer:MeanCosine', this config has 'late_interaction'"),
        ([SCORER[0], "qff.scorer_options.scale=3"], "qff.scorer_options.scale: trained with 2.0, this config has 3.0"),
    ):
        clear_run_env()
        capsys.readouterr()
        assert main(["rerank", "run_id=plugin-refused", "split=val", *common, *extra]) == 2
        assert message in capsys.readouterr().err


FOCUS = "qff.focus=examples.question_keys_focus:QuestionKeys"


def test_a_focus_block_outside_the_package_trains_reranks_and_is_recorded(mined, capsys):
    """examples/question_keys_focus.py: its gates are its only new parameters (no weight decay), it trains, the
    exported QFF names it with its source hash, rerank and evaluate rebuild it, and a built-in focus is refused."""
    clear_run_env()
    argv = ["train", "experiment=demo/qff_per_layer", "run_id=plugin-focus", *mined["overrides"], *QUIET, FOCUS]
    argv += ["trainer.max_steps=2", "trainer.limit_val_batches=0", "checkpoint.monitor=null", "qff.gate_init=0.3"]
    assert main(argv) == 0
    run = mined["work"] / "runs" / "plugin-focus"
    saved = json.loads((run / "qff" / "qff_config.json").read_text())
    assert saved["focus"] == "examples.question_keys_focus:QuestionKeys"
    assert saved["focus_source_sha256"] == sha256_file(REPO / "examples" / "question_keys_focus.py")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["global_step"] == 2 and "train/gate" in summary

    stage1 = mined["work"] / "stage1_val.json"
    common = [
        "experiment=demo/qff_per_layer",
        f"qff.checkpoint={run / 'qff'}",
        f"retrieval.results={stage1}",
        "data.max_questions=4",
        *mined["overrides"],
    ]
    clear_run_env()
    assert main(["rerank", "run_id=plugin-focus-rerank", "split=val", *common, FOCUS]) == 0
    made = json.loads((mined["work"] / "runs" / "plugin-focus-rerank" / "reranked_val.meta.json").read_text())[
        "produced_by"
    ]
    assert made["qff.focus"] == "examples.question_keys_focus:QuestionKeys"
    clear_run_env()
    evaluate = ["evaluate", "run_id=plugin-focus-eval", "eval.split=val", "eval.stop_after=filter", *common, FOCUS]
    assert main(evaluate) == 0
    card = json.loads((mined["work"] / "runs" / "plugin-focus-eval" / "scores.json").read_text())["protocol"]
    assert card["filter"]["focus"] == "examples.question_keys_focus:QuestionKeys"
    clear_run_env()
    capsys.readouterr()
    assert main(["rerank", "run_id=plugin-focus-refused", "split=val", *common, "qff.focus=per_layer"]) == 2
    assert "qff.focus='per_layer', but the loaded QFF model was built with focus=" in capsys.readouterr().err


def test_a_focus_block_that_reads_the_tokenizer_gets_it_from_the_builder(mined):
    """The study's positive control (tests/helpers/qff_oracle.py) takes its token ids in `bind_tokenizer`: `qkvqa
    train` and `qkvqa rerank` build it through the builder, which hands it the tokenizer (no callback, no entry of
    its own), and the sha256 of the ids it trained with is exported with its weights."""
    from safetensors.torch import load_file

    oracle = "qff.focus=tests.helpers.qff_oracle:PresenceOracle"
    clear_run_env()
    argv = ["train", "experiment=demo/qff_per_layer", "run_id=plugin-oracle", *mined["overrides"], *QUIET, oracle]
    argv += ["trainer.max_steps=2", "trainer.limit_val_batches=0", "checkpoint.monitor=null"]
    assert main(argv) == 0
    run = mined["work"] / "runs" / "plugin-oracle"
    assert load_file(str(run / "qff" / "model.safetensors"))["oracle_ids_sha256"].any()
    stage1 = mined["work"] / "stage1_val.json"
    common = [f"qff.checkpoint={run / 'qff'}", f"retrieval.results={stage1}", "data.max_questions=4"]
    clear_run_env()
    rerank = ["rerank", "experiment=demo/qff_per_layer", "run_id=plugin-oracle-rerank", "split=val", *common]
    assert main([*rerank, *mined["overrides"], oracle]) == 0
    reranked = json.loads((mined["work"] / "runs" / "plugin-oracle-rerank" / "reranked_val.json").read_text())
    assert len(reranked) == 4 and all(q["qff_scores"] for q in reranked.values())


def test_a_sweep_trains_the_example_scorer_with_each_focus_and_compare_lists_them(mined, monkeypatch, tmp_path):
    """Both QFF trials run through `qkvqa sweep` as trials of their own processes (the scorer in each, the example
    focus beside the shipped per_layer), and `qkvqa compare` of the sweep shows the swept focus and each run's
    validation figure, the plugin's import path as the cell."""
    from qkvqa.compare import runs as compare_runs

    monkeypatch.chdir(REPO)  # the trials run `python -m qkvqa.cli` here: `examples` imports from the working folder
    clear_run_env()
    focus_values = ["per_layer", FOCUS.split("=", 1)[1]]
    args = ["train", "experiment=demo/qff_per_layer", *mined["overrides"], *QUIET, *SCORER]
    args += ["trainer.max_steps=2", "trainer.val_check_interval=2", "qff.max_val_samples=4"]
    root, trials = grid_sweep(tmp_path, "qff_plugins", "val/section_r1", "qff.focus", focus_values, args)
    for tid, trial in trials.items():
        saved = json.loads((root / f"qff_plugins-{tid}" / "qff" / "qff_config.json").read_text())
        assert saved["scoring"]["scorer"] == SCORER[0].split("=", 1)[1], saved["scoring"]
        assert saved["focus"] == trial["params"]["qff.focus"]
    table = compare_runs(root / "sweeps" / "qff_plugins")
    assert len(table) == 2 and sorted(table["qff.focus"]) == sorted(focus_values), table.to_string()
    assert table["val/section_r1"].notna().all(), table.to_string()
