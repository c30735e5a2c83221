"""Issue 44 class 5: question text with HTML went raw into `qkvqa compare --format markdown` and `report.md`, where a
Markdown viewer renders it. Text from data is escaped there; the plain table and CSV keep it as it is."""

from __future__ import annotations

from qkvqa.compare.rows import RunRow
from qkvqa.compare.table import build_table, render_table
from qkvqa.utils.markdown import md_text

HTML = "What is <img src=x onerror=alert(1)> in the | picture?\nSecond line"


def _rows():
    return [
        RunRow("a", "finished", None, {"eval.question": HTML, "seed": 0}, {"acc": 1.0}, None, "", task="evaluate"),
        RunRow("b", "finished", None, {"eval.question": "plain", "seed": 1}, {"acc": 0.5}, None, "", task="evaluate"),
    ]


def test_compare_markdown_shows_html_as_text_and_keeps_the_table_whole():
    text = render_table(build_table(_rows(), "acc", "max", all_columns=True), "markdown")
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt;" in text
    assert "in the \\| picture? Second line" in text  # one row: the line break and the pipe do not split it
    csv_text = render_table(build_table(_rows(), "acc", "max", all_columns=True), "csv")
    assert "<img src=x onerror=alert(1)>" in csv_text  # CSV keeps the data as it is


def test_report_md_escapes_data_text(tmp_path):
    from types import SimpleNamespace

    from qkvqa.pipeline.report import _fmt, render_report
    from qkvqa.pipeline.scoring import score_run
    from tests.unit.test_evqa_release import _scored

    assert _fmt("<b>bold</b>") == "&lt;b&gt;bold&lt;/b&gt;" and md_text("a & b") == "a &amp; b"
    questions, predictions = _scored(tmp_path)
    scores = score_run("evqa", predictions, questions, {}, None, 20, "exclude")
    cfg = SimpleNamespace(
        experiment="<b>x</b>",
        eval=SimpleNamespace(split="test", filter="retrieval", context="cda"),
        cda=SimpleNamespace(mode="full", U=2, theta=0.5, chunk_tokens=60, K1=4, K2=2),
    )
    text = render_report("<script>x</script>", cfg, scores, None, [f"skipped question: {HTML}"])
    assert "<script>" not in text and "<img" not in text and "<b>" not in text
    assert "&lt;img src=x onerror=alert(1)&gt;" in text and "| all, gold article seen in training | 3 | 66.67 |" in text
