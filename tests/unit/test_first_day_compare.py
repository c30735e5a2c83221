"""Issue 34 item 3: `qkvqa compare` output that fits a terminal and compares what applies, from real run records."""

from __future__ import annotations

import csv
import io
import json
import os

import pytest

from qkvqa.cli.main import main
from qkvqa.compare.rows import collect_local
from qkvqa.compare.table import build_table, filter_rows
from tests.unit.test_compare_local import _job


@pytest.fixture
def evaluations(run_root, tmp_path):
    """Two training runs (lr 1e-5 and 2e-5) with a qff/, three evaluations (two of those QFFs, one retrieval-only),
    the same world given as a relative and as an absolute path, and an auto-named embed run."""
    world = tmp_path / "world"
    world.mkdir()
    for run_id, lr in (("train-a", "1e-5"), ("train-b", "2e-5")):
        _job(run_root, run_id, "train", [f"qff.lr={lr}"], {"val/article_r1": 40.0, "global_step": 6})
        (run_root / run_id / "qff").mkdir()
    here = os.getcwd()
    os.chdir(tmp_path)  # eval-b names the world relative to where it was run
    try:
        for run_id, overrides, acc in (
            (
                "eval-a",
                ["qff.checkpoint=" + str(run_root / "train-a" / "qff"), "qff.focus=per_layer", f"data.root={world}"],
                30.123456,
            ),
            (
                "eval-b",
                ["qff.checkpoint=" + str(run_root / "train-b" / "qff"), "qff.focus=none", "data.root=world"],
                35.5,
            ),
            ("eval-retrieval", ["eval.filter=retrieval", "qff.focus=input", f"data.root={world}"], 20.0),
        ):
            _job(
                run_root,
                run_id,
                "evaluate",
                overrides,
                {"eval/accuracy": acc, "eval/recall@1_after_filter": 50.0, "eval/section_r1": 12.345678},
            )
        _job(run_root, "20261203-101010-demo-evaluate-ab12", "embed", [], {"embed/kb_text/rows": 36})
    finally:
        os.chdir(here)
    return run_root


@pytest.mark.slow
def test_the_default_table_fits_the_terminal(evaluations, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    monkeypatch.chdir(evaluations.parent)
    assert main(["compare", str(evaluations)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out and max(len(line) for line in out) <= 80, out
    assert any(line.startswith("eval-a") for line in out)
    monkeypatch.setenv("COLUMNS", "60")
    assert main(["compare", str(evaluations), "--all"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in out) <= 60 and "--format markdown|csv|json" in " ".join(out[-3:]), out


@pytest.mark.slow
def test_markdown_csv_and_json_hold_every_column(evaluations, capsys):
    assert main(["compare", str(evaluations), "--task", "evaluate", "--format", "json"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert {r["run_id"] for r in records} == {"eval-a", "eval-b", "eval-retrieval"}
    assert {r["eval/accuracy"] for r in records} == {30.123456, 35.5, 20.0}  # every digit
    assert main(["compare", str(evaluations), "--task", "evaluate", "--format", "markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| run_id |") and len(lines) == 5
    assert main(["compare", str(evaluations), "--task", "evaluate", "--format", "csv"]) == 0
    assert len(list(csv.DictReader(io.StringIO(capsys.readouterr().out)))) == 3


@pytest.mark.slow
def test_floats_show_four_significant_figures(evaluations, capsys):
    assert main(["compare", str(evaluations), "--task", "evaluate", "--format", "markdown"]) == 0
    out = capsys.readouterr().out
    assert "30.12" in out and "12.35" in out and "30.123456" not in out and "12.345678" not in out


@pytest.mark.slow
def test_paths_compare_resolved_keys_that_do_not_apply_are_empty_and_evaluations_show_their_training(evaluations):
    table = build_table(filter_rows(collect_local([evaluations]), [], task="evaluate"), metrics=["eval/accuracy"])
    rows = table.records
    assert "data.root" not in table.columns  # ./world and /abs/world are one world
    assert "qff.focus" in table.columns
    by_id = {r["run_id"]: r for r in rows}
    assert by_id["eval-retrieval"]["qff.focus"] is None  # no QFF ran: not "input"
    assert by_id["eval-a"]["qff.focus"] == "per_layer"
    assert "trained.qff.lr" in table.columns  # the lr that made each evaluated QFF
    assert by_id["eval-a"]["trained.qff.lr"] == 1e-5 and by_id["eval-b"]["trained.qff.lr"] == 2e-5
    assert by_id["eval-retrieval"]["trained.qff.lr"] is None


@pytest.mark.slow
def test_auto_named_embed_and_index_runs_are_out_of_the_default_view(evaluations, capsys):
    assert main(["compare", str(evaluations), "--format", "csv"]) == 0
    captured = capsys.readouterr()
    ids = [r["run_id"] for r in csv.DictReader(io.StringIO(captured.out))]
    assert "20261203-101010-demo-evaluate-ab12" not in ids and "eval-a" in ids
    assert "1 auto-named embed run(s) not shown" in captured.err
    assert main(["compare", str(evaluations), "--task", "embed", "--format", "csv"]) == 0
    assert "20261203-101010-demo-evaluate-ab12" in capsys.readouterr().out
