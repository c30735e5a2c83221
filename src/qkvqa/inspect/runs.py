"""Read what `qkvqa inspect` shows of a run (its traces, headline metrics, protocol card) and pair two runs."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from qkvqa.errors import ConfigError, DataError
from qkvqa.metrics.analysis import NOT_RETRIEVED, NR_C, NR_W, R1_C, R1_W
from qkvqa.pipeline.traces import TRACE_VERSION, TRACES

TRACE_VERSIONS = (TRACE_VERSION,)  # the trace versions this page reads
# The Table 3 categories of a trace (qkvqa.metrics.analysis.error_category), in the order the page lists them.
CATEGORIES = (R1_C, R1_W, NR_C, NR_W, NOT_RETRIEVED)


@dataclass
class RunTraces:
    """One evaluation run as the site shows it."""

    run_dir: Path
    run_id: str
    traces: list[dict]
    scores: dict = field(default_factory=dict)  # scores.json (empty when absent)
    status: dict = field(default_factory=dict)  # status.json (empty when absent)

    @property
    def card(self) -> Optional[dict]:
        """The protocol card of the evaluation, when its scores record one."""
        return self.scores.get("protocol")

    def ids(self) -> list[str]:
        return [t["data_id"] for t in self.traces]

    def correct_ids(self) -> set[str]:
        return {t["data_id"] for t in self.traces if (t.get("verdict") or {}).get("correct")}


def _read_json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: malformed JSON ({e}); rerun `qkvqa score run {path.parent}` to rewrite it") from None


def read_traces(path: Path) -> list[dict]:
    """Every trace of a traces.jsonl, checked: one JSON object a line with a known trace_version and a data_id, no
    data_id twice."""
    from qkvqa.utils.io import iter_jsonl

    traces, seen = [], {}
    try:
        for lineno, row in iter_jsonl(path):
            if not isinstance(row, dict):
                raise DataError(f"{path}: line {lineno}: a trace must be a JSON object")
            version = row.get("trace_version")
            if version not in TRACE_VERSIONS:
                raise DataError(
                    f"{path}: line {lineno}: field trace_version is {version!r}, this qkvqa reads "
                    f"{', '.join(map(str, TRACE_VERSIONS))}; upgrade qkvqa, or rerun `qkvqa evaluate`"
                )
            data_id = row.get("data_id")
            if not isinstance(data_id, str):
                raise DataError(f"{path}: line {lineno}: field data_id is missing or not a string")
            if data_id in seen:
                raise DataError(
                    f"{path}: line {lineno}: field data_id {data_id!r} repeats line {seen[data_id]}; "
                    "rerun `qkvqa evaluate` with the same run_id to rewrite the traces"
                )
            seen[data_id] = lineno
            traces.append(row)
    except ValueError as e:  # iter_jsonl's malformed line or bad bytes, named by file and line
        if isinstance(e, DataError):
            raise
        raise DataError(str(e)) from None
    return traces


def load_run(run_dir: str | Path) -> RunTraces:
    """The traces, scores and status of an evaluation run directory (`checkpoints/<run_id>/`)."""
    run_dir = Path(run_dir).expanduser().resolve()
    if not run_dir.is_dir():
        raise ConfigError(
            f"{run_dir}: no such run directory; give an evaluation run's directory, e.g. checkpoints/<run_id>"
        )
    status = _read_json(run_dir / "status.json")
    run_id = status.get("run_id") or run_dir.name
    path = run_dir / TRACES
    if not path.is_file():
        state = status.get("state")
        why = (
            f"the run is {state}, not finished"
            if state and state != "finished"
            else "the run predates traces or has not finished"
        )
        if status.get("command") not in (None, "evaluate"):
            why = f"it is a `{status['command']}` run, not an evaluation"
        raise DataError(
            f"{path}: missing ({why}); rerun `qkvqa evaluate` with the same experiment and "
            f"run_id={run_id} resume=auto (it resumes, answers what is left and writes {TRACES}; a "
            f"finished run is only re-scored, as `qkvqa score run {run_dir}` does)"
        )
    traces = read_traces(path)
    if not traces:
        raise DataError(f"{path}: no traces; rerun `qkvqa evaluate` with run_id={run_id} resume=auto")
    return RunTraces(run_dir, run_id, traces, _read_json(run_dir / "scores.json"), status)


def pair_runs(a: RunTraces, b: RunTraces) -> list[int]:
    """For each of `a`'s traces, the position of the same question in `b`; ConfigError when the two runs evaluated
    different question sets (or datasets / splits), which no flip count could mean anything over."""

    def where(run: RunTraces) -> set[tuple]:
        return {(t.get("dataset"), t.get("split")) for t in run.traces}

    ids_a, ids_b = a.ids(), b.ids()
    only_a = [q for q in ids_a if q not in set(ids_b)]
    only_b = [q for q in ids_b if q not in set(ids_a)]
    if only_a or only_b or where(a) != where(b):
        example = (only_a or only_b or [""])[0]
        raise ConfigError(
            f"{b.run_dir / TRACES}: --compare needs two runs over the same questions, but {a.run_id} and {b.run_id} "
            f"differ ({len(only_a)} questions only in {a.run_id}, {len(only_b)} only in {b.run_id}"
            + (f", e.g. {example!r}" if example else "")
            + f"; dataset/split {sorted(map(str, where(a)))} vs {sorted(map(str, where(b)))}); compare two "
            "evaluations of the same dataset, split and question selection (data.* keys), or inspect each alone"
        )
    position = {q: i for i, q in enumerate(ids_b)}
    return [position[q] for q in ids_a]


def flips(a: RunTraces, b: RunTraces) -> dict[str, int]:
    """Questions right in `a` and wrong in `b` and the reverse: the differences of the two correct sets."""
    ca, cb = a.correct_ids(), b.correct_ids()
    return {
        "right_to_wrong": len(ca - cb),
        "wrong_to_right": len(cb - ca),
        "both_right": len(ca & cb),
        "both_wrong": len(set(a.ids()) - ca - cb),
    }


def headline(run: RunTraces) -> dict[str, Any]:
    """The run's headline metrics (its scores.json; the trace counts when it has none)."""
    s = run.scores
    before, after = s.get("recall_before_filter") or {}, s.get("recall_after_filter") or {}
    n = len(run.traces)
    correct = len(run.correct_ids())
    out = {
        "questions": n,
        "correct": correct,
        "accuracy": s.get("accuracy") if s.get("accuracy") is not None else (100.0 * correct / n if n else None),
        "skipped": s.get("n_skipped", sum(1 for t in run.traces if t.get("skipped"))),
        "judge": (s.get("benchmark") or {}).get("label"),
        "answer in context %": s.get("answer_in_context"),
        "section R@1": (s.get("section_recall") or {}).get("evidence_section_recall@1"),
    }
    seen_unseen = (s.get("benchmark") or {}).get("seen_unseen") or {}
    for name in ("seen", "unseen"):  # E-VQA: gold article also a training question's, or not
        if (seen_unseen.get(name) or {}).get("n"):
            out[f"accuracy {name}"], out[f"n {name}"] = seen_unseen[name]["accuracy"], seen_unseen[name]["n"]
    for k in (1, 5, 10, 20):
        if f"recall@{k}" in before:
            out[f"R@{k} stage 1"] = before[f"recall@{k}"]
        if f"recall@{k}" in after:
            out[f"R@{k} filtered"] = after[f"recall@{k}"]
    ea = s.get("error_analysis") or {}
    for key in ("r1_c", "nr_c"):
        if ea.get(key) is not None:
            out[key.upper().replace("_", "-")] = ea[key]
    return out
