"""Train tiny QFFs on a synthetic world and score them: shared by the learning test and bench/qff_focus.py.

`world_stage1` is a stand-in for stage 1 and `mine_world` mines OMGM pools from it (shared by the QFF
data, training, cache and DDP tests). `prepare` writes a world, that stage 1 (the entities the query
image shows and others, in an order that tells nothing, with near-tied similarities, so article R@1
after fusion measures the QFF), the pools and the ViT cache. `train` runs `qkvqa train` for (focus,
seed) pairs as separate processes with one intra-op thread each, a few at a time. `evaluate` scores a
model on the val + test questions; `evaluate_many` scores several in parallel processes.
"""

from __future__ import annotations

import csv
import json
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from qkvqa.config.load import compose
from qkvqa.data.benchmark import build_benchmark
from qkvqa.qff.mining import mine_to_dir
from qkvqa.retrieval.results import Retrieved, write_results

REPO = Path(__file__).resolve().parents[2]
EXPERIMENTS = {"per_layer": "demo/qff_per_layer", "none": "demo/qff_none"}
PRETRAINED_HERE = "components.qformer.init=pretrained_here"
# the oracles in the focus path (tests/helpers/qff_oracle.py): focus plugins, so a trained one is scored by its class
ATTRIBUTE_ORACLE = "qff.focus=tests.helpers.qff_oracle:AttributeOracle"
PRESENCE_ORACLE = "qff.focus=tests.helpers.qff_oracle:PresenceOracle"
# The study's variants: name -> (experiment, overrides). The first two are the learning test's EXPERIMENTS.
VARIANTS = {
    "per_layer": ("demo/qff_per_layer", []),
    "none": ("demo/qff_none", []),
    "input": ("demo/qff_per_layer", ["qff.focus=input"]),
    "per_layer_gate_none": ("demo/qff_per_layer", ["qff.gate=none"]),  # the paper's plain residual
    "per_layer_open": ("demo/qff_per_layer", ["qff.gate_init=0.5"]),  # tanh 0.46 at step 0
    "per_layer_lr10": ("demo/qff_per_layer", ["qff.new_block_lr_scale=10"]),  # new blocks and gates 10x lr
    "per_layer_lr100": ("demo/qff_per_layer", ["qff.new_block_lr_scale=100"]),  # at the paper's lr 1e-5: 1e-3
    # the Q-Former's text layers pretrained here first (masked-language modelling: qkvqa.qff.pretrain_here)
    "none_pt": ("demo/qff_none", [PRETRAINED_HERE]),
    "per_layer_lr10_pt": ("demo/qff_per_layer", ["qff.new_block_lr_scale=10", PRETRAINED_HERE]),
    "per_layer_pt": ("demo/qff_per_layer", [PRETRAINED_HERE]),
    # Oracles in the focus path (OracleFocusModel), on per_layer_lr10_pt; late interaction still reads the whole
    # question. oracle_attribute: the focus blocks attend to the question pass of the question with every word but its
    # attribute words masked (told which attribute is asked, the model must still find it in the section).
    "oracle_attribute": ("demo/qff_per_layer", [ATTRIBUTE_ORACLE, "qff.new_block_lr_scale=10", PRETRAINED_HERE]),
    # positive_control: that oracle state scaled by the share of the question's attribute words the section holds,
    # so the focus path is handed, per (question, section), whether the section states the asked attribute: it must
    # help by construction where the attribute words tell the evidence from its siblings (the controlled world)
    "positive_control": ("demo/qff_per_layer", [PRESENCE_ORACLE, "qff.new_block_lr_scale=10", PRETRAINED_HERE]),
    # the same, random init
    "positive_control_random": ("demo/qff_per_layer", [PRESENCE_ORACLE, "qff.new_block_lr_scale=10"]),
    # the same on the study's init (bench/qff_focus.py --init bert:<ref>: the BERT-initialised Q-Former)
    "positive_control_lr10": ("demo/qff_per_layer", [PRESENCE_ORACLE, "qff.new_block_lr_scale=10"]),
}
SPLIT_FILES = {"train": "evqa/train.csv", "val": "evqa/val.csv", "test": "evqa/test.csv"}
EVAL_SPLITS = {split: SPLIT_FILES[split] for split in ("val", "test")}
TRAINING = [
    "trainer.limit_val_batches=0",
    "checkpoint.monitor=null",
    "trainer.enable_progress_bar=false",
    "trainer.deterministic=true",
]


