"""`compare` from local run records: one table schema, differing keys, deduped best steps, CSV/MD, plots."""

from __future__ import annotations

import csv
import io

import pytest

from qkvqa.cli.main import main
from qkvqa.compare.rows import RunRow, collect_local, dedupe_steps
from qkvqa.compare.table import build_table, filter_rows, render_table
from qkvqa.config.load import compose
from qkvqa.errors import ConfigError
from qkvqa.run.record import RunRecord
from qkvqa.run.sweep_manifest import Manifest


def _run(root, run_id, alpha, losses, state="finished", seed=0, extra_summary=None):
    """A run record as a real job writes it; `losses` is [(step, value), ...] in logging order."""
    record = RunRecord(root / run_id)
    record.write_config(compose(None, [], [f"run_id={run_id}", f"qff.alpha={alpha}", f"seed={seed}"]))
    record.start(run_id, 1, "train")
    for step, value in losses:
        record.append_metrics({"val/loss": value}, step)
    record.update_summary(
        {"val/loss": losses[-1][1], "global_step": losses[-1][0], "best_model_path": "/x.ckpt", **(extra_summary or {})}
    )
    record.finish(state)
    return root / run_id


@pytest.fixture
def runs(run_root):
    _run(run_root, "a", 0.1, [(0, 0.9), (1, 0.5), (2, 0.6)])
    # resumed from step 1: steps 1-2 logged twice, the later values count
    _run(run_root, "b", 0.5, [(0, 0.8), (1, 0.7), (2, 0.2), (1, 0.4), (2, 0.3)])
    _run(run_root, "c", 0.9, [(0, 0.95)], state="failed")
    return run_root


@pytest.mark.slow
def test_table_schema_from_local_runs(runs):
    table = build_table(collect_local([runs]), metric="val/loss", goal="min")
    assert table.columns == ["run_id", "task", "state", "qff.alpha", "val/loss", "best_value", "best_step"]
    full = build_table(collect_local([runs]), metric="val/loss", goal="min", all_columns=True)
    assert full.columns == [
        "run_id",
        "task",
        "state",
        "experiment",
        "qff.alpha",
        "global_step",
        "val/loss",
        "best_value",
        "best_step",
        "runtime_s",
    ]
    assert full.records[0]["experiment"] == "base" and full.records[0]["runtime_s"] >= 0
    assert [r["run_id"] for r in table.records] == ["b", "a", "c"]
    b = table.records[0]
    assert b["best_value"] == pytest.approx(0.3) and b["best_step"] == 2  # the re-logged 0.2 was replaced
    assert table.records[1]["best_value"] == pytest.approx(0.5) and table.records[1]["best_step"] == 1
    assert [r["state"] for r in table.records] == ["finished", "finished", "failed"]
    assert b["qff.alpha"] == 0.5 and b["task"] == "train" and b["val/loss"] == 0.3  # the final value
    assert "best_model_path" not in table.columns and "seed" not in table.columns  # paths; equal keys


@pytest.mark.slow
def test_goal_max_reverses_the_order(runs):
    table = build_table(collect_local([runs]), metric="val/loss", goal="max")
    assert [(r["run_id"], r["best_value"]) for r in table.records] == [("c", 0.95), ("a", 0.9), ("b", 0.8)]


def test_dedupe_keeps_the_last_value_per_step():
    assert dedupe_steps([(0, 1.0), (1, 2.0), (1, 3.0), (0, 4.0)]) == [(0, 4.0), (1, 3.0)]


def test_summary_value_is_used_when_the_metric_has_no_history(run_root):
    _run(run_root, "e", 0.3, [(0, 1.0)], extra_summary={"eval/accuracy": 0.42})
    record = build_table(collect_local([run_root]), metric="eval/accuracy", goal="max").records[0]
    assert record["best_value"] == 0.42 and record["best_step"] is None


