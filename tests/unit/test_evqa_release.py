"""E-VQA question files as released (google-research `encyclopedic_vqa/README.md`): 2_hop rows hold two values
joined by '|' in `wikipedia_url`, `evidence_section_id` and `evidence_section_title`, and both hops are kept through
the question, the scores and the trace; `wikipedia_url_used_in_train` gives the seen / unseen rows of the report."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from qkvqa.data.questions import read_evqa_csv
from qkvqa.errors import DataError
from qkvqa.pipeline.report import render_report
from qkvqa.pipeline.scoring import flat_metrics, score_run
from qkvqa.pipeline.traces import build_traces
from qkvqa.retrieval.results import Retrieved
from tests.data_fixtures import evqa_row, write_csv

A, B = "https://en.wikipedia.org/wiki/A", "https://en.wikipedia.org/wiki/B"


def two_hop_row(**overrides: str) -> dict[str, str]:
    """A 2_hop row written as the README says: two URLs, two section ids, two section titles."""
    return evqa_row(
        "2_hop",
        **{
            "wikipedia_url": f"{A}|{B}",
            "wikipedia_title": "A|B",
            "evidence_section_id": "3|1",
            "evidence_section_title": "Habitat|Diet",
            "answer": "seeds",
            "wikipedia_url_used_in_train": "False",
            **overrides,
        },
    )


def test_a_two_hop_row_keeps_both_urls_section_ids_and_titles(tmp_path):
    path = write_csv(tmp_path / "test.csv", [evqa_row(), two_hop_row()])
    single, two_hop = read_evqa_csv(path, include_two_hop=True)
    assert two_hop.hops == [
        {"url": A, "title": "A", "section_index": 3, "section_title": "Habitat"},
        {"url": B, "title": "B", "section_index": 1, "section_title": "Diet"},
    ]
    assert (two_hop.gold_url, two_hop.evidence_section_id) == (A, 3)  # the first hop: the entity in the image
    assert single.hops == [{"url": A, "title": "A", "section_index": 1, "section_title": "Description"}]


def test_a_two_hop_row_with_one_title_keeps_it_for_the_first_hop(tmp_path):
    """The README documents two values for three fields only; one `wikipedia_title` is read as the first hop's."""
    path = write_csv(tmp_path / "test.csv", [two_hop_row(wikipedia_title="A")])
    (question,) = read_evqa_csv(path, include_two_hop=True)
    assert [h["title"] for h in question.hops] == ["A", None]


@pytest.mark.parametrize(
    "field, value",
    [
        ("evidence_section_id", "3|x"),  # a hop that is not a section index
        ("evidence_section_id", "3"),  # one id for two URLs
        ("evidence_section_id", "3|1|2"),
        ("evidence_section_id", "3|"),
        ("evidence_section_title", "Habitat"),  # one title for two URLs
        ("wikipedia_url", A),  # a 2_hop row with one URL
        ("wikipedia_url", f"{A}|"),
        ("wikipedia_title", "A|B|C"),
        ("wikipedia_url_used_in_train", "yes"),
    ],
)
def test_a_malformed_two_hop_value_names_file_line_and_field(tmp_path, field, value):
    path = write_csv(tmp_path / "test.csv", [evqa_row(), two_hop_row(**{field: value})])
    with pytest.raises(DataError, match=f"line 3: field '{field}'") as error:
        read_evqa_csv(path, include_two_hop=True)
    assert str(path) in str(error.value)


def test_two_section_ids_on_a_single_hop_row_say_that_only_two_hop_rows_hold_two(tmp_path):
    path = write_csv(tmp_path / "test.csv", [evqa_row(evidence_section_id="3|1")])
    with pytest.raises(
        DataError,
        match=r"line 2: field 'evidence_section_id': '3\|1' is not a section index "
        r"\(only 2_hop rows",
    ):
        read_evqa_csv(path)


@pytest.mark.parametrize("value, expected", [("True", True), ("False", False), ("", None)])
def test_wikipedia_url_used_in_train_is_read(tmp_path, value, expected):
    path = write_csv(tmp_path / "test.csv", [evqa_row(wikipedia_url_used_in_train=value)])
    assert read_evqa_csv(path)[0].url_used_in_train is expected


