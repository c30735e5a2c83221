"""The offline sweep runner: every trial a subprocess, N at a time, recorded in a resumable manifest."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

from qkvqa.errors import ConfigError
from qkvqa.run.record import RunRecord
from qkvqa.run.sweep_manifest import Manifest, RunnerLock, now
from qkvqa.sweep.command import render_args, render_command
from qkvqa.sweep.spec import SweepSpec
from qkvqa.utils.logging import get_logger
from qkvqa.utils.progress import progress

log = get_logger(__name__)
# A trial is one fresh run: nothing of the runner's own run identity or W&B sweep may reach it.
LEAKED_ENV = (
    "WANDB_RUN_ID",
    "WANDB_SWEEP_ID",
    "WANDB_RESUME",
    "WANDB_SWEEP_PARAM_PATH",
    "WANDB_SERVICE",
    "QKVQA_RUN_ID",
    "QKVQA_RUN_DIR",
)


@dataclass
class Trial:
    """One planned trial: its id, swept values and the run it becomes."""

    trial_id: str
    index: int
    params: dict[str, Any]
    run_id: str
    injected: dict[str, Any] = field(default_factory=dict)  # run_id, resume, checkpoints root, W&B group

    @property
    def overrides(self) -> list[str]:
        """The swept values as the `key=value` tokens the trial's command receives."""
        return render_args(self.params)["args_no_hyphens"]


@dataclass
class SweepResult:
    """What a local sweep did."""

    sweep_dir: Path
    manifest: Manifest
    launched: list[str]
    skipped: list[str]
    comparison: Optional[Path] = None

    def count(self, status: str) -> int:
        """How many trials are in `status` now."""
        return sum(t["status"] == status for t in self.manifest.trials.values())


def plan_trials(spec: SweepSpec, checkpoints_root: Path, count: Optional[int], seed: int) -> list[Trial]:
    """The trials of a sweep, in order, with the keys the runner injects into each."""
    trials = []
    root = str(Path(checkpoints_root).resolve())
    for i, params in enumerate(spec.trial_params(count, seed)):
        trial_id = f"t{i:03d}"
        run_id = f"{spec.name}-{trial_id}"
        injected = {"run_id": run_id, "resume": "auto", "paths.checkpoints_root": root}
        if "logger.wandb.group" not in params:
            injected["logger.wandb.group"] = spec.name
        trials.append(Trial(trial_id=trial_id, index=i, params=params, run_id=run_id, injected=injected))
    return trials