def init_overrides(init: str) -> list[str]:
    """The overrides that start a demo experiment's Q-Former from `init`; for bert:<ref> the experiment's tiny shape
    options (it sets them after any preset) are replaced by the BERT's, the world's vocabulary by the BERT's, and the
    ViT keeps the experiment's options with 4 heads."""
    if not init.startswith("bert:"):
        return [f"components.qformer.init={init}"]
    from transformers import AutoConfig

    from qkvqa.components.registry import ComponentSpec, resolve_pretrained

    bert = AutoConfig.from_pretrained(resolve_pretrained(ComponentSpec(kind="blip2_qff", pretrained=init[5:])))
    options = "components.qformer.options"
    return [
        "components.qformer.tiny=false",
        "components.qformer.pretrained=null",
        f"components.qformer.init={init}",
        f"{options}.hidden_size={bert.hidden_size}",
        f"{options}.num_layers={bert.num_hidden_layers}",
        f"{options}.num_heads={bert.num_attention_heads}",
        f"{options}.max_position_embeddings={bert.max_position_embeddings}",
        f"{options}.vision_heads=4",
        f"{options}.vocab_texts=[]",
    ]


def compose_run(experiment: str, tokens: Sequence[str]):
    """compose() of an experiment with command-line tokens, `preset=NAME` ones included (as `qkvqa train` reads them)."""
    from qkvqa.config.cli import split_overrides

    _, presets, rest = split_overrides(list(tokens))
    return compose(experiment, presets, rest)


def world_stage1(
    world: dict, split: str, top_k: int = 20, seed: int = 0, shuffled: bool = False
) -> dict[str, Retrieved]:
    """A stand-in for stage 1, a function of the query image: the entities it shows and others in a seeded order
    fill the top-K; the shown ones come first, or (`shuffled`) anywhere, so that the order tells nothing."""
    entities = {e["entity_id"]: e for e in world["entities"]}
    results = {}
    for record in world["questions"][SPLIT_FILES[split]]:
        shown = [entities[e] for e in record["image_entities"]]
        rest = [e for e in entities.values() if e not in shown]
        random.Random(f"{seed}/{record['image_id']}").shuffle(rest)
        ranked = (shown + rest)[:top_k]
        if shuffled:
            random.Random(f"{seed}/order/{record['image_id']}").shuffle(ranked)
        # near-ties, as tiny encoders give them: with alpha = 0.9 the QFF decides the fused order
        results[record["data_id"]] = Retrieved(
            [e["url"] for e in ranked], [e["title"] for e in ranked], [0.9 - 0.0005 * k for k in range(len(ranked))]
        )
    return results


def mine_world(world: dict, work: Path, splits=("train", "val"), shuffled: bool = False) -> list[str]:
    """Write stage-1 stand-in results and mine the pools of `splits` for the demo experiment under `work`;
    returns the overrides that point a config at the train and val pools."""
    base = [
        f"paths.world_dir={world['dir']}",
        f"paths.checkpoints_root={work / 'runs'}",
        f"paths.cache_dir={work / 'cache'}",
    ]
    for split in splits:
        write_results(work / f"stage1_{split}.json", world_stage1(world, split, shuffled=shuffled))
        cfg = compose("demo/qff_per_layer", [], [*base, f"retrieval.results={work / f'stage1_{split}.json'}"])
        mine_to_dir(cfg, split, work / "pools", build_benchmark(cfg.data))
    return [
        *base,
        f"qff.negatives={work / 'pools/hardneg_train.json'}",
        f"qff.val_negatives={work / 'pools/hardneg_val.json'}",
    ]


def world_words(world: dict) -> str:
    """Every word of the world's KB and training questions, so that the tiny tokenizer keeps titles whole."""
    kb = json.loads((Path(world["dir"]) / world["paths"]["kb_json"]).read_text(encoding="utf-8"))
    texts = [" ".join(a["section_titles"] + a["section_texts"]) for a in kb.values()]
    with open(Path(world["dir"]) / "evqa/train.csv", newline="", encoding="utf-8") as f:
        texts += [row["question"] for row in csv.DictReader(f)]
    return " ".join(sorted({w for text in texts for w in re.findall(r"[a-z]+", text.lower())}))


