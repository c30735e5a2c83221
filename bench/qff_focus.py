"""Question focus against no focus: train tiny QFFs (focus per_layer and none) over several seeds on one synthetic
world and score section and article R@1 on its val + test questions, overall and on the multi-entity ones.

Each (focus, seed) run is its own process with one intra-op thread, `--parallel` at a time. Stage 1 is the
learning test's stand-in (the entities the query image shows, and others, in an order that tells nothing),
so article R@1 after fusion measures the QFF. Writes bench/out/qff_focus.json and .md.

    python bench/qff_focus.py --same-category-groups --entities 120 --seeds 0 1 2 --parallel 2
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "bench" / "out"
EXPERIMENTS = {"per_layer": "demo/qff_per_layer", "none": "demo/qff_none"}
EVAL_SPLITS = {"val": "evqa/val.csv", "test": "evqa/test.csv"}


def prepare(work: Path, entities: int, facts_per_section: int, same_category_groups: bool,
            extra: list[str]) -> list[str]:
    """World, stand-in stage 1, mined pools and the ViT cache under `work`; returns the shared overrides."""
    from qkvqa.config.load import compose
    from qkvqa.data.synth import generate_world
    from qkvqa.qff.vit_cache import build_cache_from_config
    from tests.integration.test_qff_train_learns import world_words
    from tests.unit.test_qff_data import mine_world

    world = generate_world(work / "world", entities=entities, seed=0, facts_per_section=facts_per_section,
                           same_category_groups=same_category_groups)
    world["dir"] = str(work / "world")
    overrides = [*mine_world(world, work, splits=("train", "val", "test"), shuffled=True),
                 f"components.qformer.options.vocab_texts=[{world_words(world)}]",
                 f"qff.vit_cache={work / 'vit_cache'}", *extra]
    # every val image, so that each seed's validation subset (qff.max_val_samples) finds its features
    assert build_cache_from_config(compose(EXPERIMENTS["per_layer"], [], [*overrides, "qff.max_val_samples=null"]))[
        "complete"]
    multi = sorted(f"{split}/{q['data_id']}" for split, file in EVAL_SPLITS.items()
                   for q in world["questions"][file] if len(q["image_entities"]) > 1)
    (work / "multi.json").write_text(json.dumps(multi))
    return overrides


def evaluate(focus: str, checkpoint, overrides: list[str], work: Path) -> dict:
    """Section / article R@1 (percent) of one model over val + test, all questions and multi-entity ones."""
    from qkvqa.config.load import compose
    from qkvqa.qff.builder import build_qff_component
    from tests.integration.test_qff_train_learns import figures, score

    hits = {}
    for split, file in EVAL_SPLITS.items():
        cfg = compose(EXPERIMENTS[focus], [], [*overrides, f"data.val_questions={file}",
                                               f"qff.val_negatives={work / f'pools/hardneg_{split}.json'}",
                                               f"qff.checkpoint={checkpoint}" if checkpoint else "qff.checkpoint=null",
                                               "qff.max_val_samples=null",   # every question, whatever the seed
                                               "qff.vit_cache=null"])   # the cache holds train + val images only
        component = build_qff_component(cfg.components.qformer, cfg.qff)
        hits.update({f"{split}/{k}": v for k, v in score(component, cfg).items()})
    return figures(hits, set(json.loads((work / "multi.json").read_text())))


def worker(args: argparse.Namespace) -> int:
    """Train one (focus, seed) model and write its figures to work/result_<focus>_<seed>.json."""
    import torch

    from qkvqa.cli.main import main

    torch.set_num_threads(1)
    work = Path(args.work)
    overrides = json.loads((work / "overrides.json").read_text())
    seeded = [*overrides, f"seed={args.seed}"]   # the training seed: sample order and negatives (the random ViT stays)
    run_id = f"qff-{args.focus}-{args.seed}"
    started = time.time()
    code = main(["train", f"experiment={EXPERIMENTS[args.focus]}", f"run_id={run_id}", *seeded,
                 f"trainer.max_epochs={args.epochs}", "trainer.limit_val_batches=0", "checkpoint.monitor=null",
                 "trainer.enable_progress_bar=false", "trainer.deterministic=true"])
    if code != 0:
        return code
    result = {"focus": args.focus, "seed": args.seed, "train_seconds": round(time.time() - started, 1),
              "trained": evaluate(args.focus, work / f"runs/{run_id}/qff", seeded, work)}
    if args.focus == "per_layer":
        result["untrained"] = evaluate(args.focus, None, seeded, work)
    (work / f"result_{args.focus}_{args.seed}.json").write_text(json.dumps(result, indent=1))
    return 0


def summarise(results: list[dict]) -> dict:
    """Mean and spread over seeds per focus mode, and the per-seed paired differences per_layer - none."""
    table = {}
    for focus in EXPERIMENTS:
        runs = [r for r in results if r["focus"] == focus]
        table[focus] = {f"{group}_{metric}": [r["trained"][group][metric] for r in runs]
                        for group in ("all", "multi") for metric in ("section_r1", "article_r1")}
    untrained = [r["untrained"] for r in results if "untrained" in r]
    table["untrained"] = {f"{group}_{metric}": [u[group][metric] for u in untrained]
                          for group in ("all", "multi") for metric in ("section_r1", "article_r1")}
    seeds = sorted({r["seed"] for r in results if r["focus"] == "none"} & {r["seed"] for r in results
                                                                           if r["focus"] == "per_layer"})
    by = {(r["focus"], r["seed"]): r["trained"] for r in results}
    table["per_layer_minus_none"] = {
        f"{group}_{metric}": [by[("per_layer", s)][group][metric] - by[("none", s)][group][metric] for s in seeds]
        for group in ("all", "multi") for metric in ("section_r1", "article_r1")}
    return table


def markdown(summary: dict, meta: dict) -> str:
    cols = ["all_section_r1", "all_article_r1", "multi_section_r1", "multi_article_r1"]
    lines = [f"{meta['entities']} entities, facts_per_section {meta['facts_per_section']}, seeds {meta['seeds']}, "
             f"{meta['epochs']} epochs, {meta['questions']} val+test questions ({meta['multi']} multi-entity); "
             f"overrides {meta['extra'] or 'none'}. Mean over seeds (min-max).", "",
             "| model | section R@1 | article R@1 | multi-entity section R@1 | multi-entity article R@1 |",
             "|---|---|---|---|---|"]
    for name, row in summary.items():
        cells = [f"{mean(row[c]):+.1f} ({min(row[c]):+.1f}..{max(row[c]):+.1f})" if name == "per_layer_minus_none"
                 else f"{mean(row[c]):.1f} ({min(row[c]):.1f}-{max(row[c]):.1f})" for c in cols if row[c]]
        if cells:
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    started = time.time()
    overrides = prepare(work, args.entities, args.facts_per_section, args.same_category_groups, args.extra)
    (work / "overrides.json").write_text(json.dumps(overrides))
    print(f"prepared {work} in {time.time() - started:.0f} s", flush=True)
    jobs = [(focus, seed) for seed in args.seeds for focus in args.modes]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", WANDB_MODE="disabled", HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO), os.environ.get("PYTHONPATH", "")]))
    running: list[tuple[subprocess.Popen, tuple]] = []
    failed = []
    while jobs or running:
        while jobs and len(running) < args.parallel:
            focus, seed = jobs.pop(0)
            log = open(work / f"log_{focus}_{seed}.txt", "w")
            cmd = [sys.executable, __file__, "--worker", "--work", str(work), "--focus", focus, "--seed", str(seed),
                   "--epochs", str(args.epochs)]
            running.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), (focus, seed)))
        time.sleep(2)
        for proc, job in list(running):
            if proc.poll() is not None:
                running.remove((proc, job))
                print(f"{job} exit {proc.returncode} at {time.time() - started:.0f} s", flush=True)
                if proc.returncode:
                    failed.append(job)
    results = [json.loads(p.read_text()) for p in sorted(work.glob("result_*.json"))]
    summary = summarise(results)
    multi = json.loads((work / "multi.json").read_text())
    meta = {"entities": args.entities, "facts_per_section": args.facts_per_section, "seeds": args.seeds,
            "same_category_groups": args.same_category_groups,
            "epochs": args.epochs, "extra": args.extra, "multi": len(multi), "wall_seconds": round(time.time() - started),
            "questions": results[0]["trained"]["all"]["n"] if results else 0, "failed": failed}
    text = markdown(summary, meta)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": results}, indent=1))
    (out / f"{args.name}.md").write_text(text)
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/qff_focus", help="scratch directory (world, pools, cache, runs)")
    parser.add_argument("--entities", type=int, default=60)
    parser.add_argument("--facts-per-section", type=int, default=1, help="see `qkvqa synth --help`")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--modes", nargs="+", default=list(EXPERIMENTS), choices=list(EXPERIMENTS))
    parser.add_argument("--same-category-groups", action="store_true",
                        help="multi-entity images of one category; questions name the kind word")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (one CPU thread each)")
    parser.add_argument("--extra", nargs="*", default=[], help="more config overrides for every run")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--name", default="qff_focus", help="output file stem under --out")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--focus", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    return worker(args) if args.worker else run(args)


if __name__ == "__main__":
    sys.exit(main())