def trial_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a trial: the runner's (WANDB_MODE included) without leaked run identities."""
    env = {k: v for k, v in environ.items() if k not in LEAKED_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def trial_argv(spec: SweepSpec, trial: Trial, interpreter: str, args_json_file: Optional[Path] = None) -> list[str]:
    """The command line of one trial (swept values first, then the injected keys)."""
    return render_command(
        spec.command,
        {**trial.params, **trial.injected},
        program=spec.program,
        interpreter=interpreter,
        args_json_file=str(args_json_file) if args_json_file else None,
    )


def _same_params(recorded: Any, planned: Mapping[str, Any]) -> bool:
    """Whether a manifest entry's values equal the planned ones (compared after a JSON round trip)."""
    return json.dumps(recorded, sort_keys=True) == json.dumps(json.loads(json.dumps(planned)), sort_keys=True)


# `compose(tokens)`: the config `qkvqa TOKENS` composes to in the current directory, as its handler composes it, None
# for a command that composes none; ConfigError when it does not parse or compose. The runner reads a trial's config
# with it to tell whether the trial's run is still the planned one. The command line's own parser knows that, so
# `qkvqa sweep` passes it in (`qkvqa.cli.sweep.compose_command`): the sweep sits below the command line.
Compose = Callable[[list[str]], Optional[Any]]


def _cli_tokens(argv: list[str]) -> Optional[list[str]]:
    """The tokens after `python -m qkvqa.cli` (or the `qkvqa` script) in a trial's argv, or None for another program."""
    for i, token in enumerate(argv):
        if token == "-m" and i + 1 < len(argv) and argv[i + 1] in ("qkvqa.cli", "qkvqa.cli.main"):
            return argv[i + 2 :]
        if Path(token).name == "qkvqa":
            return argv[i + 1 :]
    return None


def command_config(argv: list[str], cwd: Path, compose: Compose) -> Optional[Any]:
    """The config a `qkvqa train|evaluate|retrieve|... ...` trial command composes to when run in `cwd` (`compose`:
    as its handler composes it, shorthands included), or None for any other command. ConfigError when it does not
    compose."""
    tokens = _cli_tokens(argv)
    if not tokens:
        return None
    here = Path.cwd()
    os.chdir(cwd)  # experiments/ is found from the trial's working directory
    try:
        return compose(tokens)
    finally:
        os.chdir(here)


def trial_change(trial: Trial, entry: dict, argv: list[str], cwd: Path, compose: Compose) -> Optional[str]:
    """Why the run a manifest entry records is not the run `trial` now plans, or None when it is: the swept values
    changed, or, once its run wrote config.yaml, the config its command composes to now differs from the saved one
    in a key a resume refuses (an experiment file or the sweep's command edited). For a program other than a qkvqa
    command that composes a config the recorded command line is compared instead."""
    if not _same_params(entry["params"], trial.params):
        return f"was run with {entry['params']} but the sweep file now gives {trial.params}"
    saved = Path(entry["run_dir"]) / "config.yaml"
    if not saved.is_file():
        return None  # nothing ran under another config yet
    try:
        current = command_config(argv, cwd, compose)
    except ConfigError as e:
        return f"its command no longer composes a config ({e})"
    if current is None:
        if entry.get("argv") and entry["argv"] != argv:
            return f"its command changed since it ran: {shlex.join(entry['argv'])} -> {shlex.join(argv)}"
        return None
    from qkvqa.config.load import from_saved
    from qkvqa.run.resume import config_changes, immutable_changes

    changes = immutable_changes(config_changes(from_saved(saved), current))
    if not changes:
        return None
    shown = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in list(changes.items())[:6])
    more = f" and {len(changes) - 6} more" if len(changes) > 6 else ""
    return f"its config changed since it ran ({saved}): {shown}{more}"


def changed_trials(
    trials: list[Trial], manifest: Optional[Manifest], argv: Callable[[Trial], list[str]], cwd: Path, compose: Compose
) -> dict[str, str]:
    """{trial id: why} for the trials whose recorded run is not the one now planned (`trial_change`)."""
    out = {}
    for trial in trials:
        entry = manifest.trials.get(trial.trial_id) if manifest is not None else None
        why = trial_change(trial, entry, argv(trial), cwd, compose) if entry is not None else None
        if why:
            out[trial.trial_id] = why
    return out


def changed_trials_error(spec: SweepSpec, changed: dict[str, str]) -> ConfigError:
    """The refusal of a sweep whose trials already ran as other runs than the ones it now plans."""
    tid, why = next(iter(changed.items()))
    others = f" (and {len(changed) - 1} other trial(s): {', '.join(list(changed)[1:])})" if len(changed) > 1 else ""
    return ConfigError(
        f"sweep {spec.name}: trial {tid} {why}{others}; its results are not those of this sweep "
        f"file: give the changed sweep another name, or another --sweep-dir"
    )


