"""Scorer inputs given as a JSONL path or as a list of dicts, with errors that name the file, line and field."""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping, Union

from qkvqa.errors import DataError
from qkvqa.utils.io import iter_jsonl

Rows = Union[str, os.PathLike, Iterable[Mapping[str, Any]]]


def load_rows(source: Rows, what: str) -> list[tuple[str, Mapping[str, Any]]]:
    """(where, row) pairs from a JSONL file or an iterable of dicts; `where` reads `file:line` or `what[i]`."""
    if isinstance(source, (str, os.PathLike)):
        try:
            rows = [(f"{source}:{lineno}", row) for lineno, row in iter_jsonl(source)]
        except FileNotFoundError as e:
            raise DataError(f"{what}: no file at {source}") from e
        except ValueError as e:
            raise DataError(str(e)) from e
    else:
        rows = [(f"{what}[{i}]", row) for i, row in enumerate(source)]
    for where, row in rows:
        if not isinstance(row, Mapping):
            raise DataError(f"{where}: expected a JSON object, got {type(row).__name__}")
    return rows


def field(row: Mapping[str, Any], key: str, where: str) -> Any:
    """`row[key]`, or a DataError naming the place and the missing field."""
    try:
        return row[key]
    except KeyError:
        raise DataError(f"{where}: missing field {key!r} (fields present: {sorted(row)})") from None


def is_skipped(row: Mapping[str, Any]) -> bool:
    """A prediction row that qkvqa could not answer (its `skipped` field gives the reason).

    qkvqa's rule, shared by `evaluate`, `score` and `retrieve`: every question of the split counts, and
    an unanswered one is wrong, whatever the official scorer would make of its empty prediction (InfoSeek
    reads "" as the number 0, which a range holding 0 accepts)."""
    return bool(row.get("skipped"))
