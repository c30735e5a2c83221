"""Build the W&B logger of a run: id = run id, files under `<run_dir>/wandb/`, resume allowed.

`run` is the run's `qkvqa.run.rundir.RunContext` (run_id, run_dir, is_rank_zero, launched_by_sweep), which the job and
trainer of `qkvqa.run` pass in: the loggers sit below them and import nothing of `qkvqa.run`."""

from __future__ import annotations

import os
import shutil
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from omegaconf import DictConfig, ListConfig

from qkvqa.config.load import to_plain
from qkvqa.metrics.retrieval import gold_rank as metric_gold_rank
from qkvqa.utils.io import read_json
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)


def wandb_mode(cfg: Optional[DictConfig]) -> str:
    """online, offline or disabled: the config's choice, else WANDB_MODE, else offline without a login."""
    mode = (cfg.logger.wandb.mode if cfg is not None else None) or os.environ.get("WANDB_MODE")
    if mode:
        return "online" if mode == "run" else mode
    if os.environ.get("WANDB_API_KEY") or os.path.exists(os.path.expanduser("~/.netrc")):
        return "online"
    log.info("W&B: no login found, logging offline (sync later with `wandb sync %s`)", "<run_dir>/wandb")
    return "offline"


# Config values that are data, not settings: a tiny model's word list (components.*.options.vocab_texts) ran to
# thousands of words in every W&B config. They stay in config.yaml and the checkpoints; W&B gets a short stand-in.
BULK_KEYS = ("vocab_texts",)
MAX_LIST_ITEMS = 64


def compact_config(plain: Any) -> Any:
    """The config as W&B (and `qkvqa compare`) show it: BULK_KEYS and lists longer than MAX_LIST_ITEMS replaced by
    "<N items: see config.yaml>"; every other value, with its type, unchanged."""
    if isinstance(plain, dict):
        return {
            k: (_stand_in(v) if k in BULK_KEYS and isinstance(v, (list, tuple)) else compact_config(v))
            for k, v in plain.items()
        }
    if isinstance(plain, (list, tuple)):
        return _stand_in(plain) if len(plain) > MAX_LIST_ITEMS else [compact_config(v) for v in plain]
    return plain


def _stand_in(values: Any) -> str:
    return f"<{len(values)} items: see config.yaml>"


def job_type(command: str) -> str:
    """The W&B job_type of a qkvqa command: its first word (train, evaluate, embed, index, mine, rerank, ...)."""
    return (command or "run").split()[0]


def run_settings(cfg: DictConfig, run: Any, command: str) -> dict:
    """The wandb.init arguments every qkvqa W&B run shares: project, entity, group, job_type, top-level notes and
    tags (joined with logger.wandb.tags), the compact config, the run directory, the mode."""
    wcfg = _without_environment_values(cfg)
    tags = list(dict.fromkeys([*(wcfg["tags"] or []), *(wcfg["top_tags"] or [])])) or None
    kwargs: dict = dict(
        project=wcfg["project"],
        entity=wcfg["entity"],
        group=wcfg["group"],
        tags=tags,
        notes=wcfg["notes"] or None,
        job_type=job_type(command),
        name=run.run_id,
        mode=wandb_mode(cfg),
        config=compact_config(to_plain(cfg)),
        resume="allow",
    )
    if not run.launched_by_sweep:
        kwargs["id"] = run.run_id  # under a sweep the agent's run id is used (and equals run_id)
    return {k: v for k, v in kwargs.items() if v is not None}


def _without_environment_values(cfg: DictConfig) -> dict:
    """The run settings W&B stores in its run file (notes, group, tags, project, entity), each read from the environment
    (`${oc.env:SECRET}`, or a value referring to one) as its interpolation's text, never the value: `config.yaml` and
    the W&B config keep the text, and the run file (uploaded by `wandb sync`) must not hold the secret either."""
    from qkvqa.config.load import environment_keys

    env = environment_keys(cfg)
    plain = to_plain(cfg)
    where = {
        "project": "logger.wandb.project",
        "entity": "logger.wandb.entity",
        "group": "logger.wandb.group",
        "tags": "logger.wandb.tags",
        "top_tags": "tags",
        "notes": "notes",
    }
    out = {}
    for name, path in where.items():
        node: Any = cfg
        text: Any = plain
        for part in path.split("."):
            node, text = node[part], text[part]
        value = list(node) if isinstance(node, ListConfig) else node
        if any(key == path or key.startswith(path + ".") for key in env):
            log.warning("%s reads the environment: W&B gets its interpolation's text, never the value", path)
            value = text
        out[name] = value
    return out


