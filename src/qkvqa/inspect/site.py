"""Build the inspect site of a run (or of two, compared): index.html, a compact index, trace shards, thumbnails.

The site is static and works opened from file:// (Chromium refuses fetch() there), so every data file is a
script that hands its JSON to a global: `data/meta.js` (the runs' protocol cards, headline metrics, plot data),
`data/index.js` (one short array per question: the table's columns) and `data/<a|b>/NNNNN.js` (the full traces of
`shard_size` questions, loaded when one of them is opened). Layout and page: docs/inspect.md.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Optional, Sequence

from qkvqa.inspect.runs import CATEGORIES, RunTraces, flips, headline, load_run, pair_runs
from qkvqa.inspect.thumbs import make_thumb, thumb_name
from qkvqa.utils.io import atomic_write_text
from qkvqa.utils.logging import get_logger
from qkvqa.utils.owned_dir import OwnedDir
from qkvqa.utils.progress import progress

log = get_logger(__name__)

SHARD_SIZE = 500
SITE_MARKER = ".qkvqa-inspect-site"  # in a site's folder: the files the last build wrote (and the only ones served)
STATIC = ("index.html", "app.js", "style.css")
PREDICTION_CHARS = 120  # the table shows this much of a prediction; the question view shows all of it
# index.js: one array per question, in these columns (the b_* ones only in compare mode; ranks 1-based, 0 = absent;
# correct and aic 1 / 0, -1 when unknown: a run stopped after the filter has no verdict)
COLUMNS = (
    "data_id",
    "question",
    "type",
    "split",
    "correct",
    "category",
    "aic",
    "before",
    "after",
    "prediction",
    "skipped",
    "score",
    "gold",
)  # gold: the reference answers, " | " between alternatives
COMPARE_COLUMNS = ("b_pos", "b_correct", "b_after", "b_prediction")


@dataclass
class Site:
    """What `build_site` wrote."""

    out: Path
    index_html: Path
    questions: int
    shards: int
    thumbs: int
    seconds: float
    flips: Optional[dict] = None


def _js(name: str, value) -> str:
    """A script that assigns `value` (as JSON) to window.<name>."""
    return f"window.{name} = {json.dumps(value, ensure_ascii=False, separators=(',', ':'))};\n"


class _Codes:
    """Dictionary codes for a column's repeated strings (question types, splits, categories)."""

    def __init__(self, initial: Sequence[str] = ()):
        self.names: list[str] = list(initial)

    def __call__(self, value: Optional[str]) -> int:
        if value is None:
            return -1
        if value not in self.names:
            self.names.append(value)
        return self.names.index(value)


def _rank(value) -> int:
    return int(value) if isinstance(value, int) and value > 0 else 0


def _flag(value) -> int:
    return -1 if value is None else int(bool(value))


def index_rows(a: RunTraces, b: Optional[RunTraces] = None, pairing: Optional[list[int]] = None) -> dict:
    """The table's compact index: column names, dictionary codes and one array per question of `a` (with `b`'s
    verdict and gold rank beside it in compare mode)."""
    types, splits, categories = _Codes(), _Codes(), _Codes(CATEGORIES)
    rows = []
    for i, t in enumerate(a.traces):
        verdict = t.get("verdict") or {}
        rank = t.get("gold_rank") or {}
        row = [
            t["data_id"],
            t.get("question") or "",
            types(t.get("question_type")),
            splits(t.get("split")),
            _flag(verdict.get("correct")) if t.get("verdict") else -1,
            categories(t.get("category")),
            _flag(t.get("answer_in_context")),
            _rank(rank.get("before")),
            _rank(rank.get("after")),
            (t.get("prediction") or "")[:PREDICTION_CHARS],
            int(bool(t.get("skipped"))),
            verdict.get("score"),
            " | ".join((t.get("gold") or {}).get("answers") or [])[:PREDICTION_CHARS],
        ]
        if b is not None and pairing is not None:
            other = b.traces[pairing[i]]
            row += [
                pairing[i],
                _flag(other["verdict"].get("correct")) if other.get("verdict") else -1,
                _rank((other.get("gold_rank") or {}).get("after")),
                (other.get("prediction") or "")[:PREDICTION_CHARS],
            ]
        rows.append(row)
    columns = list(COLUMNS) + (list(COMPARE_COLUMNS) if b is not None else [])
    return {
        "columns": columns,
        "codes": {"type": types.names, "split": splits.names, "category": categories.names},
        "rows": rows,
    }


