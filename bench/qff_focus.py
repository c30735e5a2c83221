"""Does question focus help? Paired-seed study of the QFF focus variants against focus `none`, on two worlds.

For each world (`controlled`: `qkvqa synth --world focus` trained with preset=focus_world; `default`: the demo's
world) the study writes the world, the learning test's stand-in stage 1 and pools (tests/helpers/qff_study.py), then
trains every (variant, seed) as its own `qkvqa train` process with one intra-op thread, `--parallel` at a time, and
scores each model's section R@1 (evidence section above its 15 negatives) and article R@1 after fusion on the val +
test questions. Per variant it reports the paired per-seed difference against `none` with its mean and a 95 %
t-interval, and per run the focus gates and the focus blocks' gradient norm over training (from metrics.csv). It
splits section R@1 into "the top candidate is in the gold article" and "the evidence tops that article's other
sections", scores every focused model again with its focus path off, and scores the first seed's models on their own
training questions (what they memorised); bench/qff_focus_facts.py breaks the within-article choice down by fact.

    python bench/qff_focus.py                                   # the study: both worlds, 8 seeds (about 1 h on 2 cores)
    python bench/qff_focus.py --worlds controlled --seeds 0 1 --variants per_layer none   # a quick look
    python bench/qff_focus.py --lr 1e-5                         # the paper's base lr (OneCycle scaled to the run)

Writes bench/out/<name>.json (for each world and variant: overrides, per-seed figures, gates, and
diff_vs_none.{section_r1, article_r1, multi_section_r1, multi_article_r1} = {mean, ci95_low, ci95_high, n_seeds})
and bench/out/<name>.md. Trained runs under --work are reused, so an interrupted study continues.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from statistics import mean, stdev

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "bench" / "out"

from omegaconf import OmegaConf  # noqa: E402

from qkvqa.qff.model import resolve_focus  # noqa: E402
from tests.helpers.qff_oracle import AttributeOracle, PresenceOracle  # noqa: E402
from tests.helpers.qff_study import (  # noqa: E402
    PRETRAINED_HERE,
    SPLIT_FILES,
    VARIANTS,
    compose_run,
    evaluate_many,
    final_gates,
    init_overrides,
    prepare,
    run_id,
    survey_rivals,
    train,
)

# world name -> (generate_world options, overrides every run of that world gets)
WORLDS = {
    "controlled": ({"facts_per_section": 3, "same_category_groups": True}, ["preset=focus_world"]),
    "default": ({}, []),
    "same_category": ({"same_category_groups": True}, []),  # the learning test's world
    "bound": ({"facts_per_section": 3, "bound_facts": True}, ["preset=bound_world"]),
}
DEFAULT_VARIANTS = {
    "controlled": ["none", "per_layer", "per_layer_gate_none", "per_layer_lr10", "input"],
    "default": ["none", "per_layer", "per_layer_gate_none", "per_layer_lr10"],
    "same_category": ["none", "per_layer"],
    "bound": ["none", "per_layer", "per_layer_gate_none", "per_layer_lr10", "input"],
}
METRICS = ("section_r1", "article_r1")
SPLIT_METRICS = ("top_in_gold_article", "within_article_r1")  # tests/helpers/qff_study.within_article
# two-sided 95 % quantiles of Student's t by degrees of freedom
T975 = {
    1: 12.706,
    2: 4.303,
    3: 3.182,
    4: 2.776,
    5: 2.571,
    6: 2.447,
    7: 2.365,
    8: 2.306,
    9: 2.262,
    10: 2.228,
    11: 2.201,
    12: 2.179,
    13: 2.160,
    14: 2.145,
    15: 2.131,
    16: 2.120,
    17: 2.110,
    18: 2.101,
    19: 2.093,
    20: 2.086,
    25: 2.060,
    30: 2.042,
}


def t975(df: int) -> float:
    """The 97.5 % quantile of Student's t with `df` degrees of freedom (table; the next lower tabulated df)."""
    if df >= 31:
        return 1.96 + 2.4 / df
    return T975[max(k for k in T975 if k <= df)]


def interval(values: list[float]) -> dict:
    """Mean and 95 % t-interval of paired differences (the interval null for one seed: JSON has no NaN)."""
    n = len(values)
    m = mean(values)
    half = t975(n - 1) * stdev(values) / math.sqrt(n) if n > 1 else None
    return {
        "mean": round(m, 2),
        "ci95_low": None if half is None else round(m - half, 2),
        "ci95_high": None if half is None else round(m + half, 2),
        "n_seeds": n,
        "per_seed": [round(v, 2) for v in values],
    }


