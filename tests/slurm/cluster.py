"""A throw-away single-node SLURM cluster for the `slurm` tests: munged, slurmctld and slurmd from the Debian packages,
started as this test run's own processes from a config in a temp dir, stopped by PID; every wait is bounded.

No cgroups are needed (proctrack/linuxproc, task/none), so it runs inside a container as root.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Optional


LAUNCH_VARS = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "MASTER_ADDR",
               "MASTER_PORT", "WANDB_RUN_ID", "WANDB_SWEEP_ID", "CUDA_VISIBLE_DEVICES"}


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
        self.env = {k: v for k, v in os.environ.items()
                    if k not in LAUNCH_VARS and not k.startswith(("SLURM_", "TORCHELASTIC_", "PL_", "QKVQA_RUN"))}
        self.env["SLURM_CONF"] = str(self.conf)

    # ------------------------------------------------------------------ set-up
    def _write_config(self) -> None:
        r = self.root
        for sub in ("state", "spool", "log", "munge"):
            (r / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
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
AuthInfo=socket={r / 'munge' / 'munge.socket'}
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
ReturnToService=2
JobRequeue=1
KillWait=15
InactiveLimit=0
MinJobAge=300
SlurmdTimeout=60
SlurmctldTimeout=60
StateSaveLocation={r / 'state'}
SlurmdSpoolDir={r / 'spool'}
SlurmctldPidFile={r / 'slurmctld.pid'}
SlurmdPidFile={r / 'slurmd.pid'}
SlurmctldLogFile={r / 'log' / 'slurmctld.log'}
SlurmdLogFile={r / 'log' / 'slurmd.log'}
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName={self.host} CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
""")

    def start(self, timeout_s: float = 90.0) -> "SlurmCluster":
        """Start the three daemons in the foreground (-D / -F) as our children, then wait until the node is idle."""
        self._write_config()
        r = self.root
        log = open(r / "log" / "daemons.out", "ab")
        self.procs["munged"] = subprocess.Popen(
            [shutil.which("munged") or "/usr/sbin/munged", "--foreground", "--force",
             f"--socket={r / 'munge' / 'munge.socket'}", f"--key-file={r / 'munge' / 'munge.key'}",
             f"--pid-file={r / 'munge' / 'munged.pid'}", f"--log-file={r / 'log' / 'munged.log'}",
             f"--seed-file={r / 'munge' / 'munge.seed'}"], stdout=log, stderr=log)
        self._wait(lambda: (r / "munge" / "munge.socket").exists(), 30, "munged's socket")
        self.procs["slurmctld"] = subprocess.Popen(["slurmctld", "-D", "-i", "-f", str(self.conf)],
                                                   stdout=log, stderr=log, env=self.env)
        self.procs["slurmd"] = subprocess.Popen(["slurmd", "-D", "-f", str(self.conf), "-N", self.host],
                                                stdout=log, stderr=log, env=self.env)
        self._wait(lambda: self.node_state() in ("idle", "mixed", "allocated"), timeout_s, "the node to come up")
        return self

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
        self.run("scontrol", "update", f"JobId={job_id}", "StartTime=now",
                 *([f"TimeLimit={time_limit}"] if time_limit else []))

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
            self.run("scancel", "--full", "--user", "root", check=False)
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
