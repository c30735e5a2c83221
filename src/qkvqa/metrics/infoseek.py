"""The official InfoSeek scorer (edchengg/infoseek_eval, metrics.md section 1), quirks included, plus coverage.

Where the official code raises (a reference id missing from the question-type file, a non-str
prediction, an empty `answer_eval`, a malformed numerical range) qkvqa raises too: a DataError, which
is a ValueError, naming the problem and the data_id when known. Nothing is folded silently into a score.
"""

from __future__ import annotations

import re
import string
from typing import Any, Optional, Sequence, Union

from qkvqa.errors import DataError
from qkvqa.metrics.coverage import check_coverage, coverage_report
from qkvqa.metrics.inputs import Rows, field, is_skipped, load_rows
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

PUNCTUATION = frozenset(string.punctuation)
ARTICLES = re.compile(r"\b(a|an|the)\b")

# A number as the official parser finds it; `\d` is Unicode-aware (Arabic-Indic and full-width digits count).
NUMBER = re.compile(r"[-+]?[.]?\d+(?:,\d\d\d)*[.]?\d*(?:[eE][-+]?\d+)?")

IOU_THRESHOLD = 0.5 - 1e-12  # IoU exactly 0.5 passes
LENGTH_EPSILON = 1e-12  # added to every interval length in the IoU
SCALAR_TOLERANCE = 0.1  # only used when the answer is a bare number (never from `evaluate`)
ZERO_SPLIT = 1e-12  # a split score of 0 enters the harmonic mean as this

TIME, NUMERICAL, STRING = "time", "numerical", "string"
UNSEEN_QUESTION, UNSEEN_ENTITY = "unseen_question", "unseen_entity"

Number = Union[float, list]


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower(), delete ASCII punctuation, articles to spaces, collapse whitespace."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in PUNCTUATION)
    text = ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, ground_truth: str) -> bool:
    """Equality after `normalize_answer` (the String and Time rule, for one alias)."""
    return normalize_answer(prediction) == normalize_answer(ground_truth)


def _isolate_range_hyphens(text: str) -> str:
    """Turn every '-' that follows a character with `str.isdigit()` into ' - ' (`9-10` -> `9 - 10`)."""
    return "".join(" - " if ch == "-" and i > 0 and text[i - 1].isdigit() else ch for i, ch in enumerate(text))


def _token_number(token: str) -> Optional[float]:
    """One regex match as the official code converts it, or None where the official code would raise.

    Commas are removed and leading/trailing dots stripped, so `.5` is 5.0 and `-.5` is -0.5. A
    signed token with two dots (`-.5.5`) goes through the official two-dots branch (keep what precedes
    the first dot), which leaves a bare sign that `float()` rejects: the official scorer crashes on it,
    qkvqa skips the token.
    """
    text = token.replace(",", "").strip(".")
    if text.count(".") > 1:
        text = text.split(".")[0]
    try:
        return float(text)
    except ValueError:
        return None


def parse_numerical_answer(text: str) -> Number:
    """The official `process_numerical_answer`: a single float, a range `[lo, hi]`, or `[0, 0]` when no number.

    The first two numbers found form a range when ascending (or equal); a descending pair keeps only
    its first number. Each match is converted by `_token_number`.
    """
    numbers = [n for n in (_token_number(t) for t in NUMBER.findall(_isolate_range_hyphens(text))) if n is not None]
    if len(numbers) >= 2:
        first, second = numbers[0], numbers[1]
        return [first, second] if first <= second else first
    if len(numbers) == 1:
        return numbers[0]
    return [0.0, 0.0]