def trajectories(run_dir: Path, points: int = 5) -> dict:
    """train/gate and train/focus_grad_norm at `points` evenly spaced logged steps (first to last)."""
    from qkvqa.compare.rows import dedupe_steps
    from qkvqa.run.record import RunRecord

    series: dict[str, list[tuple[int, float]]] = {}
    for row in RunRecord(run_dir).read_metrics():
        if row["name"] in ("train/gate", "train/focus_grad_norm"):
            series.setdefault(row["name"], []).append((row["step"], row["value"]))
    out = {}
    for name, logged in series.items():
        rows = dedupe_steps(logged)  # a resumed run logs the steps after its checkpoint twice
        picks = sorted({round(i * (len(rows) - 1) / (points - 1)) for i in range(points)})
        out[name.split("/", 1)[1]] = [[rows[i][0], round(rows[i][1], 4)] for i in picks]
    return out


def study_world(world: str, args: argparse.Namespace) -> dict:
    """Train and score every (variant, seed) of one world; returns its section of the study's JSON."""
    options, world_overrides = WORLDS[world]
    variants = args.variants or DEFAULT_VARIANTS[world]
    base = args.baseline  # what every diff_vs_none is against: focus none (none_pt: reading init)
    if base not in variants:
        variants = [base, *variants]
    work = Path(args.work) / world
    work.mkdir(parents=True, exist_ok=True)
    extra = [*world_overrides, *([f"qff.lr={args.lr:.2e}"] if args.lr else []), *args.extra]
    overrides, multi = prepare(work, args.entities, extra, **options)
    # Trained runs under `work` are reused only when they were trained with these settings (another --extra, --lr
    # or --epochs in the same --work would otherwise be scored as if it were this study's). The stamp holds the
    # resolved config, so an edited preset or experiment file counts as another setting too.
    resolved = OmegaConf.to_container(compose_run(VARIANTS["per_layer"][0], overrides), resolve=True)
    stamp, settings = (
        work / "study_settings.json",
        {"overrides": overrides, "resolved": resolved, "epochs": args.epochs, "threads": args.threads},
    )
    if stamp.exists() and json.loads(stamp.read_text()) != settings:
        raise SystemExit(
            f"{stamp}: the runs under {work} were trained with other settings (--extra, --lr, --epochs "
            f"or --threads); pass another --work, or delete {work}"
        )
    stamp.write_text(json.dumps(settings, indent=1))
    pretrained_here = None
    reading = [v for v in variants if PRETRAINED_HERE in VARIANTS[v][1]]
    if reading:  # build the pretrained-here text layers once, before the runs that start from them
        import torch

        from qkvqa.qff.pretrain_here import build

        torch.set_num_threads(args.threads)
        path, record = build(compose_run(VARIANTS[reading[0]][0], [*overrides, *VARIANTS[reading[0]][1]]))
        pretrained_here = {"path": str(path), **record["figures"]}
        print(
            f"[{world}] text layers pretrained here: {path} (MLM loss {record['figures']['probe_loss_before']} -> "
            f"{record['figures']['probe_loss_after']})",
            flush=True,
        )
    jobs = [(variant, seed) for seed in args.seeds for variant in variants]
    todo = [job for job in jobs if not (work / "runs" / run_id(*job) / "qff" / "model.safetensors").exists()]
    print(f"[{world}] {len(jobs) - len(todo)} of {len(jobs)} runs already trained; training {len(todo)}", flush=True)
    started = time.time()
    codes = train(work, overrides, todo, args.epochs, parallel=args.parallel, threads=args.threads)
    failed = [job for job, code in codes.items() if code != 0]
    if failed:
        raise SystemExit(f"training failed for {failed}; see {work}/log_<variant>_<seed>.txt")
    print(f"[{world}] trained in {time.time() - started:.0f} s; scoring", flush=True)
    score_jobs = {(v, s): (v, work / "runs" / run_id(v, s) / "qff", s) for v, s in jobs}
    score_jobs[("untrained", 0)] = ("per_layer", None, 0)
    score_jobs[("bm25", 0)] = ("bm25", None, 0)  # the lexical reference (seed-free)
    if reading:
        score_jobs[("untrained_pt", 0)] = ("per_layer_pt", None, 0)
    rivals = survey_rivals(json.loads((work / "world/world.json").read_text())) if options.get("bound_facts") else None
    scoring = [*overrides, *args.score_extra]  # --score-extra: scoring only (the trained runs are still reused)
    scored = evaluate_many(score_jobs, scoring, work, multi, parallel=args.score_parallel, rivals=rivals)
    # The first seed's models on their own training questions: the gap to val + test is what they memorised.
    train_jobs = {v: (v, work / "runs" / run_id(v, args.seeds[0]) / "qff", args.seeds[0]) for v in variants}
    on_train = (
        {}
        if args.skip_train_questions
        else evaluate_many(
            train_jobs, scoring, work, set(), parallel=args.score_parallel, splits={"train": SPLIT_FILES["train"]}
        )
    )
    section: dict = {
        "options": options,
        "overrides": overrides,
        "untrained": scored[("untrained", 0)],
        "questions": scored[("untrained", 0)]["all"]["n"],
        "multi_entity_questions": scored[("untrained", 0)]["multi"]["n"],
        "within_article_samples": scored[("untrained", 0)]["all"]["within_article_n"],
        "bm25": scored[("bm25", 0)],
        "variants": {},
    }
    if reading:
        section["pretrained_here"] = pretrained_here
        section["untrained_pt"] = scored[("untrained_pt", 0)]
    for variant in variants:
        experiment, variant_overrides = VARIANTS[variant]
        entry = {
            "experiment": experiment,
            "overrides": [*world_overrides, *variant_overrides],
            "per_seed": {s: scored[(variant, s)] for s in args.seeds},
            "gates": {s: final_gates(work / "runs" / run_id(variant, s) / "qff") for s in args.seeds},
            "trajectories": {s: trajectories(work / "runs" / run_id(variant, s)) for s in args.seeds},
        }
        if variant != base:
            entry["diff_vs_none"] = {
                f"{prefix}{metric}": interval(
                    [scored[(variant, s)][group][metric] - scored[(base, s)][group][metric] for s in args.seeds]
                )
                for group, prefix in (("all", ""), ("multi", "multi_"))
                for metric in METRICS
            }
            entry["baseline"] = base
        entry["mean"] = {
            f"{prefix}{metric}": round(mean(scored[(variant, s)][group][metric] for s in args.seeds), 2)
            for group, prefix in (("all", ""), ("multi", "multi_"))
            for metric in METRICS
        }
        if on_train:
            entry["train_seed"] = {
                "seed": args.seeds[0],
                **{metric: round(on_train[variant]["all"][metric], 2) for metric in ("section_r1", *SPLIT_METRICS)},
            }
        for metric in SPLIT_METRICS:  # which article tops the sample (the image's work), and the choice within it
            if any(scored[(v, s)]["all"][metric] is None for v in (variant, base) for s in args.seeds):
                continue  # no sample holds a sibling section: no within-article figure
            entry["mean"][metric] = round(mean(scored[(variant, s)]["all"][metric] for s in args.seeds), 2)
            if variant != base:
                entry["diff_vs_none"][metric] = interval(
                    [scored[(variant, s)]["all"][metric] - scored[(base, s)]["all"][metric] for s in args.seeds]
                )
        if (
            variant != base and VARIANTS[variant][0] != "demo/qff_none"
        ):  # focus switched off at test time: how much the trained model relies on it
            entry["focus_off"] = {
                "section_r1": round(mean(scored[(variant, s)]["all"]["section_r1_focus_off"] for s in args.seeds), 2),
                "diff_vs_focus_on": interval(
                    [
                        scored[(variant, s)]["all"]["section_r1_focus_off"] - scored[(variant, s)]["all"]["section_r1"]
                        for s in args.seeds
                    ]
                ),
                "relative_change": round(mean(scored[(variant, s)]["all"]["focus_change"] for s in args.seeds), 4),
            }
        if rivals:  # evidence above the other survey's statement of the same fact (chance: 50 %)
            entry["mean"]["pair_accuracy"] = round(
                mean(scored[(variant, s)]["all"]["pair_accuracy"] for s in args.seeds), 2
            )
        section["variants"][variant] = entry
    controls = [v for v in variants if issubclass(focus_class(v), PresenceOracle)] or [
        v for v in variants if issubclass(focus_class(v), AttributeOracle)
    ]
    if controls:  # the positive control beside the study (its full entry is under variants)
        section["positive_control"] = {
            "variant": controls[0],
            "baseline": base,
            "diff_vs_none": section["variants"][controls[0]]["diff_vs_none"],
            "mean": section["variants"][controls[0]]["mean"],
        }
    return section


