"""Question-keyed torchmetrics in one process: de-duplication by question id, recall, the coverage assertion."""

from __future__ import annotations

import math

import pytest
import torch

from qkvqa.metrics.torchmetrics_classes import (
    PerQuestionMean,
    RecallAtK,
    assert_question_ids,
    question_key,
    question_keys,
)


def test_repeated_question_counts_once_with_its_first_value():
    metric = PerQuestionMean()
    metric.update(["a", "b"], [1.0, 0.0])
    metric.update(["a", "c"], [0.0, 0.0])  # a repeated: its first value (1.0) is kept
    assert metric.compute().item() == pytest.approx(1 / 3)
    keys, values = metric.per_question()
    assert len(keys) == 3 and sorted(values.tolist()) == [0.0, 0.0, 1.0]


def test_integer_ids_and_tensors_are_used_as_keys():
    metric = PerQuestionMean()
    metric.update(torch.tensor([0, 1, 2]), torch.tensor([1.0, 1.0, 0.0]))
    metric.update([2], [1.0])
    assert metric.compute().item() == pytest.approx(2 / 3)
    assert question_keys([5, 7]).tolist() == [5, 7]


def test_string_keys_are_stable_63_bit_hashes():
    assert question_key("E-VQA_0") == question_key("E-VQA_0") != question_key("E-VQA_1")
    assert 0 <= question_key("infoseek_val_00012345") < 2**63
    # pinned: the key must not depend on the process (Python's salted hash() would differ between ranks)
    assert question_key("E-VQA_0") == 3161020944951795196


def test_reset_and_empty_compute():
    metric = PerQuestionMean()
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert math.isnan(metric.compute().item())
    metric.update(["a"], [1.0])
    metric.reset()
    metric.update(["b"], [0.0])
    assert metric.compute().item() == 0.0


def test_update_rejects_mismatched_lengths():
    with pytest.raises(ValueError, match="2 question ids but 1 values"):
        PerQuestionMean().update(["a", "b"], [1.0])


def test_recall_at_k_from_gold_ranks():
    metric = RecallAtK(ks=(1, 5))
    metric.update(["a", "b", "c", "d"], [1, 3, 0, 7])
    metric.update(["a"], [1])  # padded repeat: ignored
    result = metric.compute()
    assert result["recall@1"].item() == 25.0 and result["recall@5"].item() == 50.0
    with pytest.warns(UserWarning, match="before the ``update``"):
        assert math.isnan(RecallAtK(ks=(1,)).compute()["recall@1"].item())


def test_assert_question_ids():
    metric = PerQuestionMean()
    metric.update(["a", "b", "a"], [1.0, 0.0, 1.0])
    assert_question_ids(metric, ["a", "b"])
    with pytest.raises(AssertionError, match=r"1 missing \(first: c\), 0 unexpected"):
        assert_question_ids(metric, ["a", "b", "c"])
    with pytest.raises(AssertionError, match="0 missing .*1 unexpected"):
        assert_question_ids(metric, ["a"])
