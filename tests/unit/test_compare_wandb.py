"""`compare` from the W&B public API, through a test double of `wandb.Api`: same schema as local runs."""

from __future__ import annotations

import csv
import io
import os

import pytest

from qkvqa.cli.main import main
from qkvqa.compare.rows import collect_local, collect_wandb
from qkvqa.compare.table import build_table
from qkvqa.config.load import compose, to_plain
from qkvqa.run.record import RunRecord


class FakeRun:
    """The attributes of `wandb.apis.public.Run` that compare uses; `history()` is sampled and must not be."""

    def __init__(self, run_id, state, config, summary, history, job_type="train"):
        self.id, self.state, self.config, self.summary, self._history = run_id, state, config, summary, history
        self.job_type = job_type

    def scan_history(self, keys=None, page_size=1000):
        return [{k: row[k] for k in keys} for row in self._history if all(k in row for k in keys)]

    def history(self, *args, **kwargs):
        raise AssertionError("sampled history() must never be used for comparison numbers")


class FakeApi:
    """`wandb.Api()`: `runs(path, filters=...)` and nothing else."""

    def __init__(self, runs):
        self._runs = runs
        self.calls = []

    def runs(self, path, filters=None, order="+created_at", per_page=50):
        self.calls.append((path, filters))
        return list(self._runs)


# (run_id, state, alpha, [(global_step, loss)] in logging order: run b resumed and re-logged steps 1-2)
RUNS = [
    ("a", "finished", 0.1, [(0, 0.9), (1, 0.5), (2, 0.6)]),
    ("b", "finished", 0.5, [(0, 0.8), (1, 0.7), (2, 0.2), (1, 0.4), (2, 0.3)]),
    ("c", "failed", 0.9, [(0, 0.95)]),
]


def _config(run_id, alpha):
    return to_plain(compose(None, [], [f"run_id={run_id}", f"qff.alpha={alpha}"]))


def _fake_api():
    runs = []
    for run_id, state, alpha, losses in RUNS:
        history = [{"val/loss": v, "trainer/global_step": s, "_step": i} for i, (s, v) in enumerate(losses)]
        history.insert(1, {"lr": 0.1, "_step": 99})  # a row without the metric
        config = {**_config(run_id, alpha), "qff.alpha": alpha, "_wandb": {"cli_version": "0.31.0"}}
        summary = {
            "val/loss": losses[-1][1],
            "global_step": losses[-1][0],
            "_runtime": 12.5,
            "_step": 4,
            "_wandb": {"runtime": 12},
            "best_model_path": "/x.ckpt",
        }
        runs.append(FakeRun(run_id, state, config, summary, history))
    return FakeApi(runs)


def _local_runs(root):
    for run_id, state, alpha, losses in RUNS:
        record = RunRecord(root / run_id)
        record.write_config(compose(None, [], [f"run_id={run_id}", f"qff.alpha={alpha}"]))
        record.start(run_id, 1, "train")
        for step, value in losses:
            record.append_metrics({"val/loss": value}, step)
        record.update_summary({"val/loss": losses[-1][1], "global_step": losses[-1][0], "best_model_path": "/x.ckpt"})
        record.finish(state)
    return root


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_wandb_rows_give_the_same_table_as_local_records(run_root):
    api = _fake_api()
    remote = build_table(collect_wandb("me/qkvqa", api=api, filters={"group": "g"}), "val/loss", "min")
    local = build_table(collect_local([_local_runs(run_root)]), "val/loss", "min")
    assert api.calls == [("me/qkvqa", {"group": "g"})]
    assert remote.columns == local.columns

    def strip(records):
        return [{k: v for k, v in r.items() if k != "runtime_s"} for r in records]

    assert strip(remote.records) == strip(local.records)
    assert [r["run_id"] for r in remote.records] == ["b", "a", "c"]
    assert remote.records[0]["best_value"] == pytest.approx(0.3) and remote.records[0]["best_step"] == 2
    full = build_table(collect_wandb("me/qkvqa", api=api), "val/loss", "min", all_columns=True)
    assert {r["runtime_s"] for r in full.records} == {12.5} and {r["task"] for r in remote.records} == {"train"}


def test_step_falls_back_to_wandb_step_without_lightning_step():
    run = FakeRun(
        "x",
        "finished",
        {"experiment": "base"},
        {"acc": 0.4},
        [{"acc": 0.1, "_step": 0}, {"acc": 0.7, "_step": 1}, {"acc": 0.4, "_step": 2}],
    )
    row = collect_wandb("me/p", api=FakeApi([run]))[0]
    assert row.best("acc", "max") == (0.7, 1) and row.experiment == "base"


@pytest.mark.slow  # seconds: `make test` runs it, `make test-fast` does not
def test_cli_reads_a_wandb_project(monkeypatch, capsys):
    import wandb

    api = _fake_api()
    monkeypatch.setattr(wandb, "Api", lambda: api)
    assert (
        main(
            [
                "compare",
                "--wandb",
                "me/qkvqa",
                "--metric",
                "val/loss",
                "--goal",
                "min",
                "--format",
                "csv",
                "--filter",
                "state=finished",
            ]
        )
        == 0
    )
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [(r["run_id"], float(r["best_value"])) for r in rows] == [("b", 0.3), ("a", 0.5)]


@pytest.mark.online
@pytest.mark.skipif(
    not os.environ.get("QKVQA_WANDB_TEST_PROJECT"),
    reason="set QKVQA_WANDB_TEST_PROJECT=entity/project (and log in) to read a real W&B project",
)
def test_real_wandb_project_builds_a_table():
    rows = collect_wandb(os.environ["QKVQA_WANDB_TEST_PROJECT"])
    table = build_table(rows, "train/loss", "min")
    assert table.columns[:3] == ["run_id", "task", "state"] and len(table.records) == len(rows)


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_compare_wandb_without_a_login_is_one_line_naming_the_fix(tmp_path, monkeypatch, capsys):
    """Issue 14 item 7: a 30-line wandb traceback became one line (no API key: refused before any network call)."""
    from qkvqa.cli.main import main

    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc, no saved key
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb_config"))
    assert main(["compare", str(tmp_path), "--wandb", "someone/project"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "wandb login" in err[0] and "qkvqa compare checkpoints" in err[0]
