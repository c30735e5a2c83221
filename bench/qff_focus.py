"""Question focus against no focus: train tiny QFFs (focus per_layer and none) over several seeds on one synthetic
world and score section and article R@1 on its val + test questions, overall and on the multi-entity ones.

Each (focus, seed) run is its own process with one intra-op thread, `--parallel` at a time; the world,
stand-in stage 1 and scoring are the learning test's (tests/helpers/qff_study.py). Writes
bench/out/<name>.json and .md. The headline setting (about 25 minutes for six seeds on 2 cores):

    python bench/qff_focus.py --same-category-groups --entities 60 --epochs 20 --seeds 0 1 2 3 4 5
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from statistics import mean

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "bench" / "out"

from tests.helpers.qff_study import EXPERIMENTS, evaluate, final_gates, prepare, run_id, train  # noqa: E402


def run_study(args: argparse.Namespace) -> list[dict]:
    """Prepare the world, train every (focus, seed) and score each model (the untrained one once per seed)."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    overrides, multi = prepare(work, args.entities, args.extra, facts_per_section=args.facts_per_section,
                               same_category_groups=args.same_category_groups)
    jobs = [(focus, seed) for seed in args.seeds for focus in args.modes]
    done = [job for job in jobs if (work / "runs" / run_id(*job) / "qff" / "model.safetensors").exists()]
    if done:
        print(f"reusing {len(done)} trained runs under {work / 'runs'}: {done}")
    codes = train(work, overrides, [job for job in jobs if job not in done], args.epochs, parallel=args.parallel,
                  threads=args.threads)
    failed = [job for job, code in codes.items() if code != 0]
    if failed:
        raise SystemExit(f"training failed for {failed}; see {work}/log_<focus>_<seed>.txt")
    results = []
    for focus, seed in jobs:
        model_dir = work / "runs" / run_id(focus, seed) / "qff"
        result = {"focus": focus, "seed": seed, "gates": final_gates(model_dir),
                  "trained": evaluate(focus, model_dir, overrides, work, multi, seed)}
        if focus == args.modes[0]:
            result["untrained"] = evaluate(focus, None, overrides, work, multi, seed)
        results.append(result)
    return results


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
    started = time.time()
    results = run_study(args)
    summary = summarise(results)
    meta = {"entities": args.entities, "facts_per_section": args.facts_per_section, "seeds": args.seeds,
            "same_category_groups": args.same_category_groups, "epochs": args.epochs, "extra": args.extra,
            "threads": args.threads,
            "multi": results[0]["trained"]["multi"]["n"], "questions": results[0]["trained"]["all"]["n"],
            "wall_seconds": round(time.time() - started)}
    text = markdown(summary, meta)
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps({"meta": meta, "summary": summary, "runs": results}, indent=1))
    (out / f"{args.name}.md").write_text(text)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", default="/tmp/qff_focus", help="scratch directory (world, pools, cache, runs)")
    parser.add_argument("--entities", type=int, default=60)
    parser.add_argument("--facts-per-section", type=int, default=1, help="see `qkvqa synth --help`")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--modes", nargs="+", default=list(EXPERIMENTS), choices=list(EXPERIMENTS))
    parser.add_argument("--same-category-groups", action="store_true",
                        help="multi-entity images of one category; questions name the kind word")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (one CPU thread each)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per run")
    parser.add_argument("--extra", nargs="*", default=[], help="more config overrides for every run")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--name", default="qff_focus", help="output file stem under --out")
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
