"""The official E-VQA scorer (google-research encyclopedic_vqa/evaluation_utils.py, metrics.md section 2).

Exact match first, then a BEM judge only for references that EM rejects. Where the official code
raises (an empty reference, a reference empty after preprocessing, an empty multi_answer set, an
unknown question type) qkvqa raises a DataError (a ValueError) naming the problem and the data_id.
`evaluate` scores many questions joined with their predictions by data_id, reports coverage and
labels the result "EM only" or with the judge's label (e.g. "BEM (PyTorch reproduction)").
"""

from __future__ import annotations

import re
import string
from typing import Any, Iterable, Mapping, Optional, Protocol, Sequence

from qkvqa.errors import DataError
from qkvqa.metrics.analysis import evqa_hop_accuracy, grouped_accuracy, seen_unseen_accuracy
from qkvqa.metrics.coverage import check_coverage, coverage_report
from qkvqa.metrics.inputs import Rows, field, is_skipped, load_rows

QUESTION_TYPES = ("templated", "automatic", "multi_answer", "2_hop")
MULTI_ANSWER = "multi_answer"
# The official BEM input builder also treats these names as multi-answer (they never pass evaluate_example).
BEM_MULTI_ANSWER_TYPES = frozenset({"multi_answer", "list", "multianswer"})
BEM_THRESHOLD = 0.5  # BEM probability of "equivalent" >= 0.5 counts as correct (inclusive)

EM_ONLY = "EM only"
EXTRA_ID_PREFIX = "<extra_id_0> "
DELETED_CHARACTERS = frozenset(string.punctuation + "\u2018\u2019\u00b4`_")  # + left/right quote, acute accent
ARTICLES = re.compile(r"\b(the answer is|a|an|the)\b")

DIGIT_WORDS = {
    "none": "0",
    "zero": "0",
    "one": "1",
    "two": "2",
    "three": "3",
    "four": "4",
    "five": "5",
    "six": "6",
    "seven": "7",
    "eight": "8",
    "nine": "9",
    "ten": "10",
    "entailment": "yes",
    "true": "yes",
    "contradiction": "no",
    "false": "no",
}

# The VQAv2 contraction table, restricted to the keys that can match: the official table also has keys
# with an apostrophe (`let's`, `somebody'd`, ...) or a capital (`Im`, `Ive`, `Id've`, ...), which never
# match because preprocessing lower-cases the text and deletes apostrophes before the lookup.
CONTRACTIONS = {
    "aint": "ain't",
    "arent": "aren't",
    "cant": "can't",
    "couldve": "could've",
    "couldnt": "couldn't",
    "didnt": "didn't",
    "doesnt": "doesn't",
    "dont": "don't",
    "hadnt": "hadn't",
    "hasnt": "hasn't",
    "havent": "haven't",
    "hed": "he'd",
    "hes": "he's",
    "howd": "how'd",
    "howll": "how'll",
    "hows": "how's",
    "isnt": "isn't",
    "itd": "it'd",
    "itll": "it'll",
    "maam": "ma'am",
    "mightnt": "mightn't",
    "mightve": "might've",
    "mustnt": "mustn't",
    "mustve": "must've",
    "neednt": "needn't",
    "notve": "not've",
    "oclock": "o'clock",
    "oughtnt": "oughtn't",
    "shant": "shan't",
    "shouldve": "should've",
    "shouldnt": "shouldn't",
    "somebodyll": "somebody'll",
    "somebodys": "somebody's",
    "someoned": "someone'd",
    "someonell": "someone'll",
    "someones": "someone's",
    "somethingd": "something'd",
    "somethingll": "something'll",
    "thats": "that's",
    "thered": "there'd",
    "therere": "there're",
    "theres": "there's",
    "theyd": "they'd",
    "theyll": "they'll",
    "theyre": "they're",
    "theyve": "they've",
    "twas": "'twas",
    "wasnt": "wasn't",
    "weve": "we've",
    "werent": "weren't",
    "whatll": "what'll",
    "whatre": "what're",
    "whats": "what's",
    "whatve": "what've",
    "whens": "when's",
    "whered": "where'd",
    "wheres": "where's",
    "whereve": "where've",
    "whod": "who'd",
    "wholl": "who'll",
    "whos": "who's",
    "whove": "who've",
    "whyll": "why'll",
    "whyre": "why're",
    "whys": "why's",
    "wont": "won't",
    "wouldve": "would've",
    "wouldnt": "wouldn't",
    "yall": "y'all",
    "youd": "you'd",
    "youll": "you'll",
    "youre": "you're",
    "youve": "you've",
}


