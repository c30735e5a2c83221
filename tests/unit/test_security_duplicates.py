"""Issue 31 item 5: question rows that repeat another row exactly are counted and warned, and refused with --strict
(E-VQA numbers rows by position, so a repeat would be scored as one more question)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from qkvqa.data.config import DataConfig
from qkvqa.data.questions import read_evqa_csv
from qkvqa.errors import DataError
from qkvqa.pipeline.evaluate import duplicate_rows, question_set


@pytest.fixture
def repeated_csv(world, tmp_path) -> Path:
    lines = (Path(world["dir"]) / "evqa" / "test.csv").read_text(encoding="utf-8").splitlines(keepends=True)
    path = tmp_path / "test.csv"
    path.write_text("".join(lines + [lines[1], lines[3]]), encoding="utf-8")
    return path


def test_exact_repeats_are_found_with_both_lines(repeated_csv, world):
    questions = read_evqa_csv(repeated_csv, split="test", include_two_hop=True)
    repeats = duplicate_rows(questions)
    n = len(questions) + 1  # the last CSV line (the header is line 1)
    assert [(a.rsplit(":", 1)[1], b.rsplit(":", 1)[1]) for a, b in repeats] == [(str(n - 1), "2"), (str(n), "4")]
    assert (
        duplicate_rows(read_evqa_csv(Path(world["dir"]) / "evqa" / "test.csv", split="test", include_two_hop=True))
        == []
    )


def test_repeats_are_counted_and_warned_and_refused_under_strict(repeated_csv, tmp_path, caplog):
    questions = read_evqa_csv(repeated_csv, split="test")
    data = DataConfig(root=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="qkvqa.pipeline.evaluate"):
        out = question_set("evqa", "test", questions, data, repeated_csv)
    assert out["duplicate_rows"] == 2 and out["n"] == len(questions)
    assert "2 question rows repeat another row exactly" in caplog.text
    with pytest.raises(DataError, match=r"test\.csv: 2 question rows repeat another row exactly .*--strict"):
        question_set("evqa", "test", questions, data, repeated_csv, strict=True)
