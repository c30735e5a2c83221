"""E-VQA and InfoSeek DataModules on the synthetic world, run through a real Lightning Trainer."""

from __future__ import annotations

import json
from pathlib import Path

import lightning as L
import pytest
import torch
import yaml
from PIL import Image

from qkvqa.data.questions import read_evqa_csv
from qkvqa.data_modules import EVQADataModule, InfoSeekDataModule, build_data_module
from qkvqa.errors import ConfigError
from tests.fixtures_world import make_world


class _Recorder(L.LightningModule):
    """Records what test batches hold; no model."""

    def __init__(self):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.batches: list[dict] = []

    def test_step(self, batch, batch_idx):
        assert all(isinstance(image, Image.Image) and image.mode == "RGB" for image in batch["image"])
        self.batches.append({k: batch[k] for k in ("data_id", "size", "answer_eval", "data_split", "dropped_data_ids")})


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    return make_world(tmp_path_factory.mktemp("dm"))


def _config(world: dict, name: str, **overrides) -> dict:
    config = yaml.safe_load((Path(world["dir"]) / f"data_{name}.yaml").read_text())
    config.update(overrides)
    return config


def _run_test(datamodule) -> _Recorder:
    recorder = _Recorder()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.test(recorder, datamodule=datamodule, verbose=False)
    return recorder


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])
def test_evqa_test_split_runs_through_a_trainer_and_counts_skips(world, tmp_path, workers):
    datamodule = build_data_module(_config(world, "evqa", num_workers=workers, batch_size=16))
    assert isinstance(datamodule, EVQADataModule)
    recorder = _run_test(datamodule)
    expected = [r["data_id"] for r in world["questions"]["evqa/test.csv"] if r["question_type"] != "2_hop"]
    skipped_ids = {s["image_id"] for s in world["deliberate_skips"] if s["file"] == "evqa/test.csv"}
    dropped = [r["data_id"] for r in world["questions"]["evqa/test.csv"] if r["image_id"] in skipped_ids]
    seen = [i for b in recorder.batches for i in b["data_id"]]
    assert seen == [i for i in expected if i not in dropped]
    assert sorted(i for b in recorder.batches for i in b["dropped_data_ids"]) == sorted(dropped)
    assert datamodule.image_loader.counts() == {"missing": 1, "corrupt": 1, "too_small": 0, "outside_root": 0}
    record = json.loads(datamodule.write_skipped_images(tmp_path).read_text())
    assert {s["image_id"] for s in record["skipped"]} == skipped_ids


@pytest.mark.slow
def test_infoseek_questions_carry_their_official_references(world):
    datamodule = build_data_module(_config(world, "infoseek"))
    assert isinstance(datamodule, InfoSeekDataModule)
    recorder = _run_test(datamodule)
    assert datamodule.reference_overlap["test"]["questions_without_reference"] == 0
    splits = {s for b in recorder.batches for s in b["data_split"]}
    assert splits == {"val_unseen_question", "val_unseen_entity"}
    assert all(a is not None for b in recorder.batches for a in b["answer_eval"])
    assert datamodule.image_loader.counts() == {"missing": 1, "corrupt": 0, "too_small": 0, "outside_root": 0}


def test_infoseek_questions_can_come_from_the_official_jsonl(world):
    datamodule = InfoSeekDataModule(_config(world, "infoseek", test_questions="infoseek/infoseek_val.jsonl"))
    questions = datamodule.questions("test")
    assert {q.question_type for q in questions} == {"String", "Numerical", "Time"}
    assert len(questions) == world["counts"]["questions:infoseek/infoseek_test_filtered.csv"]


