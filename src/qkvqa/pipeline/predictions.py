"""Prediction files of an evaluation run: per-rank append-only parts, resume, and an exactly-once merge."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Iterable, Sequence

from qkvqa.errors import DataError
from qkvqa.pipeline.traces import TRACE_KEY
from qkvqa.utils.io import append_jsonl, atomic_write_text, cut_torn_tail

PARTS_DIR = "predictions.parts"
MERGED = "predictions.jsonl"


class PredictionStore:
    """`<run_dir>/predictions.parts/rank{r}.jsonl` while running, `<run_dir>/predictions.jsonl` when merged.

    Each rank appends (and fsyncs) its rows as soon as a batch is answered, so a killed run loses at
    most the batch in flight; a restart reads every part and skips the questions already answered.
    A part row also carries the question's trace stage record (TRACE_KEY) in the same line, so a prediction and
    its trace are written, lost and merged together.
    """

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.parts = self.run_dir / PARTS_DIR

    def part(self, rank: int) -> Path:
        """The append-only file of one rank."""
        return self.parts / f"rank{rank}.jsonl"

    def append(self, rank: int, rows: Iterable[dict]) -> None:
        """Append answered rows of this rank (after cutting a row torn by a kill, which would glue onto the next)."""
        self.parts.mkdir(parents=True, exist_ok=True)
        cut_torn_tail(self.part(rank))
        append_jsonl(self.part(rank), rows)

    def rows(self) -> list[dict]:
        """Every row of every part (a torn last line from a crash is ignored)."""
        out = []
        for part in sorted(self.parts.glob("rank*.jsonl")) if self.parts.is_dir() else []:
            lines = part.read_text(encoding="utf-8").splitlines()
            for lineno, line in enumerate(lines, 1):
                if not line.strip():
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    if lineno != len(lines):
                        raise DataError(f"{part}: line {lineno}: malformed prediction row") from None
        return out

    def done_ids(self) -> set[str]:
        """Question ids that already have a prediction (from any rank, any attempt)."""
        return {row["data_id"] for row in self.rows()}

    def merge(self, expected_ids: Sequence[str]) -> list[dict]:
        """Write predictions.jsonl with exactly one row per expected id, in the expected order.

        Rows repeated by a restart or by padding keep their first occurrence; a missing or unknown
        id is an error, so a report never scores a partial or foreign set. The returned rows keep their trace
        stage record (TRACE_KEY) for `qkvqa.pipeline.traces.build_traces`; predictions.jsonl holds none.
        """
        first: dict[str, dict] = {}
        counts = Counter()
        for row in self.rows():
            counts[row["data_id"]] += 1
            first.setdefault(row["data_id"], row)
        expected = list(expected_ids)
        missing = [q for q in expected if q not in first]
        unknown = sorted(set(first) - set(expected))
        if missing or unknown:
            raise DataError(
                f"{self.parts}: {len(missing)} expected questions have no prediction (first: "
                f"{missing[:5]}) and {len(unknown)} predictions are for unknown ids (first: {unknown[:5]})"
            )
        rows = [first[q] for q in expected]
        atomic_write_text(
            self.run_dir / MERGED,
            "".join(
                json.dumps({k: v for k, v in r.items() if k != TRACE_KEY}, ensure_ascii=False) + "\n" for r in rows
            ),
        )
        return rows

    def duplicates(self) -> int:
        """How many rows repeat an id already answered (restarts, padding)."""
        counts = Counter(row["data_id"] for row in self.rows())
        return sum(c - 1 for c in counts.values())
