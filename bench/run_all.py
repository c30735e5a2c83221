"""`make bench`: run every benchmark in one go and write bench/RESULTS.md with their ratios side by side."""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

from qkvqa.utils.io import atomic_write_json

BENCH = Path(__file__).resolve().parent
OUT = BENCH / "out"
# Each benchmark, with arguments that keep the whole run within tens of minutes on a 2-core machine.
BENCHMARKS = {
    "kb_store": ["--articles", "200000"],
    "retrieval": ["--n", "100000"],
    "bem": [],
    "chunker": [],
    "qff": [],
    "pipeline": [],
    "pipeline_real": ["--config", "mid"],
    "inspect_load": [],
}
# Full-scale runs that take too long for `make bench`: run by hand (the commands are in each bench's docstring);
# RESULTS.md shows their outputs when bench/out holds them, with the date each ran.
EXTRA = {
    "retrieval_1m": 'bench/retrieval.py --n 1000000 --factories "Flat;IVF2048,Flat;IVF2048,SQ8" --name retrieval_1m',
    "retrieval_2m": 'bench/retrieval.py --n 2000000 --factories "Flat;IVF2048,SQ8" --threads 1 --name retrieval_2m',
    "kb_store_2m": "bench/kb_store.py --articles 2000000 --sections 12 --sentences 10 --store-only --name kb_store_2m",
}


def _load(name: str):
    path = OUT / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _md(name: str) -> str:
    path = OUT / f"{name}.md"
    return path.read_text().strip() if path.exists() else ""


def section_kb_store(d: dict) -> str:
    r, g = d["ratios"], d.get("goals", {})
    if d.get("json_load") is None:  # --store-only: no json.load baseline, no ratios against it
        b, s = d["build"], d["store"]
        return (
            f"{d['articles']:,} articles ({d['kb_json_mb'] / 1024:.1f} GiB JSON, written in "
            f"{d['write_seconds'] / 60:.1f} min); `json.load` baseline not run (it needs ~3x the JSON in RAM). "
            f"Build {b['build_seconds'] / 60:.1f} min ({d['kb_json_mb'] / b['build_seconds']:.0f} MiB/s) at peak "
            f"RSS {b['peak_rss_mb']:.0f} MiB; store {d['store_mb'] / 1024:.1f} GiB; open "
            f"{1e3 * s['open_seconds']:.2f} ms (median); a random article's first read {1e6 * s['access_seconds']:.0f} us by row "
            f"(from disk once the store outgrows the page cache), "
            f"{1e6 * s['access_by_url_seconds']:.0f} us by URL; peak RSS open + reads {s['peak_rss_mb']:.0f} MiB; "
            f"full sha256 source check {s['full_source_check_seconds']:.0f} s."
        )
    return (
        f"{d['articles']:,} articles ({d['kb_json_mb']:.0f} MB JSON). Peak memory {r['peak_memory_reduction']:.0f}x "
        f"less than `json.load` (goal {g.get('peak_memory_reduction', 10)}x), opening {r['open_speedup']:,.0f}x "
        f"faster (goal {g.get('open_speedup', 100)}x); one article in {1e6 * d['store']['access_seconds']:.0f} us "
        f"({r['access_slowdown']:.1f}x a dict lookup)."
    )


def section_bem(d: dict) -> str:
    rows = ["| config | batched answers/s | one at a time | speed-up |", "|---|---|---|---|"]
    rows += [
        f"| {r['config']} | {r['batched_answers_per_s']:.1f} | {r['single_answers_per_s']:.1f} | "
        f"{r['speedup_batched_vs_single']:.1f}x |"
        for r in d["results"]
    ]
    return "\n".join(rows)


def section_qff(d: dict) -> str:
    parts = []
    scoring = d.get("scoring")
    if scoring:
        parts.append(
            f"(a) scoring {scoring['sections']} sections of {scoring['articles']} articles for one question "
            f"(mid-size random config, CPU, sections in batches of {scoring.get('section_batch_size', 64)}): "
            f"batched with one ViT pass per article image {scoring['batched_seconds']:.1f} s vs the "
            f"per-section loop that re-runs the ViT {scoring['per_section_loop_seconds']:.1f} s: "
            f"**{scoring['speedup']:.1f}x**; ViT images {scoring['vit_images_batched']} vs "
            f"{scoring['vit_images_loop']}, scores equal within {scoring['max_abs_score_difference']:.1e}. "
            f"The goal (5x) is set for the real config, where a ViT-g image costs "
            f"{scoring['real_vit_to_section_flop_ratio']:.1f} section passes; the mid config's ViT costs "
            f"{scoring['mid_vit_to_section_flop_ratio']:.1f} in FLOPs but "
            f"{scoring['vit_pass_seconds'] / scoring['section_pass_seconds']:.1f} in time on this machine "
            f"({1000 * scoring['vit_pass_seconds']:.0f} ms against {1000 * scoring['section_pass_seconds']:.0f}"
            f" ms), which bounds the ratio here at {scoring['speedup_bound']:.1f}x."
        )
    training = d.get("training")
    if training:
        rows = ["| ViT handling | ViT images per step | samples/s | x per-pair |", "|---|---|---|---|"]
        for how in training["samples_per_s"]:
            rows.append(
                f"| {how} | {training['vit_images_per_step'][how]} | {training['samples_per_s'][how]:.2f} | "
                f"{training['speedup_vs_per_pair'][how]:.1f}x |"
            )
        parts.append(
            f"(b) training steps (mid-size random config, batch {training['batch']}, {training['steps']} "
            f"timed steps each, {training['threads']} threads; writing the cache for the batch's images "
            f"took {training['cache_write_seconds_for_the_batch_images']:.1f} s once):\n\n" + "\n".join(rows)
        )
    flops = d.get("flops")
    if flops:
        rows = ["| section tokens | ViT handling | TFLOP/sample | L40 samples/s at 40% |", "|---|---|---|---|"]
        for row in flops["rows"]:
            for how, v in row["per_sample"].items():
                rows.append(
                    f"| {row['section_tokens']} | {how} | {v['tflop']:.2f} | {v['l40_samples_per_s_at_40pct']:.1f} |"
                )
        parts.append(
            "(c) FLOPs per training sample at the real config (paper: ~1.9 samples/s per L40):\n\n" + "\n".join(rows)
        )
    return "\n\n".join(parts)


