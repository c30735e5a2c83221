"""`qkvqa score infoseek|evqa`: JSON on stdout, a table on stderr, coverage, --strict, the judge choice."""

from __future__ import annotations

import csv
import json

import pytest

from qkvqa.cli.main import main

EVQA_COLUMNS = [
    "question",
    "answer",
    "dataset_image_ids",
    "dataset_name",
    "question_type",
    "wikipedia_url",
    "wikipedia_title",
    "evidence",
    "evidence_section_id",
    "evidence_section_title",
]
EVQA_ROWS = [  # (question, answer, question_type)
    ("what colour is the flower", "red&&blue", "multi_answer"),
    ("where is mont blanc", "France|Italy", "2_hop"),
    ("how tall is the tree", "1.5", "templated"),
    ("what family is the bird", "Corvidae", "automatic"),
]


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return str(path)


def _evqa_csv(path):
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, EVQA_COLUMNS)
        writer.writeheader()
        for i, (question, answer, question_type) in enumerate(EVQA_ROWS):
            url = (
                "https://en.wikipedia.org/wiki/A|https://en.wikipedia.org/wiki/B"
                if question_type == "2_hop"
                else f"https://en.wikipedia.org/wiki/Q{i}"
            )
            writer.writerow(
                {
                    "question": question,
                    "answer": answer,
                    "dataset_image_ids": f"img{i}|img{i}b",
                    "dataset_name": "inaturalist",
                    "question_type": question_type,
                    "wikipedia_url": url,
                    "wikipedia_title": "T",
                    "evidence": "e",
                    # a 2_hop row holds one section id and title per hop (encyclopedic_vqa/README.md)
                    "evidence_section_id": "0|0" if question_type == "2_hop" else "0",
                    "evidence_section_title": "Intro|Intro" if question_type == "2_hop" else "Intro",
                }
            )
    return str(path)


@pytest.fixture
def infoseek_files(tmp_path):
    refs = [
        {"data_id": "a", "answer_eval": ["Paris"], "data_split": "val_unseen_question"},
        {"data_id": "b", "answer_eval": [{"wikidata": 5, "range": [4.5, 5.5]}], "data_split": "val_unseen_entity"},
        {"data_id": "c", "answer_eval": ["1998"], "data_split": "val_unseen_entity"},
    ]
    qtypes = [
        {"data_id": "a", "question_type": "String"},
        {"data_id": "b", "question_type": "Numerical"},
        {"data_id": "c", "question_type": "Time"},
    ]
    preds = [
        {"data_id": "a", "prediction": "paris"},
        {"data_id": "b", "prediction": "about 5 metres"},
        {"data_id": "c", "prediction": "1997"},
    ]
    return {
        "--predictions": _jsonl(tmp_path / "p.jsonl", preds),
        "--references": _jsonl(tmp_path / "r.jsonl", refs),
        "--qtypes": _jsonl(tmp_path / "q.jsonl", qtypes),
    }


def _argv(command, files, *extra):
    return ["score", command] + [item for pair in files.items() for item in pair] + list(extra)


def test_score_infoseek_prints_json_and_a_table(infoseek_files, capsys, tmp_path):
    per_question = tmp_path / "details.jsonl"
    assert main(_argv("infoseek", infoseek_files, "--per-question", str(per_question))) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["unseen_question_score"]["score"] == 100.0
    assert result["unseen_entity_score"] == {"score": 50.0, "score_time": 0.0, "score_num": 100.0, "score_string": 0}
    assert result["final_score"] == 66.67
    assert "| **overall (HM)** | 66.67 |" in err and "coverage: 3 predictions for 3 questions; complete" in err
    rows = [json.loads(line) for line in per_question.read_text().splitlines()]
    assert [(r["data_id"], r["correct"]) for r in rows] == [("a", 1), ("b", 1), ("c", 0)]


def test_score_infoseek_strict_fails_with_one_line(infoseek_files, tmp_path, capsys):
    infoseek_files["--predictions"] = _jsonl(tmp_path / "p2.jsonl", [{"data_id": "a", "prediction": "paris"}])
    assert main(_argv("infoseek", infoseek_files)) == 0
    assert json.loads(capsys.readouterr().out)["coverage"]["n_missing"] == 2
    assert main(_argv("infoseek", infoseek_files, "--strict")) == 2
    err = capsys.readouterr().err
    assert "qkvqa score: error: InfoSeek: predictions do not cover" in err and "2 missing id(s) (b, c)" in err


def test_score_evqa_em_only(tmp_path, capsys):
    preds = [
        {"data_id": "E-VQA_0", "prediction": "blue"},
        {"data_id": "E-VQA_1", "prediction": "15"},
        {"data_id": "E-VQA_2", "prediction": "Corvids"},
    ]
    files = {"--predictions": _jsonl(tmp_path / "p.jsonl", preds), "--questions": _evqa_csv(tmp_path / "test.csv")}
    assert main(_argv("evqa", files, "--em-only", "--single-hop-only", "--strict")) == 0
    out, err = capsys.readouterr()
    result = json.loads(out)
    assert result["label"] == "EM only"
    assert result["single_hop"]["n"] == 3 and result["single_hop"]["correct"] == 2.0
    assert result["two_hop"]["accuracy"] is None
    assert "E-VQA accuracy, EM only" in err and "| single_hop | 3 | 2 | 66.67 |" in err


