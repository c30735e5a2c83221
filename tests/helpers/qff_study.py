"""Train tiny QFFs on a synthetic world and score them: shared by the learning test and bench/qff_focus.py.

`prepare` writes a world, a stand-in stage 1 (the entities the query image shows and others, in an order
that tells nothing, with near-tied similarities, so article R@1 after fusion measures the QFF), OMGM
pools and the ViT cache. `train` runs `qkvqa train` for (focus, seed) pairs as separate processes with
one intra-op thread each, a few at a time. `evaluate` scores a model on the val + test questions.
"""
from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = {"per_layer": "demo/qff_per_layer", "none": "demo/qff_none"}
EVAL_SPLITS = {"val": "evqa/val.csv", "test": "evqa/test.csv"}
TRAINING = ["trainer.limit_val_batches=0", "checkpoint.monitor=null", "trainer.enable_progress_bar=false",
            "trainer.deterministic=true"]


def world_words(world: dict) -> str:
    """Every word of the world's KB and training questions, so that the tiny tokenizer keeps titles whole."""
    kb = json.loads((Path(world["dir"]) / world["paths"]["kb_json"]).read_text(encoding="utf-8"))
    texts = [" ".join(a["section_titles"] + a["section_texts"]) for a in kb.values()]
    with open(Path(world["dir"]) / "evqa/train.csv", newline="", encoding="utf-8") as f:
        texts += [row["question"] for row in csv.DictReader(f)]
    return " ".join(sorted({w for text in texts for w in re.findall(r"[a-z]+", text.lower())}))


def prepare(work: Path, entities: int, extra: Sequence[str] = (), **world_options) -> tuple[list[str], set[str]]:
    """World, stand-in stage 1, pools and ViT cache under `work`; returns the overrides every run shares and
    the ids ("split/data_id") of the val + test questions whose image shows several entities."""
    from qkvqa.config.load import compose
    from qkvqa.data.synth import generate_world
    from qkvqa.qff.vit_cache import build_cache_from_config
    from tests.unit.test_qff_data import mine_world

    world = dict(generate_world(work / "world", entities=entities, seed=0, **world_options), dir=str(work / "world"))
    overrides = [*mine_world(world, work, splits=("train", "val", "test"), shuffled=True),
                 f"components.qformer.options.vocab_texts=[{world_words(world)}]",
                 f"qff.vit_cache={work / 'vit_cache'}", *extra]
    # every val image, so that each seed's validation subset (qff.max_val_samples) finds its features
    assert build_cache_from_config(compose(EXPERIMENTS["per_layer"], [], [*overrides, "qff.max_val_samples=null"]))[
        "complete"]
    multi = {f"{split}/{q['data_id']}" for split, file in EVAL_SPLITS.items() for q in world["questions"][file]
             if len(q["image_entities"]) > 1}
    return overrides, multi


def run_id(focus: str, seed: int) -> str:
    """The run directory name of one (focus, seed) training."""
    return f"qff-{focus}-{seed}"


def train(work: Path, overrides: Sequence[str], jobs: Sequence[tuple[str, int]], epochs: int,
          parallel: int = 2) -> dict[tuple[str, int], int]:
    """`qkvqa train` for each (focus, seed), `parallel` processes at a time; returns each job's exit code."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="disabled", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]))
    for name in ("QKVQA_RUN_ID", "QKVQA_RUN_DIR"):
        env.pop(name, None)
    pending, running, codes = list(jobs), [], {}
    while pending or running:
        while pending and len(running) < parallel:
            focus, seed = pending.pop(0)
            log = open(work / f"log_{focus}_{seed}.txt", "w")
            cmd = [sys.executable, "-m", "qkvqa.cli.main", "train", f"experiment={EXPERIMENTS[focus]}",
                   f"run_id={run_id(focus, seed)}", *overrides, f"seed={seed}", f"trainer.max_epochs={epochs}",
                   *TRAINING]
            running.append(((focus, seed), subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        job, proc, log = running.pop(0)
        codes[job] = proc.wait()
        log.close()
    return codes


def score(component, cfg) -> dict[str, tuple[float, float]]:
    """(section hit, article hit after fusion) per question of cfg's validation split."""
    from data_modules.qff_train import QFFTrainDataModule, settings_from_config
    from qkvqa.models.qff_module import QFFTrainer, QFFTrainSettings

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


def evaluate(focus: str, checkpoint: Optional[Path], overrides: Sequence[str], work: Path, multi: set,
             seed: int = 0) -> dict:
    """Section / article R@1 of one model (None: untrained) over every val + test question."""
    from qkvqa.config.load import compose
    from qkvqa.qff.builder import build_qff_component

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        hits = {}
        for split, file in EVAL_SPLITS.items():
            cfg = compose(EXPERIMENTS[focus], [], [*overrides, f"seed={seed}", f"data.val_questions={file}",
                                                   f"qff.val_negatives={work / f'pools/hardneg_{split}.json'}",
                                                   f"qff.checkpoint={checkpoint}" if checkpoint else "qff.checkpoint=null",
                                                   "qff.max_val_samples=null",   # every question, whatever the seed
                                                   "qff.vit_cache=null"])        # the cache holds train + val images
            component = build_qff_component(cfg.components.qformer, cfg.qff)
            hits.update({f"{split}/{k}": v for k, v in score(component, cfg).items()})
        return figures(hits, multi)
    finally:
        torch.set_num_threads(threads)
