"""The doctor's findings: one row per check, rendered as one table or JSON; a failed row is blocking."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Iterable

# ok: fine; warn: works, but look (counted skips under the bound, an unpinned revision); todo: an artefact a later
# command writes (index, trained QFF); fail: the run would stop or give wrong numbers (exit status 1)
STATUSES = ("ok", "warn", "todo", "fail")


@dataclass
class Check:
    """One finding: its area (paths, questions, kb, ...), the thing checked, a status and one line of detail."""

    area: str
    item: str
    status: str
    detail: str

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status {self.status!r} is not one of {STATUSES}")
        self.detail = " ".join(str(self.detail).split())  # one line, whatever the message held


def blocking(checks: Iterable[Check]) -> list[Check]:
    """The failed checks (any one makes `qkvqa doctor` exit 1)."""
    return [c for c in checks if c.status == "fail"]


def render_table(checks: list[Check]) -> str:
    """The checks as one plain-text table (status, area, item, detail), then a one-line verdict."""
    header = ("status", "area", "item", "detail")
    rows = [(c.status.upper() if c.status == "fail" else c.status, c.area, c.item, c.detail) for c in checks]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    lines = ["  ".join(v.ljust(w) for v, w in zip(r[:3], widths)) + "  " + r[3] for r in [header, *rows]]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 6)
    failed = blocking(checks)
    counts = ", ".join(f"{sum(c.status == s for c in checks)} {s}" for s in STATUSES)
    verdict = (
        f"doctor: {len(failed)} blocking problem(s) ({counts}); fix the FAIL rows first"
        if failed
        else f"doctor: nothing blocking ({counts})"
    )
    return "\n".join(lines + ["", verdict])


def render_json(checks: list[Check], extra: dict | None = None) -> str:
    """The checks as JSON: {"ok": bool, "checks": [...], ...extra}."""
    return json.dumps({"ok": not blocking(checks), "checks": [asdict(c) for c in checks], **(extra or {})}, indent=2)
