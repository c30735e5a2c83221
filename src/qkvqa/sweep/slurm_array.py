"""The SLURM sweep backend: a sweep's unfinished trials submitted with `sbatch` as one job array, one trial per task.

The runner plans the trials exactly as the local runner does (same run ids, `resume=auto`, W&B group), records each
trial's command in `sweep_manifest.json`, writes the array script under `<sweep dir>/slurm/` and submits it. Each
task runs `srun python -m qkvqa.sweep.array_task <sweep dir>`, which starts the trial of its array index. A rerun
first settles what happened to the tasks it submitted (still queued or running in `squeue`, else the trial's own run
record: finished, failed, or anything else = interrupted), then submits only the trials that are not done and not
queued. SLURM schedules; qkvqa only submits and reads back.
"""

from __future__ import annotations

import secrets
import shlex
import shutil
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

from qkvqa.errors import ConfigError, QkvqaError
from qkvqa.run.record import RunRecord
from qkvqa.run.sweep_manifest import Manifest, RunnerLock, now
from qkvqa.sweep.local import LocalSweep, SweepResult, Trial, _open_manifest, _should_run
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)
LIVE = ("queued", "running")  # manifest states of a trial whose array task SLURM still holds
SUBMITTING = "submitting"  # recorded before sbatch: the trial's submission token, its job id not yet known


def array_spec(indices: Sequence[int], parallel: Optional[int]) -> str:
    """`--array` value: the trial indices, `%N` when at most N may run at once."""
    return ",".join(str(i) for i in indices) + (f"%{parallel}" if parallel else "")


