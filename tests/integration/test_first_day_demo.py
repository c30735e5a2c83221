"""Issue 34 item 4, the demo end to end: its answers come from its contexts (the extractive reader), and the report
states the reader and where the world is. (Whether focus none and per_layer flip a question needs the full demo's
world and training: at this test's 14 entities and one epoch their contexts may hold the same answers.)"""

from __future__ import annotations

import json

import pytest
import torch

from qkvqa.cli.main import main

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        root = tmp_path_factory.mktemp("demo34")
        args = ["demo", "--dir", str(root / "work"), "--runs", str(root / "runs"), "--entities", "14", "--epochs", "1"]
        args += ["--tiny-models", "--retriever-steps", "10"]
        assert main(args) == 0
        return root
    finally:
        torch.set_num_threads(threads)


def _traces(run_dir):
    return [json.loads(line) for line in (run_dir / "traces.jsonl").read_text(encoding="utf-8").splitlines()]


def test_the_demos_answers_come_from_its_contexts_and_the_report_says_so(demo):
    runs = demo / "runs"
    a, b = _traces(runs / "demo-eval-1"), _traces(runs / "demo-eval-2")  # QFF without focus, with focus
    answered = [t for t in a + b if t.get("context") and not t.get("skipped")]
    # every prediction is a span of its own context, never a heading: the reader read it
    assert answered and all(t["prediction"] in t["context"] and not t["prediction"].startswith("#") for t in answered)
    assert any(t["verdict"]["correct"] for t in answered)
    report = (runs / "demo" / "report.md").read_text(encoding="utf-8")
    assert "extractive reader" in report and str(demo / "work" / "world") in report and "right -> wrong" in report