def test_score_evqa_two_hop_and_tiny_bem(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("QKVQA_TINY_DIR", str(tmp_path / "tiny"))
    preds = [
        {"data_id": "E-VQA_0", "prediction": "blue"},
        {"data_id": "E-VQA_1", "prediction": "15"},
        {"data_id": "E-VQA_2", "prediction": "a crow"},
        {"data_id": "E-VQA_2hop_0", "prediction": "italy"},
    ]
    files = {"--predictions": _jsonl(tmp_path / "p.jsonl", preds), "--questions": _evqa_csv(tmp_path / "test.csv")}
    assert main(_argv("evqa", files, "--bem-tiny", "--device", "cpu", "--strict")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["label"] == "BEM (PyTorch reproduction)"
    assert result["all"]["n"] == 4 and result["two_hop"]["correct"] == 1.0
    assert result["single_hop"]["correct"] in (2.0, 3.0)  # EM passes 2; the random tiny BEM judges "a crow"


def test_score_evqa_requires_a_judge_choice(tmp_path, capsys):
    files = {"--predictions": _jsonl(tmp_path / "p.jsonl", []), "--questions": _evqa_csv(tmp_path / "test.csv")}
    with pytest.raises(SystemExit) as exit_info:
        main(_argv("evqa", files))
    assert exit_info.value.code == 2
    assert "one of the arguments --bem --bem-tiny --em-only is required" in capsys.readouterr().err


def test_a_skipped_question_is_wrong_in_both_scorers(infoseek_files, tmp_path, capsys):
    """A row qkvqa could not answer scores 0, even where the official rule would accept its empty answer
    (InfoSeek reads "" as the number 0, inside a range around 0)."""
    refs = [
        {"data_id": "z", "answer_eval": [{"wikidata": 0, "range": [-1, 1]}], "data_split": "val_unseen_entity"},
        {"data_id": "a", "answer_eval": ["Paris"], "data_split": "val_unseen_question"},
    ]
    qtypes = [{"data_id": "z", "question_type": "Numerical"}, {"data_id": "a", "question_type": "String"}]
    files = {
        "--predictions": _jsonl(
            tmp_path / "p0.jsonl", [{"data_id": "z", "prediction": ""}, {"data_id": "a", "prediction": "paris"}]
        ),
        "--references": _jsonl(tmp_path / "r0.jsonl", refs),
        "--qtypes": _jsonl(tmp_path / "q0.jsonl", qtypes),
    }
    assert main(_argv("infoseek", files, "--strict")) == 0
    assert json.loads(capsys.readouterr().out)["unseen_entity_score"]["score_num"] == 100.0  # the official rule
    files["--predictions"] = _jsonl(
        tmp_path / "p1.jsonl",
        [
            {"data_id": "z", "prediction": "", "skipped": "query image missing or unreadable"},
            {"data_id": "a", "prediction": "paris"},
        ],
    )
    assert main(_argv("infoseek", files, "--strict")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["unseen_entity_score"]["score_num"] == 0 and result["coverage"]["n_skipped"] == 1
    assert result["unseen_question_score"]["score"] == 100.0

    preds = [
        {"data_id": "E-VQA_0", "prediction": "blue"},
        {"data_id": "E-VQA_1", "prediction": "1.5", "skipped": "query image missing or unreadable"},
        {"data_id": "E-VQA_2", "prediction": "Corvidae"},
        {"data_id": "E-VQA_2hop_0", "prediction": "italy"},
    ]
    files = {"--predictions": _jsonl(tmp_path / "e.jsonl", preds), "--questions": _evqa_csv(tmp_path / "test.csv")}
    assert main(_argv("evqa", files, "--em-only", "--strict")) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["all"]["n"] == 4 and result["all"]["correct"] == 3.0 and result["coverage"]["n_skipped"] == 1
    assert result["single_hop"] == {"n": 3, "correct": 2.0, "accuracy": pytest.approx(200 / 3)}


def test_score_evqa_gives_seen_and_unseen_from_the_release_column(tmp_path, capsys):
    """`wikipedia_url_used_in_train` (encyclopedic_vqa/README.md) reaches `qkvqa score evqa`'s seen / unseen rows."""
    path = _evqa_csv(tmp_path / "test.csv")
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    for row, used in zip(rows, ["True", "False", "False", ""]):
        row["wikipedia_url_used_in_train"] = used
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, EVQA_COLUMNS + ["wikipedia_url_used_in_train"])
        writer.writeheader()
        writer.writerows(rows)
    preds = [
        {"data_id": "E-VQA_0", "prediction": "blue"},
        {"data_id": "E-VQA_1", "prediction": "1.5"},
        {"data_id": "E-VQA_2", "prediction": "moss"},
    ]
    files = {"--predictions": _jsonl(tmp_path / "p.jsonl", preds), "--questions": path}
    assert main(_argv("evqa", files, "--em-only", "--single-hop-only")) == 0
    seen_unseen = json.loads(capsys.readouterr().out)["seen_unseen"]
    assert seen_unseen["seen"]["n"] == 1 and seen_unseen["unseen"]["n"] == 1 and seen_unseen["n_unknown"] == 1