def _recall_population(traces: Sequence[dict]) -> list[dict]:
    """The questions Recall@K is measured over: those with a gold article, E-VQA two-hop rows left out (Table 4)."""
    return [
        t
        for t in traces
        if (t.get("gold") or {}).get("urls") and not (t.get("dataset") == "evqa" and t.get("question_type") == "2_hop")
    ]


def recall_curve(traces: Sequence[dict], which: str, k_max: int) -> list[float]:
    """Recall@K in percent for K = 1..k_max from the traces' gold ranks (`which`: before or after the filter); an
    unanswered question or a gold article outside the list is a miss."""
    chosen = _recall_population(traces)
    ranks = [_rank((t.get("gold_rank") or {}).get(which)) for t in chosen]
    return [
        round(100.0 * sum(1 for r in ranks if 0 < r <= k) / len(ranks), 3) if ranks else 0.0
        for k in range(1, k_max + 1)
    ]


def accuracy_by_type(traces: Sequence[dict]) -> dict[str, dict]:
    """Per question type (None as "unknown"): question count and accuracy in percent."""
    out: dict[str, dict] = {}
    for t in traces:
        entry = out.setdefault(t.get("question_type") or "unknown", {"n": 0, "correct": 0})
        entry["n"] += 1
        entry["correct"] += int(bool((t.get("verdict") or {}).get("correct")))
    for entry in out.values():
        entry["accuracy"] = round(100.0 * entry["correct"] / entry["n"], 3)
    return dict(sorted(out.items()))


