"""W&B runs of an evaluation and of a job without a Trainer (embed), offline, read back with W&B's own reader."""

from __future__ import annotations

import json

import pytest

from qkvqa.cli.main import main
from qkvqa.run.rundir import clear_run_env
from tests.integration.test_wandb_offline import _offline_dirs, leet

pytestmark = pytest.mark.slow


@pytest.fixture
def offline(monkeypatch, eval_env):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    clear_run_env()
    yield eval_env
    import wandb

    if wandb.run is not None:
        wandb.finish()
    clear_run_env()


def test_an_evaluation_logs_its_questions_as_a_table_with_job_type_evaluate(offline, world):
    assert (
        main(
            [
                "evaluate",
                "experiment=world_eval",
                "run_id=wb-eval",
                "eval.judge=em_only",
                "logger.wandb.enabled=true",
                "logger.wandb.eval_table_images=true",
            ]
        )
        == 0
    )
    (run_dir,) = _offline_dirs(offline["runs"] / "wb-eval")
    records = leet(run_dir)
    assert [r["run"]["job_type"] for r in records if r.get("type") == "run"] == ["evaluate"]
    rows = [r["history"]["item"] for r in records if r.get("type") == "history"]
    (table,) = [row for row in rows if "eval/predictions.path" in row]
    n_test = len(world["questions"]["evqa/test.csv"])  # every row of the test CSV, 2_hop included
    assert table["eval/predictions._type"] == "table-file" and table["eval/predictions.nrows"] == n_test
    content = json.loads((run_dir / "files" / table["eval/predictions.path"]).read_text())
    assert content["columns"] == [
        "id",
        "question",
        "gold_answer",
        "prediction",
        "correct",
        "gold_rank_before_filter",
        "gold_rank_after_filter",
        "context_tokens",
        "category",
        "answer_in_context",
        "kept_articles",
        "top_chunk",
        "image",
    ]
    predictions = {
        json.loads(line)["data_id"]: json.loads(line)
        for line in (offline["runs"] / "wb-eval" / "predictions.jsonl").read_text().splitlines()
    }
    traces = {
        json.loads(line)["data_id"]: json.loads(line)
        for line in (offline["runs"] / "wb-eval" / "traces.jsonl").read_text().splitlines()
    }
    assert [row[0] for row in content["data"]] == list(traces)
    for row in content["data"]:
        qid, prediction, correct, after = row[0], row[3], row[4], row[6]
        trace = traces[qid]  # the trace's columns, as traces.jsonl has them
        assert row[8:10] == [trace["category"], trace["answer_in_context"]]
        assert row[5:7] == [trace["gold_rank"]["before"], trace["gold_rank"]["after"]]
        if predictions[qid].get("skipped"):
            assert prediction.startswith("<skipped: ") and correct == 0.0 and row[12] is None
            assert row[10] is None and row[11] is None
        else:
            assert prediction == predictions[qid]["prediction"] and correct in (0.0, 1.0)
            assert row[7] == predictions[qid]["context_tokens"] and row[12] is not None  # the query image
            assert after is None or 1 <= after <= len(predictions[qid]["ranking"])
            assert correct == trace["verdict"]["score"] and row[11] in trace["context"]  # the best selected chunk
            kept = {a["url"]: a["title"] for a in trace["filter"]["articles"]}
            assert row[10] == " | ".join(kept[url] for url in trace["cda"]["kept"])
    summary = leet(run_dir, "--summary")[0]["summary"]
    assert "eval/accuracy" in summary and summary["report"] == "report.md"


def test_an_embed_job_is_a_wandb_run_of_job_type_embed_with_its_summary(offline):
    assert main(["embed", "experiment=world_eval", "run_id=wb-embed", "logger.wandb.enabled=true", "tags=[kb]"]) == 0
    (run_dir,) = _offline_dirs(offline["runs"] / "wb-embed")
    state = leet(run_dir, "--summary")[0]
    assert state["state"] == "finished" and state["tags"] == ["kb"]
    assert [r["run"]["job_type"] for r in leet(run_dir) if r.get("type") == "run"] == ["embed"]
    assert any(k.startswith("embed/") for k in state["summary"])