class AnswerJudge(Protocol):
    """What `evaluate_example` needs from a BEM-like judge: P(equivalent) for raw strings."""

    label: str

    def equivalent(self, question: str, reference: str, candidate: str) -> float: ...

    def score_batch(self, triples: Sequence[tuple[str, str, str]]) -> list[float]: ...


def preprocess_answer(text: str) -> str:
    """The official `preprocess_answer`: lower, strip, drop `<extra_id_0> `, delete punctuation (ASCII and
    ‘ ’ ´), articles and "the answer is" to spaces, number words to digits, VQAv2 contractions."""
    if not isinstance(text, str):
        raise DataError(f"an answer must be a str, got {type(text).__name__} {text!r}")
    text = text.lower().replace("\n", " ").replace("\t", " ").strip()
    if text.startswith(EXTRA_ID_PREFIX):
        text = text.replace(EXTRA_ID_PREFIX, "")
    text = "".join(ch for ch in text if ch not in DELETED_CHARACTERS)
    text = ARTICLES.sub(" ", text)
    tokens = [DIGIT_WORDS.get(token, token) for token in text.split()]
    return " ".join(CONTRACTIONS.get(token, token) for token in tokens)


def _multi_answer_items(texts: Iterable[str]) -> set[str]:
    return {item for item in (preprocess_answer(text) for text in texts) if item}


def exact_match(reference: str, candidate: str, question_type: str) -> bool:
    """The official EM: equality after preprocessing, or for `multi_answer` item-set IoU >= 0.5.

    Any type other than `multi_answer` is single-answer. The multi_answer candidate is split on
    " and ", " & " and "," in its raw (not yet lower-cased) form. A reference that preprocesses to
    nothing (single-answer) or to no items (multi_answer) raises.
    """
    if question_type == MULTI_ANSWER:
        reference_items = _multi_answer_items(reference.split("&&"))
        if not reference_items:
            raise DataError(f"multi_answer reference {reference!r} has no item left after preprocessing")
        if not isinstance(candidate, str):
            raise DataError(f"a candidate must be a str, got {type(candidate).__name__} {candidate!r}")
        candidate_items = _multi_answer_items(candidate.replace(" and ", ",").replace(" & ", ",").split(","))
        shared = len(reference_items & candidate_items)
        return shared / len(reference_items | candidate_items) >= 0.5
    processed_reference = preprocess_answer(reference)
    if not processed_reference:
        raise DataError(f"reference {reference!r} is empty after preprocessing")
    return processed_reference == preprocess_answer(candidate)


def bem_reference(reference: str, question_type: str) -> str:
    """The reference as BEM sees it: raw, with `&&` replaced by `,` for multi-answer types."""
    return reference.replace("&&", ",") if question_type in BEM_MULTI_ANSWER_TYPES else reference


def _validate_reference(reference: Any, question_type: Any) -> None:
    if not isinstance(reference, str) or reference == "":
        raise DataError(
            f"empty or non-str reference {reference!r} (an answer field like 'Paris|' has an empty "
            "alternative); the official scorer raises for the whole question"
        )
    if question_type not in QUESTION_TYPES:
        raise DataError(f"unknown question_type {question_type!r}; expected one of {list(QUESTION_TYPES)}")