def focus_class(variant: str) -> type:
    """The QFF model class a variant builds: its composed config's `qff.focus`, resolved as the builder does."""
    return resolve_focus(compose_run(*VARIANTS[variant]).qff.focus)


def interval_text(d: dict) -> str:
    """'+1.2 [-0.5, +2.9]': a paired difference's mean and 95 % interval (`interval`); '+1.2 (1 seed)' without one."""
    if d["ci95_low"] is None:
        return f"{d['mean']:+.1f} ({d['n_seeds']} seed)"
    return f"{d['mean']:+.1f} [{d['ci95_low']:+.1f}, {d['ci95_high']:+.1f}]"


def focus_off(entry: dict) -> str:
    """The focus-off cells of a variant: section R@1 with the focus path skipped at test time (its paired change)
    and the mean relative change focus makes to the section encodings; '–' for none and for older studies."""
    off = entry.get("focus_off")
    if not off:
        return "– | –"
    return f"{off['section_r1']:.1f} ({interval_text(off['diff_vs_focus_on'])}) | {100 * off['relative_change']:.1f} %"


def markdown(study: dict) -> str:
    lines = []
    for world, section in study["worlds"].items():
        meta = section.get("meta", study["meta"])  # each world's own settings (an older file: the study's)
        lines += [
            f"{meta['entities']} entities, {meta['epochs']} epochs, seeds {meta['seeds']}, lr {meta['lr'] or 'demo'}"
            f"{', extra: ' + ' '.join(meta['extra']) if meta.get('extra') else ''}"
            f"{', Q-Former init ' + meta['init'] if meta.get('init') else ''}"
            f"{' (' + meta['steps_note'] + ')' if meta.get('steps_note') else ''}"
            f"{', scored with ' + ' '.join(meta['score_extra']) if meta.get('score_extra') else ''}; paired difference against focus "
            f"{meta.get('baseline', 'none')}, mean [95 % CI] over seeds, in points.",
            "",
            f"**{world}** world ({section['questions']} val + test questions, {section['multi_entity_questions']}"
            f" multi-entity; untrained section R@1 {section['untrained']['all']['section_r1']:.1f}, article R@1 "
            f"{section['untrained']['all']['article_r1']:.1f})",
            "",
            "| variant | overrides | section R@1 | Δ section R@1 | article R@1 | Δ article R@1 | "
            "Δ multi-entity section R@1 | mean tanh(gate) at the end | section R@1, focus off at test | "
            "focus's change of the encoding |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for variant, entry in section["variants"].items():

            def cell(metric: str) -> str:
                d = entry.get("diff_vs_none", {}).get(metric)
                return "–" if d is None else interval_text(d)

            gates = [mean(abs(g) for g in gs) for gs in entry["gates"].values() if gs]
            lines.append(
                f"| {variant} | {' '.join(entry['overrides']) or '–'} | {entry['mean']['section_r1']:.1f} | "
                f"{cell('section_r1')} | {entry['mean']['article_r1']:.1f} | {cell('article_r1')} | "
                f"{cell('multi_section_r1')} | {f'{mean(gates):.3f}' if gates else '–'} | "
                f"{focus_off(entry)} |"
            )
        entries = section["variants"]
        if all(m in e["mean"] for e in entries.values() for m in SPLIT_METRICS):
            within = [
                f"{v} {e['mean']['top_in_gold_article']:.1f} % and {e['mean']['within_article_r1']:.1f} %"
                + (
                    f" (Δ within {interval_text(e['diff_vs_none']['within_article_r1'])})"
                    if "diff_vs_none" in e
                    else ""
                )
                for v, e in entries.items()
            ]
            lines += [
                "",
                "Section R@1 split in two: the top candidate is a section of the gold article (then only the "
                "text can choose), and the evidence tops the gold article's other sections in the sample (over the "
                f"{section.get('within_article_samples', '?')} samples that hold one): " + "; ".join(within) + ".",
            ]
        if all("train_seed" in e for e in entries.values()):
            trained = [
                f"{v} section R@1 {e['train_seed']['section_r1']:.1f}, within the article "
                f"{e['train_seed']['within_article_r1']:.1f} %"
                for v, e in entries.items()
            ]
            lines += [
                "",
                f"The same models on their own training questions (seed "
                f"{next(iter(entries.values()))['train_seed']['seed']}): " + "; ".join(trained) + ".",
            ]
        if "bm25" in section:
            lexical = section["bm25"]["all"]
            within = lexical.get("within_article_r1")
            lines += [
                "",
                f"Lexical reference (BM25 between the question and each section of the same samples): section "
                f"R@1 {lexical['section_r1']:.1f}, top candidate in the gold article "
                f"{lexical['top_in_gold_article']:.1f} %, evidence above its siblings "
                + (f"{within:.1f} %." if within is not None else "– (no sample holds a sibling)."),
            ]
        if "pretrained_here" in section:
            pt, untrained = section["pretrained_here"], section["untrained_pt"]["all"]
            lines += [
                "",
                f"Text layers pretrained here ({pt['steps']} MLM steps on {pt['texts']} texts, "
                f"{pt['seconds']:.0f} s): held-aside MLM loss {pt['probe_loss_before']:.2f} -> "
                f"{pt['probe_loss_after']:.2f} (chance {pt['chance_loss']:.2f}); untrained with that init: "
                f"section R@1 {untrained['section_r1']:.1f}, within the article "
                + (
                    f"{untrained['within_article_r1']:.1f} %."
                    if untrained.get("within_article_r1") is not None
                    else "–."
                ),
            ]
        if "pair_accuracy" in section["untrained"]["all"]:
            lines += [
                "",
                "Evidence above the other survey's statement of the same fact (pair accuracy, chance 50 %): "
                f"untrained {section['untrained']['all']['pair_accuracy']:.1f} %, "
                + ", ".join(f"{v} {e['mean']['pair_accuracy']:.1f} %" for v, e in section["variants"].items())
                + ".",
            ]
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 2)[2],
    )
    parser.add_argument(
        "--worlds",
        nargs="+",
        default=["controlled", "default"],
        choices=list(WORLDS),
        help="controlled (--world focus + preset=focus_world), default, same_category (the learning "
        "test's world); default: controlled default",
    )
    parser.add_argument(
        "--variants",
        nargs="+",
        choices=list(VARIANTS),
        help="variants to compare with none (default per world: "
        + "; ".join(f"{w}: {' '.join(v)}" for w, v in DEFAULT_VARIANTS.items())
        + ")",
    )
    parser.add_argument(
        "--baseline",
        default="none",
        choices=list(VARIANTS),
        help="the variant every diff_vs_none is taken against (none; none_pt for the reading init)",
    )
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    parser.add_argument("--entities", type=int, default=60)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--lr", type=float, help="base learning rate (default: the demo's 2e-3)")
    parser.add_argument("--parallel", type=int, default=2, help="runs at a time (one CPU thread each)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per run")
    parser.add_argument(
        "--score-parallel", type=int, help="models scored at a time (one thread each; default: --parallel)"
    )
    parser.add_argument("--extra", nargs="*", default=[], help="more config overrides for every run")
    parser.add_argument(
        "--init",
        help="components.qformer.init of every run: bert:<ref> starts each Q-Former from that BERT (its shape, "
        "the world's tiny ViT); default: the variants' own (random tiny, or _pt)",
    )
    parser.add_argument("--work", help="scratch directory (worlds, pools, runs); default /tmp/qff_focus_study/<name>")
    parser.add_argument(
        "--skip-train-questions",
        action="store_true",
        help="do not score the first seed's models on their own training questions (saves a scoring pass per variant)",
    )
    parser.add_argument(
        "--score-extra",
        nargs="*",
        default=[],
        help="config overrides for scoring only, e.g. qff.val_top_k=1 (article R@1 then reranks only stage 1's top "
        "article; section R@1, over each sample's 16 sections, is unchanged)",
    )
    parser.add_argument("--steps-note", help="a line on how the training was cut, printed with the table")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--name", default="qff_focus", help="output file stem under --out")
    args = parser.parse_args(argv)
    args.work = args.work or f"/tmp/qff_focus_study/{args.name}"
    args.score_parallel = args.score_parallel or args.parallel
    if args.init:  # before --extra's own overrides, after each world's preset
        args.extra = [*init_overrides(args.init), *args.extra]  # tests.helpers.qff_study
    meta = {
        "entities": args.entities,
        "epochs": args.epochs,
        "seeds": args.seeds,
        "lr": args.lr,
        "threads": args.threads,
        "extra": args.extra,
        "baseline": args.baseline,
        "init": args.init,
        "steps_note": args.steps_note,
        "score_extra": args.score_extra,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{args.name}.json"
    # Worlds studied by an earlier call stay in the file, each with the settings it was run with (worlds.<w>.meta),
    # so the worlds of one study may take different calls and settings (the bound world fewer epochs, say).
    previous = json.loads(path.read_text()) if path.exists() else {}
    kept = {w: s for w, s in previous.get("worlds", {}).items() if w not in args.worlds and "meta" in s}
    study = {
        "meta": meta,
        "worlds": kept,
        "wall_seconds": {w: t for w, t in previous.get("wall_seconds", {}).items() if w in kept},
    }
    for world in args.worlds:
        started = time.time()
        study["worlds"][world] = {**study_world(world, args), "meta": meta}
        study["wall_seconds"][world] = round(time.time() - started)
        text = markdown(study)
        path.write_text(json.dumps(study, indent=1))  # after every world: a stopped study keeps its part
        (out / f"{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
