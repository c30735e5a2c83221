"""Exactly-once evaluation under DDP: 7 questions on 2 gloo ranks with the padded DistributedSampler."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DistributedSampler
from torchmetrics import MeanMetric

from qkvqa.metrics.torchmetrics_classes import PerQuestionMean, RecallAtK, assert_question_ids

pytestmark = [pytest.mark.ddp, pytest.mark.slow]

WORLD_SIZE = 2
DATA_IDS = [f"E-VQA_{i}" for i in range(7)]
SCORES = [1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0]  # question 0, repeated by the padding, is correct
GOLD_RANKS = [1, 0, 4, 2, 0, 1, 9]
KS = (1, 5)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _evaluate(indices_per_step, metric_mean, metric_recall, naive):
    for batch in indices_per_step:
        qids = [DATA_IDS[i] for i in batch]
        metric_mean.update(qids, [SCORES[i] for i in batch])
        metric_recall.update(qids, [GOLD_RANKS[i] for i in batch])
        naive.update(torch.tensor([SCORES[i] for i in batch], dtype=torch.float64))


def _worker(rank: int, port: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        indices = list(DistributedSampler(range(len(DATA_IDS)), num_replicas=WORLD_SIZE, rank=rank, shuffle=False))
        mean, recall, naive = PerQuestionMean(), RecallAtK(ks=KS), MeanMetric()
        _evaluate([indices[i : i + 2] for i in range(0, len(indices), 2)], mean, recall, naive)
        result = {
            "indices": indices,
            "mean": mean.compute().item(),
            "naive": naive.compute().item(),
            "recall": {k: v.item() for k, v in recall.compute().items()},
        }
        assert_question_ids(mean, DATA_IDS)
        try:
            assert_question_ids(recall, DATA_IDS + ["E-VQA_7"])
        except AssertionError as e:
            result["missing_error"] = str(e)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()


def test_padded_duplicates_count_once_on_two_ranks(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD_SIZE)]

    single_mean, single_recall, single_naive = PerQuestionMean(), RecallAtK(ks=KS), MeanMetric()
    _evaluate([range(len(DATA_IDS))], single_mean, single_recall, single_naive)
    expected_mean = single_mean.compute().item()
    expected_recall = {k: v.item() for k, v in single_recall.compute().items()}
    assert expected_mean == 3 / 7 and expected_recall == pytest.approx({"recall@1": 200 / 7, "recall@5": 400 / 7})

    # the sampler really padded: 8 slots for 7 questions, question 0 seen on both ranks
    assert sorted(ranks[0]["indices"] + ranks[1]["indices"]) == [0, 0, 1, 2, 3, 4, 5, 6]
    for result in ranks:
        assert result["mean"] == expected_mean  # exactly the single-process value
        assert result["recall"] == expected_recall
        assert result["naive"] == 4 / 8 != expected_mean  # what a plain MeanMetric reports
        assert "1 missing (first: E-VQA_7), 0 unexpected" in result["missing_error"]