def _em_pass(reference_list: Sequence[str], candidate: str, question_type: str) -> bool:
    """Validate every reference (the official scorer raises on any bad one) and return whether EM passes any."""
    return any(_em_matches(reference_list, candidate, question_type))


def _em_matches(reference_list: Sequence[str], candidate: str, question_type: str) -> list[bool]:
    """Validate every reference (the official scorer raises on any bad one) and return EM per reference."""
    if not reference_list:
        raise DataError("empty reference list (the official max() over references raises)")
    matches = []
    for reference in reference_list:
        _validate_reference(reference, question_type)
        matches.append(exact_match(reference, candidate, question_type))
    return matches


def evaluate_example(
    question: str, reference_list: Sequence[str], candidate: str, question_type: str, bem: Optional[AnswerJudge] = None
) -> float:
    """1.0 or 0.0 for one question: max over references of EM, else BEM >= 0.5 (`bem=None`: EM only).

    Every reference is validated even when an earlier one matches, as in the official loop. BEM
    scores are only computed for questions EM rejects; this gives the same maximum as the official
    per-reference scoring because an EM pass is already the maximum score.
    """
    if _em_pass(reference_list, candidate, question_type):
        return 1.0
    if bem is None:
        return 0.0
    return float(
        any(
            bem.equivalent(question, bem_reference(reference, question_type), candidate) >= BEM_THRESHOLD
            for reference in reference_list
        )
    )


def judge_label(bem: Optional[AnswerJudge]) -> str:
    """How a result was judged: "EM only", or the judge's own label."""
    return EM_ONLY if bem is None else getattr(bem, "label", type(bem).__name__)


def score_examples(examples: Sequence[Mapping[str, Any]], bem: Optional[AnswerJudge] = None) -> list[float]:
    """`evaluate_example` for many `{question, reference_list, candidate, question_type[, data_id]}` dicts,
    with all BEM calls for EM-rejected references sent to the judge as one batch."""
    return score_examples_with_references(examples, bem)[0]


def score_examples_with_references(
    examples: Sequence[Mapping[str, Any]], bem: Optional[AnswerJudge] = None
) -> tuple[list[float], list[list[dict]]]:
    """`score_examples`, plus each example's `[{answer, em, bem}]` per reference: `em` the official EM, `bem` the
    judge's P(equivalent), None where the judge was not asked (an EM pass, or no judge)."""
    scores: list[float] = []
    references: list[list[dict]] = []
    pending: list[tuple[int, int, tuple[str, str, str]]] = []
    for index, example in enumerate(examples):
        data_id = example.get("data_id", f"example {index}")
        try:
            matches = _em_matches(example["reference_list"], example["candidate"], example["question_type"])
        except DataError as e:
            raise DataError(f"data_id {data_id}: {e}") from None
        matched = any(matches)
        scores.append(1.0 if matched else 0.0)
        references.append(
            [{"answer": reference, "em": em, "bem": None} for reference, em in zip(example["reference_list"], matches)]
        )
        if not matched and bem is not None:
            pending.extend(
                (
                    index,
                    position,
                    (example["question"], bem_reference(reference, example["question_type"]), example["candidate"]),
                )
                for position, reference in enumerate(example["reference_list"])
            )
    if pending:
        probabilities = bem.score_batch([triple for _, _, triple in pending])
        for (index, position, _), probability in zip(pending, probabilities):
            references[index][position]["bem"] = float(probability)
            if probability >= BEM_THRESHOLD:
                scores[index] = 1.0
    return scores, references


def _load_questions(questions: Rows) -> dict[str, dict]:
    """data_id -> {question, reference_list, question_type}; references are the `answer` split on '|'."""
    by_id: dict[str, dict] = {}
    for where, row in load_rows(questions, "questions"):
        qid = field(row, "data_id", where)
        if qid in by_id:
            raise DataError(f"{where}: data_id {qid} appears twice in the questions")
        answer = field(row, "answer", where)
        by_id[qid] = {
            "question": field(row, "question", where),
            "reference_list": answer.split("|") if isinstance(answer, str) else answer,
            "question_type": field(row, "question_type", where),
            "used_in_train": _used_in_train(row.get(USED_IN_TRAIN), where),
        }
    return by_id


