"""Run an offline grid sweep of `qkvqa` commands from a test, each trial its own process (`qkvqa sweep`)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import yaml

from qkvqa.cli.main import main
from qkvqa.run.sweep_manifest import Manifest


def grid_sweep(
    tmp_path: Path, name: str, metric: str, key: str, values: list, args: Sequence[str]
) -> tuple[Path, dict]:
    """Sweep `key` over `values`, each trial `python -m qkvqa.cli ARGS KEY=VALUE` in the working folder; returns the
    checkpoints root of the trials' runs (`NAME-TRIAL`) and the manifest's trials, after asserting the sweep ran."""
    sweep = {
        "name": name,
        "program": "qkvqa.cli",
        "method": "grid",
        "metric": {"name": metric, "goal": "maximize"},
        "parameters": {key: {"values": values}},
        "command": ["${env}", "${interpreter}", "-m", "qkvqa.cli", *args, "${args_no_hyphens}"],
    }
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(sweep, sort_keys=False))
    root = tmp_path / "runs"
    assert main(["sweep", str(path), "--checkpoints-root", str(root)]) == 0
    trials = Manifest.load(root / "sweeps" / name).trials
    assert sorted(t["params"][key] for t in trials.values()) == sorted(values)
    assert all(t["status"] == "finished" for t in trials.values()), trials
    return root, trials
