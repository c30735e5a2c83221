"""Question readers: E-VQA ids and filters, 2_hop handling, InfoSeek CSV / JSONL, and DataErrors naming file, line, field."""

from __future__ import annotations

import json

import pytest

from qkvqa.data.questions import (
    attach_infoseek_references,
    is_training_question,
    read_evqa_csv,
    read_infoseek_csv,
    read_infoseek_jsonl_questions,
    read_infoseek_references,
)
from qkvqa.errors import DataError
from tests.data_fixtures import evqa_row, write_csv

TYPES = ["templated", "2_hop", "automatic", "multi_answer", "2_hop", "templated"]


@pytest.fixture
def evqa_csv(tmp_path):
    rows = [evqa_row(t, question=f"q{i}") for i, t in enumerate(TYPES)]
    rows[3]["answer"] = "red&&blue|blue&&red"
    return write_csv(tmp_path / "test.csv", rows)


def test_single_hop_ids_count_only_single_hop_rows(evqa_csv):
    questions = read_evqa_csv(evqa_csv)
    assert [(q.data_id, q.question) for q in questions] == [
        ("E-VQA_0", "q0"),
        ("E-VQA_1", "q2"),
        ("E-VQA_2", "q3"),
        ("E-VQA_3", "q5"),
    ]


def test_two_hop_rows_get_their_own_ids_and_never_shift_single_hop_ids(evqa_csv):
    single = {q.question: q.data_id for q in read_evqa_csv(evqa_csv)}
    everything = read_evqa_csv(evqa_csv, include_two_hop=True)
    assert [q.data_id for q in everything] == [
        "E-VQA_0",
        "E-VQA_2hop_0",
        "E-VQA_1",
        "E-VQA_2",
        "E-VQA_2hop_1",
        "E-VQA_3",
    ]
    assert {q.question: q.data_id for q in everything if q.question_type != "2_hop"} == single
    two_hop = everything[1]
    assert two_hop.gold_urls == ["https://en.wikipedia.org/wiki/A", "https://en.wikipedia.org/wiki/B"]
    assert two_hop.gold_url == "https://en.wikipedia.org/wiki/A"


def test_fields_answers_first_image_and_every_column_kept(evqa_csv):
    first, _, multi, _ = read_evqa_csv(evqa_csv, split="test")
    assert first.answers == ["30 cm", "thirty centimetres"]
    assert first.raw_answer == "30 cm|thirty centimetres"
    assert (first.image_id, first.image_ids) == ("111", ["111", "222"])
    assert (first.evidence_section_id, first.evidence_section_title) == (1, "Description")
    assert first.row["evidence"] == "The wingspan is 30 cm." and first.row["dataset_category_id"] == "7"
    assert first.source.endswith("test.csv:2") and first.split == "test"
    assert multi.answers == ["red&&blue", "blue&&red"]


def test_training_rows_are_the_single_hop_and_infoseek_types(evqa_csv):
    questions = read_evqa_csv(evqa_csv, include_two_hop=True)
    assert [is_training_question(q) for q in questions] == [t != "2_hop" for t in TYPES]


def test_an_empty_evidence_section_id_is_none(tmp_path):
    path = write_csv(tmp_path / "q.csv", [evqa_row(evidence_section_id=""), evqa_row(evidence_section_id="4.0")])
    assert [q.evidence_section_id for q in read_evqa_csv(path)] == [None, 4]


def test_a_wrong_column_name_names_file_line_and_the_near_miss(tmp_path):
    row = evqa_row()
    row["wikipedia_link"] = row.pop("wikipedia_url")
    path = write_csv(tmp_path / "q.csv", [row], columns=list(row))
    with pytest.raises(DataError) as error:
        read_evqa_csv(path)
    message = str(error.value)
    assert str(path) in message and "line 1" in message and "'wikipedia_url'" in message
    assert "found 'wikipedia_link'" in message


@pytest.mark.parametrize(
    "field, value, expected",
    [
        ("evidence_section_id", "three", "line 3: field 'evidence_section_id'"),
        ("question_type", "4_hop", "line 3: field 'question_type'"),
        ("dataset_image_ids", " | ", "line 3: field 'dataset_image_ids'"),
        ("answer", "", "line 3: field 'answer'"),
        ("wikipedia_url", "https://a|https://b", "line 3: field 'wikipedia_url'"),
    ],
)
def test_a_malformed_row_names_file_line_and_field(tmp_path, field, value, expected):
    path = write_csv(tmp_path / "q.csv", [evqa_row(), evqa_row(**{field: value})])
    with pytest.raises(DataError, match=expected) as error:
        read_evqa_csv(path)
    assert str(path) in str(error.value)


def test_a_row_with_too_few_fields_is_a_data_error(tmp_path):
    path = write_csv(tmp_path / "q.csv", [evqa_row()])
    with open(path, "a", encoding="utf-8") as f:
        f.write("What?,yes,1\n")
    with pytest.raises(DataError, match="line 3: field 'dataset_category_id': missing"):
        read_evqa_csv(path)


