"""Runs every doctor check on a composed config, in order, each failure one row (no check stops the others)."""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from qkvqa.doctor.report import Check


def run_doctor(
    cfg: Any,
    load: bool = False,
    device: Optional[str] = None,
    splits: Optional[list[str]] = None,
    open_images: Optional[int] = None,
) -> list[Check]:
    """Every check of `qkvqa doctor` for `cfg`: paths, questions and query images of the task's splits, the KB store,
    KB images per CSV, the index, the models (with `load`: on the meta device, or on `device` with one forward), the
    GPU and faiss, the disk. Returns the rows; a `fail` row is blocking."""
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.data.config import data_config_from_dict, for_evaluation
    from qkvqa.doctor import data, models, system

    start = time.perf_counter()
    quiet = logging.getLogger("qkvqa")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # the checks' own progress and info lines would bury the table
    try:
        splits = splits or data.splits_read(cfg)
        checks = data.path_checks(cfg, splits)
        try:
            config = data_config_from_dict(cfg.data)
            dm = build_benchmark(for_evaluation(config) if cfg.task == "evaluate" else config)
        except Exception as e:
            return checks + [Check("data", "config", "fail", data._err(e))]
        kwargs = {} if open_images is None else {"open_images": open_images}
        checks += _guarded("questions", "read", lambda: data.question_checks(dm, splits, **kwargs))
        kb, store = data.kb_checks(dm)
        checks += kb
        counts: dict = {}

        def images() -> list[Check]:
            rows, found = data.kb_image_checks(dm, store)
            counts.update(found)
            return rows

        checks += _guarded("kb images", "CSVs", images)
        checks += _guarded("index", cfg.retrieval.mode, lambda: data.index_checks(cfg, dm, store))
        names = models.used_models(cfg)
        checks += _guarded("models", "components", lambda: models.model_checks(cfg, names))
        if load:
            checks += _guarded("models", "load", lambda: models.load_checks(cfg, names, device or "meta"))
        checks += _guarded("gpu", "status", lambda: system.gpu_checks(cfg, names))
        questions = sum(len(dm._questions.get(s, ())) for s in splits)
        checks += _guarded(
            "disk", "estimate", lambda: system.disk_checks(cfg, dm, store, questions, counts.get("kb_images", 0))
        )
    finally:
        quiet.setLevel(level)
    checks.append(Check("doctor", "time", "ok", f"{time.perf_counter() - start:.1f}s"))
    return checks


def _guarded(area: str, item: str, run: Callable[[], list[Check]]) -> list[Check]:
    """The rows of one group of checks, or one FAIL row naming what stopped it (no group stops the others)."""
    from qkvqa.doctor.data import _err

    try:
        return run()
    except Exception as e:
        return [Check(area, item, "fail", _err(e))]