def numerical_range_match(
    prediction: Number, answer: Union[Sequence[float], float], tolerance: float = SCALAR_TOLERANCE
) -> bool:
    """The official `metric_numerical_range`: relaxed accuracy of a parsed prediction against `[lo, hi]`.

    A single number must lie in `[lo, hi]` (inclusive). A range passes when both ends lie in it, or
    when its IoU with the answer is at least 0.5 (minus 1e-12); the IoU branch uses min/max, so only
    a range prediction can match a reversed answer range. A bare-number answer `a` becomes
    `[a(1-tol), a(1+tol)]`, which is inverted, and so never matches, when `a < 0`.
    """
    if isinstance(answer, (list, tuple)):
        low, high = answer
    else:
        low, high = answer * (1 - tolerance), answer * (1 + tolerance)
    if not isinstance(prediction, (list, tuple)):
        return low <= prediction <= high
    start, end = prediction
    if low <= start <= high and low <= end <= high:
        return True
    min_p, max_p = min(start, end), max(start, end)
    min_a, max_a = min(low, high), max(low, high)
    overlap = max(0.0, min(max_p, max_a) - max(min_p, min_a))
    length_p = max_p - min_p + LENGTH_EPSILON
    length_a = max_a - min_a + LENGTH_EPSILON
    return overlap / (length_p + length_a - overlap) >= IOU_THRESHOLD


def question_kind(question_type: Any) -> str:
    """Route a question type: lower-cased exactly `time` or `numerical`, anything else is `string`."""
    if not isinstance(question_type, str):
        raise DataError(f"question_type must be a str, got {question_type!r}")
    lowered = question_type.lower()
    return lowered if lowered in (TIME, NUMERICAL) else STRING


def reference_range(answer_eval: Any) -> list[str]:
    """The stored range as the official `prepare_qid2example` keeps it: `str` of the first two elements of
    `answer_eval[0]["range"]` (or `answer_eval["range"]` for a bare dict); `wikidata` is ignored."""
    if isinstance(answer_eval, dict):
        entry = answer_eval
    elif isinstance(answer_eval, list) and answer_eval:
        entry = answer_eval[0]
    else:
        raise DataError(f"numerical answer_eval must be a dict or a non-empty list of dicts, got {answer_eval!r}")
    if not isinstance(entry, dict) or not isinstance(entry.get("range"), (list, tuple)):
        raise DataError(f"numerical answer_eval needs a dict with a 'range' list, got {entry!r}")
    return [str(bound) for bound in entry["range"]][:2]


def _range_bounds(stored_range: list[str]) -> tuple[float, float]:
    """The float bounds of a stored range; a one-element or non-numeric range raises (as at official scoring)."""
    if len(stored_range) != 2:
        raise DataError(f"numerical range needs two bounds, got {stored_range!r}")
    try:
        return float(stored_range[0]), float(stored_range[1])
    except ValueError:
        raise DataError(f"numerical range bounds must be numbers, got {stored_range!r}") from None


def _score_prepared(prediction: Any, answer: Any, kind: str) -> int:
    """Score one prediction against a prepared answer (alias list, or stored range for numerical)."""
    return int(any(matched for _, matched in _reference_matches(prediction, answer, kind)))


def _reference_matches(prediction: Any, answer: Any, kind: str) -> list[tuple[str, bool]]:
    """(accepted answer, whether the prediction matches it) per `answer_eval` alias (String/Time), or the one stored
    range written `[lo, hi]` (Numerical); the question is correct iff any matches."""
    if not isinstance(prediction, str):
        raise DataError(f"prediction must be a str, got {type(prediction).__name__} {prediction!r}")
    if kind == NUMERICAL:
        bounds = _range_bounds(answer)
        return [(f"[{answer[0]}, {answer[1]}]", numerical_range_match(parse_numerical_answer(prediction), bounds))]
    if not isinstance(answer, list) or not answer:
        raise DataError(f"answer_eval must be a non-empty list of strings for {kind} questions, got {answer!r}")
    if not all(isinstance(alias, str) for alias in answer):
        raise DataError(f"answer_eval must hold strings for {kind} questions, got {answer!r}")
    return [(alias, exact_match(prediction, alias)) for alias in answer]


def _accepted_answers(answer: Any, kind: str) -> list[str]:
    """The accepted answers of a prepared reference as `_reference_matches` names them (for a skipped row)."""
    if kind == NUMERICAL:
        return [f"[{answer[0]}, {answer[1]}]"] if len(answer) == 2 else [str(answer)]
    return [alias for alias in answer if isinstance(alias, str)] if isinstance(answer, list) else [str(answer)]