def test_a_missing_question_file_is_a_data_error(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_evqa_csv(tmp_path / "nope.csv")


def _infoseek_rows():
    return [
        dict(
            evqa_row(
                data_id=f"infoseek_val_{i:08d}",
                question_type="infoseek",
                dataset_name="infoseek",
                dataset_image_ids=f"oven_{i:08d}",
            )
        )
        for i in range(3)
    ]


def test_infoseek_csv_keeps_its_data_ids_and_refuses_repeats(tmp_path):
    rows = _infoseek_rows()
    path = write_csv(tmp_path / "infoseek_test_filtered.csv", rows)
    questions = read_infoseek_csv(path)
    assert [q.data_id for q in questions] == [r["data_id"] for r in rows]
    assert all(is_training_question(q) for q in questions)
    write_csv(path, rows + [rows[0]])
    with pytest.raises(DataError, match="line 5: field 'data_id': 'infoseek_val_00000000' already on line 2"):
        read_infoseek_csv(path)


def test_infoseek_csv_without_data_id_column_is_refused(tmp_path):
    path = write_csv(tmp_path / "q.csv", [evqa_row()])
    with pytest.raises(DataError, match="missing column\\(s\\) 'data_id'"):
        read_infoseek_csv(path)


def _write_jsonl(path, objects):
    path.write_text("".join(json.dumps(o) + "\n" for o in objects))
    return path


REFERENCES = [
    {
        "data_id": "infoseek_val_00000000",
        "image_id": "oven_0",
        "question": "Where?",
        "answer": ["China"],
        "answer_eval": ["China", "PRC"],
        "data_split": "val_unseen_question",
    },
    {
        "data_id": "infoseek_val_00000001",
        "image_id": "oven_1",
        "question": "How tall?",
        "answer": ["1.0"],
        "answer_eval": {"wikidata": 1.0, "range": [0.9, 1.1]},
        "data_split": "val_unseen_entity",
    },
    {
        "data_id": "infoseek_val_00000002",
        "image_id": "oven_2",
        "question": "When?",
        "answer": ["1990"],
        "answer_eval": ["1990"],
        "data_split": "val_unseen_entity",
    },
]
QTYPES = [
    {"data_id": "infoseek_val_00000000", "question_type": "String"},
    {"data_id": "infoseek_val_00000001", "question_type": "Numerical"},
    {"data_id": "infoseek_val_00000002", "question_type": "time"},
]


def test_infoseek_references_join_question_types_and_the_last_duplicate_wins(tmp_path):
    duplicate = dict(REFERENCES[0], answer_eval=["Taiwan"])
    refs_path = _write_jsonl(tmp_path / "infoseek_val.jsonl", REFERENCES + [duplicate])
    qtypes_path = _write_jsonl(tmp_path / "infoseek_val_qtype.jsonl", QTYPES)
    references = read_infoseek_references(refs_path, qtypes_path)
    assert list(references) == [r["data_id"] for r in REFERENCES]
    assert references["infoseek_val_00000000"].answer_eval == ["Taiwan"]
    assert references["infoseek_val_00000001"].question_type == "Numerical"
    assert references["infoseek_val_00000001"].data_split == "val_unseen_entity"
    questions = read_infoseek_jsonl_questions(refs_path, qtypes_path)
    assert [(q.data_id, q.image_id, q.question_type) for q in questions][2] == (
        "infoseek_val_00000002",
        "oven_2",
        "time",
    )


def test_a_reference_without_question_type_or_with_a_bad_answer_eval_is_a_data_error(tmp_path):
    refs_path = _write_jsonl(tmp_path / "infoseek_val.jsonl", REFERENCES)
    qtypes_path = _write_jsonl(tmp_path / "infoseek_val_qtype.jsonl", QTYPES[:2])
    with pytest.raises(DataError, match="'infoseek_val_00000002'.*line 3.* has no question type"):
        read_infoseek_references(refs_path, qtypes_path)
    _write_jsonl(refs_path, [dict(REFERENCES[1], answer_eval=[{"wikidata": 1.0}])])
    with pytest.raises(DataError, match="line 1: field 'answer_eval'"):
        read_infoseek_references(refs_path)
    _write_jsonl(qtypes_path, [{"data_id": "x", "question_type": "Boolean"}])
    with pytest.raises(DataError, match="line 1: field 'question_type'"):
        read_infoseek_references(refs_path, qtypes_path)


def test_attaching_references_reports_the_overlap(tmp_path):
    questions = read_infoseek_csv(
        write_csv(
            tmp_path / "q.csv", _infoseek_rows()[:2] + [dict(_infoseek_rows()[0], data_id="infoseek_val_99999999")]
        )
    )
    references = read_infoseek_references(_write_jsonl(tmp_path / "r.jsonl", REFERENCES))
    overlap = attach_infoseek_references(questions, references)
    assert overlap == {
        "questions": 3,
        "references": 3,
        "matched": 2,
        "questions_without_reference": 1,
        "references_without_question": 1,
    }
    assert questions[1].reference.answer_eval == {"wikidata": 1.0, "range": [0.9, 1.1]}
    assert questions[2].reference is None


def test_a_file_that_is_not_utf8_is_one_line_naming_the_file_and_the_line(tmp_path):
    """Issue 14 item 6: a Latin-1 question file ended in a raw UnicodeDecodeError."""
    from qkvqa.data.questions import read_evqa_csv, read_infoseek_references
    from qkvqa.errors import DataError

    good = tmp_path / "test.csv"
    write_csv(good, [evqa_row(), evqa_row(question="Où niche-t-il ?")])
    latin = tmp_path / "latin.csv"
    latin.write_bytes(good.read_text(encoding="utf-8").encode("latin-1"))
    with pytest.raises(DataError, match=r"latin\.csv: line 3: not UTF-8 text.*iconv"):
        read_evqa_csv(latin)
    refs = tmp_path / "infoseek_val.jsonl"
    refs.write_bytes(
        b'{"data_id": "a", "answer_eval": ["x"], "data_split": "val_unseen_question"}\n'
        b'{"data_id": "b", "answer_eval": ["caf\xe9"], "data_split": "val_unseen_question"}\n'
    )
    with pytest.raises(DataError, match=r"infoseek_val\.jsonl: line 2: not UTF-8 text"):
        read_infoseek_references(refs)