def make_wandb_logger(cfg: DictConfig, run: Any, command: str = "train"):
    """A WandbLogger for this run (job_type `command`), or None when W&B is disabled."""
    if not cfg.logger.wandb.enabled or wandb_mode(cfg) == "disabled":
        return None
    from lightning.pytorch.loggers import WandbLogger

    finish_active_run()
    if run.is_rank_zero:  # other ranks only join the record rank zero writes
        run.run_dir.mkdir(parents=True, exist_ok=True)
    logger = _tolerant(WandbLogger)(save_dir=str(run.run_dir), log_model=False, **run_settings(cfg, run, command))
    # Lightning 2.6.6 always passes anonymous=None to wandb.init, which W&B 0.31 answers with "The anonymous setting
    # has no effect" on every run; the unset value is dropped (its init arguments are the private `_wandb_init`)
    init = getattr(logger, "_wandb_init", None)
    if isinstance(init, dict) and init.get("anonymous", False) is None:
        del init["anonymous"]
    return logger


_TOLERANT: dict = {}


def stop_is_not_a_wandb_failure(error: Exception) -> None:
    """Re-raise a stop (RunInterrupted from a signal handler that fired inside a W&B call), which the W&B guards
    below must not swallow as "W&B stopped": the run would go on after SIGTERM until SIGKILL."""
    from qkvqa.errors import RunInterrupted

    if isinstance(error, RunInterrupted):
        raise error


def _tolerant(base: type) -> type:
    """WandbLogger whose calls cannot fail the run: when the W&B service is gone (SLURM signals every process of
    the job step, and wandb-core exits on SIGTERM), rank zero's next W&B call raised ConnectionResetError, and the
    exception path then waited in a DDP barrier the other ranks never reached, until SIGKILL. Here the first
    failure logs one warning and W&B stops; the local run record goes on (sync the offline files later)."""
    if base in _TOLERANT:
        return _TOLERANT[base]
    from lightning.pytorch.utilities import rank_zero_only

    class TolerantWandbLogger(base):
        _broken = False
        _skipped_steps = 0

        def _guard(self, name: str, *args, **kwargs):
            return self._guard_call(getattr(super(), name), *args, **kwargs)

        @rank_zero_only
        def log_metrics(self, metrics, step=None):
            if step is None:
                return self._guard("log_metrics", metrics)
            return self._guard_call(self._log_at_step, metrics, int(step))

        def _log_at_step(self, metrics, step: int) -> None:
            """Log with W&B's own step equal to Lightning's (not only the `trainer/global_step` column): an offline
            run resumed from a checkpoint starts a new offline segment whose `_step` would restart at 0, and
            syncing it into the same run then hid a segment (wandb/wandb#5865). Steps W&B has already passed
            (an online resume re-doing the steps after the checkpoint; exact resume makes them the same values) are
            skipped with one note; metrics.csv holds them."""
            current = int(getattr(self.experiment, "step", 0) or 0)
            if step < current:
                if not self._skipped_steps:
                    log.info(
                        "W&B: this run already has steps up to %d (the attempt before this resume); steps "
                        "below it are not logged to W&B again (metrics.csv has them)",
                        current - 1,
                    )
                self._skipped_steps += 1
                return
            self.experiment.log({**metrics, "trainer/global_step": step}, step=step)

        def _guard_call(self, fn, *args, **kwargs):
            if self._broken:
                return None
            try:
                return fn(*args, **kwargs)
            except Exception as e:  # the service died or the network went: never fail the run
                stop_is_not_a_wandb_failure(e)
                self._broken = True
                log.warning(
                    "W&B stopped (%s: %s); the local run record in %s goes on", type(e).__name__, e, self.save_dir
                )
                return None

        def log_hyperparams(self, *args, **kwargs):
            return self._guard("log_hyperparams", *args, **kwargs)

        def after_save_checkpoint(self, *args, **kwargs):
            return self._guard("after_save_checkpoint", *args, **kwargs)

        def finalize(self, *args, **kwargs):
            return self._guard("finalize", *args, **kwargs)

    _TOLERANT[base] = TolerantWandbLogger
    return TolerantWandbLogger