def test_order_is_deterministic_and_two_hop_and_caps_apply(world):
    first = EVQADataModule(_config(world, "evqa", include_two_hop=True, drop_missing_images=False))
    second = EVQADataModule(_config(world, "evqa", include_two_hop=True, drop_missing_images=False))
    ids = [i for b in first.test_dataloader() for i in b["data_id"]]
    assert ids == [i for b in second.test_dataloader() for i in b["data_id"]]
    assert ids == [r["data_id"] for r in world["questions"]["evqa/test.csv"]]
    assert any(i.startswith("E-VQA_2hop_") for i in ids)
    capped = EVQADataModule(_config(world, "evqa", max_questions=5))
    assert [q.data_id for q in capped.questions("val")] == [
        q.data_id for q in read_evqa_csv(Path(world["dir"]) / "evqa/val.csv")
    ][:5]


def test_kb_store_and_article_images_come_from_the_config(world):
    datamodule = EVQADataModule(_config(world, "evqa"))
    store = datamodule.kb_store()
    assert len(store) == world["counts"]["articles"]
    index = datamodule.article_images()
    modes = {e["title"]: e["image_mode"] for e in world["entities"]}
    for article in store:
        image = index.main_image(article.title, article.image_urls)
        assert (image is None) == (modes[article.title] == "none")
    assert index.coverage()["fallback_to_url_store"] == world["counts"]["articles_with_url_store_image_only"]


def test_config_errors_name_the_key(world):
    with pytest.raises(ConfigError, match="data.dataset"):
        build_data_module(_config(world, "evqa", dataset="okvqa"))
    with pytest.raises(ConfigError, match="data.val_questions is not set"):
        InfoSeekDataModule(_config(world, "infoseek")).val_dataloader()


class _Batches(L.LightningModule):
    """Records the data ids of every predict batch; no model."""

    def __init__(self):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))
        self.batches: list[list[str]] = []

    def predict_step(self, batch, batch_idx):
        self.batches.append(list(batch["data_id"]) + list(batch["dropped_data_ids"]))
        return len(self.batches[-1])


def _rank_batches(datamodule, rank: int, world: int) -> list[list[str]]:
    """The batches one rank of `world` is given (what predict_dataloader hands that rank's trainer)."""
    from types import SimpleNamespace

    datamodule.trainer = SimpleNamespace(global_rank=rank, world_size=world)  # only its rank and world are read
    loader = datamodule.predict_dataloader()
    return [sorted(b["data_id"] + b["dropped_data_ids"]) for b in loader]


def test_evaluation_batches_are_fixed_blocks_of_the_split_on_any_ranks_and_after_a_resume(world):
    from qkvqa.data_modules.evaluation import EvaluationDataModule

    benchmark = build_data_module(_config(world, "evqa", batch_size=16))
    ids = [q.data_id for q in benchmark.questions("test")]
    B = next(b for b in (6, 4, 7, 8) if len(ids) % b)  # a batch size that leaves a short last block
    blocks = [sorted(ids[s : s + B]) for s in range(0, len(ids), B)]
    assert len(blocks) >= 4 and len(blocks[-1]) < B, "the split must end in a short block"
    whole = EvaluationDataModule(benchmark, "test", batch_size=B)
    recorder = _Batches()
    L.Trainer(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False, enable_model_summary=False
    ).predict(recorder, datamodule=whole, return_predictions=False)
    assert [sorted(b) for b in recorder.batches] == blocks  # one rank: the split's blocks, in order
    for world_size in (2, 3):
        per_rank = [_rank_batches(whole, r, world_size) for r in range(world_size)]
        assert sorted(b for rank in per_rank for b in rank) == sorted(blocks)  # every block once, whole
    # A resume after some rows of block 1 and all of block 0 were written: block 0 is done, block 1 runs whole
    done = set(ids[:B]) | set(ids[B : B + 2])
    resumed = EvaluationDataModule(benchmark, "test", done, batch_size=B)
    resumed.setup("predict")
    assert _rank_batches(resumed, 0, 1) == blocks[1:]
    assert sorted(b for r in range(2) for b in _rank_batches(resumed, r, 2)) == sorted(blocks[1:])