@pytest.mark.slow
def test_sources_run_dir_sweep_dir_and_root_agree(runs, tmp_path):
    sweep_dir = tmp_path / "sweep"
    manifest = Manifest.create(sweep_dir, {"sweep": "s", "metric": {"name": "val/loss", "goal": "minimize"}})
    manifest.data["trials"] = {
        "t000": {"run_dir": str(runs / "a")},
        "t001": {"run_dir": str(runs / "b")},
        "t002": {"run_dir": str(runs / "never-started")},
    }
    manifest.save()
    assert [r.run_id for r in collect_local([sweep_dir])] == ["a", "b"]
    assert [r.run_id for r in collect_local([runs / "a", runs, runs / "b"])] == ["a", "b", "c"]
    with pytest.raises(ConfigError, match="not a run directory"):
        collect_local([tmp_path / "missing"])


@pytest.mark.slow
def test_filters(runs):
    rows = collect_local([runs])
    assert [r.run_id for r in filter_rows(rows, ["qff.alpha=0.5"])] == ["b"]
    assert [r.run_id for r in filter_rows(rows, ["state=finished"])] == ["a", "b"]
    assert filter_rows(rows, ["state=finished", "qff.alpha=0.9"]) == []
    with pytest.raises(ConfigError, match="key=value"):
        filter_rows(rows, ["qff.alpha"])


@pytest.mark.slow
def test_markdown_and_csv_rendering(runs):
    table = build_table(collect_local([runs]), metric="val/loss", goal="min")
    lines = render_table(table, "md").splitlines()
    assert lines[0].startswith("| run_id | task | state | qff.alpha |") and "best val/loss (min)" in lines[0]
    assert lines[1] == "|" + "---|" * len(table.columns) and len(lines) == 5
    rows = list(csv.DictReader(io.StringIO(render_table(table, "csv"))))
    assert [r["run_id"] for r in rows] == ["b", "a", "c"] and float(rows[0]["best_value"]) == 0.3


@pytest.mark.slow
def test_cli_writes_table_and_alpha_plot(runs, tmp_path, capsys):
    out = tmp_path / "cmp" / "table.csv"
    assert (
        main(
            [
                "compare",
                str(runs),
                "--metric",
                "val/loss",
                "--goal",
                "min",
                "--out",
                str(out),
                "--plot",
                "qff.alpha",
                "--filter",
                "state=finished",
            ]
        )
        == 0
    )
    rows = list(csv.DictReader(out.open()))
    assert [r["run_id"] for r in rows] == ["b", "a"]
    png = tmp_path / "cmp" / "val_loss_vs_qff.alpha.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
    assert str(png) in capsys.readouterr().out