def wandb_run_id(logger: Optional[object]) -> Optional[str]:
    """The W&B run id of a WandbLogger (without starting a run), or None."""
    if logger is None:
        return None
    return getattr(logger, "version", None)


def finish_active_run() -> None:
    """Finish a W&B run an earlier job left open in this process; WandbLogger would log into it otherwise."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and wandb.run is not None:
        log.info("W&B: finishing run %s left open by an earlier job in this process", wandb.run.id)
        wandb.finish()


RUN_FILES = ("summary.json", "report.md")


def log_run_files(run_dir: str | os.PathLike) -> list[str]:
    """Copy summary.json into the active W&B run's summary and save summary.json and report.md with it.

    Call it after a job wrote its record (rank zero); without an active run it does nothing. Returns
    the names of the files saved.
    """
    wandb = sys.modules.get("wandb")
    run = wandb.run if wandb is not None else None
    if run is None:
        return []
    run_dir = Path(run_dir)
    saved = []
    try:
        summary = run_dir / RUN_FILES[0]  # the run record's summary.json (qkvqa.run.record)
        run.summary.update(relative_paths(read_json(summary) if summary.exists() else {}, run_dir))
        for name in RUN_FILES:
            if (run_dir / name).is_file():
                # a copy inside the W&B run's files directory: saving a file from outside it made W&B symlink it
                # and warn "Symlinked 1 file ..." on every run
                copy = Path(run.dir) / name
                shutil.copyfile(run_dir / name, copy)
                run.save(str(copy), base_path=str(run.dir), policy="now")
                saved.append(name)
    except Exception as e:  # a dead W&B service must not fail a finished job
        stop_is_not_a_wandb_failure(e)
        log.warning("W&B: could not save the run files (%s: %s); they are in %s", type(e).__name__, e, run_dir)
    return saved


def relative_paths(summary: dict, run_dir: str | os.PathLike) -> dict:
    """The summary with every path inside the run directory written relative to it (`last.ckpt`, `qff`), as a W&B
    user reads it on another machine; other values unchanged."""
    root = os.path.realpath(run_dir)

    def rel(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: rel(v) for k, v in value.items()}
        if isinstance(value, str) and os.path.isabs(value):
            path = os.path.realpath(value)
            if path == root or path.startswith(root + os.sep):
                return os.path.relpath(path, root)
        return value

    return rel(summary)


# Commands whose job is not a Lightning Trainer (train and evaluate log through WandbLogger): their W&B run is opened
# by run_job around the job, with the same settings, and carries the summary and files at the end.
OWN_RUN_COMMANDS = ("embed", "index build", "mine", "rerank", "retrieve", "cache-vit")


@contextmanager
def job_run(cfg: DictConfig, run: Any, command: str) -> Iterator[None]:
    """A W&B run around a non-Lightning job (OWN_RUN_COMMANDS) on rank zero, finished with its exit status; nothing
    for other commands or with W&B disabled. A W&B failure is one warning: the job and its record go on."""
    if (
        command not in OWN_RUN_COMMANDS
        or not run.is_rank_zero
        or not cfg.logger.wandb.enabled
        or wandb_mode(cfg) == "disabled"
    ):
        yield
        return
    import wandb

    finish_active_run()
    try:
        wrun = wandb.init(dir=str(run.run_dir), **run_settings(cfg, run, command))
    except Exception as e:
        from qkvqa.utils.stop_signals import stop_signal_received

        if stop_signal_received() is not None:  # the stop arrived during init (whatever init made of it)
            raise
        log.warning(
            "W&B: could not start the run (%s: %s); the local run record in %s goes on",
            type(e).__name__,
            e,
            run.run_dir,
        )
        yield
        return
    failed = True
    try:
        yield
        failed = False
    finally:
        try:
            if not failed:
                log_run_files(run.run_dir)
            wrun.finish(exit_code=1 if failed else 0)
        except Exception as e:  # a dead W&B service must not fail a finished job
            stop_is_not_a_wandb_failure(e)
            log.warning("W&B: could not finish the run (%s: %s)", type(e).__name__, e)


TABLE_COLUMNS = [
    "id",
    "question",
    "gold_answer",
    "prediction",
    "correct",
    "gold_rank_before_filter",
    "gold_rank_after_filter",
    "context_tokens",
]
# From the question's trace (traces.jsonl), after TABLE_COLUMNS: its Table 3 cell, whether a reference answer is in
# the context, the articles CDA kept (titles), and the best-scored selected chunk's text.
TRACE_COLUMNS = ["category", "answer_in_context", "kept_articles", "top_chunk"]


def gold_rank(urls: Sequence[str], gold: Sequence[str]) -> Optional[int]:
    """1-based rank of the first gold URL in `urls` as the retrieval metrics count it (duplicates once), None when no
    gold article is ranked."""
    return metric_gold_rank(urls, gold) or None


def trace_cells(trace: Optional[dict]) -> list:
    """The TRACE_COLUMNS cells of one trace (None each without one)."""
    if trace is None:
        return [None] * len(TRACE_COLUMNS)
    cda = trace.get("cda") or {}
    titles = {a["url"]: a["title"] or a["url"] for a in (trace.get("filter") or {}).get("articles", [])}
    selected = [c for c in cda.get("chunks", []) if c["selected"]]
    top = max(selected, key=lambda c: c["score"] if c["score"] is not None else float("-inf"), default=None)
    return [
        trace.get("category"),
        trace.get("answer_in_context"),
        " | ".join(titles.get(url, url) for url in cda.get("kept", [])) or None,
        top["text"] if top else None,
    ]


def predictions_table_rows(
    rows: Sequence[dict],
    questions: Sequence[Any],
    retrieved: dict,
    correct: dict,
    traces: Optional[Sequence[dict]] = None,
) -> list[list]:
    """One row per question of the split, in TABLE_COLUMNS order (a skipped question: empty prediction, the reason in
    `prediction`, its correctness as scored), then with `traces` the TRACE_COLUMNS of each question's trace."""
    by_id = {r["data_id"]: r for r in rows}
    trace_of = {t["data_id"]: t for t in traces} if traces is not None else None
    out = []
    for q in questions:
        row = by_id.get(q.data_id, {})
        if q.reference is not None:  # InfoSeek: the official answer_eval list (or numeric range)
            gold = q.reference.answer_eval
            gold = " | ".join(map(str, gold)) if isinstance(gold, list) else str(gold)
        else:
            gold = " | ".join(q.answers)
        before = retrieved.get(q.data_id)
        prediction = row.get("prediction", "")
        if row.get("skipped"):
            prediction = f"<skipped: {row['skipped']}>"
        trace = trace_of.get(q.data_id) if trace_of is not None else None
        if trace is not None:  # the trace's ranks (stage 1 cut at the filter's top-K), as qkvqa inspect shows them
            ranks = [trace["gold_rank"]["before"], trace["gold_rank"]["after"]]
        else:
            ranks = [
                gold_rank(before.urls if before is not None else [], q.gold_urls),
                gold_rank([a["url"] for a in row.get("ranking") or []], q.gold_urls) if row else None,
            ]
        out.append([q.data_id, q.question, gold, prediction, correct.get(q.data_id), *ranks, row.get("context_tokens")])
        if trace_of is not None:
            out[-1].extend(trace_cells(trace))
    return out


