"""`compare` from local run records: one table schema, differing keys, deduped best steps, CSV/MD, plots."""
from __future__ import annotations

import csv
import io

import pytest

from qkvqa.cli.main import main
from qkvqa.compare.rows import collect_local, dedupe_steps
from qkvqa.compare.table import build_table, filter_rows, render_table
from qkvqa.config.load import compose
from qkvqa.errors import ConfigError
from qkvqa.run.record import RunRecord
from qkvqa.sweep.manifest import Manifest


def _run(root, run_id, alpha, losses, state="finished", seed=0, extra_summary=None):
    """A run record as a real job writes it; `losses` is [(step, value), ...] in logging order."""
    record = RunRecord(root / run_id)
    record.write_config(compose(None, [], [f"run_id={run_id}", f"qff.alpha={alpha}", f"seed={seed}"]))
    record.start(run_id, 1, "train")
    for step, value in losses:
        record.append_metrics({"val/loss": value}, step)
    record.update_summary({"val/loss": losses[-1][1], "global_step": losses[-1][0], "best_model_path": "/x.ckpt",
                           **(extra_summary or {})})
    record.finish(state)
    return root / run_id


@pytest.fixture
def runs(run_root):
    _run(run_root, "a", 0.1, [(0, 0.9), (1, 0.5), (2, 0.6)])
    # resumed from step 1: steps 1-2 logged twice, the later values count
    _run(run_root, "b", 0.5, [(0, 0.8), (1, 0.7), (2, 0.2), (1, 0.4), (2, 0.3)])
    _run(run_root, "c", 0.9, [(0, 0.95)], state="failed")
    return run_root


def test_table_schema_from_local_runs(runs):
    table = build_table(collect_local([runs]), metric="val/loss", goal="min")
    assert table.columns == ["run_id", "state", "experiment", "qff.alpha", "global_step", "val/loss",
                             "best_value", "best_step", "runtime_s"]
    assert [r["run_id"] for r in table.records] == ["b", "a", "c"]
    b = table.records[0]
    assert b["best_value"] == pytest.approx(0.3) and b["best_step"] == 2      # the re-logged 0.2 was replaced
    assert table.records[1]["best_value"] == pytest.approx(0.5) and table.records[1]["best_step"] == 1
    assert [r["state"] for r in table.records] == ["finished", "finished", "failed"]
    assert b["qff.alpha"] == 0.5 and b["experiment"] == "base" and b["runtime_s"] >= 0
    assert "best_model_path" not in table.columns and "seed" not in table.columns     # paths; equal keys


def test_goal_max_reverses_the_order(runs):
    table = build_table(collect_local([runs]), metric="val/loss", goal="max")
    assert [(r["run_id"], r["best_value"]) for r in table.records] == [("c", 0.95), ("a", 0.9), ("b", 0.8)]


def test_dedupe_keeps_the_last_value_per_step():
    assert dedupe_steps([(0, 1.0), (1, 2.0), (1, 3.0), (0, 4.0)]) == [(0, 4.0), (1, 3.0)]


def test_summary_value_is_used_when_the_metric_has_no_history(run_root):
    _run(run_root, "e", 0.3, [(0, 1.0)], extra_summary={"eval/accuracy": 0.42})
    record = build_table(collect_local([run_root]), metric="eval/accuracy", goal="max").records[0]
    assert record["best_value"] == 0.42 and record["best_step"] is None


def test_sources_run_dir_sweep_dir_and_root_agree(runs, tmp_path):
    sweep_dir = tmp_path / "sweep"
    manifest = Manifest.create(sweep_dir, {"sweep": "s", "metric": {"name": "val/loss", "goal": "minimize"}})
    manifest.data["trials"] = {"t000": {"run_dir": str(runs / "a")}, "t001": {"run_dir": str(runs / "b")},
                               "t002": {"run_dir": str(runs / "never-started")}}
    manifest.save()
    assert [r.run_id for r in collect_local([sweep_dir])] == ["a", "b"]
    assert [r.run_id for r in collect_local([runs / "a", runs, runs / "b"])] == ["a", "b", "c"]
    with pytest.raises(ConfigError, match="not a run directory"):
        collect_local([tmp_path / "missing"])


def test_filters(runs):
    rows = collect_local([runs])
    assert [r.run_id for r in filter_rows(rows, ["qff.alpha=0.5"])] == ["b"]
    assert [r.run_id for r in filter_rows(rows, ["state=finished"])] == ["a", "b"]
    assert filter_rows(rows, ["state=finished", "qff.alpha=0.9"]) == []
    with pytest.raises(ConfigError, match="key=value"):
        filter_rows(rows, ["qff.alpha"])


def test_markdown_and_csv_rendering(runs):
    table = build_table(collect_local([runs]), metric="val/loss", goal="min")
    lines = render_table(table, "md").splitlines()
    assert lines[0].startswith("| run_id | state | experiment | qff.alpha |") and "best val/loss (min)" in lines[0]
    assert lines[1] == "|" + "---|" * len(table.columns) and len(lines) == 5
    rows = list(csv.DictReader(io.StringIO(render_table(table, "csv"))))
    assert [r["run_id"] for r in rows] == ["b", "a", "c"] and float(rows[0]["best_value"]) == 0.3


def test_cli_writes_table_and_alpha_plot(runs, tmp_path, capsys):
    out = tmp_path / "cmp" / "table.csv"
    assert main(["compare", str(runs), "--metric", "val/loss", "--goal", "min", "--out", str(out),
                 "--plot", "qff.alpha", "--filter", "state=finished"]) == 0
    rows = list(csv.DictReader(out.open()))
    assert [r["run_id"] for r in rows] == ["b", "a"]
    png = tmp_path / "cmp" / "val_loss_vs_qff.alpha.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    assert str(png) in capsys.readouterr().out


def test_cli_takes_metric_and_goal_from_a_sweep_dir(runs, tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    manifest = Manifest.create(sweep_dir, {"sweep": "s", "metric": {"name": "val/loss", "goal": "minimize"}})
    manifest.data["trials"] = {"t000": {"run_dir": str(runs / "a")}, "t001": {"run_dir": str(runs / "b")}}
    manifest.save()
    assert main(["compare", str(sweep_dir), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["run_id"], r["best_value"]) for r in rows] == [("b", "0.3"), ("a", "0.5")]


def test_plot_without_metric_is_an_error(runs, capsys):
    assert main(["compare", str(runs), "--plot", "qff.alpha"]) == 2
    assert "--plot needs --metric" in capsys.readouterr().err