USED_IN_TRAIN = "wikipedia_url_used_in_train"  # optional question field: the release's True / False


def _used_in_train(value: Any, where: str) -> Optional[bool]:
    """A question's `wikipedia_url_used_in_train` as a bool (the CSV's "True" / "False" or a JSON bool); None when
    absent or empty; anything else is a DataError naming the place."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", ""):
        return {"true": True, "false": False}.get(value.strip().lower())
    raise DataError(f"{where}: field {USED_IN_TRAIN!r}: {value!r} is neither True nor False")


def evaluate(predictions: Rows, questions: Rows, bem: Optional[AnswerJudge] = None, strict: bool = False) -> dict:
    """E-VQA accuracy (%) of `{data_id, prediction}` rows joined with `{data_id, question, answer,
    question_type}` rows: single-hop (not 2_hop), two-hop, all, and per question type; with the rows' optional
    `wikipedia_url_used_in_train` (True / False, the release's column), also `seen_unseen` (every scored question
    split by it, each with its n; `n_unknown` counts the rows without a value).

    qkvqa's choices (the official code has no aggregate): each question counts once and the last of
    repeated predictions wins; the denominator is the questions that have a prediction; unknown ids
    are dropped; a row marked `skipped` (qkvqa could not answer it) scores 0 without the judge. All three are reported under `coverage`; `strict=True` raises instead. A group
    with no scored question has accuracy None. `label` says how answers were judged.
    """
    return evaluate_with_details(predictions, questions, bem, strict)[0]


def evaluate_with_details(
    predictions: Rows, questions: Rows, bem: Optional[AnswerJudge] = None, strict: bool = False
) -> tuple[dict, list[dict]]:
    """`evaluate`, plus one `{data_id, question_type, score, references}` row per scored question (`references`:
    `[{answer, em, bem}]` per reference answer, as `score_examples_with_references`; em and bem None when skipped)."""
    by_id = _load_questions(questions)
    prediction_rows = load_rows(predictions, "predictions")
    prediction_ids = [field(row, "data_id", where) for where, row in prediction_rows]
    coverage = coverage_report(prediction_ids, by_id)
    check_coverage(coverage, "E-VQA", strict)

    latest = {
        qid: (field(row, "prediction", where), is_skipped(row))
        for (where, row), qid in zip(prediction_rows, prediction_ids)
        if qid in by_id
    }
    examples = [{"data_id": qid, "candidate": candidate, **by_id[qid]} for qid, (candidate, _) in latest.items()]
    skipped = [skip for _, skip in latest.values()]
    judged_scores, judged_references = score_examples_with_references(
        [e for e, skip in zip(examples, skipped) if not skip], bem
    )
    judged, per_reference = iter(judged_scores), iter(judged_references)
    scores = [0.0 if skip else next(judged) for skip in skipped]
    references = [
        [{"answer": r, "em": None, "bem": None} for r in example["reference_list"]] if skip else next(per_reference)
        for example, skip in zip(examples, skipped)
    ]
    coverage["n_skipped"] = sum(skipped)
    types = [example["question_type"] for example in examples]
    summary = {
        "label": judge_label(bem),
        **evqa_hop_accuracy(scores, types),
        "per_question_type": grouped_accuracy(scores, types),
        "seen_unseen": seen_unseen_accuracy(scores, [example["used_in_train"] for example in examples]),
        "coverage": coverage,
    }
    details = [
        {"data_id": example["data_id"], "question_type": example["question_type"], "score": score, "references": refs}
        for example, score, refs in zip(examples, scores, references)
    ]
    return summary, details