def render_array_script(
    name: str,
    sweep_dir: Path,
    indices: Sequence[int],
    *,
    cwd: Path,
    interpreter: str,
    parallel: Optional[int] = None,
    gpus_per_trial: int = 0,
) -> str:
    """The batch script of one submission: one trial per array task, launched with `srun` (so a trial with
    `--ntasks-per-node` > 1 in the sbatch arguments runs as DDP), requeueable, one log per task across attempts."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --array={array_spec(indices, parallel)}",
        f"#SBATCH --output={sweep_dir.resolve()}/logs/slurm-%A_%a.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
    ]
    if gpus_per_trial:
        lines.append(f"#SBATCH --gres=gpu:{gpus_per_trial}")
    lines += [
        "# written by `qkvqa sweep --backend slurm`: each task runs the trial whose index is SLURM_ARRAY_TASK_ID;",
        "# the trials' commands are in sweep_manifest.json next to this folder",
        f"cd {shlex.quote(str(cwd))}",
        "export PYTHONUNBUFFERED=1",
        f"srun {shlex.quote(interpreter)} -m qkvqa.sweep.array_task {shlex.quote(str(sweep_dir.resolve()))}",
        "",
    ]
    return "\n".join(lines)


def _slurm_command(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ConfigError(
            f"--backend slurm needs `{name}` on PATH: run the sweep on a SLURM login node (or use --backend local)"
        )
    return path


def live_tasks(job_ids: set[str], timeout_s: float = 60.0) -> dict[tuple[str, int], str]:
    """(array job id, task index) -> SLURM state (PENDING, RUNNING, ...) of every task `squeue` still lists."""
    if not job_ids:
        return {}
    done = subprocess.run(
        [_slurm_command("squeue"), "-h", "-r", "-o", "%F|%K|%T"], capture_output=True, text=True, timeout=timeout_s
    )
    if done.returncode != 0:
        raise QkvqaError(
            f"squeue failed ({done.stderr.strip()[:300]}); the sweep cannot tell which trials still run: "
            f"rerun when the controller answers"
        )
    live = {}
    for line in done.stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) == 3 and parts[0] in job_ids and parts[1].isdigit():
            live[(parts[0], int(parts[1]))] = parts[2]
    return live


SBATCH_TIMEOUT_S = 120.0  # an sbatch that has not answered by then may or may not have submitted: ask by the token


def job_named(token: str, timeout_s: float = 30.0) -> Optional[str]:
    """The id of the (array) job whose job name is `token`, as the controller (`squeue`, every state it still holds)
    or accounting (`sacct`) knows it, else None. A controller that does not answer raises: the caller must not
    guess that nothing was submitted."""
    done = subprocess.run(
        [_slurm_command("squeue"), "-h", "--states=all", f"--name={token}", "-o", "%F"],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise QkvqaError(
            f"squeue failed ({done.stderr.strip()[:300]}); the sweep cannot tell whether its submission "
            f"{token} reached SLURM: rerun when the controller answers"
        )
    ids = sorted({line.strip() for line in done.stdout.splitlines() if line.strip().isdigit()}, key=int)
    if not ids and shutil.which("sacct"):
        acct = subprocess.run(
            ["sacct", "-n", "-X", "-P", f"--name={token}", "-o", "JobID", "--starttime=now-30days"],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        if acct.returncode == 0:  # accounting off: an error, read as "not known there"
            ids = sorted(
                {
                    line.split("_")[0].strip()
                    for line in acct.stdout.splitlines()
                    if line.split("_")[0].strip().isdigit()
                },
                key=int,
            )
    if len(ids) > 1:
        log.warning("SLURM holds %d jobs named %s (%s); the sweep adopts the first", len(ids), token, ", ".join(ids))
    return ids[0] if ids else None


def settled_status(run_state: Optional[str], task_log_exists: bool) -> str:
    """The manifest status of a trial whose task SLURM no longer holds, from its run record's state. Without a run
    record the task was cancelled while pending (no task log: `pending`, submitted again) or started and died before
    the trial got going, e.g. a bad interpreter path (`failed`, with the task's log to read; not resubmitted for
    ever)."""
    if run_state is None:
        return "failed" if task_log_exists else "pending"
    return {"finished": "finished", "failed": "failed"}.get(run_state, "interrupted")


def _submittable(entry: Optional[dict], retry_failed: bool) -> bool:
    """A trial to submit: never planned, or not finished, not failed (unless retried) and not held by SLURM."""
    return entry is None or (_should_run(entry, retry_failed) and entry["status"] not in (*LIVE, SUBMITTING))


class SlurmSweep(LocalSweep):
    """Submits a sweep's unfinished trials as a SLURM job array and reads back what they did."""

    def __init__(
        self,
        spec,
        *,
        sbatch_args: Sequence[str] = (),
        gpus_per_trial: int = 0,
        parallel: Optional[int] = None,
        **kwargs,
    ):
        super().__init__(spec, parallel=1, **kwargs)
        self.parallel = parallel  # the array's throttle (%N); None: as many as SLURM grants
        self.sbatch_args = list(sbatch_args)
        self.gpus_per_trial = gpus_per_trial

    def _job_in_logs(self, token: str) -> Optional[str]:
        """The array job id a task log names for this token (the first line array_task prints), else None: what is
        left of a submission that ran and that neither the controller nor accounting remembers."""
        for path in sorted((self.sweep_dir / "logs").glob("slurm-*_*.out")):
            try:
                with open(path, errors="replace") as f:
                    head = f.read(4096)
            except OSError:
                continue
            if f"job name {token}," in head:
                return path.name[len("slurm-") :].split("_")[0]
        return None

    def settle_submissions(self, manifest: Manifest) -> None:
        """Resolve every submission recorded before sbatch whose job id the runner never wrote: adopt the array
        named by its token, or release its trials (back to their status before) when SLURM never got it."""
        for sub in manifest.data.get("submissions", []):
            if sub.get("job") or sub.get("outcome") or not sub.get("token"):
                continue
            job = job_named(sub["token"]) or self._job_in_logs(sub["token"])
            if job:
                self._adopt(manifest, sub, job)
                log.info(
                    "sweep %s: adopted SLURM array job %s (submission %s, whose runner stopped before it "
                    "recorded the job id)",
                    self.spec.name,
                    job,
                    sub["token"],
                )
                continue
            sub["outcome"] = "not submitted"
            for tid in sub["trials"]:
                entry = manifest.trials[tid]
                if entry.get("status") == SUBMITTING and entry.get("submission") == sub["token"]:
                    entry["status"] = entry.pop("status_before_submit", "pending")
            log.info(
                "sweep %s: submission %s never reached SLURM; its trials are submitted again",
                self.spec.name,
                sub["token"],
            )

    def _adopt(self, manifest: Manifest, sub: dict, job: str) -> None:
        """Record `job` as the array of submission `sub`: its trials queued (reconcile then reads their state)."""
        sub["job"] = job
        sub.setdefault("submitted_at", now())
        for tid in sub["trials"]:
            entry = manifest.trials[tid]
            if entry.get("submission") != sub["token"]:
                continue
            entry.pop("status_before_submit", None)
            entry.update(
                status="queued",
                backend="slurm",
                slurm_job=job,
                attempts=entry["attempts"] + 1,
                started_at=now(),
                finished_at=None,
                returncode=None,
                run_state=None,
                log=f"logs/slurm-{job}_{entry['index']}.out",
            )

    def reconcile(self, manifest: Manifest, save: bool = True) -> None:
        """Settle the trials this backend submitted: a submission without a job id first (by its token), then each
        task: live in squeue, else what the trial's run record says."""
        self.settle_submissions(manifest)
        submitted = {tid: e for tid, e in manifest.trials.items() if e.get("status") in LIVE and e.get("slurm_job")}
        live = live_tasks({e["slurm_job"] for e in submitted.values()})
        for tid, entry in submitted.items():
            state = live.get((entry["slurm_job"], entry["index"]))
            if state is not None:
                entry["status"] = "queued" if state == "PENDING" else "running"
                continue
            run_state = RunRecord(entry["run_dir"]).status().get("state")
            status = settled_status(run_state, (self.sweep_dir / entry["log"]).exists())
            if run_state is None and status == "failed":
                log.warning(
                    "sweep %s: trial %s ended before its run started; see %s",
                    self.spec.name,
                    tid,
                    self.sweep_dir / entry["log"],
                )
            entry.update(status=status, run_state=run_state, finished_at=now())
        if save:
            manifest.save()

    def plan(self) -> list[tuple[Trial, str]]:
        """(trial, action) without submitting: run, skip (finished / failed / queued / running) or changed."""
        manifest = Manifest.load(self.sweep_dir)
        if manifest is not None:
            self.reconcile(manifest, save=False)  # a dry run writes nothing
        changed = self.changes(manifest)
        out = []
        for trial in self.trials:
            entry = manifest.trials.get(trial.trial_id) if manifest else None
            out.append(
                (
                    trial,
                    f"changed ({entry['status']})"
                    if trial.trial_id in changed
                    else "run"
                    if _submittable(entry, self.retry_failed)
                    else f"skip ({entry['status']})",
                )
            )
        return out

    def script(self, indices: Sequence[int], job_name: Optional[str] = None) -> str:
        """The batch script that would be submitted for these trial indices (named `job_name`, the submission's
        token; a dry run shows the sweep's name)."""
        return render_array_script(
            job_name or self.spec.name,
            self.sweep_dir,
            indices,
            cwd=self.cwd,
            interpreter=self.interpreter,
            parallel=self.parallel,
            gpus_per_trial=self.gpus_per_trial,
        )

    def sbatch_argv(self, script_path: Path) -> list[str]:
        return [_slurm_command("sbatch"), "--parsable", *self.sbatch_args, str(script_path)]

    def _check_sbatch_args(self) -> None:
        for arg in self.sbatch_args:
            if arg in ("-J", "--job-name") or arg.startswith(("--job-name=", "-J")):
                raise ConfigError(
                    f"--sbatch-arg={arg}: the sweep names each array itself (<sweep>-sNNN-<token>, "
                    f"recorded before sbatch so that a rerun finds an array whose job id it never "
                    f"read); leave --job-name out"
                )

    def run(self, wait: bool = False, timeout_s: Optional[float] = None, poll_s: float = 5.0) -> SweepResult:
        """Submit every trial that is not done and not queued (one array); with `wait`, wait until SLURM holds none
        of the sweep's tasks, then write the comparison of the finished trials."""
        _slurm_command("sbatch")
        self._check_sbatch_args()
        with RunnerLock(self.sweep_dir):
            manifest = _open_manifest(
                self.spec, self.sweep_dir, self.trials, self.seed, self.root, self.argv, self.cwd, self.compose
            )
            self.reconcile(manifest)
            todo = [t for t in self.trials if _submittable(manifest.trials[t.trial_id], self.retry_failed)]
            skipped = [t.trial_id for t in self.trials if t not in todo]
            if skipped:
                log.info(
                    "sweep %s: not submitting %d trial(s): %s",
                    self.spec.name,
                    len(skipped),
                    ", ".join(f"{tid} ({manifest.trials[tid]['status']})" for tid in skipped),
                )
            if todo:
                self._submit(manifest, todo)
        if wait:
            self.wait(timeout_s, poll_s)
            manifest = Manifest.load(self.sweep_dir)
        result = SweepResult(self.sweep_dir, manifest, [t.trial_id for t in todo], skipped)
        result.comparison = self.write_comparison(manifest)
        return result

    def _submit(self, manifest: Manifest, todo: list[Trial]) -> str:
        # The commands go into the manifest before sbatch: a task may start before sbatch returns. So does the
        # submission's token (its job name): a runner that never reads sbatch's answer leaves it for the next run.
        n = len(manifest.data.get("submissions", [])) + 1
        token = f"{self.spec.name}-s{n:03d}-{secrets.token_hex(4)}"
        script_path = self.sweep_dir / "slurm" / f"submit-{n:03d}.sbatch"
        argv = self.sbatch_argv(script_path)
        for trial in todo:
            self.write_args_file(trial)
            entry = manifest.trials[trial.trial_id]
            entry.update(
                argv=self.argv(trial), status_before_submit=entry["status"], status=SUBMITTING, submission=token
            )
        sub = {
            "token": token,
            "job": None,
            "trials": [t.trial_id for t in todo],
            "script": str(script_path.relative_to(self.sweep_dir)),
            "sbatch": argv,
            "submitting_at": now(),
        }
        manifest.data.setdefault("submissions", []).append(sub)
        script_path.parent.mkdir(parents=True, exist_ok=True)
        (self.sweep_dir / "logs").mkdir(parents=True, exist_ok=True)
        script_path.write_text(self.script([t.index for t in todo], job_name=token))
        manifest.save()
        try:
            done = subprocess.run(argv, cwd=self.cwd, capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S)
        except (KeyboardInterrupt, subprocess.TimeoutExpired) as e:
            # sbatch may or may not have submitted: ask the controller by the token instead of guessing
            try:
                job = job_named(token, timeout_s=15)
            except (QkvqaError, OSError, subprocess.TimeoutExpired):
                job = None
            if job:
                self._adopt(manifest, sub, job)
                manifest.save()
            what = "Ctrl-C" if isinstance(e, KeyboardInterrupt) else "a timeout"
            log.warning(
                "sweep %s: sbatch stopped by %s; %s",
                self.spec.name,
                what,
                f"it had submitted array job {job}, now recorded"
                if job
                else f"the next run looks up submission {token} and submits only if SLURM never got it",
            )
            if isinstance(e, KeyboardInterrupt) or not job:
                raise
            return job
        if done.returncode != 0:
            manifest.data["submissions"].remove(sub)
            for trial in todo:
                entry = manifest.trials[trial.trial_id]
                entry.update(status=entry.pop("status_before_submit", "pending"), submission=None)
            manifest.save()
            raise QkvqaError(
                f"sbatch refused the sweep's array ({done.stderr.strip()[:400]}); nothing was submitted; "
                f"fix the --sbatch-arg options or the partition and rerun"
            )
        job = done.stdout.strip().split(";")[0]
        self._adopt(manifest, sub, job)
        manifest.save()
        log.info(
            "sweep %s: submitted %d trial(s) as SLURM array job %s (%s, job name %s)",
            self.spec.name,
            len(todo),
            job,
            array_spec([t.index for t in todo], self.parallel),
            token,
        )
        return job

    def wait(self, timeout_s: Optional[float] = None, poll_s: float = 5.0) -> None:
        """Poll squeue (every `poll_s`) until none of the sweep's tasks is queued or running; logs progress."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        last = None
        while True:
            with RunnerLock(self.sweep_dir):
                manifest = Manifest.load(self.sweep_dir)
                self.reconcile(manifest)
            counts = {
                s: sum(e["status"] == s for e in manifest.trials.values())
                for s in ("queued", "running", "finished", "failed", "interrupted")
            }
            if counts != last:
                log.info("sweep %s: %s", self.spec.name, ", ".join(f"{v} {k}" for k, v in counts.items() if v))
                last = counts
            if not counts["queued"] and not counts["running"]:
                return
            if deadline is not None and time.monotonic() > deadline:
                raise QkvqaError(
                    f"sweep {self.spec.name}: trials still queued or running after {timeout_s:g} s; "
                    f"rerun the sweep later to read back the rest"
                )
            time.sleep(poll_s)