def accepted_answers(answer_eval: Any, question_type: str) -> list[str]:
    """The accepted answers of one reference as the per-reference details name them: the `answer_eval` aliases
    (String/Time) or the stored range written `[lo, hi]` (Numerical)."""
    kind = question_kind(question_type)
    return _accepted_answers(reference_range(answer_eval) if kind == NUMERICAL else answer_eval, kind)


def score_item(prediction: str, answer_eval: Any, question_type: str) -> int:
    """1 if `prediction` is correct for one InfoSeek question, else 0 (String/Time: exact match over
    `answer_eval` aliases; Numerical: relaxed range accuracy on the first stored range).

    String/Time need a non-empty list of strings: qkvqa raises for anything else, where the official
    code would raise too, or (for a bare dict) silently compare against the dict's keys.
    """
    kind = question_kind(question_type)
    answer = reference_range(answer_eval) if kind == NUMERICAL else answer_eval
    return _score_prepared(prediction, answer, kind)


def split_of(data_split: Any) -> str:
    """`unseen_question` iff the split name ends with it; every other split counts as `unseen_entity`."""
    if not isinstance(data_split, str):
        raise DataError(f"data_split must be a str, got {data_split!r}")
    return UNSEEN_QUESTION if data_split.endswith(UNSEEN_QUESTION) else UNSEEN_ENTITY


def _percent(hits: Sequence[int]) -> Union[int, float]:
    """round(100 * mean, 2) with Python's round; an empty bucket is integer 0 (the official safe_division)."""
    fraction = sum(hits) / len(hits) if hits else 0
    return round(fraction * 100, 2)


def harmonic_mean(first: float, second: float) -> float:
    """2 / (1/a + 1/b), with a zero replaced by 1e-12 (so one empty or all-wrong split makes it ~0).

    The reciprocal form is qkvqa's reading of the 1e-12 guard; `2ab/(a+b)` differs from it in the
    last bit for about 5 in 100,000 pairs of 2-decimal scores, which can move the rounded value by 0.01.
    """
    first = first if first != 0 else ZERO_SPLIT
    second = second if second != 0 else ZERO_SPLIT
    return 2 / (1 / first + 1 / second)


def _load_question_types(qtypes: Rows, strict: bool = False) -> dict[str, str]:
    """data_id -> question type, the last line winning (as the official scorer); `strict` refuses an id listed twice
    with different types."""
    qtype_of: dict[str, str] = {}
    for where, row in load_rows(qtypes, "question types"):
        qid, qtype = field(row, "data_id", where), field(row, "question_type", where)
        if strict and qid in qtype_of and qtype_of[qid] != qtype:
            raise DataError(
                f"{where}: data_id {qid}: question_type {qtype!r}, but an earlier line gives "
                f"{qtype_of[qid]!r} (--strict refuses a repeated id that disagrees; fix the file)"
            )
        qtype_of[qid] = qtype
    return qtype_of


def _load_references(
    references: Rows, qtype_of: dict[str, str], strict: bool = False
) -> tuple[dict[str, tuple], int, list[str]]:
    """data_id -> (prepared answer, split, kind), the last line of a repeated id winning; also the number of
    repeated reference lines and the ids repeated with other answers or splits (`strict`: a DataError naming
    the line). Every reference id must have a question type."""
    prepared: dict[str, tuple] = {}
    first_line: dict[str, str] = {}
    repeated, conflicting = 0, []
    without_type = []
    for where, row in load_rows(references, "references"):
        qid = field(row, "data_id", where)
        if qid not in qtype_of:
            without_type.append(qid)
            continue
        kind = question_kind(qtype_of[qid])
        answer_eval = field(row, "answer_eval", where)
        try:
            answer = reference_range(answer_eval) if kind == NUMERICAL else answer_eval
            split = split_of(field(row, "data_split", where))
        except DataError as e:
            raise DataError(f"{where}: data_id {qid}: {e}") from None
        if qid in prepared:
            repeated += 1
            if prepared[qid] != (answer, split, kind):
                if strict:
                    raise DataError(
                        f"{where}: data_id {qid}: repeated with another answer or split than at "
                        f"{first_line[qid]} (the official scorer silently keeps the last; --strict "
                        "refuses it: fix the file)"
                    )
                conflicting.append(qid)
        else:
            first_line[qid] = where
        prepared[qid] = (answer, split, kind)
    if without_type:
        raise DataError(
            f"{len(without_type)} reference data_id(s) have no entry in the question-type file "
            f"(first: {', '.join(without_type[:5])}); the official scorer raises KeyError here"
        )
    if conflicting:
        log.warning(
            "InfoSeek references: %d data_ids repeat with other answers (first: %s); the last line wins, as "
            "in the official scorer (--strict refuses them)",
            len(conflicting),
            ", ".join(conflicting[:3]),
        )
    return prepared, repeated, conflicting


