"""A QFF section scorer outside qkvqa: the cosine of the mean-pooled question and section query tokens.

Select it with one config line (this folder on PYTHONPATH, or the repository root as here):

    qff:
      scorer: examples.mean_cosine_scorer:MeanCosine
      scorer_options: {scale: 1.0}

Training, `qkvqa rerank` and `qkvqa evaluate` then all score with it; the trained QFF records the import path and the
sha256 of this file, and refuses to score with another scorer (docs/extending.md, "The QFF section scorer").
"""

from __future__ import annotations

import torch.nn.functional as F

from qkvqa.qff.scorers import Option, SectionScorer


class MeanCosine(SectionScorer):
    """`scale * cos(mean_a q_a, mean_b h_b)`: one vector per side instead of late interaction's token maxima."""

    OPTIONS = {"scale": Option(float, 1.0, low=0.0, high=100.0, doc="multiplies the cosine")}

    def score(self, question_tokens, section_tokens, training: bool = False):
        """`[..., A, D]` against `[..., B, D]` -> `[...]` (leading dimensions broadcast), in fp32."""
        question = F.normalize(question_tokens.float().mean(dim=-2), dim=-1)
        section = F.normalize(section_tokens.float().mean(dim=-2), dim=-1)
        return self.options["scale"] * (question * section).sum(dim=-1)