def log_predictions_table(
    rows: Sequence[dict],
    questions: Sequence[Any],
    retrieved: dict,
    correct: dict,
    images: Any = None,
    key: str = "eval/predictions",
    traces: Optional[Sequence[dict]] = None,
) -> bool:
    """Log the per-question results of an evaluation as a wandb.Table into the active run (rank zero); with `traces`
    (traces.jsonl's rows) the TRACE_COLUMNS too, with `images` (the benchmark's image loader) a last column of query
    images. False when no W&B run is active."""
    wandb = sys.modules.get("wandb")
    run = wandb.run if wandb is not None else None
    if run is None:
        return False
    data = predictions_table_rows(rows, questions, retrieved, correct, traces)
    columns = list(TABLE_COLUMNS) + (list(TRACE_COLUMNS) if traces is not None else [])
    try:
        if images is not None:
            columns.append("image")
            for values, q in zip(data, questions):
                image = images.load(q.dataset_name, q.image_id)
                values.append(wandb.Image(image) if image is not None else None)
        run.log({key: wandb.Table(columns=columns, data=data)})
    except Exception as e:  # a dead W&B service must not fail a finished evaluation
        stop_is_not_a_wandb_failure(e)
        log.warning("W&B: could not log %s (%s: %s); predictions.jsonl has every row", key, type(e).__name__, e)
        return False
    return True