def evaluate(predictions: Rows, references: Rows, qtypes: Rows, strict: bool = False) -> dict:
    """Score InfoSeek predictions exactly as the official `evaluate(prediction, reference, qtype)` does.

    Arguments are JSONL paths or lists of dicts. Only predictions are iterated: unknown ids are
    dropped, reference questions without a prediction are not counted, duplicates are each counted. One
    qkvqa rule on top: a row marked `skipped` (qkvqa could not answer it) is wrong, where the official
    scorer would read its empty prediction as the number 0.
    Returns the official keys (`final_score`, `unseen_question_score`, `unseen_entity_score` with
    `score`, `score_time`, `score_num`, `score_string`) plus `coverage` (missing, unknown and
    duplicated ids, scored counts). `strict=True` raises DataError when coverage is not one-to-one.
    """
    return evaluate_with_details(predictions, references, qtypes, strict)[0]


def evaluate_with_details(
    predictions: Rows, references: Rows, qtypes: Rows, strict: bool = False
) -> tuple[dict, list[dict]]:
    """`evaluate`, plus one `{data_id, split, kind, correct, references}` row per scored prediction in prediction
    order; `references` holds `{answer, em, bem: None}` per accepted answer (Numerical: the stored range, `em` its
    range match), `em` None for a skipped row."""
    prepared, repeated_references, conflicting = _load_references(
        references, _load_question_types(qtypes, strict), strict
    )
    prediction_rows = load_rows(predictions, "predictions")
    prediction_ids = [field(row, "data_id", where) for where, row in prediction_rows]
    coverage = coverage_report(prediction_ids, prepared)
    coverage["n_repeated_reference_lines"] = repeated_references
    coverage["n_conflicting_reference_ids"] = len(conflicting)
    check_coverage(coverage, "InfoSeek", strict)

    details, skipped = [], 0
    hits: dict[str, dict[str, list[int]]] = {
        split: {TIME: [], NUMERICAL: [], STRING: []} for split in (UNSEEN_QUESTION, UNSEEN_ENTITY)
    }
    for (where, row), qid in zip(prediction_rows, prediction_ids):
        if qid not in prepared:
            continue
        answer, split, kind = prepared[qid]
        try:
            matches = None if is_skipped(row) else _reference_matches(field(row, "prediction", where), answer, kind)
        except DataError as e:
            raise DataError(f"{where}: data_id {qid}: {e}") from None
        correct = int(any(matched for _, matched in matches)) if matches is not None else 0
        skipped += is_skipped(row)
        hits[split][kind].append(correct)
        references = (
            [{"answer": a, "em": m, "bem": None} for a, m in matches]
            if matches is not None
            else [{"answer": a, "em": None, "bem": None} for a in _accepted_answers(answer, kind)]
        )
        details.append({"data_id": qid, "split": split, "kind": kind, "correct": correct, "references": references})

    result: dict[str, Any] = {}
    for split in (UNSEEN_QUESTION, UNSEEN_ENTITY):
        by_kind = hits[split]
        result[f"{split}_score"] = {
            "score": _percent(by_kind[TIME] + by_kind[NUMERICAL] + by_kind[STRING]),
            "score_time": _percent(by_kind[TIME]),
            "score_num": _percent(by_kind[NUMERICAL]),
            "score_string": _percent(by_kind[STRING]),
        }
    final = round(harmonic_mean(result["unseen_question_score"]["score"], result["unseen_entity_score"]["score"]), 2)
    coverage["n_skipped"] = skipped
    coverage["n_scored"] = {split: {kind: len(items) for kind, items in hits[split].items()} for split in hits}
    return {"final_score": final, **result, "coverage": coverage}, details