RENDER = {
    "kb_store": section_kb_store,
    "kb_store_2m": section_kb_store,
    "bem": section_bem,
    "qff": section_qff,
}  # the others: bench/out/NAME.md as the bench wrote it


RUN_RECORD = "run_all"  # OUT/run_all.json: where and when the last run ran, so that --render-only keeps it


def record_run(results: dict[str, dict]) -> dict:
    """Write OUT/run_all.json for the benchmarks this run has finished (`results`: exit code and seconds each): the
    machine, the date, which ran (all of them, or an --only or stopped run's subset), and the earlier record's
    results for the others. Written atomically after every benchmark, so a stopped run keeps what it measured."""
    earlier = _load(RUN_RECORD) or {}
    kept = {k: v for k, v in earlier.get("results", {}).items() if k not in results}
    run = {
        "node": platform.node(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "ran": list(results),
        "all": set(results) == set(BENCHMARKS),
        "results": {**kept, **results},
    }
    atomic_write_json(OUT / f"{RUN_RECORD}.json", run, indent=1)
    return run


def header(run: Optional[dict]) -> str:
    """RESULTS.md's first line: the run that produced the figures (OUT/run_all.json), not the time of rendering."""
    if run is None:
        return "Rendered from bench/out by `bench/run_all.py --render-only`; no record of the run that produced it."
    where = f"on {run['node']} ({run['cpus']} CPUs, {run['machine']}, Python {run['python']}), {run['date']}"
    scope = (
        "One `make bench` run"
        if run["all"]
        else f"A `bench/run_all.py` run of {', '.join(run['ran'])} (the other benchmarks' figures are from earlier runs)"
    )
    return (
        f"{scope} {where}. Ratios are measured side by side within each benchmark; absolute times depend on the "
        "machine's load."
    )


def write_results(ran: dict[str, dict]) -> Path:
    """Compose RESULTS.md from bench/out/*.json and *.md, under the header of the run recorded in OUT/run_all.json."""
    run = _load(RUN_RECORD)
    lines = ["# Benchmark results", "", header(run), ""]
    for name in BENCHMARKS:
        data, md = _load(name), _md(name)
        status = ran.get(name) or (run or {}).get("results", {}).get(name, {})
        lines += [f"## {name}", ""]
        if status.get("rc") not in (None, 0):
            lines += [f"FAILED (exit {status['rc']}); see bench/out/{name}.log", ""]
        if data is None and not md:
            lines += ["(no result)", ""]
            continue
        rendered = RENDER[name](data) if name in RENDER and data else md
        lines += [rendered, "", f"Raw figures: `bench/out/{name}.json`.", ""]
        if "seconds" in status:
            lines += [f"Ran in {status['seconds']:.0f} s.", ""]
    extra = [name for name in EXTRA if _load(name) is not None or _md(name)]
    if extra:
        lines += [
            "# Full-scale runs (not part of `make bench`)",
            "",
            "Run by hand, one at a time; each keeps the figures of its own run (date and threads in its JSON).",
            "",
        ]
    for name in extra:
        data, md = _load(name), _md(name)
        rendered = RENDER[name](data) if name in RENDER and data else md
        date = ((data or {}).get("machine") or {}).get("date")
        lines += [
            f"## {name}",
            "",
            rendered,
            "",
            f"Command: `.venv/bin/python {EXTRA[name]}`"
            + (f"; ran {date}" if date else "")
            + f". Raw figures: `bench/out/{name}.json`.",
            "",
        ]
    path = BENCH / "RESULTS.md"
    path.write_text("\n".join(lines))
    return path


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=list(BENCHMARKS), help="run these only (default: all)")
    parser.add_argument("--render-only", action="store_true", help="rewrite RESULTS.md from bench/out without running")
    args = parser.parse_args(argv)
    ran: dict[str, dict] = {}
    if not args.render_only:
        OUT.mkdir(exist_ok=True)
        for name in args.only or BENCHMARKS:
            print(f"== bench/{name}.py", flush=True)
            start = time.perf_counter()
            with open(OUT / f"{name}.log", "w") as log:
                rc = subprocess.call(
                    [sys.executable, str(BENCH / f"{name}.py"), *BENCHMARKS[name]],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=BENCH.parent,
                )
            ran[name] = {"rc": rc, "seconds": time.perf_counter() - start}
            record_run(ran)
            print(f"   exit {rc} in {ran[name]['seconds']:.0f} s", flush=True)
    print(f"wrote {write_results(ran)}")
    return 0 if all(r["rc"] == 0 for r in ran.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
