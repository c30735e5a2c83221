"""QFF scoring: late-interaction section scores, article max, fusion with retrieval and the rerank step (method.md §2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

import torch
import torch.nn.functional as F

from qkvqa.config.schema import QUESTION_NORMS, SCORE_DIRECTIONS  # declared with the config
from qkvqa.errors import ConfigError


def late_interaction(
    question_tokens: torch.Tensor,
    section_tokens: torch.Tensor,
    direction: str = "question_to_section",
    question_norm: str = "per_token",
) -> torch.Tensor:
    """ColBERT-style score of `[..., A, D]` question tokens against `[..., B, D]` section tokens -> `[...]`.

    `question_to_section` (the paper): `(1/A) Σ_a max_b cos(q_a, h_b)`; `section_to_question`: the
    reverse average, `(1/B) Σ_b max_a cos(q_a, h_b)`. Leading dimensions broadcast, so `[1, A, D]`
    against `[N, B, D]` scores one question against N sections, and `[Bq, 1, A, D]` against
    `[Bq, M, B, D]` gives the `[Bq, M]` logits of a contrastive batch. Computed in fp32.

    `question_norm`: `per_token` (the paper's cosine) makes each question token a unit vector; `across_tokens` is
    OMGM's released step 2b (`F.normalize(fusion_output.last_hidden_state[:, :32, :])`, default `dim=1`), which
    makes each hidden channel a unit vector across the A tokens, so a token's norm is about sqrt(D / A) and the
    score that many times a cosine (docs/protocol.md "Readings"). Section tokens are unit vectors either way.
    """
    if direction not in SCORE_DIRECTIONS:
        raise ConfigError(f"qff.score_direction must be one of {SCORE_DIRECTIONS}, got {direction!r}")
    if question_norm not in QUESTION_NORMS:
        raise ConfigError(f"qff.question_norm must be one of {', '.join(QUESTION_NORMS)}, got {question_norm!r}")
    q = F.normalize(question_tokens.float(), dim=-1 if question_norm == "per_token" else -2)
    s = F.normalize(section_tokens.float(), dim=-1)
    cosine = q @ s.transpose(-1, -2)  # [..., A, B]
    if direction == "question_to_section":
        return cosine.amax(dim=-1).mean(dim=-1)
    return cosine.amax(dim=-2).mean(dim=-1)


def fuse(retrieval_similarity: float, qff_score: float, alpha: float) -> float:
    """Eq. 9: `S = alpha * sim_ret + (1 - alpha) * QFF`."""
    return alpha * retrieval_similarity + (1.0 - alpha) * qff_score


@dataclass
class RerankResult:
    """Articles in fused-score order; every list is in that order (OMGM step-2b layout)."""

    order: list[int]  # order[k] = input index of the k-th article
    fused_scores: list[float]  # S_i
    qff_scores: list[float]  # max section score (0 for articles without scored sections)
    section_scores: list[list[float]]  # per-section scores (`sec_sim`), [] for articles without any


def rerank(
    retrieval_similarities: Sequence[float], section_scores: Sequence[Optional[Sequence[float]]], alpha: float = 0.9
) -> RerankResult:
    """Fuse retrieval similarities with article QFF scores and sort descending (ties keep retrieval order).

    `section_scores[i]` holds the scores of article i's candidate sections, or None / [] when the
    article has no sections or no image: its QFF score is 0, as in OMGM.
    """
    if len(retrieval_similarities) != len(section_scores):
        raise ValueError(
            f"{len(retrieval_similarities)} retrieval similarities but {len(section_scores)} section-score lists"
        )
    sections = [[float(s) for s in scores] if scores else [] for scores in section_scores]
    qff = [max(scores) if scores else 0.0 for scores in sections]
    fused = [fuse(float(r), q, alpha) for r, q in zip(retrieval_similarities, qff)]
    order = sorted(range(len(fused)), key=lambda i: -fused[i])
    return RerankResult(
        order=order,
        fused_scores=[fused[i] for i in order],
        qff_scores=[qff[i] for i in order],
        section_scores=[sections[i] for i in order],
    )


def per_section_loop(
    comp, question: str, question_image, images: Iterable, sections: Iterable[Sequence[str]]
) -> list[list[float]]:
    """OMGM's per-section scoring, the baseline the benchmarks (`bench/qff.py`, `bench/pipeline_real.py`) time and
    check `QFFComponent.score_sections` against: for every section, its article's image through the ViT again, then
    that one section alone (batch 1). `images[i]` is article i's image, `sections[i]` its section strings (either
    may be a lazy iterable); the caller picks inference mode and autocast. -> one list of scores per article."""
    question_enc = comp.encode_question(question, question_image)
    scores = []
    for image, texts in zip(images, sections):
        row = []
        for text in texts:
            image_states = comp.model.encode_image(comp.preprocess_images([image]))
            tokens = comp.tokenize_sections([text])
            states = comp.model.encode_sections(
                tokens["input_ids"], tokens["attention_mask"], image_states, question_enc
            )
            row.append(comp.scorer.score(question_enc.tokens, states).item())
        scores.append(row)
    return scores


# ---------------------------------------------------------------------------------------------- training batches
# The contrastive batches of `qkvqa.data_modules.qff_train` (their keys: `QFFCollator`), scored with any model that
# has `encode_sections(input_ids, attention_mask, states, question, image_index=, question_index=)` (`QFFModel`) and
# the run's `SectionScorer` (`qkvqa.qff.scorers`); `QFFTrainer` only calls these.


def in_batch_scores(model, batch: dict[str, Any], question, states: torch.Tensor, scorer) -> torch.Tensor:
    """`[B, B - 1]` scores of each question of a contrastive batch against the other samples' positives (column 0 of
    each sample's candidates), those sections encoded focused on that question; row i skips column i."""
    b, n = batch["size"], batch["num_candidates"]
    device = states.device
    pairs = [(i, j) for i in range(b) for j in range(b) if j != i]
    rows = torch.tensor([j * n for _, j in pairs], device=device)
    question_index = torch.tensor([i for i, _ in pairs], device=device)
    sections = model.encode_sections(
        batch["sections"]["input_ids"].index_select(0, rows),
        batch["sections"]["attention_mask"].index_select(0, rows),
        states,
        question,
        image_index=batch["section_image_index"].index_select(0, rows),
        question_index=question_index,
    )
    scores = scorer.score(question.tokens.index_select(0, question_index), sections, training=True)
    return scores.view(b, b - 1)