def log_sweep_run(
    spec: Any, sweep_dir: str | os.PathLike, table: Any, counts: dict, trial_cfg: Optional[DictConfig] = None
) -> bool:
    """The W&B run of a local sweep (job_type sweep, id and group the sweep's name, files under
    `<sweep_dir>/wandb/`): the sweep file as its config, the comparison as the `sweep/trials` table, the trial counts
    and the best trial in its summary. Its trials are runs of their own command's job_type in the same group.
    `trial_cfg` (the config a trial composes to, None for another program) gives the W&B switch, mode, project and
    entity, so the sweep's run goes where its trials go and not at all when they log nothing; without it
    WANDB_MODE and the sweep file's project decide. A W&B failure is one warning (comparison.csv has everything).
    True when logged."""
    if trial_cfg is not None and not trial_cfg.logger.wandb.enabled:
        return False
    mode = wandb_mode(trial_cfg)
    if mode == "disabled":
        return False
    import wandb

    finish_active_run()
    if trial_cfg is not None:
        project, entity = trial_cfg.logger.wandb.project, trial_cfg.logger.wandb.entity
    else:  # as the W&B backend's sweep
        project, entity = spec.raw.get("project") or "qkvqa", spec.raw.get("entity")
    summary: dict = {f"trials/{k}": v for k, v in counts.items()}
    best = table.records[0] if table.records and table.metric else None
    if best is not None and best.get("best_value") is not None:
        summary.update(
            {
                "best/run_id": best.get("run_id"),
                "best/value": best.get("best_value"),
                "metric": table.metric,
                "goal": table.goal,
            }
        )
    try:
        run = wandb.init(
            project=project,
            entity=entity,
            id=f"sweep-{spec.name}",
            name=spec.name,
            group=spec.name,
            job_type="sweep",
            dir=str(sweep_dir),
            mode=mode,
            resume="allow",
            config={k: v for k, v in spec.raw.items() if k != "command"} | {"command": spec.command},
        )
        columns = list(table.columns)
        run.log(
            {
                "sweep/trials": wandb.Table(
                    columns=columns, data=[[_table_cell(r.get(c)) for c in columns] for r in table.records]
                )
            }
        )
        run.summary.update(summary)
        run.finish()
    except Exception as e:  # a dead W&B service must not fail a finished sweep
        stop_is_not_a_wandb_failure(e)
        log.warning(
            "W&B: could not log the sweep run (%s: %s); %s/comparison.csv has every trial",
            type(e).__name__,
            e,
            sweep_dir,
        )
        return False
    return True


def _table_cell(value: Any) -> Any:
    """A comparison value as a wandb.Table cell: numbers and text as they are, anything else as its JSON text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    import json

    return json.dumps(value, sort_keys=True, default=str)
