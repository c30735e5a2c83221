"""The QFF learns: tiny models trained on the synthetic world lift section and article R@1 far above the untrained model.

A 60-entity world; stage 1 is a stand-in whose top-20 holds the entities the query image shows and
others in a seeded order that tells nothing (so article R@1 measures the QFF, not stage 1). Pools are
mined with OMGM's rule, the ViT features cached, and `qkvqa train` runs demo/qff_per_layer and
demo/qff_none with the same seed. Both models and the untrained one are scored on the val and test
questions: section R@1 (the evidence section outscores the sample's 15 negatives) and article R@1
after alpha fusion over the top-20. The figures are written to `learning.json` beside the runs.

Question focus (per_layer) against none is reported there but not asserted: in this world, and in the
variants bench/qff_focus.py tries, the two do not separate beyond seed noise (docs/training.md, "Does
question focus help on the synthetic world?").
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
import torch

from data_modules.qff_train import QFFTrainDataModule, settings_from_config
from qkvqa.cli.main import main
from qkvqa.config.load import compose
from qkvqa.models.qff_module import QFFTrainer, QFFTrainSettings
from qkvqa.qff.builder import build_qff_component
from qkvqa.qff.vit_cache import build_cache_from_config
from qkvqa.run.rundir import clear_run_env
from tests.fixtures_world import make_world
from tests.unit.test_qff_data import mine_world

pytestmark = pytest.mark.slow

ENTITIES = 60
TRAINING = ["trainer.max_epochs=5", "trainer.limit_val_batches=0", "checkpoint.monitor=null",
            "trainer.enable_progress_bar=false", "trainer.deterministic=true"]
EVAL_SPLITS = {"val": "evqa/val.csv", "test": "evqa/test.csv"}


def world_words(world: dict) -> str:
    """Every word of the world's KB and training questions, so that the tiny tokenizer keeps titles whole."""
    kb = json.loads((Path(world["dir"]) / world["paths"]["kb_json"]).read_text(encoding="utf-8"))
    texts = [" ".join(a["section_titles"] + a["section_texts"]) for a in kb.values()]
    with open(Path(world["dir"]) / "evqa/train.csv", newline="", encoding="utf-8") as f:
        texts += [row["question"] for row in csv.DictReader(f)]
    return " ".join(sorted({w for text in texts for w in re.findall(r"[a-z]+", text.lower())}))


def score(component, cfg) -> dict[str, tuple[float, float]]:
    """(section hit, article hit after fusion) per question of cfg's validation split."""
    module = QFFTrainer(component.model, QFFTrainSettings.from_config(cfg.qff)).eval()
    dm = QFFTrainDataModule(cfg.data, settings_from_config(cfg, component), component.tokenizer,
                            component.image_processor)
    dm.setup("validate")
    hits = {}
    with torch.no_grad():
        for batch in dm.val_dataloader():
            question, sections, states = module.encode(batch)
            logits = module.logits(batch, question, sections, states)
            articles, _ = module.rerank_hits(batch["rerank"], question, states)
            for row, data_id in enumerate(batch["data_ids"]):
                hits[data_id] = (float(logits[row].argmax() == 0), articles[row])
    return hits


def figures(hits: dict, multi: set) -> dict:
    """Section and article R@1 (percent) over all questions and over the multi-entity ones."""
    out = {}
    for name, keys in (("all", list(hits)), ("multi", [k for k in hits if k in multi])):
        out[name] = {"n": len(keys), "section_r1": 100 * sum(hits[k][0] for k in keys) / len(keys),
                     "article_r1": 100 * sum(hits[k][1] for k in keys) / len(keys)}
    return out


@pytest.fixture(scope="module")
def learning(tmp_path_factory) -> dict:
    """Train both focus modes and score them and the untrained model (see the module docstring)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)                          # steadier and faster for tiny models on shared cores
    try:
        work = tmp_path_factory.mktemp("learns")
        world = make_world(work, entities=ENTITIES)
        overrides = [*mine_world(world, work, splits=("train", "val", "test"), shuffled=True),
                     f"components.qformer.options.vocab_texts=[{world_words(world)}]"]
        cache = [f"qff.vit_cache={work / 'vit_cache'}"]
        assert build_cache_from_config(compose("demo/qff_per_layer", [], [*overrides, *cache]))["complete"]
        for name in ("per_layer", "none"):
            clear_run_env()
            assert main(["train", f"experiment=demo/qff_{name}", f"run_id=qff-{name}", *overrides, *cache,
                         *TRAINING]) == 0
        multi = {(split, q["data_id"]) for split, file in EVAL_SPLITS.items() for q in world["questions"][file]
                 if len(q["image_entities"]) > 1}
        results = {}
        for model, experiment, checkpoint in (("untrained", "demo/qff_per_layer", None),
                                              ("per_layer", "demo/qff_per_layer", work / "runs/qff-per_layer/qff"),
                                              ("none", "demo/qff_none", work / "runs/qff-none/qff")):
            hits = {}
            for split, file in EVAL_SPLITS.items():
                cfg = compose(experiment, [], [*overrides, f"data.val_questions={file}",
                                                          f"qff.val_negatives={work / f'pools/hardneg_{split}.json'}",
                                                          f"qff.checkpoint={checkpoint}" if checkpoint else
                                                          "qff.checkpoint=null"])
                component = build_qff_component(cfg.components.qformer, cfg.qff)
                hits.update({(split, k): v for k, v in score(component, cfg).items()})
            results[model] = figures(hits, multi)
        (work / "learning.json").write_text(json.dumps(results, indent=2))
        print(json.dumps(results, indent=2))
        return results
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("model", ["per_layer", "none"])
def test_training_lifts_section_and_article_r1_far_above_the_untrained_model(learning, model):
    untrained, trained = learning["untrained"]["all"], learning[model]["all"]
    assert trained["n"] == untrained["n"] >= 100
    assert trained["section_r1"] >= untrained["section_r1"] + 25
    assert trained["article_r1"] >= untrained["article_r1"] + 25


@pytest.mark.parametrize("model", ["per_layer", "none"])
def test_training_also_lifts_the_multi_entity_questions(learning, model):
    untrained, trained = learning["untrained"]["multi"], learning[model]["multi"]
    assert trained["n"] == untrained["n"] >= 30
    assert trained["section_r1"] >= untrained["section_r1"] + 5
    assert trained["article_r1"] >= untrained["article_r1"] + 5