def _run_meta(run: RunTraces, shard_size: int) -> dict:
    card = run.card
    line = None
    if card:
        from qkvqa.pipeline.protocol import comparability_line

        line = comparability_line(card)
    return {
        "run_id": run.run_id,
        "run_dir": str(run.run_dir),
        "state": run.status.get("state"),
        "finished_at": run.status.get("finished_at"),
        "headline": headline(run),
        "card": card,
        "comparable": line,
        "questions": len(run.traces),
        "shards": -(-len(run.traces) // shard_size),
    }


def plots(a: RunTraces, b: Optional[RunTraces]) -> dict:
    """The page's plot data: Recall@K before and after the filter, accuracy per question type."""
    runs = {"a": a, **({"b": b} if b is not None else {})}
    k_max = max([len(t.get("stage1") or []) for r in runs.values() for t in r.traces] + [1])
    recall = {"k": list(range(1, k_max + 1)), "n": len(_recall_population(a.traces))}
    for key, run in runs.items():
        recall[f"{key}_before"] = recall_curve(run.traces, "before", k_max)
        recall[f"{key}_after"] = recall_curve(run.traces, "after", k_max)
    return {"recall": recall, "accuracy_by_type": {key: accuracy_by_type(run.traces) for key, run in runs.items()}}


def _write_shards(run: RunTraces, key: str, out: Path, shard_size: int, thumbs: dict[str, Optional[str]]) -> set[Path]:
    written = set()
    for shard, start in enumerate(range(0, len(run.traces), shard_size)):
        rows = []
        for t in run.traces[start : start + shard_size]:
            rows.append({**t, "_thumb": thumbs.get(t.get("image") or "")})
        path = out / "data" / key / f"{shard:05d}.js"
        atomic_write_text(
            path,
            f"QKVQA.shard({json.dumps(key)},{shard},{json.dumps(rows, ensure_ascii=False, separators=(',', ':'))});\n",
        )
        written.add(path)
    return written


def _make_thumbs(runs: Sequence[RunTraces], out: Path) -> dict[str, Optional[str]]:
    """image path -> thumbnail file name under thumbs/ (None: missing or unreadable), each image once."""
    images = sorted({t["image"] for run in runs for t in run.traces if t.get("image")})
    names: dict[str, Optional[str]] = {}
    for image in progress(images, desc="inspect thumbnails", unit="image") if len(images) > 200 else images:
        name = thumb_name(image)
        names[image] = name if name and make_thumb(image, out / "thumbs" / name) else None
    return names


def site_dir(out: Path) -> OwnedDir:
    """The site folder `out`: written only when new, empty or holding SITE_MARKER, which lists its files."""
    return OwnedDir(out, SITE_MARKER, "qkvqa inspect --out")


def default_out(run_dir: Path, compare: Optional[Path] = None) -> Path:
    """RUN_DIR/inspect, or RUN_DIR/inspect-vs-<other run's directory name> in compare mode."""
    return run_dir / ("inspect" if compare is None else f"inspect-vs-{compare.name}")


def build_site(
    run_dir: str | Path,
    out: Optional[str | Path] = None,
    compare: Optional[str | Path] = None,
    shard_size: int = SHARD_SIZE,
) -> Site:
    """Write the static site of `run_dir` (compared with the run `compare`) into `out` (default: `default_out`)."""
    from qkvqa.errors import ConfigError

    if shard_size < 1:
        raise ConfigError(f"shard_size must be at least 1, got {shard_size}")
    start = time.perf_counter()
    a = load_run(run_dir)
    b = load_run(compare) if compare is not None else None
    pairing = pair_runs(a, b) if b is not None else None
    out = Path(out).expanduser().resolve() if out else default_out(a.run_dir, b.run_dir if b else None)
    owned = site_dir(out)
    previous = owned.claim()  # a folder of the user's is refused before anything is written
    runs = [a] + ([b] if b is not None else [])
    thumbs = _make_thumbs(runs, out)
    keep = {out / "thumbs" / name for name in thumbs.values() if name}
    keep |= _write_shards(a, "a", out, shard_size, thumbs)
    if b is not None:
        keep |= _write_shards(b, "b", out, shard_size, thumbs)
    counts = flips(a, b) if b is not None else None
    meta = {
        "site_version": 1,
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "shard_size": shard_size,
        "compare": b is not None,
        "runs": {"a": _run_meta(a, shard_size)},
        "plots": plots(a, b),
        "flips": counts,
    }
    if b is not None:
        meta["runs"]["b"] = _run_meta(b, shard_size)
    keep |= {out / "data" / "meta.js", out / "data" / "index.js"}
    atomic_write_text(out / "data" / "meta.js", _js("QKVQA_META", meta))
    atomic_write_text(out / "data" / "index.js", _js("QKVQA_INDEX", index_rows(a, b, pairing)))
    static = resources.files("qkvqa.inspect") / "static"
    for name in STATIC:
        atomic_write_text(out / name, (static / name).read_text(encoding="utf-8"))
    keep |= {out / name for name in STATIC}
    written = {str(path.relative_to(out)) for path in keep}
    owned.record(written)
    owned.remove_old(previous, written)  # shards and thumbnails of an earlier build not written again
    site = Site(
        out,
        out / "index.html",
        len(a.traces),
        sum(1 for p in keep if p.parent.parent.name == "data" and p.parent.parent.parent == out),
        sum(1 for n in set(thumbs.values()) if n),
        time.perf_counter() - start,
        counts,
    )
    log.info("inspect site of %d questions in %.1f s: %s", site.questions, site.seconds, site.index_html)
    return site
