"""Resume policy: find the checkpoint to continue from and refuse changes to immutable keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from qkvqa.config.load import from_saved, to_plain
from qkvqa.config.schema import MUTABLE_ON_RESUME
from qkvqa.errors import ConfigError
from qkvqa.run.rundir import RunContext
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)
RESUME_MODES = ("never", "auto")
# The files a training run reads whose content its weights depend on, by config key; their sha256 is recorded in
# RUN/inputs.json when training starts and checked when it resumes from last.ckpt (issue 44: a resumed training after
# its hard-negative pool file was edited went on without a word, to other weights than the unedited run's).
TRAINING_INPUT_KEYS = ("qff.negatives", "qff.val_negatives")
INPUTS_FILE = "inputs.json"


def training_inputs(cfg: DictConfig) -> dict:
    """{config key: {"path", "sha256"}} of the training input files `cfg` names (absent keys and files left out)."""
    from omegaconf import OmegaConf

    from qkvqa.utils.io import sha256_file_cached

    out = {}
    for key in TRAINING_INPUT_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if not value:
            continue
        path = Path(str(value)).expanduser()
        if path.is_file():
            out[key] = {"path": str(value), "sha256": sha256_file_cached(path)}
    return out


def check_training_inputs(cfg: DictConfig, run: RunContext, resuming: bool) -> None:
    """Refuse (one line naming the key and file) a resume from last.ckpt whose input files changed since they were
    recorded; record them otherwise."""
    from qkvqa.utils.io import atomic_write_json, read_json

    path = run.run_dir / INPUTS_FILE
    now = training_inputs(cfg)
    if resuming and path.is_file():
        try:
            before = read_json(path)
        except ValueError:
            before = {}
        for key, was in sorted(before.items()):
            if key in now and now[key]["sha256"] != was.get("sha256"):
                raise ConfigError(
                    f"{key}: {now[key]['path']} changed since run {run.run_id} started training on it (sha256 "
                    f"{str(was.get('sha256'))[:12]}, now {now[key]['sha256'][:12]}): its weights so far come from the "
                    "other file. Put that file back to resume, or train on this one as a new run (another run_id)"
                )
        now = {**before, **now}
    if now or path.is_file():
        atomic_write_json(path, now)


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: d}


def _is_mutable(key: str) -> bool:
    return any(key == m or key.startswith(m + ".") for m in MUTABLE_ON_RESUME)


def config_changes(saved: DictConfig, current: DictConfig) -> dict[str, tuple[Any, Any]]:
    """Every key whose value differs between two configs: {key: (saved, current)}."""
    a, b = _flatten(to_plain(saved)), _flatten(to_plain(current))
    return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}


def immutable_changes(changes: dict[str, tuple[Any, Any]]) -> dict[str, tuple[Any, Any]]:
    """The changes a resume refuses: keys outside MUTABLE_ON_RESUME (run_id and experiment aside)."""
    return {k: v for k, v in changes.items() if not _is_mutable(k) and k not in ("run_id", "experiment")}


def check_resume_config(saved_path: Path, current: DictConfig) -> dict[str, tuple[Any, Any]]:
    """Refuse immutable changes against the saved config; return the allowed (mutable) ones."""
    saved = from_saved(saved_path)
    changes = config_changes(saved, current)
    refused = immutable_changes(changes)
    if refused:
        lines = ", ".join(f"{k}: {old!r} -> {new!r}" for k, (old, new) in list(refused.items())[:8])
        raise ConfigError(
            f"cannot resume {saved_path.parent.name}: these keys differ from its saved config.yaml and may not "
            f"change on resume: {lines}. Start a new run (another run_id) to change them; keys that may change: "
            f"{', '.join(MUTABLE_ON_RESUME)}"
        )
    return {k: v for k, v in changes.items() if k not in ("run_id", "experiment")}


def prepare_resume(cfg: DictConfig, run: RunContext, trains: bool = True) -> tuple[Optional[str], dict]:
    """Decide what to resume from: (checkpoint path or None, allowed config changes).

    resume=never on a directory that already holds a run is refused, so no run is overwritten.
    resume=auto continues `last.ckpt` when present, and trains from scratch on the first launch; a job that does
    not train (`trains` False: evaluate, embed, ...) continues in its directory from what it wrote there.
    """
    if cfg.resume not in RESUME_MODES:
        raise ConfigError(f"resume must be one of {RESUME_MODES}, got {cfg.resume!r}")
    if not run.resumed:
        if trains:
            check_training_inputs(cfg, run, resuming=False)
        return None, {}
    if cfg.resume == "never":
        raise ConfigError(
            f"run directory {run.run_dir} already holds run {run.run_id!r}. Pass resume=auto to continue it, "
            "or choose another run_id (or none for a new one)."
        )
    changes = check_resume_config(run.run_dir / "config.yaml", cfg)
    last = run.run_dir / "last.ckpt"
    if changes:
        log.info("resuming %s with changed keys: %s", run.run_id, changes)
    if not trains:
        log.info("resume=auto: continuing %s in %s", run.run_id, run.run_dir)
        return None, changes
    if last.exists():
        check_training_inputs(cfg, run, resuming=True)
        log.info("resuming %s from %s", run.run_id, last)
        return str(last), changes
    log.info("resume=auto: %s has no last.ckpt yet, starting from scratch in the same directory", run.run_id)
    check_training_inputs(cfg, run, resuming=False)
    return None, changes


# The keys that decide where training ends: a finished run resumed with a larger one trains on.
_TRAINING_LENGTH = ("trainer.max_steps", "trainer.max_epochs")


def finished_training(cfg: DictConfig, run: RunContext) -> Optional[str]:
    """With resume=auto on a training run that finished (status.json) and whose length keys are unchanged: the line
    that says so (there is nothing to train, and refitting "from step N to N" re-exported its weights), else None."""
    import json

    status_path, saved_path = run.run_dir / "status.json", run.run_dir / "config.yaml"
    if cfg.resume != "auto" or not run.resumed or not status_path.is_file():
        return None
    try:
        status = json.loads(status_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if status.get("state") != "finished":
        return None
    changes = config_changes(from_saved(saved_path), cfg)
    if any(key in changes for key in _TRAINING_LENGTH) or immutable_changes(changes):
        return None  # trains on, or is refused by name (prepare_resume)
    summary_path = run.run_dir / "summary.json"
    try:
        step = json.loads(summary_path.read_text(encoding="utf-8")).get("global_step")
    except (OSError, ValueError):
        step = None
    at = f" at step {step}" if step is not None else ""
    return (
        f"run {run.run_id} is finished{at} (trainer.max_steps={cfg.trainer.max_steps}, trainer.max_epochs="
        f"{cfg.trainer.max_epochs}; {status_path}): nothing to resume, nothing touched. To train further, raise "
        f"trainer.max_steps (or max_epochs) with run_id={run.run_id} resume=auto; to train again, use another run_id"
    )
