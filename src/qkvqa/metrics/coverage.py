"""Coverage of a prediction file against its reference ids: missing, unknown and duplicate ids."""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Sequence

from qkvqa.errors import DataError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

# How many ids of each kind a report or an error message lists.
SHOWN_IDS = 5


def coverage_report(prediction_ids: Sequence[str], reference_ids: Iterable[str]) -> dict:
    """Count and list the reference ids without a prediction, the predicted ids that are not references,
    and the ids predicted more than once (each counted once, with its number of extra copies)."""
    reference_set = set(reference_ids)
    counts = Counter(prediction_ids)
    missing = sorted(reference_set - counts.keys())
    unknown = sorted(counts.keys() - reference_set)
    duplicated = sorted(qid for qid, n in counts.items() if n > 1)
    return {
        "n_references": len(reference_set),
        "n_predictions": len(prediction_ids),
        "n_missing": len(missing),
        "n_unknown": len(unknown),
        "n_duplicated_ids": len(duplicated),
        "n_extra_copies": sum(counts[qid] - 1 for qid in duplicated),
        "missing_ids": missing[:SHOWN_IDS],
        "unknown_ids": unknown[:SHOWN_IDS],
        "duplicated_ids": duplicated[:SHOWN_IDS],
    }


def is_complete(report: dict) -> bool:
    """True when every reference id has exactly one prediction and no prediction is unknown."""
    return report["n_missing"] == report["n_unknown"] == report["n_duplicated_ids"] == 0


def describe(report: dict) -> str:
    """One line naming each coverage problem with its count and its first few ids."""
    parts = []
    for kind, count_key, ids_key in (
        ("missing", "n_missing", "missing_ids"),
        ("unknown", "n_unknown", "unknown_ids"),
        ("duplicated", "n_duplicated_ids", "duplicated_ids"),
    ):
        if report[count_key]:
            more = ", ..." if report[count_key] > len(report[ids_key]) else ""
            parts.append(f"{report[count_key]} {kind} id(s) ({', '.join(report[ids_key])}{more})")
    return "; ".join(parts) if parts else "complete"


def check_coverage(report: dict, what: str, strict: bool) -> None:
    """Under `strict`, raise DataError (a ValueError) when coverage is incomplete; otherwise log the gaps."""
    if is_complete(report):
        return
    message = f"{what}: predictions do not cover the references one-to-one: {describe(report)}"
    if strict:
        raise DataError(message)
    log.warning("%s (scored anyway; see the result's `coverage`)", message)