def _scored(tmp_path):
    """Five questions: 3 seen (2 answered right), 1 unseen two-hop (right), 1 without a used-in-train value (wrong)."""
    rows = [
        evqa_row(question=f"q{i}", answer="seeds", wikipedia_url_used_in_train=seen)
        for i, seen in enumerate(["True", "True", "True", ""])
    ]
    rows.insert(2, two_hop_row(question="q2hop"))
    questions = read_evqa_csv(write_csv(tmp_path / "test.csv", rows), include_two_hop=True)
    right = {"q0", "q2hop", "q1"}
    predictions = [
        {
            "data_id": q.data_id,
            "prediction": "seeds" if q.question in right else "moss",
            "ranking": [{"url": B, "score": 1.0}],
            "top1_section": [B, 1],
            "context_text": "",
            "context_tokens": 1,
            "seconds": {},
        }
        for q in questions
    ]
    return questions, predictions


def test_the_scores_give_seen_and_unseen_accuracy_each_with_its_n(tmp_path):
    questions, predictions = _scored(tmp_path)
    scores = score_run("evqa", predictions, questions, {}, None, 20, "exclude")
    split = scores["benchmark"]["seen_unseen"]
    assert split["seen"] == {"n": 3, "correct": 2.0, "accuracy": pytest.approx(200 / 3)}
    assert split["unseen"] == {"n": 1, "correct": 1.0, "accuracy": 100.0}
    assert split["n_unknown"] == 1
    assert flat_metrics(scores)["eval/accuracy_unseen"] == 100.0
    cfg = SimpleNamespace(
        experiment="x",
        eval=SimpleNamespace(split="test", filter="retrieval", context="cda"),
        cda=SimpleNamespace(mode="full", U=2, theta=0.5, chunk_tokens=60, K1=4, K2=2),
    )
    report = render_report("run", cfg, scores, None, [])
    assert "| all, gold article seen in training | 3 | 66.67 |" in report
    assert "| all, gold article unseen in training | 1 | 100.00 |" in report
    assert "1 questions have no value there" in report


def test_two_hop_rows_stay_out_of_the_recall_tables_and_count_per_hop_under_policy_any(tmp_path):
    questions, predictions = _scored(tmp_path)
    excluded = score_run("evqa", predictions, questions, {}, None, 20, "exclude")
    assert excluded["recall_after_filter"]["n_excluded_two_hop"] == 1
    assert excluded["section_recall"]["n_excluded_two_hop"] == 1
    # The two-hop question's top-1 article is its second hop with that hop's evidence section (1): a hit; the first
    # hop's section index (3) would have made it a miss.
    two_hop = [q for q in questions if q.question_type == "2_hop"]
    any_hop = score_run(
        "evqa", [p for p in predictions if p["data_id"] == two_hop[0].data_id], two_hop, {}, None, 20, "any"
    )
    assert any_hop["section_recall"]["evidence_section_recall@1"] == 100.0


def test_the_trace_keeps_both_hops_and_the_used_in_train_flag(tmp_path):
    questions, predictions = _scored(tmp_path)
    traces = build_traces(
        predictions,
        questions,
        {q.data_id: Retrieved([B]) for q in questions},
        {},
        dataset="evqa",
        split="test",
        top_k=20,
        filter_name="retrieval",
        alpha=None,
        image_path=lambda q: None,
    )
    two_hop = next(t for t in traces if t["question_type"] == "2_hop")
    assert two_hop["gold"]["urls"] == [A, B] and two_hop["gold"]["section_index"] == 3
    assert [(h["url"], h["section_index"], h["section_title"]) for h in two_hop["gold"]["hops"]] == [
        (A, 3, "Habitat"),
        (B, 1, "Diet"),
    ]
    assert two_hop["gold"]["url_used_in_train"] is False
    assert [t["gold"]["url_used_in_train"] for t in traces if t["question_type"] != "2_hop"] == [True, True, True, None]


def test_the_synthetic_world_writes_two_hop_rows_as_the_release_does(world):
    root = Path(world["dir"])
    records = json.loads((root / "world.json").read_text(encoding="utf-8"))["questions"]["evqa/test.csv"]
    with open(root / "evqa/test.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    two_hop = [(row, record) for row, record in zip(rows, records) if row["question_type"] == "2_hop"]
    assert two_hop
    for row, record in two_hop:
        for name in ("wikipedia_url", "evidence_section_id", "evidence_section_title"):
            assert len(row[name].split("|")) == 2, (name, row[name])
        assert row["evidence_section_id"] == f"{record['evidence_section_id']}|{record['answer_section_id']}"
    assert {row["wikipedia_url_used_in_train"] for row in rows} == {"True", "False"}
    questions = {q.data_id: q for q in read_evqa_csv(root / "evqa/test.csv", include_two_hop=True)}
    for row, record in two_hop:
        hops = questions[record["data_id"]].hops
        assert [h["url"] for h in hops] == record["gold_urls"]
        assert [h["section_index"] for h in hops] == [record["evidence_section_id"], record["answer_section_id"]]
