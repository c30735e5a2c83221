"""QFF scoring: late interaction against a naive loop, article max, fusion and the rerank order."""

from __future__ import annotations

import math

import pytest
import torch

from qkvqa.errors import ConfigError
from qkvqa.qff.scoring import fuse, late_interaction, rerank


def naive_late_interaction(q: torch.Tensor, s: torch.Tensor, direction: str) -> float:
    """One pair, two plain loops over tokens."""

    def cos(a, b):
        return float(a @ b) / (float(a.norm()) * float(b.norm()))

    outer, inner = (q, s) if direction == "question_to_section" else (s, q)
    return sum(max(cos(a, b) for b in inner) for a in outer) / len(outer)


@pytest.mark.parametrize("direction", ["question_to_section", "section_to_question"])
def test_late_interaction_matches_a_naive_loop(direction):
    g = torch.Generator().manual_seed(0)
    questions = torch.randn(2, 5, 8, generator=g)  # 2 questions, 5 tokens
    sections = torch.randn(2, 3, 7, 8, generator=g) * 3.0  # 3 sections per question, 7 tokens, unnormalised
    scores = late_interaction(questions[:, None], sections, direction)
    assert scores.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            assert scores[i, j].item() == pytest.approx(
                naive_late_interaction(questions[i], sections[i, j], direction), abs=1e-6
            )
    one_vs_many = late_interaction(questions[:1], sections[0], direction)
    torch.testing.assert_close(one_vs_many, scores[0])


def test_directions_differ_and_bad_direction_is_refused():
    g = torch.Generator().manual_seed(1)
    q, s = torch.randn(1, 4, 6, generator=g), torch.randn(1, 9, 6, generator=g)
    assert late_interaction(q, s, "question_to_section") != late_interaction(q, s, "section_to_question")
    with pytest.raises(ConfigError, match="score_direction"):
        late_interaction(q, s, "both")


def test_identical_tokens_score_one():
    tokens = torch.randn(1, 4, 6)
    assert late_interaction(tokens, tokens * 2.5).item() == pytest.approx(1.0, abs=1e-6)


def test_rerank_fuses_article_max_with_retrieval_and_sorts():
    retrieval = [0.50, 0.49, 0.45, 0.40]
    sections = [[0.1, 0.2], [0.9, 0.3], None, [0.95]]  # article 2 has no image or sections: QFF 0
    result = rerank(retrieval, sections, alpha=0.9)
    expected = [0.9 * 0.50 + 0.1 * 0.2, 0.9 * 0.49 + 0.1 * 0.9, 0.9 * 0.45, 0.9 * 0.40 + 0.1 * 0.95]
    assert result.order == [1, 0, 3, 2]
    assert result.fused_scores == pytest.approx([expected[i] for i in result.order])
    assert result.qff_scores == pytest.approx([0.9, 0.2, 0.95, 0.0])
    assert result.section_scores == [[0.9, 0.3], [0.1, 0.2], [0.95], []]
    assert fuse(0.5, 0.2, 0.9) == pytest.approx(expected[0])


def test_rerank_extremes_and_ties():
    retrieval = [0.3, 0.3, 0.2]
    sections = [[0.1], [0.1], [0.9]]
    assert rerank(retrieval, sections, alpha=1.0).order == [0, 1, 2]  # retrieval only; the tie keeps its order
    assert rerank(retrieval, sections, alpha=0.0).order == [2, 0, 1]  # QFF only
    assert all(math.isfinite(s) for s in rerank(retrieval, [[], [], []]).fused_scores)
    with pytest.raises(ValueError, match="section-score lists"):
        rerank(retrieval, sections[:2])
