"""Issue 44 class 1: the installed qkvqa (version and source digest) is in the run record, and a resume under another
qkvqa is said and recorded (`git_commit` is null outside a checkout, so it was not seen)."""

from __future__ import annotations

import json
import logging

from qkvqa.run.record import RunRecord, qkvqa_version


def test_each_attempt_records_the_installed_qkvqa_and_a_resume_under_another_is_said(tmp_path, caplog):
    record = RunRecord(tmp_path / "run")
    record.start("run", 1, "train")
    status = json.loads(record.status_path.read_text())
    installed = qkvqa_version()
    assert installed["version"] and len(installed["source_sha256"]) == 16
    assert status["qkvqa"] == installed and status["attempts"][0]["qkvqa"] == installed
    record.finish("interrupted")
    status["qkvqa"] = {"version": "0.0.9", "source_sha256": "0123456789abcdef"}  # an earlier attempt's qkvqa
    record.status_path.write_text(json.dumps(status))
    with caplog.at_level(logging.WARNING):
        record.start("run", 1, "train")
    assert "run run was run so far by qkvqa 0.0.9" in caplog.text
    status = json.loads(record.status_path.read_text())
    assert status["qkvqa_changes"][0]["from"]["version"] == "0.0.9" and status["qkvqa_changes"][0]["to"] == installed
    assert status["qkvqa"] == installed
