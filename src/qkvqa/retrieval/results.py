"""Retrieval results files keyed by data_id: written in OMGM's layout, read in OMGM's or EchoSight's.

OMGM (written): `{data_id: {"retrieved_entities": [{"url", "title"}, ...], "retrieval_similarities": [...]}}`.
EchoSight (read): `{data_id: {"retrieved_entries": [url, ...], "retrieval_similarities": [...], ...}}`.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from qkvqa.errors import DataError
from qkvqa.utils.io import read_description, write_described


@dataclass
class Retrieved:
    """The ranked articles of one question: URLs, titles (None when the file has none) and similarities."""

    urls: list[str] = field(default_factory=list)
    titles: list[Optional[str]] = field(default_factory=list)
    similarities: list[float] = field(default_factory=list)

    def to_omgm(self) -> dict:
        """The OMGM step-1 value of this question."""
        return {
            "retrieved_entities": [{"url": u, "title": t} for u, t in zip(self.urls, self.titles)],
            "retrieval_similarities": [float(s) for s in self.similarities],
        }


def write_results(
    path: str | os.PathLike, results: Mapping[str, Retrieved], stage1_text: Optional[dict] = None
) -> Path:
    """Write results in the OMGM layout, atomically; returns the path. `stage1_text`: what the searched index
    embedded (`retrieve.index_text_source`), kept in the sidecar `NAME.meta.json` with the file's sha256, so that an
    evaluation reading the file (retrieval.results) knows its stage 1 instead of assuming it."""
    path = Path(path)
    write_described(
        path,
        json.dumps({qid: r.to_omgm() for qid, r in results.items()}, ensure_ascii=False),
        None if stage1_text is None else {"stage1_text": stage1_text},
    )
    return path


def read_results_stage1(path: str | os.PathLike) -> Optional[dict]:
    """What stage 1 embedded for a results file, from the sidecar `qkvqa retrieve` wrote; None for a file without
    one (OMGM's, EchoSight's, an older qkvqa's). DataError when the sidecar describes another version of it."""
    meta = read_description(
        path,
        fix="run `qkvqa retrieve` again to write both, or delete the .meta.json to use the file as of unknown stage 1",
    )
    return None if meta is None else meta.get("stage1_text")


def _entry(path: Path, qid: str, value: object) -> Retrieved:
    def fail(problem: str) -> DataError:
        return DataError(f"{path}: data_id {qid!r}: {problem}")

    if not isinstance(value, dict):
        raise fail(f"expected an object, found {type(value).__name__}")
    if "retrieved_entities" in value:
        entries = value["retrieved_entities"]
    elif "retrieved_entries" in value:
        entries = value["retrieved_entries"]
    else:
        raise fail("neither 'retrieved_entities' (OMGM) nor 'retrieved_entries' (EchoSight) is present")
    if not isinstance(entries, list):
        raise fail("the retrieved list is not a list")
    urls, titles = [], []
    for entry in entries:
        if isinstance(entry, str):
            urls.append(entry)
            titles.append(None)
        elif isinstance(entry, dict) and isinstance(entry.get("url"), str):
            urls.append(entry["url"])
            titles.append(entry.get("title"))
        else:
            raise fail(f"a retrieved entry must be a URL or an object with 'url', found {json.dumps(entry)[:80]}")
    similarities = value.get("retrieval_similarities", [])
    if not isinstance(similarities, list) or len(similarities) != len(urls):
        raise fail(f"'retrieval_similarities' must be a list as long as the {len(urls)} retrieved entries")
    try:
        similarities = [float(s) for s in similarities]
    except (TypeError, ValueError):
        raise fail("'retrieval_similarities' holds a value that is not a number") from None
    return Retrieved(urls, titles, similarities)


def read_results(path: str | os.PathLike) -> dict[str, Retrieved]:
    """Read a results file in the OMGM or EchoSight layout (DataError naming the file and data_id when malformed)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: retrieval results file not found")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}: line {e.lineno}: malformed JSON ({e.msg})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected an object keyed by data_id, found {type(data).__name__}")
    return {str(qid): _entry(path, str(qid), value) for qid, value in data.items()}


def check_coverage_of(path, covered_ids, questions, min_share: float, key: str) -> None:
    """Refuse a results file that covers less than `min_share` of `questions` (one line: the file, the counts,
    the first missing ids and the fix); log how many it covers otherwise."""
    from qkvqa.errors import DataError
    from qkvqa.utils.logging import get_logger

    ids = [q.data_id for q in questions]
    missing = [qid for qid in ids if qid not in covered_ids]
    share = 1.0 - len(missing) / len(ids) if ids else 1.0
    if share < min_share:
        raise DataError(
            f"{path}: results for {len(ids) - len(missing)} of the split's {len(ids)} questions "
            f"({100 * share:.1f}%, below {key}={min_share}); first missing: {missing[:5]}. Check that "
            f"the file belongs to this split and data_id scheme, or lower {key}"
        )
    get_logger(__name__).info("%s: results for %d of %d questions", path, len(ids) - len(missing), len(ids))
