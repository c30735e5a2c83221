"""Progress of long loops: a tqdm bar on a terminal, plain timed lines in a file (SLURM log), rank zero only."""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

from qkvqa.utils.logging import get_logger, global_rank

T = TypeVar("T")
MODES = ("auto", "bar", "lines", "off")
MIN_GAP_S = 1.0  # lines mode: the least gap before a fraction-mark line
ENV_ALIASES = {"0": "off", "false": "off", "no": "off", "1": "auto", "true": "auto", "yes": "auto"}
# logger.progress (schema.ProgressConfig) as set by the running job; None fields follow the environment / defaults
_SETTINGS: dict[str, Any] = {"mode": None, "every_s": 30.0, "every_fraction": 0.1}

log = get_logger("qkvqa.progress")


@contextmanager
def progress_settings(mode: Optional[str] = None, every_s: float = 30.0, every_fraction: float = 0.1) -> Iterator[None]:
    """Use a job's `logger.progress` settings inside the block (restored after it)."""
    previous = dict(_SETTINGS)
    _SETTINGS.update(mode=mode, every_s=float(every_s), every_fraction=float(every_fraction))
    try:
        yield
    finally:
        _SETTINGS.clear()
        _SETTINGS.update(previous)


def progress_mode() -> str:
    """bar, lines or off: logger.progress.mode, else QKVQA_PROGRESS (0 = off, 1 = auto, bar, lines), else auto.

    auto gives bars when stdout and stderr are both terminals, and plain lines otherwise (a SLURM log,
    `> log.txt`): a bar written to a file shows nothing until the loop ends, or a blur of carriage returns."""
    from qkvqa.errors import ConfigError

    raw = _SETTINGS["mode"] or os.environ.get("QKVQA_PROGRESS") or "auto"
    mode = ENV_ALIASES.get(str(raw).strip().lower(), str(raw).strip().lower())
    if mode not in MODES:
        source = "logger.progress.mode" if _SETTINGS["mode"] else "QKVQA_PROGRESS"
        raise ConfigError(f"{source}={raw!r} is not one of {', '.join(MODES)} (or 0 / 1)")
    if mode == "auto":
        return "bar" if _is_terminal(sys.stdout) and _is_terminal(sys.stderr) else "lines"
    return mode


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def line_every_s() -> float:
    """Lines mode: the longest gap between two lines, in seconds."""
    return float(_SETTINGS["every_s"])


def line_every_fraction() -> float:
    """Lines mode: a line at each such fraction of a loop of known length (0.1: at 10%, 20%, ...)."""
    return float(_SETTINGS["every_fraction"])


def progress(
    iterable: Optional[Iterable[T]] = None, *, desc: str = "", total: Optional[int] = None, unit: str = "it", **kwargs
):
    """Wrap a long loop: a tqdm bar, plain lines (`ProgressLines`) or nothing, by `progress_mode()`; silent off rank 0."""
    from tqdm.auto import tqdm

    mode = progress_mode()
    if global_rank() != 0 or mode == "off":
        return tqdm(iterable, desc=desc, total=total, unit=unit, disable=True, **kwargs)
    if mode == "lines":
        return ProgressLines(iterable, desc=desc, total=total, unit=unit, **kwargs)
    return tqdm(iterable, desc=desc, total=total, unit=unit, dynamic_ncols=True, mininterval=0.5, **kwargs)


def format_seconds(seconds: float) -> str:
    """H:MM:SS."""
    seconds = int(round(max(seconds, 0.0)))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


def format_rate(rate: float) -> str:
    """A rate: three significant digits, whole numbers from 100 on."""
    return f"{rate:,.0f}" if rate >= 100 else f"{rate:.3g}"


def format_count(n: float, unit_scale: bool = False) -> str:
    """A count; with `unit_scale`, in k / M / G / T (bytes of a KB file)."""
    if not unit_scale:
        return f"{n:,.0f}" if float(n).is_integer() else f"{n:,.1f}"
    for prefix in ("", "k", "M", "G", "T"):
        if abs(n) < 1000 or prefix == "T":
            return f"{n:.3g}{prefix}"
        n /= 1000.0
    return str(n)