def reuse_world(out: Path, entities: int, world_options: dict) -> Optional[dict]:
    """The manifest of a world an earlier call wrote to `out` with these settings, or None: a rewritten world would
    give its files new times, which the ViT cache (rightly) takes for other images, so a continued study reuses it."""
    manifest = out / "world.json"
    if not manifest.exists():
        return None
    world = json.loads(manifest.read_text(encoding="utf-8"))
    wanted = {
        "seed": 0,
        "facts_per_section": world_options.get("facts_per_section", 1),
        "same_category_groups": world_options.get("same_category_groups", False),
        "bound_facts": world_options.get("bound_facts", False),
    }
    same = all(world.get(k) == v for k, v in wanted.items()) and world["counts"]["entities"] == entities
    return world if same else None


def prepare(work: Path, entities: int, extra: Sequence[str] = (), **world_options) -> tuple[list[str], set[str]]:
    """World, stand-in stage 1, pools and ViT cache under `work`; returns the overrides every run shares and
    the ids ("split/data_id") of the val + test questions whose image shows several entities."""
    from qkvqa.cli.cache_vit import build_cache_from_config
    from qkvqa.synth.world import generate_world

    world = reuse_world(work / "world", entities, world_options)
    if world is None:
        world = generate_world(work / "world", entities=entities, seed=0, **world_options)
    world = dict(world, dir=str(work / "world"))
    overrides = [
        *mine_world(world, work, splits=("train", "val", "test"), shuffled=True),
        f"components.qformer.options.vocab_texts=[{world_words(world)}]",
        f"qff.vit_cache={work / 'vit_cache'}",
        *extra,
    ]
    # every val image, so that each seed's validation subset (qff.max_val_samples) finds its features
    assert build_cache_from_config(compose_run(EXPERIMENTS["per_layer"], [*overrides, "qff.max_val_samples=null"]))[
        "complete"
    ]
    multi = {
        f"{split}/{q['data_id']}"
        for split, file in EVAL_SPLITS.items()
        for q in world["questions"][file]
        if len(q["image_entities"]) > 1
    }
    return overrides, multi


def run_id(focus: str, seed: int) -> str:
    """The run directory name of one (focus, seed) training."""
    return f"qff-{focus}-{seed}"