@pytest.mark.slow
def test_cli_takes_metric_and_goal_from_a_sweep_dir(runs, tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    manifest = Manifest.create(sweep_dir, {"sweep": "s", "metric": {"name": "val/loss", "goal": "minimize"}})
    manifest.data["trials"] = {"t000": {"run_dir": str(runs / "a")}, "t001": {"run_dir": str(runs / "b")}}
    manifest.save()
    assert main(["compare", str(sweep_dir), "--format", "csv"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["run_id"], r["best_value"]) for r in rows] == [("b", "0.3"), ("a", "0.5")]


@pytest.mark.slow
def test_plot_without_metric_is_an_error(runs, capsys):
    assert main(["compare", str(runs), "--plot", "qff.alpha"]) == 2
    assert "--plot needs --metric" in capsys.readouterr().err


def _job(root, run_id, command, overrides=(), summary=None, experiment=None):
    """The run record of a job of `command` with the config `experiment` + `overrides` composes to."""
    record = RunRecord(root / run_id)
    record.write_config(compose(experiment, [], [f"run_id={run_id}", f"paths.checkpoints_root={root}", *overrides]))
    record.start(run_id, 1, command)
    record.update_summary(summary or {})
    record.finish("finished")


@pytest.fixture
def mixed(run_root):
    """An embed and an index run beside two training runs and two evaluations of a real experiment config."""
    _job(run_root, "e1", "embed", ["retrieval.embed_what=kb_text"], {"embed/kb_text/rows": 36})
    _job(run_root, "i1", "index build", [], {"index/count": 36})
    for run_id, alpha, r1 in (("t1", 0.5, 40.0), ("t2", 0.9, 55.0)):
        _job(
            run_root,
            run_id,
            "train",
            [f"qff.alpha={alpha}", "notes=try", f"logger.wandb.group={run_id}"],
            {
                "val/article_r1": r1,
                "val/loss": 2.0,
                "train/loss": 1.5,
                "global_step": 6,
                "last_model_path": str(run_root / run_id / "last.ckpt"),
            },
            experiment="demo/qff_per_layer",
        )
    for run_id, alpha, acc in (("v1", 0.5, 30.0), ("v2", 0.9, 35.0)):
        _job(
            run_root,
            run_id,
            "evaluate",
            [f"qff.alpha={alpha}"],
            {"eval/accuracy": acc, "eval/recall@1_after_filter": 50.0, "eval/n_skipped": 2.0},
        )
    return run_root


@pytest.mark.slow
def test_the_default_table_is_readable(mixed):
    table = build_table(collect_local([mixed]))
    tasks = {r["run_id"]: r["task"] for r in table.records}
    assert tasks == {
        "e1": "embed",
        "i1": "index build",
        "t1": "train",
        "t2": "train",
        "v1": "evaluate",
        "v2": "evaluate",
    }
    assert table.columns[:3] == ["run_id", "task", "state"] and "experiment" in table.columns  # differs: a swept key
    assert not [c for c in table.columns if c.startswith(("paths.", "logger.")) or c in ("notes", "run_id.")]
    assert not [c for c in table.columns if "vocab_texts" in c] and len(table.columns) < 25
    assert {"val/article_r1", "eval/accuracy"} <= set(table.columns) and "last_model_path" not in table.columns
    train = build_table(filter_rows(collect_local([mixed]), [], task="train"))
    assert train.columns == ["run_id", "task", "state", "qff.alpha", "val/article_r1", "val/loss", "train/loss"]
    assert [r.run_id for r in filter_rows(collect_local([mixed]), ["qff.alpha=0.9"], task="evaluate")] == ["v2"]
    assert [r.run_id for r in filter_rows(collect_local([mixed]), [], task="index")] == ["i1"]


@pytest.mark.slow
def test_an_unknown_metric_is_an_error_naming_the_nearest(mixed, capsys):
    assert main(["compare", str(mixed), "--task", "train", "--metric", "val/article_r"]) == 2
    err = capsys.readouterr().err
    assert "--metric 'val/article_r': no compared run has it; did you mean val/article_r1" in err
    assert (
        main(
            [
                "compare",
                str(mixed),
                "--task",
                "evaluate",
                "--where",
                "qff.alpha=0.5",
                "--metric",
                "eval/accuracy",
                "--format",
                "csv",
            ]
        )
        == 0
    )
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["run_id"], r["task"], r["eval/accuracy"], r["best_value"]) for r in rows] == [
        ("v1", "evaluate", "30.0", "30.0")
    ]


@pytest.mark.slow
def test_runs_gives_a_dataframe_for_notebooks(mixed):
    from qkvqa.compare import runs

    df = runs(mixed, task="train", metric="val/article_r1")
    assert list(df.index) == ["t2", "t1"] and df.loc["t2", "val/article_r1"] == 55.0
    assert list(df.columns) == ["task", "state", "qff.alpha", "val/article_r1", "best_value", "best_step"]
    assert runs(mixed, all_columns=True).shape[0] == 6
    with pytest.raises(ConfigError, match="did you mean eval/accuracy"):
        runs(mixed, metric="eval/acuracy")


