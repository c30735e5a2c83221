"""QFF training DataModule: seeded negatives per (seed, epoch, sample), de-duplicated images, dynamic padding, drops, sharding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from qkvqa.config.load import compose
from qkvqa.data_modules.qff_train import (
    EpochTaggedSampler,
    QFFTrainDataModule,
    article_image_id,
    query_image_id,
    settings_from_config,
)
from qkvqa.qff.builder import build_qff_component
from tests.helpers.qff_study import SPLIT_FILES, mine_world


@pytest.fixture(scope="module")
def mined(world, tmp_path_factory) -> list[str]:
    """Overrides of the demo experiment with pools mined on the session world."""
    return mine_world(world, tmp_path_factory.mktemp("qff_data"))


@pytest.fixture(scope="module")
def setting(mined):
    """(cfg, component, DataModule set up for fit) on the session world."""
    cfg = compose("demo/qff_per_layer", [], mined)
    component = build_qff_component(cfg.components.qformer, cfg.qff)
    dm = QFFTrainDataModule(
        cfg.data, settings_from_config(cfg, component), component.tokenizer, component.image_processor
    )
    dm.setup("fit")
    return cfg, component, dm


@pytest.mark.slow
def test_negatives_are_drawn_from_the_pool_and_fixed_by_seed_epoch_and_index(setting):
    cfg, _, dm = setting
    dataset = dm.dataset("train")
    n = cfg.qff.num_negatives + 1
    for index in range(len(dataset)):
        ref = dataset.samples[index]
        pool = dm.pool_file("train").pool(ref.question, ref.key)
        sample = dataset[(0, index)]
        assert sample["candidates"][0] == (pool.positive.url, pool.positive.section_index)
        assert len(sample["candidates"]) == len(set(sample["candidates"])) == n
        assert set(sample["candidates"][1:]) <= {(c.url, c.section_index) for c in pool.negatives}
        assert sample == dataset[(0, index)]
    epoch0 = [dataset[(0, i)]["candidates"] for i in range(len(dataset))]
    epoch1 = [dataset[(1, i)]["candidates"] for i in range(len(dataset))]
    other_seed = dataclasses.replace(dm.settings, seed=1)
    reseeded = type(dataset)(dataset.samples, dataset.pools, dataset.store, other_seed)
    assert sum(a != b for a, b in zip(epoch0, epoch1)) > 0.9 * len(dataset)
    assert sum(a != reseeded[(0, i)]["candidates"] for i, a in enumerate(epoch0)) > 0.9 * len(dataset)


@pytest.mark.slow
def test_keep_gold_negatives_puts_every_sibling_section_in_the_drawn_set_and_draws_the_rest(setting):
    cfg, _, dm = setting
    dataset = dm.dataset("train")
    kept = type(dataset)(
        dataset.samples,
        dataset.pools,
        dataset.store,
        dataclasses.replace(
            dm.settings, qff=dataclasses.replace(dm.settings.qff, mining_gold_sections=8, keep_gold_negatives=True)
        ),
    )
    plain = type(dataset)(
        dataset.samples,
        dataset.pools,
        dataset.store,
        dataclasses.replace(dm.settings, qff=dataclasses.replace(dm.settings.qff, mining_gold_sections=8)),
    )
    siblings_drawn = {"kept": 0, "plain": 0}
    for index in range(len(dataset)):
        ref = dataset.samples[index]
        pool = dm.pool_file("train").pool(ref.question, ref.key, gold_sections=8)
        gold = {(c.url, c.section_index) for c in pool.negatives if c.url == pool.positive.url}
        for name, data in (("kept", kept), ("plain", plain)):
            candidates = data[(0, index)]["candidates"]
            assert len(candidates) == len(set(candidates)) == cfg.qff.num_negatives + 1
            assert set(candidates[1:]) <= {(c.url, c.section_index) for c in pool.negatives}
            siblings_drawn[name] += len(gold & set(candidates[1:]))
            if name == "kept":
                assert gold <= set(candidates[1:])
        assert kept[(0, index)] == kept[(0, index)] and kept[(0, index)] != kept[(1, index)]
    assert siblings_drawn["kept"] > 3 * siblings_drawn["plain"]


def test_samples_carry_section_strings_of_the_candidates_with_their_original_indices(setting):
    _, _, dm = setting
    sample = dm.dataset("train")[(0, 0)]
    store = dm.kb_store()
    for (url, index), text in zip(sample["candidates"], sample["texts"]):
        article = store.get_by_url(url)
        assert text == article.section_string(index)
        assert (
            article.section_titles[index] not in ("References", "External links")
            or (url, index) == sample["candidates"][0]
        )


def test_the_collate_loads_each_distinct_image_once_and_pads_to_the_longest_text(setting):
    cfg, component, dm = setting
    dataset = dm.dataset("train")
    samples = [dataset[(0, i)] for i in range(4)]
    batch = dm.collator()(samples)
    n = cfg.qff.num_negatives + 1
    assert batch["size"] == 4 and batch["dropped"] == [] and batch["num_candidates"] == n
    ids = batch["image_ids"]
    assert len(ids) == len(set(ids)) == batch["pixel_values"].shape[0]
    assert batch["pixel_values"].shape[1:] == (3, component.model.image_size, component.model.image_size)
    for row, sample in enumerate(samples):
        assert ids[batch["question_image_index"][row]] == query_image_id(*sample["query_image"])
        for k, path in enumerate(sample["images"]):
            assert ids[batch["section_image_index"][row * n + k]] == article_image_id(path)
    shared = sum(len(s["images"]) + 1 for s in samples) - len(ids)
    assert shared > 0, "the gold article's image repeats within a sample, so some images must be shared"
    sections = batch["sections"]
    lengths = sections["attention_mask"].sum(1)
    assert sections["input_ids"].shape == (4 * n, int(lengths.max())) and lengths.min() < lengths.max()
    texts = [t for s in samples for t in s["texts"]]
    expected = component.tokenizer(texts[0], truncation=True, max_length=component.max_text_tokens)["input_ids"]
    assert sections["input_ids"][0, : lengths[0]].tolist() == expected


def test_samples_with_unreadable_images_are_dropped_and_an_all_dropped_batch_is_empty(setting):
    _, _, dm = setting
    dataset = dm.dataset("train")
    good, bad = dataset[(0, 0)], dict(dataset[(0, 1)], query_image=("inaturalist", "no-such-image"))
    broken = dict(dataset[(0, 2)], images=["wiki_image_split/nowhere.jpg"] + dataset[(0, 2)]["images"][1:])
    batch = dm.collator()([good, bad, broken])
    assert batch["size"] == 1 and batch["data_ids"] == [good["data_id"]]
    assert {(d["data_id"], d["reason"]) for d in batch["dropped"]} == {
        (bad["data_id"], "query_image_unreadable"),
        (broken["data_id"], "article_image_unreadable"),
    }
    empty = dm.collator()([bad, broken])
    assert empty["size"] == 0 and len(empty["dropped"]) == 2
    assert "sections" not in empty and "pixel_values" not in empty


def test_setup_drops_the_samples_the_rule_drops_and_counts_them(setting, world):
    _, _, dm = setting
    report = dm.sample_report()
    imageless = {e["url"] for e in world["entities"] if e["image_mode"] == "none"}
    train_rows = [q for q in world["questions"][SPLIT_FILES["train"]] if q["question_type"] != "2_hop"]
    expected = sum(1 for q in train_rows if q["gold_urls"][0] in imageless)
    assert report["train"]["dropped_by_reason"] == {"no_gold_image": expected}
    assert report["train"]["kept"] == len(train_rows) - expected == len(dm.dataset("train"))
    assert "val" in report


def test_training_batches_shard_across_ranks_and_tag_the_epoch(setting):
    _, _, dm = setting
    n = len(dm.dataset("train"))
    samplers = [EpochTaggedSampler(n, seed=0, rank=r, world_size=2) for r in range(2)]
    for sampler in samplers:
        sampler.set_epoch(3)
    drawn = [list(s) for s in samplers]
    assert all(epoch == 3 for rank in drawn for epoch, _ in rank)
    indices = [i for rank in drawn for _, i in rank]
    assert sorted(set(indices)) == list(range(n)) and len(indices) == 2 * ((n + 1) // 2)
    samplers[0].resume_from(3, 4)
    assert list(samplers[0]) == drawn[0][4:]


@pytest.mark.slow
def test_max_train_samples_takes_a_seeded_subset(setting, mined):
    _, component, _ = setting
    cfg = compose("demo/qff_per_layer", [], [*mined, "qff.max_train_samples=10", "qff.max_val_samples=5"])
    subsets = []
    for _ in range(2):
        dm = QFFTrainDataModule(
            cfg.data, settings_from_config(cfg, component), component.tokenizer, component.image_processor
        )
        dm.setup("fit")
        subsets.append([r.question.data_id for r in dm.dataset("train").samples])
        assert len(dm.dataset("val")) == 5
    assert len(subsets[0]) == 10 and subsets[0] == subsets[1]


def test_validation_batches_carry_every_section_of_the_top_k_articles(setting):
    cfg, _, dm = setting
    dataset = dm.dataset("val")
    samples = [dataset[i] for i in range(3)]
    batch = dm.collator()(samples)
    rerank = batch["rerank"]
    slots = torch.cat([c["slot"] for c in rerank["chunks"]]).tolist()
    expected = {
        (q, a, j)
        for q, item in enumerate(rerank["questions"])
        for a, article in enumerate(item["articles"])
        for j in range(len(article["sections"]))
    }
    assert len(slots) == len(set(map(tuple, slots))) and set(map(tuple, slots)) == expected
    for q, (sample, item) in enumerate(zip(samples, rerank["questions"])):
        assert len(item["articles"]) == min(cfg.qff.val_top_k, 20)
        with_sections = [a for a in item["articles"] if a["sections"]]
        assert with_sections and all(a["url"] for a in with_sections)
        assert item["gold_urls"] == dm.dataset("val").samples[q].question.gold_urls
    for chunk in rerank["chunks"]:
        assert chunk["input_ids"].shape[0] <= cfg.qff.section_batch_size
        assert int(chunk["image_index"].max()) < len(batch["image_ids"])


def test_focus_blocks_and_gates_get_their_own_learning_rate_and_gates_no_weight_decay():
    from qkvqa.components import build_component
    from qkvqa.config.schema import QFFConfig
    from qkvqa.models.qff_module import QFFTrainer

    comp = build_component({"kind": "blip2_qff", "tiny": True, "device": "cpu", "options": {"num_layers": 2}})
    trainer = QFFTrainer(comp.model, QFFConfig(lr=1e-5, weight_decay=0.05, new_block_lr_scale=10.0))
    groups = {g["name"]: g for g in trainer.parameter_groups()}
    assert set(groups) == {"qformer", "focus_blocks", "focus_gates"}
    assert (groups["qformer"]["lr"], groups["qformer"]["weight_decay"]) == (1e-5, 0.05)
    assert groups["focus_blocks"]["lr"] == pytest.approx(1e-4) and groups["focus_blocks"]["weight_decay"] == 0.05
    assert groups["focus_gates"]["lr"] == pytest.approx(1e-4) and groups["focus_gates"]["weight_decay"] == 0.0
    assert groups["focus_gates"]["params"] == [comp.model.q_gate]
    ids = [id(p) for g in groups.values() for p in g["params"]]
    trainable = [p for p in comp.model.parameters() if p.requires_grad]
    assert len(ids) == len(set(ids)) == len(trainable)  # every trainable parameter in exactly one group


@pytest.mark.slow
def test_the_datasets_and_collator_travel_pickled_without_the_datamodule(setting):
    """Beside a live process group, DataLoader workers start from the fork server and unpickle what they load
    (data_modules.samplers.worker_start_context). A pool file's fallback was the DataModule's bound method, which took
    the DataModule, and with it the fitting trainer (locks, lambdas), into that pickle: every worker failed to start."""
    import io
    import pickle

    _, _, dm = setting

    class NoDataModule(pickle.Pickler):
        def persistent_id(self, obj):
            assert obj is not dm, "the DataModule travels with what the workers load"
            return None

    def copied(obj):
        buffer = io.BytesIO()
        NoDataModule(buffer).dump(obj)
        return pickle.loads(buffer.getvalue())

    collate = dm.collator()
    # nor the questions the benchmark read (every split's, unpickled by each worker at every epoch): read again if asked
    assert dm.benchmark._questions and copied(dm.benchmark)._questions == {}
    assert [q.data_id for q in copied(dm.benchmark).questions("train")] == [
        q.data_id for q in dm.benchmark.questions("train")
    ]
    for split in ("train", "val"):
        dataset = dm.dataset(split)
        copy = copied(dataset)
        # the copy, collated by a copy of the collator, gives the same batch
        a = collate([dataset[(1, 0)], dataset[(1, 1)]])
        b = copied(collate)([copy[(1, 0)], copy[(1, 1)]])
        assert a["data_ids"] == b["data_ids"]
        assert torch.equal(a["sections"]["input_ids"], b["sections"]["input_ids"])


def test_a_new_focus_parameter_declares_its_optimizer_group_or_is_refused():
    """Issue 45 item 4: a parameter a focus block adds must name its group; an undeclared one never lands silently in
    the base group with weight decay."""
    from torch import nn

    from qkvqa.components import build_component
    from qkvqa.config.schema import QFFConfig
    from qkvqa.errors import ConfigError
    from qkvqa.models.qff_module import QFFTrainer
    from qkvqa.qff.model import QFFModel

    comp = build_component({"kind": "blip2_qff", "tiny": True, "device": "cpu", "options": {"num_layers": 2}})
    model = comp.model
    model.extra_gate = nn.Parameter(torch.zeros(2))
    trainer = QFFTrainer(model, QFFConfig(lr=1e-5, weight_decay=0.05))
    with pytest.raises(ConfigError, match=r"parameter 'extra_gate' is in no optimizer group: declare it in"):
        trainer.parameter_groups()

    class ExtraGate(QFFModel):
        PARAMETER_GROUPS = {**QFFModel.PARAMETER_GROUPS, "extra_gate": "focus_gates"}

    model.__class__ = ExtraGate
    groups = {g["name"]: g for g in trainer.parameter_groups()}
    assert groups["focus_gates"]["params"] == [model.q_gate, model.extra_gate]
    assert groups["focus_gates"]["weight_decay"] == 0.0
    assert all(p is not model.extra_gate for p in groups["qformer"]["params"])
