"""QFF scoring: late-interaction section scores, article max, fusion with retrieval and the rerank step (method.md §2)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F

from qkvqa.errors import ConfigError

SCORE_DIRECTIONS = ("question_to_section", "section_to_question")


def late_interaction(question_tokens: torch.Tensor, section_tokens: torch.Tensor,
                     direction: str = "question_to_section") -> torch.Tensor:
    """ColBERT-style score of `[..., A, D]` question tokens against `[..., B, D]` section tokens -> `[...]`.

    `question_to_section` (the paper): `(1/A) Σ_a max_b cos(q_a, h_b)`; `section_to_question`: the
    reverse average, `(1/B) Σ_b max_a cos(q_a, h_b)`. Leading dimensions broadcast, so `[1, A, D]`
    against `[N, B, D]` scores one question against N sections, and `[Bq, 1, A, D]` against
    `[Bq, M, B, D]` gives the `[Bq, M]` logits of a contrastive batch. Computed in fp32.
    """
    if direction not in SCORE_DIRECTIONS:
        raise ConfigError(f"qff.score_direction must be one of {SCORE_DIRECTIONS}, got {direction!r}")
    q = F.normalize(question_tokens.float(), dim=-1)
    s = F.normalize(section_tokens.float(), dim=-1)
    cosine = q @ s.transpose(-1, -2)                      # [..., A, B]
    if direction == "question_to_section":
        return cosine.amax(dim=-1).mean(dim=-1)
    return cosine.amax(dim=-2).mean(dim=-1)


def fuse(retrieval_similarity: float, qff_score: float, alpha: float) -> float:
    """Eq. 9: `S = alpha * sim_ret + (1 - alpha) * QFF`."""
    return alpha * retrieval_similarity + (1.0 - alpha) * qff_score


@dataclass
class RerankResult:
    """Articles in fused-score order; every list is in that order (OMGM step-2b layout)."""

    order: list[int]                    # order[k] = input index of the k-th article
    fused_scores: list[float]           # S_i
    qff_scores: list[float]             # max section score (0 for articles without scored sections)
    section_scores: list[list[float]]   # per-section scores (`sec_sim`), [] for articles without any


def rerank(retrieval_similarities: Sequence[float], section_scores: Sequence[Optional[Sequence[float]]],
           alpha: float = 0.9) -> RerankResult:
    """Fuse retrieval similarities with article QFF scores and sort descending (ties keep retrieval order).

    `section_scores[i]` holds the scores of article i's candidate sections, or None / [] when the
    article has no sections or no image: its QFF score is 0, as in OMGM.
    """
    if len(retrieval_similarities) != len(section_scores):
        raise ValueError(f"{len(retrieval_similarities)} retrieval similarities but {len(section_scores)} "
                         "section-score lists")
    sections = [[float(s) for s in scores] if scores else [] for scores in section_scores]
    qff = [max(scores) if scores else 0.0 for scores in sections]
    fused = [fuse(float(r), q, alpha) for r, q in zip(retrieval_similarities, qff)]
    order = sorted(range(len(fused)), key=lambda i: -fused[i])
    return RerankResult(order=order, fused_scores=[fused[i] for i in order], qff_scores=[qff[i] for i in order],
                        section_scores=[sections[i] for i in order])
