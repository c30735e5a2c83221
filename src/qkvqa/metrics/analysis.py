"""Analysis metrics: per-group accuracy, E-VQA hop splits, R1 / R1-C / NR-C (paper Table 3), context lengths."""

from __future__ import annotations

from typing import Hashable, Mapping, Optional, Sequence

import numpy as np

from qkvqa.errors import DataError

TWO_HOP = "2_hop"


def _percent(numerator: float, denominator: int) -> Optional[float]:
    return 100.0 * numerator / denominator if denominator else None


def accuracy_summary(scores: Sequence[float]) -> dict:
    """`{n, correct, accuracy}` with accuracy in percent (None when there is no score)."""
    correct = float(sum(scores))
    return {"n": len(scores), "correct": correct, "accuracy": _percent(correct, len(scores))}


def grouped_accuracy(scores: Sequence[float], groups: Sequence[Hashable]) -> dict:
    """`accuracy_summary` per group (e.g. per question type), groups in sorted order."""
    if len(scores) != len(groups):
        raise DataError(f"{len(scores)} scores but {len(groups)} group labels")
    by_group: dict = {}
    for score, group in zip(scores, groups):
        by_group.setdefault(group, []).append(score)
    return {group: accuracy_summary(by_group[group]) for group in sorted(by_group, key=str)}


def evqa_hop_accuracy(scores: Sequence[float], question_types: Sequence[str]) -> dict:
    """E-VQA reporting splits: `single_hop` (every type but 2_hop, the EchoSight convention), `two_hop`, `all`."""
    if len(scores) != len(question_types):
        raise DataError(f"{len(scores)} scores but {len(question_types)} question types")
    single = [s for s, t in zip(scores, question_types) if t != TWO_HOP]
    double = [s for s, t in zip(scores, question_types) if t == TWO_HOP]
    return {
        "single_hop": accuracy_summary(single),
        "two_hop": accuracy_summary(double),
        "all": accuracy_summary(list(scores)),
    }


def seen_unseen_accuracy(scores: Sequence[float], used_in_train: Sequence[Optional[bool]]) -> dict:
    """E-VQA's seen / unseen split (the release's `wikipedia_url_used_in_train`: whether the question's gold article
    is also a training question's): `seen` (True), `unseen` (False), each `accuracy_summary` with its n, and
    `n_unknown`, the questions whose file gives no value (counted in neither row, never guessed)."""
    if len(scores) != len(used_in_train):
        raise DataError(f"{len(scores)} scores but {len(used_in_train)} used-in-train flags")
    return {
        "seen": accuracy_summary([s for s, u in zip(scores, used_in_train) if u is True]),
        "unseen": accuracy_summary([s for s, u in zip(scores, used_in_train) if u is False]),
        "n_unknown": sum(1 for u in used_in_train if u is None),
    }


def error_analysis(gold_at_top1: Mapping[str, bool], scores: Mapping[str, float]) -> dict:
    """Paper Table 3 over questions joined by id (both mappings must hold the same ids), in percent.

    - `r1`: share of questions whose gold article is ranked first.
    - `r1_c`: accuracy among those questions.
    - `nr_c`: share of **all** questions whose gold article is not ranked first and whose answer is
      correct (the paper's wording).
    - `nr_c_conditional`: accuracy among the questions whose gold article is not ranked first.
    A ratio with an empty denominator is None.
    """
    if gold_at_top1.keys() != scores.keys():
        only_rank = sorted(gold_at_top1.keys() - scores.keys())
        only_score = sorted(scores.keys() - gold_at_top1.keys())
        raise DataError(
            f"error analysis needs the same question ids on both sides: {len(only_rank)} only with "
            f"retrieval ranks (first: {only_rank[:5]}), {len(only_score)} only with scores "
            f"(first: {only_score[:5]})"
        )
    n = len(scores)
    top1 = [qid for qid, hit in gold_at_top1.items() if hit]
    rest = [qid for qid, hit in gold_at_top1.items() if not hit]
    correct_top1 = float(sum(scores[qid] for qid in top1))
    correct_rest = float(sum(scores[qid] for qid in rest))
    return {
        "n": n,
        "n_top1": len(top1),
        "n_not_top1": len(rest),
        "r1": _percent(len(top1), n),
        "r1_c": _percent(correct_top1, len(top1)),
        "nr_c": _percent(correct_rest, n),
        "nr_c_conditional": _percent(correct_rest, len(rest)),
    }


R1_C, R1_W, NR_C, NOT_RETRIEVED, NR_W = "R1-C", "R1-W", "NR-C", "not_retrieved", "NR-W"
CATEGORIES = (R1_C, R1_W, NR_C, NOT_RETRIEVED, NR_W)


def error_category(gold_at_top1: bool, score: float, gold_retrieved: bool) -> str:
    """One question's cell of Table 3 (`error_analysis` counts the same split): R1-C / R1-W (gold article ranked
    first, answer correct / wrong), NR-C (not first, correct), then the wrong ones without the gold article first
    split into `not_retrieved` (not in stage 1's top-K either) and NR-W. `score` is the official 0/1 score."""
    if gold_at_top1:
        return R1_C if score else R1_W
    if score:
        return NR_C
    return NR_W if gold_retrieved else NOT_RETRIEVED


def context_length_stats(lengths: Sequence[float]) -> dict:
    """Mean, median and 95th percentile (numpy's default linear interpolation) of context lengths in
    generator tokens; None for each statistic when there is no length."""
    if len(lengths) == 0:
        return {"n": 0, "mean": None, "median": None, "p95": None}
    values = np.asarray(lengths, dtype=np.float64)
    return {
        "n": int(values.size),
        "mean": float(values.mean()),
        "median": float(np.median(values)),
        "p95": float(np.percentile(values, 95)),
    }
