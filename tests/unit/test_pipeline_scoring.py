"""Scoring an evaluation run: one denominator, single-hop Table 3, and n/a where no number can be computed."""

from __future__ import annotations

from pathlib import Path

from qkvqa.data.questions import read_evqa_csv, read_infoseek_jsonl_questions
from qkvqa.pipeline.scoring import score_run
from qkvqa.retrieval.results import Retrieved


def _rows(questions, ranking_url="https://en.wikipedia.org/wiki/Nowhere"):
    return [
        {
            "data_id": q.data_id,
            "prediction": "x",
            "ranking": [{"url": ranking_url, "score": 1.0}],
            "top1_section": None,
            "context_text": "",
            "context_tokens": 3,
            "seconds": {"filter": 0.1},
        }
        for q in questions
    ]


def test_questions_without_a_gold_url_give_no_table_3_and_no_recall(world):
    root = Path(world["dir"]) / "infoseek"
    questions = read_infoseek_jsonl_questions(root / "infoseek_val.jsonl", root / "infoseek_val_qtype.jsonl")
    assert questions and not any(q.gold_urls for q in questions)  # the official JSONL has no gold URL
    scores = score_run("infoseek", _rows(questions), questions, {}, None, 20, "exclude")
    assert scores["error_analysis"] is None  # n/a, never R1 = 0.00
    assert scores["recall_after_filter"]["recall@1"] is None and scores["recall_after_filter"]["n_without_gold"] == len(
        questions
    )
    assert scores["accuracy"] is not None and scores["n_scored"] == len(questions)


def test_an_unanswerable_question_is_wrong_and_a_miss_unless_excluded_for_diagnosis(world):
    questions = read_evqa_csv(Path(world["dir"]) / "evqa/test.csv", include_two_hop=True)
    single = [q for q in questions if q.question_type != "2_hop"]
    rows = [
        {
            "data_id": q.data_id,
            "prediction": q.answers[0],
            "context_text": q.answers[0],
            "context_tokens": 5,
            "ranking": [{"url": q.gold_urls[0], "score": 1.0}],
            "top1_section": None,
            "seconds": {},
        }
        for q in questions
    ]
    rows[0] = {"data_id": single[0].data_id, "prediction": "", "skipped": "query image missing or unreadable"}
    retrieved = {q.data_id: Retrieved([q.gold_urls[0]]) for q in questions}
    counted = score_run("evqa", rows, questions, retrieved, None, 20, "exclude")
    left_out = score_run("evqa", rows, questions, retrieved, None, 20, "exclude", exclude_skipped=True)
    n = len(questions)
    assert counted["n_scored"] == n and counted["benchmark"]["all"]["n"] == n
    assert counted["benchmark"]["all"]["correct"] <= n - 1  # the unanswered one is wrong
    assert counted["recall_after_filter"]["recall@1"] == 100.0 * (len(single) - 1) / len(single)
    assert counted["error_analysis"]["n"] == len(single)  # Table 3: single-hop rows only
    assert left_out["n_scored"] == n - 1 and left_out["recall_after_filter"]["recall@1"] == 100.0
    assert counted["skipped"] == [{"data_id": single[0].data_id, "reason": "query image missing or unreadable"}]