def _open_manifest(
    spec: SweepSpec,
    sweep_dir: Path,
    trials: list[Trial],
    seed: int,
    root: Path,
    argv: Callable[[Trial], list[str]],
    cwd: Path,
    compose: Compose,
) -> Manifest:
    manifest = Manifest.load(sweep_dir)
    if manifest is None:
        manifest = Manifest.create(
            sweep_dir,
            {
                "sweep": spec.name,
                "sweep_file": str(spec.path) if spec.path else None,
                "method": spec.method,
                "metric": {"name": spec.metric, "goal": spec.goal},
                "seed": seed,
                "checkpoints_root": str(root.resolve()),
                "command": spec.command,
            },
        )
    changed = changed_trials(trials, manifest, argv, cwd, compose)
    if changed:
        raise changed_trials_error(spec, changed)
    for trial in trials:
        entry = manifest.trials.get(trial.trial_id)
        if entry is None:
            manifest.trials[trial.trial_id] = {
                "trial": trial.trial_id,
                "index": trial.index,
                "params": trial.params,
                "overrides": trial.overrides,
                "run_id": trial.run_id,
                "run_dir": str((root / trial.run_id).resolve()),
                "status": "pending",
                "returncode": None,
                "attempts": 0,
                "log": f"logs/{trial.trial_id}.log",
                "started_at": None,
                "finished_at": None,
                "run_state": None,
                "argv": None,
            }
    return manifest


def _should_run(entry: dict, retry_failed: bool) -> bool:
    """pending, interrupted and stale `running` trials run; failed ones only when retried."""
    return entry["status"] != "finished" and (entry["status"] != "failed" or retry_failed)