def train(
    work: Path,
    overrides: Sequence[str],
    jobs: Sequence[tuple[str, int]],
    epochs: int,
    parallel: int = 2,
    threads: int = 1,
) -> dict[tuple[str, int], int]:
    """`qkvqa train` for each (variant, seed) (VARIANTS), `parallel` processes of `threads` intra-op threads at a time;
    returns each job's exit code."""
    env = dict(
        os.environ,
        OMP_NUM_THREADS=str(threads),
        MKL_NUM_THREADS=str(threads),
        WANDB_MODE="disabled",
        HF_HUB_OFFLINE="1",
        PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]),
    )
    for name in ("QKVQA_RUN_ID", "QKVQA_RUN_DIR"):
        env.pop(name, None)
    pending, running, codes = list(jobs), [], {}
    while pending or running:
        while pending and len(running) < parallel:
            focus, seed = pending.pop(0)
            log = open(work / f"log_{focus}_{seed}.txt", "w")
            experiment, extra = VARIANTS[focus]
            cmd = [
                sys.executable,
                "-m",
                "qkvqa.cli.main",
                "train",
                f"experiment={experiment}",
                f"run_id={run_id(focus, seed)}",
                *overrides,
                *extra,
                f"seed={seed}",
                f"trainer.max_epochs={epochs}",
                *TRAINING,
            ]
            running.append(((focus, seed), subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        job, proc, log = running.pop(0)
        codes[job] = proc.wait()
        log.close()
    return codes


def final_gates(model_dir: Path) -> Optional[list[float]]:
    """tanh of every focus gate of an exported QFF (`RUN/qff`), or None when the model has no gate (focus none)."""
    from safetensors.torch import load_file

    weights = load_file(str(Path(model_dir) / "model.safetensors"))
    for key in ("q_gate", "input_gate"):
        if key in weights:
            return torch.tanh(weights[key].float()).reshape(-1).tolist()
    return None


def score(component, cfg) -> dict[str, tuple]:
    """Per question of cfg's validation split: (section hit, article hit after fusion) and, for a model with
    question focus, (section hit with the focus path switched off at test time, the relative change the focus
    path makes to the section encodings): how much a trained model relies on focus (docs/training.md); last, the
    score of every candidate of its sample, {(url, section index): score}."""
    from qkvqa.config.schema import qff_settings
    from qkvqa.data_modules.qff_train import QFFTrainDataModule, settings_from_config
    from qkvqa.models.qff_module import QFFTrainer
    from qkvqa.qff.scoring import rerank_hits

    module = QFFTrainer(component.model, qff_settings(cfg.qff)).eval()
    dm = QFFTrainDataModule(
        cfg.data, settings_from_config(cfg, component), component.tokenizer, component.image_processor
    )
    dm.setup("validate")
    focused = component.model.focus != "none"
    hits = {}
    with torch.no_grad():
        for batch in dm.val_dataloader():
            question, sections, states = module.encode(batch)
            logits = module.logits(batch, question, sections, states)
            articles, _ = rerank_hits(
                component.model,
                batch["rerank"],
                question,
                states,
                module.scorer,
                module.qff.alpha,
            )
            off, change = [None] * len(batch["data_ids"]), [None] * len(batch["data_ids"])
            if focused:
                plain = component.model.encode_sections(
                    batch["sections"]["input_ids"],
                    batch["sections"]["attention_mask"],
                    states,
                    question,
                    image_index=batch["section_image_index"],
                    focus="none",
                ).view(sections.shape)
                off = (module.scorer.score(question.tokens[:, None], plain, training=True).argmax(dim=1) == 0).tolist()
                change = ((sections - plain).norm(dim=-1) / sections.norm(dim=-1)).mean(dim=(1, 2)).tolist()
            for row, data_id in enumerate(batch["data_ids"]):
                scores = {tuple(c): float(v) for c, v in zip(batch["candidates"][row], logits[row].tolist())}
                hits[data_id] = (float(logits[row].argmax() == 0), articles[row], off[row], change[row], scores)
    return hits


def survey_rivals(world: dict) -> dict[str, tuple[str, int]]:
    """For each val + test question of a bound-facts world ("split/data_id"): the gold article's section that states
    the same fact as the other survey reports it, the sibling holding the question's words in another pairing."""
    from qkvqa.synth.world import other_survey

    entities = {e["entity_id"]: e for e in world["entities"]}
    rivals = {}
    for split, file in EVAL_SPLITS.items():
        for record in world["questions"][file]:
            rival = other_survey(record["fact"])
            if record["question_type"] == "2_hop" or rival is None:
                continue
            entity = entities[record["entity"]]
            rivals[f"{split}/{record['data_id']}"] = (entity["url"], entity["facts"][rival]["section_id"])
    return rivals


def best_sibling(scores: dict) -> Optional[tuple[int, float]]:
    """(section index, score) of the best-scored other section of the gold article in one sample (`{(url, section):
    score}`, the positive first), None when the sample holds none."""
    (gold, _), *rest = scores.items()
    siblings = [(index, score) for (url, index), score in rest if url == gold[0]]
    return max(siblings, key=lambda sibling: sibling[1]) if siblings else None


def within_article(scores: dict) -> tuple[bool, Optional[bool]]:
    """Split one sample's outcome (`{(url, section): score}`, the positive first) in two: is the top-scored candidate
    a section of the gold article, and does the evidence outscore every other section of that article in the sample
    (None when the sample holds none): telling the article (the image's work) from choosing within it (the text's)."""
    (gold, gold_score), *_ = scores.items()
    sibling = best_sibling(scores)
    return max(scores, key=scores.get)[0] == gold[0], (None if sibling is None else gold_score > sibling[1])


def figures(hits: dict, multi: set, rivals: Optional[dict] = None) -> dict:
    """Section and article R@1 (percent) over all questions and over the multi-entity ones; for a focused model
    also section R@1 with focus switched off at test time and the mean relative change focus makes; with `rivals`
    (survey_rivals), `pair_accuracy`: how often the evidence outscores its rival, over the questions whose
    sample holds it (50 % is chance: the words alone cannot tell the two apart); and (within_article) how often the
    top candidate is a section of the gold article, and the evidence tops the gold article's other sections, over
    the `within_article_n` samples that hold one (None when none does)."""
    out = {}
    for name, keys in (("all", list(hits)), ("multi", [k for k in hits if k in multi])):
        n = max(len(keys), 1)
        out[name] = {
            "n": len(keys),
            "section_r1": 100 * sum(hits[k][0] for k in keys) / n,
            "article_r1": (
                None
                if keys and hits[keys[0]][1] is None  # the lexical reference ranks no article
                else 100 * sum(hits[k][1] for k in keys) / n
            ),
        }
        split = [within_article(hits[k][4]) for k in keys]
        out[name]["top_in_gold_article"] = 100 * sum(right for right, _ in split) / n
        among = [best for _, best in split if best is not None]  # the samples that hold a sibling
        out[name]["within_article_n"] = len(among)
        out[name]["within_article_r1"] = 100 * sum(among) / len(among) if among else None
        if keys and hits[keys[0]][2] is not None:
            out[name]["section_r1_focus_off"] = 100 * sum(hits[k][2] for k in keys) / n
            out[name]["focus_change"] = sum(hits[k][3] for k in keys) / n
    if rivals:
        samples = [(hits[k][4], rivals[k]) for k in hits if k in rivals and rivals[k] in hits[k][4]]
        wins = [list(scores.values())[0] > scores[rival] for scores, rival in samples]  # the positive comes first
        out["all"]["pair_accuracy"] = 100 * sum(wins) / max(len(wins), 1)
        out["all"]["pair_n"] = len(wins)
    return out


def score_splits(
    focus: str,
    checkpoint: Optional[Path],
    overrides: Sequence[str],
    work: Path,
    seed: int = 0,
    splits: Optional[dict] = None,
) -> dict:
    """`score` of one model (checkpoint None: untrained) over every question of `splits` (split -> E-VQA file; default
    the val + test ones, EVAL_SPLITS; the pools are `work/pools/hardneg_<split>.json`), keyed "split/data_id"."""
    from qkvqa.qff.builder import build_qff_component
    from qkvqa.qff.pretrain_here import resolve_qformer_spec

    hits, component = {}, None
    lexical = focus == "bm25"  # the lexical reference: BM25 on the same samples (bm25_score)
    experiment, extra = VARIANTS["none" if lexical else focus]
    for split, file in (splits or EVAL_SPLITS).items():
        # world.json keys the files from the world's folder; data.root is its evqa/ release folder (preset demo_world)
        cfg = compose_run(
            experiment,
            [
                *overrides,
                *extra,
                f"seed={seed}",
                f"data.val_questions={Path(file).relative_to('evqa')}",
                f"qff.val_negatives={work / f'pools/hardneg_{split}.json'}",
                f"qff.checkpoint={checkpoint}" if checkpoint else "qff.checkpoint=null",
                "qff.max_val_samples=null",  # every question, whatever the seed
                "qff.vit_cache=null",
            ],
        )  # the cache holds train + val images
        if component is None:  # the model is the same for every split: build it once
            # untrained with init pretrained_here: the pretrained-here weights (the study builds them before training)
            component = build_qff_component(
                resolve_qformer_spec(cfg) if checkpoint is None else cfg.components.qformer, cfg.qff
            )
        hits.update({f"{split}/{k}": v for k, v in (bm25_score if lexical else score)(component, cfg).items()})
    return hits


def evaluate(
    focus: str,
    checkpoint: Optional[Path],
    overrides: Sequence[str],
    work: Path,
    multi: set,
    seed: int = 0,
    rivals: Optional[dict] = None,
    splits: Optional[dict] = None,
) -> dict:
    """Section / article R@1 of one model (None: untrained) over every question of `splits` (`score_splits`), on one
    intra-op thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return figures(score_splits(focus, checkpoint, overrides, work, seed, splits), multi, rivals)
    finally:
        torch.set_num_threads(threads)


def evaluate_many(
    jobs: dict,
    overrides: Sequence[str],
    work: Path,
    multi: set,
    parallel: int = 2,
    rivals: Optional[dict] = None,
    splits: Optional[dict] = None,
) -> dict:
    """`evaluate` for each `name: (focus, checkpoint, seed)`, `parallel` spawned processes at a time (each one
    intra-op thread, as `evaluate` sets, so the figures equal a one-by-one run); returns `name: figures`. The first
    model that fails stops the rest: the jobs not started are cancelled, not scored and then discarded."""
    from concurrent.futures import ProcessPoolExecutor, as_completed
    from multiprocessing import get_context

    with ProcessPoolExecutor(max_workers=parallel, mp_context=get_context("spawn")) as pool:
        futures = {
            name: pool.submit(evaluate, focus, checkpoint, list(overrides), work, multi, seed, rivals, splits)
            for name, (focus, checkpoint, seed) in jobs.items()
        }
        names = {future: name for name, future in futures.items()}
        for future in as_completed(names):
            if future.exception() is not None:
                pool.shutdown(cancel_futures=True)
                raise RuntimeError(f"scoring {names[future]} failed") from future.exception()
        return {name: future.result() for name, future in futures.items()}


# ---------------------------------------------------------------------- the lexical reference
class BM25:
    """Okapi BM25 over token ids (k1 1.2, b 0.75), document frequencies from a corpus of token-id lists."""

    def __init__(self, corpus: Sequence[Sequence[int]], k1: float = 1.2, b: float = 0.75, ignore: Sequence[int] = ()):
        import math

        self.k1, self.b, self.ignore = k1, b, set(ignore)
        docs = [[t for t in doc if t not in self.ignore] for doc in corpus]
        self.avgdl = sum(len(d) for d in docs) / max(len(docs), 1)
        df: dict[int, int] = {}
        for doc in docs:
            for t in set(doc):
                df[t] = df.get(t, 0) + 1
        n = len(docs)
        self.idf = {t: math.log(1 + (n - f + 0.5) / (f + 0.5)) for t, f in df.items()}

    def score(self, query: Sequence[int], doc: Sequence[int]) -> float:
        doc = [t for t in doc if t not in self.ignore]
        counts: dict[int, int] = {}
        for t in doc:
            counts[t] = counts.get(t, 0) + 1
        norm = self.k1 * (1 - self.b + self.b * len(doc) / max(self.avgdl, 1e-9))
        return sum(
            self.idf.get(t, 0.0) * counts[t] * (self.k1 + 1) / (counts[t] + norm)
            for t in set(query)
            if t not in self.ignore and t in counts
        )


def bm25_score(component, cfg) -> dict[str, tuple]:
    """`score`'s layout for BM25 between each question and each candidate section of its sample (the same samples
    and tokens the QFF sees; document frequencies over every candidate section of the KB): (section hit, None, None,
    None, {(url, section index): score})."""
    from qkvqa.data_modules.qff_train import QFFTrainDataModule, settings_from_config
    from qkvqa.qff.pretrain_here import corpus_files, corpus_texts

    tokenizer = component.tokenizer
    sections = [t for t in corpus_texts(cfg, corpus_files(cfg))]
    corpus = tokenizer(
        [component.prepare_text(t) for t in sections], truncation=True, max_length=component.max_text_tokens
    )["input_ids"]
    bm25 = BM25(corpus, ignore=tokenizer.all_special_ids)
    dm = QFFTrainDataModule(cfg.data, settings_from_config(cfg, component), tokenizer, component.image_processor)
    dm.setup("validate")
    hits = {}
    for batch in dm.val_dataloader():
        n = batch["num_candidates"]
        questions = batch["question"]["input_ids"].tolist()
        docs = batch["sections"]["input_ids"].tolist()
        for row, data_id in enumerate(batch["data_ids"]):
            values = [bm25.score(questions[row], docs[row * n + j]) for j in range(n)]
            scores = {tuple(c): v for c, v in zip(batch["candidates"][row], values)}
            best = max(range(n), key=lambda j: values[j])
            hits[data_id] = (float(best == 0 and values[0] > max(values[1:], default=-1.0)), None, None, None, scores)
    return hits
