"""Inside a SLURM array task: replace this process with the sweep trial whose index is SLURM_ARRAY_TASK_ID."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from qkvqa.run.sweep_manifest import Manifest, now
from qkvqa.sweep.local import trial_env


def trial_command(sweep_dir: Path, index: int) -> tuple[str, list[str]]:
    """(trial id, argv) of the trial with this array index, as the runner recorded it before submitting."""
    manifest = Manifest.load(sweep_dir)
    if manifest is None:
        raise SystemExit(f"{sweep_dir}: no sweep_manifest.json; submit the sweep with `qkvqa sweep --backend slurm`")
    for trial_id, entry in manifest.trials.items():
        if entry["index"] == index and entry.get("argv"):
            return trial_id, list(entry["argv"])
    raise SystemExit(
        f"{manifest.path}: no submitted trial has index {index}; the array and the manifest disagree "
        f"(was the sweep directory reused by another sweep?)"
    )


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or "SLURM_ARRAY_TASK_ID" not in os.environ:
        raise SystemExit("usage: srun python -m qkvqa.sweep.array_task SWEEP_DIR  (inside a SLURM array task)")
    trial_id, command = trial_command(Path(args[0]), int(os.environ["SLURM_ARRAY_TASK_ID"]))
    if os.environ.get("SLURM_PROCID", "0") == "0":
        print(
            f"=== {now()} trial {trial_id}, array task {os.environ.get('SLURM_ARRAY_JOB_ID')}_"
            f"{os.environ['SLURM_ARRAY_TASK_ID']}, job name {os.environ.get('SLURM_JOB_NAME', '')}, "
            f"restart {os.environ.get('SLURM_RESTART_COUNT', '0')}: "
            f"{shlex.join(command)}",
            flush=True,
        )
    os.execvpe(command[0], command, trial_env(os.environ))


if __name__ == "__main__":
    main()
