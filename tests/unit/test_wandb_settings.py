"""What a W&B run is given: the compact config, job_type, notes and tags, relative summary paths, the predictions table."""

from __future__ import annotations

from qkvqa.config.load import compose, to_plain
from qkvqa.data.questions import Question
from qkvqa.loggers.wandb import (
    TABLE_COLUMNS,
    TRACE_COLUMNS,
    compact_config,
    gold_rank,
    job_type,
    predictions_table_rows,
    relative_paths,
    run_settings,
)
from qkvqa.retrieval.results import Retrieved
from qkvqa.run.rundir import resolve_run


def test_the_config_sent_to_wandb_has_no_word_list_and_keeps_every_setting_with_its_type():
    cfg = compose("demo/qff_per_layer", [], ["qff.alpha=0.3", "cda.U=null"])
    plain = to_plain(cfg)
    assert len(plain["components"]["qformer"]["options"]["vocab_texts"]) > 10
    compact = compact_config(plain)
    words = compact["components"]["qformer"]["options"]["vocab_texts"]
    assert words == f"<{len(plain['components']['qformer']['options']['vocab_texts'])} items: see config.yaml>"
    assert compact["qff"]["alpha"] == 0.3 and compact["cda"]["U"] is None and compact["qff"]["betas"] == [0.9, 0.98]
    assert compact_config({"a": list(range(65)), "b": list(range(64))}) == {
        "a": "<65 items: see config.yaml>",
        "b": list(range(64)),
    }


def test_run_settings_carry_job_type_notes_and_both_tag_lists(tmp_path):
    cfg = compose(
        None,
        [],
        [
            f"paths.checkpoints_root={tmp_path}",
            "run_id=r1",
            "notes=why",
            "tags=[a,b]",
            "logger.wandb.tags=[b,c]",
            "logger.wandb.mode=offline",
        ],
    )
    settings = run_settings(cfg, resolve_run(cfg), "index build")
    assert settings["job_type"] == "index" and settings["notes"] == "why" and settings["tags"] == ["b", "c", "a"]
    assert settings["id"] == settings["name"] == "r1" and settings["mode"] == "offline"
    assert [job_type(c) for c in ("train", "evaluate", "embed", "mine", "")] == [
        "train",
        "evaluate",
        "embed",
        "mine",
        "run",
    ]


def test_summary_paths_inside_the_run_dir_become_relative(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "qff").mkdir(parents=True)
    summary = {
        "last_model_path": str(run_dir / "last.ckpt"),
        "qff/checkpoint": str(run_dir / "qff"),
        "elsewhere": "/data/kb.json",
        "n": 3,
        "protocol": {"report": str(run_dir / "report.md")},
    }
    assert relative_paths(summary, run_dir) == {
        "last_model_path": "last.ckpt",
        "qff/checkpoint": "qff",
        "elsewhere": "/data/kb.json",
        "n": 3,
        "protocol": {"report": "report.md"},
    }


def _question(qid: str, gold: str) -> Question:
    return Question(
        data_id=qid,
        question=f"what is {qid}?",
        answers=["x", "y"],
        raw_answer="x|y",
        question_type="templated",
        image_id="i",
        image_ids=["i"],
        dataset_name="inaturalist",
        gold_urls=[gold],
        gold_title="",
        evidence_section_id=None,
        evidence_section_title="",
        split="test",
        source="f:1",
    )


def test_predictions_table_rows_name_the_gold_rank_before_and_after_the_filter():
    questions = [_question("q1", "u/b"), _question("q2", "u/z"), _question("q3", "u/a")]
    rows = [
        {"data_id": "q1", "prediction": "x", "ranking": [{"url": "u/b"}, {"url": "u/a"}], "context_tokens": 40},
        {"data_id": "q2", "prediction": "n", "ranking": [{"url": "u/a"}], "context_tokens": 12},
        {"data_id": "q3", "prediction": "", "skipped": "query image missing or unreadable"},
    ]
    retrieved = {"q1": Retrieved(["u/a", "u/b"]), "q2": Retrieved(["u/a"]), "q3": Retrieved(["u/a"])}
    table = predictions_table_rows(rows, questions, retrieved, {"q1": 1.0, "q2": 0.0, "q3": 0.0})
    assert TABLE_COLUMNS == [
        "id",
        "question",
        "gold_answer",
        "prediction",
        "correct",
        "gold_rank_before_filter",
        "gold_rank_after_filter",
        "context_tokens",
    ]
    assert table[0] == ["q1", "what is q1?", "x | y", "x", 1.0, 2, 1, 40]
    assert table[1][5:] == [None, None, 12]  # gold article never ranked
    assert table[2][3] == "<skipped: query image missing or unreadable>" and table[2][5:] == [1, None, None]
    assert gold_rank(["a", "b", "c"], ["c", "b"]) == 2 and gold_rank([], ["a"]) is None
    assert gold_rank(["a", "a", "c"], ["c"]) == 2  # a duplicate counts once, as in recall@K
    # with the traces, their columns follow: Table 3 cell, answer in context, kept articles, best selected chunk;
    # the ranks are the trace's (its stage 1 is cut at the filter's top-K)
    trace = {
        "data_id": "q1",
        "category": "R1-C",
        "answer_in_context": True,
        "gold_rank": {"before": 2, "after": 1},
        "filter": {"articles": [{"url": "u/b", "title": "B"}, {"url": "u/a", "title": None}]},
        "cda": {
            "kept": ["u/b", "u/a"],
            "chunks": [
                {"selected": True, "score": 0.2, "text": "low"},
                {"selected": False, "score": 0.9, "text": None},
                {"selected": True, "score": 0.7, "text": "best"},
            ],
        },
    }
    traced = predictions_table_rows(rows, questions, retrieved, {"q1": 1.0, "q2": 0.0, "q3": 0.0}, [trace])
    assert TRACE_COLUMNS == ["category", "answer_in_context", "kept_articles", "top_chunk"]
    assert traced[0] == table[0] + ["R1-C", True, "B | u/a", "best"] and traced[1] == table[1] + [None] * 4


def test_a_sweep_whose_trials_log_nothing_to_wandb_makes_no_wandb_run_of_its_own(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from qkvqa.compare.table import Table
    from qkvqa.loggers.wandb import log_sweep_run

    spec = SimpleNamespace(name="s", raw={"project": "elsewhere"}, command=["x"])
    table = Table(
        columns=["run_id", "best_value"],
        records=[{"run_id": "s-t000", "best_value": None}],
        metric="eval/r1",
        goal="max",
    )
    monkeypatch.setenv("WANDB_MODE", "offline")
    off = OmegaConf.create({"logger": {"wandb": {"enabled": False, "mode": None, "project": "p", "entity": None}}})
    assert log_sweep_run(spec, tmp_path, table, {"finished": 1}, off) is False
    disabled = OmegaConf.create(
        {"logger": {"wandb": {"enabled": True, "mode": "disabled", "project": "p", "entity": None}}}
    )
    assert log_sweep_run(spec, tmp_path, table, {"finished": 1}, disabled) is False
    assert not (tmp_path / "wandb").exists()
