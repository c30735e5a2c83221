"""A throw-away single-node SLURM cluster for the `slurm` tests: munged, slurmctld and slurmd from the Debian packages,
started as this test run's own processes from a config in a temp dir, stopped by PID; every wait is bounded.

No cgroups are needed (proctrack/linuxproc, task/none), so it runs inside a container as root.

The cluster is configured as a site's would be where the recipes must say what they need (issue 37 item 6):
- `JobRequeue=0`: a job is requeued (by the scheduler, or by qkvqa's `scontrol requeue` after a SIGUSR1 save) only
  when its script asks for it with `--requeue`;
- jobs run as an unprivileged user (`nobody`, when the tests run as root): `as_user(argv)` runs a command, sbatch or a
  sweep runner, as that user, and `workdir(name)` makes a directory it owns, where its jobs write;
- two fake GPUs (`GresTypes=gpu`, `Gres=gpu:2`, gres.conf with `/dev/null` files): `--gres=gpu:N` is accepted and
  counted (a job's `AllocTRES` shows `gres/gpu=N`), though nothing uses a GPU.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]
LAUNCH_VARS = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "WANDB_RUN_ID",
    "WANDB_SWEEP_ID",
    "CUDA_VISIBLE_DEVICES",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SlurmCluster:
    """One node (this host, all its CPUs), one partition `debug`; `env` points the SLURM commands at it."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.host = socket.gethostname().split(".")[0]
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "slurm.conf"
        # Jobs inherit the submitting environment (sbatch --export=ALL): leave out what earlier tests in this process
        # (Lightning, torchrun, a run) set, or a job's ranks would read another launch's rank and address.
        self.env = {
            k: v
            for k, v in os.environ.items()
            if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_", "PL_", "QKVQA_RUN"))
        }
        self.env["SLURM_CONF"] = str(self.conf)
        # Jobs run as an unprivileged user (slurmd, as root, switches to it); not root: as this user anyway. The
        # Python jobs need the interpreter: one under /root (mode 0700, as pyenv's is here) is out of that user's
        # reach in a job, and then they run as root, with the reason in `python_user_note` (`start` tries a job;
        # shell-only jobs stay unprivileged: `unprivileged`).
        self.unprivileged = "nobody" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
        entry = pwd.getpwnam(self.unprivileged)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        self.user, self.python_user_note = self.unprivileged, ""
        # folders given a traverse-only ACL entry for that user, with whether they had an ACL before (`_grant_traversal`)
        self.granted: list[tuple[Path, bool]] = []

    # ------------------------------------------------------------------ set-up
    def _write_config(self) -> None:
        r = self.root
        for sub in ("state", "spool", "log", "munge", "work"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        for path in (r, r / "munge", r / "work"):  # the job user reads slurm.conf and talks to munged's socket
            os.chmod(path, 0o755)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o400)
        cpus = os.cpu_count() or 1
        memory = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
        self.conf.write_text(f"""ClusterName=qkvqa-test
SlurmctldHost={self.host}
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={r / "munge" / "munge.socket"}
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
ReturnToService=2
JobRequeue=0
GresTypes=gpu
KillWait=15
InactiveLimit=0
MinJobAge=300
SlurmdTimeout=60
SlurmctldTimeout=60
StateSaveLocation={r / "state"}
SlurmdSpoolDir={r / "spool"}
SlurmctldPidFile={r / "slurmctld.pid"}
SlurmdPidFile={r / "slurmd.pid"}
SlurmctldLogFile={r / "log" / "slurmctld.log"}
SlurmdLogFile={r / "log" / "slurmd.log"}
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={self.host} CPUs={cpus} RealMemory={memory} Gres=gpu:2 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")
        (r / "gres.conf").write_text(
            f"NodeName={self.host} Name=gpu File=/dev/null\nNodeName={self.host} Name=gpu File=/dev/zero\n"
        )

    def workdir(self, name: str) -> Path:
        """A new directory, owned by the unprivileged user (the job user's when that is root), for what its jobs
        write (runs, logs, sweep directories)."""
        path = self.root / "work" / name
        n = 1
        while path.exists():
            n += 1
            path = self.root / "work" / f"{name}{n}"
        path.mkdir(parents=True)
        os.chown(path, self.uid, self.gid)
        return path

    def as_user(self, argv: list[str], user: Optional[str] = None) -> list[str]:
        """`argv` run as `user` (default: the Python jobs' user; setpriv keeps the environment: SLURM_CONF, PATH)."""
        user = user or getattr(self, "user", self.unprivileged)
        if os.geteuid() != 0 or user == "root":
            return list(argv)
        return ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups", "--", *argv]

    def user_env(self, **extra: str) -> dict[str, str]:
        """The environment of a command run as the job user (a HOME it may write: W&B, torch caches)."""
        home = self.root / "work" / ".home"
        if not home.exists():
            home.mkdir()
            os.chown(home, self.uid, self.gid)
        return {**self.env, "HOME": str(home), "PYTHONDONTWRITEBYTECODE": "1", **extra}

    def start(self, timeout_s: float = 90.0) -> "SlurmCluster":
        """Start the three daemons in the foreground (-D / -F) as our children, then wait until the node is idle."""
        self._write_config()
        r = self.root
        log = open(r / "log" / "daemons.out", "ab")
        self.procs["munged"] = subprocess.Popen(
            [
                shutil.which("munged") or "/usr/sbin/munged",
                "--foreground",
                "--force",
                f"--socket={r / 'munge' / 'munge.socket'}",
                f"--key-file={r / 'munge' / 'munge.key'}",
                f"--pid-file={r / 'munge' / 'munged.pid'}",
                f"--log-file={r / 'log' / 'munged.log'}",
                f"--seed-file={r / 'munge' / 'munge.seed'}",
            ],
            stdout=log,
            stderr=log,
        )
        self._wait(lambda: (r / "munge" / "munge.socket").exists(), 30, "munged's socket")
        self.procs["slurmctld"] = subprocess.Popen(
            ["slurmctld", "-D", "-i", "-f", str(self.conf)], stdout=log, stderr=log, env=self.env
        )
        self.procs["slurmd"] = subprocess.Popen(
            ["slurmd", "-D", "-f", str(self.conf), "-N", self.host], stdout=log, stderr=log, env=self.env
        )
        self._wait(lambda: self.node_state() in ("idle", "mixed", "allocated"), timeout_s, "the node to come up")
        if os.geteuid() == 0:
            self._grant_traversal()
            self._check_python_as_user()
        return self

    def _grant_traversal(self) -> None:
        """As root, let the job user reach this Python and the checkout: pyenv's interpreter under /root (mode 0700,
        as here) is out of its reach. A traverse-only ACL entry for that user (`setfacl -m u:USER:x`, no read, so it
        cannot list them) on each folder above them that others cannot traverse; `stop` removes the entries."""
        setfacl = shutil.which("setfacl")
        if setfacl is None:
            return  # no acl package: the probe job tells, and the Python jobs run as root (python_user_note)
        targets = {Path(os.path.realpath(sys.executable)), Path(sys.base_prefix).resolve(), REPO}
        folders = {f for t in targets for f in (t, *t.parents) if f.is_dir() and not f.stat().st_mode & 0o001}
        for folder in sorted(folders):
            had_acl = bool(
                subprocess.run(
                    ["getfacl", "--skip-base", "-p", str(folder)], capture_output=True, text=True, timeout=10
                ).stdout.strip()
            )
            done = subprocess.run(
                [setfacl, "-m", f"u:{self.unprivileged}:x", str(folder)], capture_output=True, text=True, timeout=10
            )
            if done.returncode == 0:
                self.granted.append((folder, had_acl))

    def _revoke_traversal(self) -> None:
        """Take the entries back: a folder that had no ACL before gets none (`-b`, not a leftover mask entry)."""
        for folder, had_acl in self.granted:
            undo = ["-x", f"u:{self.unprivileged}"] if had_acl else ["-b"]
            subprocess.run(["setfacl", *undo, str(folder)], capture_output=True, text=True, timeout=10)
        self.granted = []

    def _check_python_as_user(self) -> None:
        """A job of the unprivileged user that starts this Python; if it cannot, Python jobs run as root."""
        out = self.workdir("probe") / "probe.out"
        done = subprocess.run(
            self.as_user(["sbatch", "--parsable", f"--output={out}", "--wrap", f"{sys.executable} -c pass"]),
            env=self.user_env(),
            cwd=self.root / "work",
            capture_output=True,
            text=True,
            timeout=30,
        )
        if done.returncode != 0:
            raise RuntimeError(f"sbatch as {self.unprivileged}: {done.stderr.strip()}; logs: {self.logs()}")
        job = done.stdout.strip().split(";")[0]
        if self.wait_job(job, ("COMPLETED", "FAILED", "CANCELLED"), 60) != "COMPLETED":
            self.user = "root"
            why = out.read_text().strip().splitlines()[-1:] if out.exists() else ["no output"]
            self.python_user_note = (
                f"{sys.executable} cannot start in a job of {self.unprivileged} ({why[0]}): the Python jobs run as root"
            )

    def _wait(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [name for name, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}; logs: {self.logs()}")
            if ready():
                return
            time.sleep(0.3)
        raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}; logs: {self.logs()}")

    # ------------------------------------------------------------------ use
    def run(self, *argv: str, timeout_s: float = 30.0, check: bool = True) -> subprocess.CompletedProcess:
        """A SLURM client command against this cluster."""
        done = subprocess.run(list(argv), env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return done

    def node_state(self) -> str:
        done = self.run("sinfo", "-h", "-N", "-o", "%t", check=False, timeout_s=10)
        return done.stdout.strip().rstrip("*~#").lower() if done.returncode == 0 else ""

    def job_state(self, job_id: str) -> str:
        done = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        for field in done.stdout.split():
            if field.startswith("JobState="):
                return field.split("=", 1)[1]
        return ""

    def job_field(self, job_id: str, name: str) -> Optional[str]:
        done = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        for field in done.stdout.split():
            if field.startswith(f"{name}="):
                return field.split("=", 1)[1]
        return None

    def wait_job(self, job_id: str, states, timeout_s: float) -> str:
        """Wait until the job is in one of `states` (e.g. COMPLETED, FAILED); returns the state."""
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.job_state(job_id)
            if state in states:
                return state
            time.sleep(0.5)
        raise RuntimeError(f"job {job_id} still {state or 'unknown'} after {timeout_s:g} s; logs: {self.logs()}")

    def requeue_now(self, job_id: str, timeout_s: float = 120.0, time_limit: Optional[str] = None) -> None:
        """Make a requeued job eligible now instead of after SLURM's begin delay (about 120 s; `scontrol update`, as
        an admin may), with a new `time_limit` if given. slurmd refuses to launch a job whose credential was revoked
        in the same second (the kill of the previous attempt: "Job credential revoked"), so the new start time lies
        3 s after the job is pending again."""
        self.wait_job(job_id, ("PENDING",), timeout_s)
        time.sleep(3.0)
        self.run(
            "scontrol",
            "update",
            f"JobId={job_id}",
            "StartTime=now",
            *([f"TimeLimit={time_limit}"] if time_limit else []),
        )

    def logs(self) -> str:
        out = []
        for name in ("slurmctld.log", "slurmd.log", "daemons.out"):
            path = self.root / "log" / name
            if path.exists():
                out.append(f"--- {name}\n" + path.read_text(errors="replace")[-2000:])
        return "\n".join(out)

    # ------------------------------------------------------------------ tear-down
    def stop(self) -> None:
        """Cancel every job (bounded wait), then stop the daemons by PID (slurmd, slurmctld, munged)."""
        if self.procs.get("slurmctld") is not None and self.procs["slurmctld"].poll() is None:
            for user in {"root", self.unprivileged}:
                self.run("scancel", "--full", "--user", user, check=False)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and self.run("squeue", "-h", check=False, timeout_s=10).stdout.strip():
                time.sleep(0.5)
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None or proc.poll() is not None:
                continue
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        self._revoke_traversal()
