"""torchmetrics Metrics keyed by question id, so a question the padded DistributedSampler repeats counts once.

Lightning's `validate` / `test` use a DistributedSampler that pads the dataset to a multiple of the
world size by repeating samples, and torchmetrics' sync does not remove the repeats (pytorch/pytorch#25162,
Lightning-AI/pytorch-lightning#2398). These metrics store one (question key, value) pair per update as `cat` list states; after
the gather, `compute` keeps the first value of each key (rank 0's copy comes first in the gathered
order), so every question counts exactly once. `assert_question_ids` checks that the gathered
questions are exactly the dataset's.

Question keys are int64: dataset indices (ints or an int64 tensor) are used as they are; string ids
(`data_id`) are hashed with BLAKE2b to 63 bits, the same on every rank (Python's `hash` is not). Use
one kind of id per metric.
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Sequence, Union

import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from qkvqa.metrics.retrieval import DEFAULT_KS

QuestionIds = Union[torch.Tensor, Sequence[Union[str, int]]]


def question_key(qid: Union[str, int]) -> int:
    """The int64 key of one question id: an int as it is, a string hashed to 63 bits."""
    if isinstance(qid, str):
        return int.from_bytes(hashlib.blake2b(qid.encode("utf-8"), digest_size=8).digest(), "big") >> 1
    return int(qid)


def question_keys(qids: QuestionIds) -> torch.Tensor:
    """A 1-D int64 tensor of question keys."""
    if isinstance(qids, torch.Tensor):
        return qids.detach().to(torch.long).flatten().cpu()
    return torch.tensor([question_key(q) for q in qids], dtype=torch.long)


class QuestionKeyedMetric(Metric):
    """Base class: `cat` states of question keys and per-question values, de-duplicated by key in `compute`."""

    full_state_update = False
    is_differentiable = False
    value_dtype = torch.float64

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("keys", default=[], dist_reduce_fx="cat")
        self.add_state("values", default=[], dist_reduce_fx="cat")

    def update(self, qids: QuestionIds, values) -> None:
        """Record one value per question."""
        keys = question_keys(qids).to(self.device)
        values = torch.as_tensor(values, dtype=self.value_dtype).detach().flatten().to(self.device)
        if keys.numel() != values.numel():
            raise ValueError(f"{type(self).__name__}.update: {keys.numel()} question ids but {values.numel()} values")
        self.keys.append(keys)
        self.values.append(values)

    def per_question(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(keys, values) with each key once, keeping its first value, sorted by key (on the current,
        possibly gathered, state)."""
        if isinstance(self.keys, list) and not self.keys:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=self.value_dtype)
        keys, values = dim_zero_cat(self.keys), dim_zero_cat(self.values)
        order = torch.argsort(keys, stable=True)
        keys, values = keys[order], values[order]
        first = torch.ones_like(keys, dtype=torch.bool)
        first[1:] = keys[1:] != keys[:-1]
        return keys[first], values[first]

    def gathered_question_keys(self) -> torch.Tensor:
        """The distinct question keys over all ranks (a collective: call it on every rank, outside compute)."""
        with self.sync_context():
            return self.per_question()[0].clone()


class PerQuestionMean(QuestionKeyedMetric):
    """Mean over distinct questions of a per-question value (VQA accuracy, BEM score, loss, ...)."""

    higher_is_better = True

    def compute(self) -> torch.Tensor:
        """The mean of the de-duplicated values (NaN when nothing was recorded)."""
        _, values = self.per_question()
        return values.mean() if values.numel() else torch.tensor(float("nan"), dtype=self.value_dtype)


class RecallAtK(QuestionKeyedMetric):
    """Recall@K in percent over distinct questions, from each question's gold rank (1-based, 0 = not retrieved,
    as `qkvqa.metrics.retrieval.gold_rank` returns it)."""

    higher_is_better = True
    value_dtype = torch.long

    def __init__(self, ks: Sequence[int] = DEFAULT_KS, **kwargs):
        super().__init__(**kwargs)
        self.ks = tuple(int(k) for k in ks)

    def compute(self) -> dict[str, torch.Tensor]:
        """`{"recall@K": percent}` for each K (NaN when nothing was recorded)."""
        _, ranks = self.per_question()
        if ranks.numel() == 0:
            return {f"recall@{k}": torch.tensor(float("nan")) for k in self.ks}
        found = ranks > 0
        return {f"recall@{k}": 100.0 * (found & (ranks <= k)).double().mean() for k in self.ks}


def assert_question_ids(metric: QuestionKeyedMetric, expected_ids: Iterable[Union[str, int]]) -> None:
    """Raise AssertionError unless the questions gathered over all ranks are exactly `expected_ids`.

    A collective under DDP: call it on every rank (e.g. in `on_validation_epoch_end`).
    """
    gathered = set(metric.gathered_question_keys().tolist())
    expected_by_key = {question_key(qid): qid for qid in expected_ids}
    if gathered != expected_by_key.keys():
        missing = [str(expected_by_key[key]) for key in sorted(expected_by_key.keys() - gathered)]
        unexpected = len(gathered - expected_by_key.keys())
        raise AssertionError(
            f"{type(metric).__name__}: gathered {len(gathered)} distinct questions, expected "
            f"{len(expected_by_key)}: {len(missing)} missing (first: {', '.join(missing[:5])}), "
            f"{unexpected} unexpected"
        )