class ProgressLines:
    """The part of tqdm's interface qkvqa's loops use (iterate, `update`, `set_postfix`, `close`, `with`), printing
    one log line at least every `every_s` seconds and at every `every_fraction` of `total`, plus one at the end:

        [12:00:30 INFO qkvqa.progress] rerank val: 120/410 question (29%) | 3.9 question/s | 0:00:31 elapsed | ETA 0:01:14

    `fields` (a callable returning strings) adds loop-specific parts, evaluated only when a line is printed."""

    def __init__(
        self,
        iterable: Optional[Iterable[T]] = None,
        desc: str = "",
        total: Optional[float] = None,
        unit: str = "it",
        initial: float = 0,
        unit_scale: bool = False,
        every_s: Optional[float] = None,
        every_fraction: Optional[float] = None,
        fields: Optional[Callable[[], list[str]]] = None,
        emit: Optional[Callable[[str], None]] = None,
        **_tqdm_only: Any,
    ):
        if total is None and iterable is not None and hasattr(iterable, "__len__"):
            total = len(iterable)  # type: ignore[arg-type]
        self.iterable, self.desc, self.total, self.unit = iterable, desc, total, unit
        self.n = self.initial = initial
        self.unit_scale = unit_scale
        self.every_s = line_every_s() if every_s is None else float(every_s)
        self.every_fraction = line_every_fraction() if every_fraction is None else float(every_fraction)
        self.fields = fields
        self.postfix: dict[str, Any] = {}
        self._emit = emit or log.info
        self.start = self._last_time = time.monotonic()
        self._last_n: Optional[float] = None
        self._next_mark = self.every_fraction if self.every_fraction > 0 else math.inf
        if self.total:
            while self._next_mark <= (self.n / self.total) + 1e-12:
                self._next_mark += self.every_fraction
        self.closed = False

    def __iter__(self):
        for item in self.iterable if self.iterable is not None else ():
            yield item
            self.update(1)
        self.close()

    def __len__(self) -> int:
        return int(self.total or 0)

    def __enter__(self) -> "ProgressLines":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def update(self, n: float = 1) -> None:
        """Advance by `n` units; print a line when one is due."""
        self.advance_to(self.n + n)

    def advance_to(self, n: float) -> None:
        """Set the position to `n` units; print a line when one is due."""
        self.n = n
        if self.due():
            self.emit()

    def set_postfix(self, ordered_dict: Optional[dict] = None, refresh: bool = True, **kwargs: Any) -> None:
        """Show `key=value` pairs in the next lines (as tqdm's postfix)."""
        self.postfix = {**(ordered_dict or {}), **kwargs}

    def set_description(self, desc: str = "", refresh: bool = True) -> None:
        self.desc = desc

    def refresh(self) -> None:
        """tqdm's redraw; lines are printed when due, so nothing to do."""

    def due(self, now: Optional[float] = None) -> bool:
        """A line is due: `every_s` passed since the last one, or the position crossed the next fraction mark at
        least MIN_GAP_S after the last line (a loop of a second prints its end line only, not ten)."""
        now = time.monotonic() if now is None else now
        gap = now - self._last_time
        if self.every_s > 0 and gap >= self.every_s:
            return True
        return bool(self.total) and gap >= MIN_GAP_S and self.n / self.total >= self._next_mark - 1e-12

    def line(self, now: Optional[float] = None, done: bool = False) -> str:
        """The progress line at the current position."""
        now = time.monotonic() if now is None else now
        elapsed = now - self.start
        count = format_count(self.n, self.unit_scale)
        if self.total:
            head = (
                f"{count}/{format_count(self.total, self.unit_scale)} {self.unit} ({100.0 * self.n / self.total:.0f}%)"
            )
        else:
            head = f"{count} {self.unit}"
        parts = [f"{self.desc}: {head}" if self.desc else head]
        done_here = self.n - self.initial
        rate = done_here / elapsed if elapsed > 0 else 0.0
        if done_here > 0 and elapsed > 0:
            parts.append(f"{format_count(rate, True) if self.unit_scale else format_rate(rate)} {self.unit}/s")
        if self.fields is not None:
            parts += [f for f in self.fields() if f]
        if self.postfix:
            parts.append(", ".join(f"{k}={v}" for k, v in self.postfix.items()))
        parts.append(f"{format_seconds(elapsed)} elapsed")
        if done:
            parts.append("done")
        elif self.total and rate > 0:
            parts.append(f"ETA {format_seconds(max(self.total - self.n, 0) / rate)}")
        else:
            parts.append("ETA ?")
        return " | ".join(parts)

    def emit(self, done: bool = False) -> None:
        """Print the line now and restart the timers."""
        now = time.monotonic()
        self._emit(self.line(now, done))
        self._last_time, self._last_n = now, self.n
        if self.total:
            while self._next_mark <= self.n / self.total + 1e-12:
                self._next_mark += self.every_fraction

    def close(self) -> None:
        """The last line (unless the position was just printed)."""
        if self.closed:
            return
        self.closed = True
        if self.n != self._last_n and self.n > self.initial:
            self.emit(done=self.total is not None and self.n >= self.total)