def gpu_pool(gpus: Optional[list[str]], per_trial: int, environ: Mapping[str, str] = os.environ) -> list[str]:
    """The devices trials share: `--gpus`, else CUDA_VISIBLE_DEVICES, else every GPU torch sees."""
    if per_trial < 0:
        raise ConfigError(f"--gpus-per-trial must be 0 or more, got {per_trial}")
    pool = list(gpus) if gpus else [g for g in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
    if not pool:
        import torch

        pool = [str(i) for i in range(torch.cuda.device_count())]
    if len(pool) < per_trial:
        raise ConfigError(
            f"--gpus-per-trial {per_trial} needs {per_trial} GPUs but {len(pool) or 'none'} "
            f"{'is' if len(pool) == 1 else 'are'} available ({','.join(pool) or 'no CUDA device'}); "
            f"give the devices with --gpus 0,1,... or lower --gpus-per-trial"
        )
    return [g.strip() for g in pool]


class _Running:
    """A launched trial: its process and open log file."""

    def __init__(self, trial: Trial, proc: subprocess.Popen, log_file: Any, started: float, gpus: list[str]):
        self.trial, self.proc, self.log_file, self.started, self.gpus = trial, proc, log_file, started, gpus


class LocalSweep:
    """Runs a sweep's trials as subprocesses and keeps `sweep_manifest.json` current."""

    def __init__(
        self,
        spec: SweepSpec,
        *,
        compose: Compose,
        checkpoints_root: str | os.PathLike = "checkpoints",
        sweep_dir: Optional[str | os.PathLike] = None,
        parallel: Optional[int] = 1,
        count: Optional[int] = None,
        seed: Optional[int] = None,
        retry_failed: bool = False,
        cwd: Optional[str | os.PathLike] = None,
        interpreter: str = sys.executable,
        poll_s: float = 0.2,
        gpus_per_trial: int = 0,
        gpus: Optional[list[str]] = None,
    ):
        # Each running trial holds `gpus_per_trial` devices of the pool (CUDA_VISIBLE_DEVICES), never another's;
        # without --parallel as many trials run as the pool has room for (1 without GPUs per trial).
        self.gpus_per_trial = gpus_per_trial
        self.free_gpus = gpu_pool(gpus, gpus_per_trial) if gpus_per_trial else []
        if parallel is None:
            parallel = len(self.free_gpus) // gpus_per_trial if gpus_per_trial else 1
        if parallel < 1:
            raise ConfigError(f"--parallel must be at least 1, got {parallel}")
        self.spec = spec
        self.root = Path(checkpoints_root)
        self.sweep_dir = Path(sweep_dir) if sweep_dir else self.root / "sweeps" / spec.name
        self.parallel = parallel
        previous = Manifest.load(self.sweep_dir)
        # A rerun reuses the recorded seed, so `qkvqa sweep FILE` twice continues the same random search.
        self.seed = seed if seed is not None else (previous.data.get("seed", 0) if previous else 0)
        self.trials = plan_trials(spec, self.root, count, self.seed)
        self.retry_failed = retry_failed
        self.cwd = Path(cwd) if cwd else Path.cwd()
        self.interpreter = interpreter
        self.poll_s = poll_s
        self.compose = compose

    def argv(self, trial: Trial) -> list[str]:
        """The command line of a trial."""
        return trial_argv(self.spec, trial, self.interpreter, self.sweep_dir / "logs" / f"{trial.trial_id}.args.json")

    def write_args_file(self, trial: Trial) -> None:
        """The trial's `${args_json_file}` (its swept values as JSON), when the command uses that macro."""
        if "${args_json_file}" in self.spec.command:
            path = self.sweep_dir / "logs" / f"{trial.trial_id}.args.json"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(render_args(trial.params)["args_json"][0])

    def changes(self, manifest: Optional[Manifest]) -> dict[str, str]:
        """{trial id: why} for the trials whose recorded run is not the one this sweep file now plans (`run`
        refuses the sweep then)."""
        return changed_trials(self.trials, manifest, self.argv, self.cwd, self.compose)

    def plan(self) -> list[tuple[Trial, str]]:
        """(trial, action) for every trial without running anything: run, skip (finished / failed), or changed
        (its run is not the one the sweep file now plans; `run` refuses the sweep)."""
        manifest = Manifest.load(self.sweep_dir)
        changed = self.changes(manifest)
        out = []
        for trial in self.trials:
            entry = manifest.trials.get(trial.trial_id) if manifest else None
            if trial.trial_id in changed:
                out.append((trial, f"changed ({entry['status']})"))
            elif entry is None or _should_run(entry, self.retry_failed):
                out.append((trial, "run"))
            else:
                out.append((trial, f"skip ({entry['status']})"))
        return out

    def run(self) -> SweepResult:
        """Run every trial that is not done yet, then write the comparison table."""
        if self.spec.controller_only_keys():
            log.warning(
                "sweep %s: %s need the W&B controller; the local runner runs every trial",
                self.spec.name,
                ", ".join(self.spec.controller_only_keys()),
            )
        with RunnerLock(self.sweep_dir):
            manifest = _open_manifest(
                self.spec, self.sweep_dir, self.trials, self.seed, self.root, self.argv, self.cwd, self.compose
            )
            manifest.save()
            todo = [t for t in self.trials if _should_run(manifest.trials[t.trial_id], self.retry_failed)]
            skipped = [t.trial_id for t in self.trials if t not in todo]
            if skipped:
                log.info(
                    "sweep %s: skipping %d trial(s) already done: %s",
                    self.spec.name,
                    len(skipped),
                    ", ".join(f"{tid} ({manifest.trials[tid]['status']})" for tid in skipped),
                )
            self._launch_all(manifest, todo)
            result = SweepResult(self.sweep_dir, manifest, [t.trial_id for t in todo], skipped)
            result.comparison = self.write_comparison(manifest)
            return result

    def _launch_all(self, manifest: Manifest, todo: list[Trial]) -> None:
        queue = list(todo)
        running: list[_Running] = []
        bar = progress(total=len(todo), desc=f"sweep {self.spec.name}", unit="trial")
        try:
            while queue or running:
                while queue and len(running) < self.parallel and len(self.free_gpus) >= self.gpus_per_trial:
                    running.append(self._start(manifest, queue.pop(0)))
                for item in [r for r in running if r.proc.poll() is not None]:
                    running.remove(item)
                    self._finish(manifest, item)
                    bar.update(1)
                    bar.set_postfix(
                        finished=sum(t["status"] == "finished" for t in manifest.trials.values()),
                        failed=sum(t["status"] == "failed" for t in manifest.trials.values()),
                    )
                time.sleep(self.poll_s if running else 0)
        except BaseException:
            for item in running:
                self._stop(manifest, item)
            raise
        finally:
            bar.close()

    def _start(self, manifest: Manifest, trial: Trial) -> _Running:
        entry = manifest.trials[trial.trial_id]
        argv = self.argv(trial)
        log_path = self.sweep_dir / entry["log"]
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self.write_args_file(trial)
        log_file = open(log_path, "a", encoding="utf-8")
        attempt = entry["attempts"] + 1
        log_file.write(f"=== {now()} attempt {attempt}: {shlex.join(argv)}\n")
        log_file.flush()
        env = trial_env(os.environ)
        gpus = [self.free_gpus.pop(0) for _ in range(self.gpus_per_trial)]
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        proc = subprocess.Popen(
            argv, cwd=self.cwd, env=env, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
        )
        manifest.update_trial(
            trial.trial_id,
            status="running",
            attempts=attempt,
            argv=argv,
            started_at=now(),
            finished_at=None,
            returncode=None,
            pid=proc.pid,
            gpus=gpus or None,
        )
        log.info(
            "trial %s started (pid %d%s): %s",
            trial.trial_id,
            proc.pid,
            f", GPUs {','.join(gpus)}" if gpus else "",
            " ".join(trial.overrides),
        )
        return _Running(trial, proc, log_file, time.monotonic(), gpus)

    def _finish(self, manifest: Manifest, item: _Running) -> None:
        item.log_file.close()
        self.free_gpus += item.gpus
        rc = item.proc.returncode
        from qkvqa.errors import EXIT_INTERRUPTED

        status = "finished" if rc == 0 else "interrupted" if rc == EXIT_INTERRUPTED else "failed"
        run_state = RunRecord(manifest.trials[item.trial.trial_id]["run_dir"]).status().get("state")
        manifest.update_trial(
            item.trial.trial_id,
            status=status,
            returncode=rc,
            finished_at=now(),
            run_state=run_state,
            duration_s=round(time.monotonic() - item.started, 3),
            pid=None,
        )
        level = log.info if status == "finished" else log.warning
        level(
            "trial %s %s (return code %d) in %.1fs%s",
            item.trial.trial_id,
            status,
            rc,
            time.monotonic() - item.started,
            "" if status == "finished" else f"; log: {self.sweep_dir / manifest.trials[item.trial.trial_id]['log']}",
        )

    def _stop(self, manifest: Manifest, item: _Running) -> None:
        """Terminate a trial when the runner itself is stopped; the rerun continues it (resume=auto)."""
        item.proc.terminate()
        try:
            item.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            item.proc.kill()
            item.proc.wait()
        item.log_file.close()
        manifest.update_trial(
            item.trial.trial_id, status="interrupted", returncode=item.proc.returncode, finished_at=now(), pid=None
        )

    def write_comparison(self, manifest: Manifest) -> Path:
        """comparison.csv and comparison.md of the finished trials, sorted by the sweep's metric goal."""
        from qkvqa.compare.rows import collect_local
        from qkvqa.compare.table import build_table, write_table

        run_dirs = [
            Path(t["run_dir"])
            for t in manifest.trials.values()
            if t["status"] == "finished" and Path(t["run_dir"]).is_dir()
        ]
        table = build_table(collect_local(run_dirs), self.spec.metric, self.spec.goal)
        write_table(table, "csv", self.sweep_dir / "comparison.csv")
        write_table(table, "md", self.sweep_dir / "comparison.md")
        from qkvqa.loggers.wandb import log_sweep_run

        counts = {
            s: sum(t["status"] == s for t in manifest.trials.values())
            for s in ("finished", "failed", "interrupted", "pending")
        }
        try:  # where the trials log to W&B (None: not a qkvqa command)
            trial_cfg = command_config(self.argv(self.trials[0]), self.cwd, self.compose) if self.trials else None
        except ConfigError:
            trial_cfg = None
        log_sweep_run(self.spec, self.sweep_dir, table, counts, trial_cfg)
        return self.sweep_dir / "comparison.csv"