def rerank_hits(
    model,
    rerank_batch: dict[str, Any],
    question,
    states: torch.Tensor,
    scorer,
    alpha: float = 0.9,
) -> tuple[list[float], list[float]]:
    """Per question of a validation batch's `rerank` part: is the gold article first after alpha fusion with the QFF
    scores of its candidate sections (every section of a stage-1 article, encoded in `chunks`), and before (stage 1)?
    The section scores are inference's (`scorer.score(..., training=False)`), as `qkvqa rerank` scores."""
    questions = rerank_batch["questions"]
    scores = [[[0.0] * len(a["sections"]) for a in q["articles"]] for q in questions]
    for chunk in rerank_batch["chunks"]:
        states_out = model.encode_sections(
            chunk["input_ids"],
            chunk["attention_mask"],
            states,
            question,
            image_index=chunk["image_index"],
            question_index=chunk["question_index"],
        )
        values = scorer.score(question.tokens.index_select(0, chunk["question_index"]), states_out)
        for (q, a, j), value in zip(chunk["slot"].tolist(), values.tolist()):
            scores[q][a][j] = value
    fused_hits, stage1_hits = [], []
    for q, item in enumerate(questions):
        gold = set(item["gold_urls"])
        urls = [a["url"] for a in item["articles"]]
        if not urls:
            fused_hits.append(0.0)
            stage1_hits.append(0.0)
            continue
        result = rerank([a["similarity"] for a in item["articles"]], scores[q], alpha)
        fused_hits.append(float(urls[result.order[0]] in gold))
        stage1_hits.append(float(urls[0] in gold))
    return fused_hits, stage1_hits
