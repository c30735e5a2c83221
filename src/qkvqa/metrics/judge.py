"""The judge extension point: a kind whose `build(spec)` returns an AnswerJudge (P(equivalent) of an answer)."""

from __future__ import annotations

from qkvqa.components.registry import ComponentKind


class JudgeKind(ComponentKind):
    """The answer judge of E-VQA (`components.judge`, used with `eval.judge: bem`): `build(spec)` returns an object
    with `label` (how results were judged, shown beside the accuracy), `equivalent(question, reference, candidate)`
    and `score_batch(triples)`, P(equivalent) in [0, 1] (qkvqa.metrics.evqa.AnswerJudge). A user's is a subclass
    named by import path (docs/extending.md)."""

    point = "judge"