@pytest.mark.slow
def test_the_plot_shows_every_run_the_mean_sd_and_n_and_rates_from_zero(run_root):
    from qkvqa.compare.plot import group_stats, metric_figure

    for run_id, alpha, hits in (("p1", 0.5, [60.0, 62.0]), ("p2", 0.5, [70.0, 66.0]), ("p3", 0.9, [80.0, 81.0])):
        _run(run_root, run_id, alpha, [(0, 1.0)], extra_summary={"val/article_r1": hits[-1]})
        record = RunRecord(run_root / run_id)
        for step, value in enumerate(hits):
            record.append_metrics({"val/article_r1": value}, step + 1)
    rows = collect_local([run_root])
    fig = metric_figure(rows, "qff.alpha", "val/article_r1", "max", "best")
    ax = fig.axes[0]
    assert ax.get_ylim()[0] == 0 and ax.get_ylabel() == "val/article_r1 (%)"
    assert "best (max) over each run's history" in ax.get_title() and "3 runs" in ax.get_title()
    assert sorted(t.get_text() for t in ax.texts) == ["n=1", "n=2"]
    stats = group_stats([(0.5, 62.0), (0.5, 70.0), (0.9, 81.0)])
    assert stats[0.5][:2] == (2, 66.0) and stats[0.5][2] == pytest.approx(5.656854) and stats[0.9] == (1, 81.0, 0.0)
    last = metric_figure(rows, "qff.alpha", "val/article_r1", "max", "last").axes[0]
    assert "last value of each run" in last.get_title()
    loss = metric_figure(rows, "qff.alpha", "val/loss", "min", "best").axes[0]
    assert loss.get_ylabel() == "val/loss (axis not from 0)"


def test_a_where_key_no_run_has_is_an_error_naming_the_nearest(tmp_path):
    """`--where qff.alfa=0.9` once gave an empty table with exit 0."""
    rows = [
        RunRow(
            run_id="a",
            task="train",
            state="finished",
            experiment="e",
            config={"qff.alpha": 0.9},
            summary={},
            runtime_s=None,
            source="local",
        )
    ]
    with pytest.raises(ConfigError, match=r"--where qff\.alfa: no compared run has this key; did you mean qff\.alpha"):
        filter_rows(rows, ["qff.alfa=0.9"])
    assert filter_rows(rows, ["qff.alpha=0.5"]) == []  # a known key with no match is an empty table


def test_an_unfinished_run_s_partial_value_is_left_out_of_the_plot_and_said_so():
    from qkvqa.compare.plot import metric_figure, metric_points

    def row(run_id, state, value):
        return RunRow(
            run_id=run_id,
            task="evaluate",
            state=state,
            experiment="e",
            config={"qff.alpha": 0.5},
            summary={"eval/accuracy": value},
            runtime_s=None,
            source="local",
        )

    rows = [row("done", "finished", 50.0), row("cut", "failed", 90.0)]
    assert metric_points(rows, "qff.alpha", "eval/accuracy", "max") == [(0.5, 50.0)]
    assert "1 runs (1 unfinished left out)" in metric_figure(rows, "qff.alpha", "eval/accuracy").axes[0].get_title()


@pytest.mark.slow
def test_one_malformed_config_yaml_in_a_runs_root_is_counted_and_the_others_compared(runs, capsys):
    """Issue 44 class 3: one malformed config.yaml made the whole `qkvqa compare` fail."""
    (runs / "broken").mkdir()
    (runs / "broken" / "config.yaml").write_text("run_id: [unclosed\n  qff: {\n")
    (runs / "broken" / "status.json").write_text('{"state": "finished"}')
    skipped: list = []
    rows = collect_local([runs], skipped)
    assert sorted(r.run_id for r in rows) == ["a", "b", "c"]
    assert [path for path, _ in skipped] == [str((runs / "broken").resolve())] and "config.yaml" in skipped[0][1]
    assert main(["compare", str(runs), "--metric", "val/loss", "--goal", "min"]) == 0
    captured = capsys.readouterr()
    assert "1 run directory skipped, record unreadable" in captured.err and "broken" in captured.err
    assert "\nb " in captured.out and "\nc " in captured.out
