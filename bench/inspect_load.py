"""Benchmark: how fast the `qkvqa inspect` site opens at E-VQA-test scale, in headless Chromium.

Usage: .venv/bin/python bench/inspect_load.py [--rows 71335] [--from RUN_DIR] [--repeats 3]

Real traces come from RUN_DIR/traces.jsonl (default: the `qkvqa demo` evaluation "QFF focus: per_layer + CDA" on a
14-entity world with one training epoch, run into .cache/qkvqa/bench_inspect and reused). They are replicated to
`--rows` rows (71,335 = the E-VQA test split plus two-hop rows, as large as a run's table gets), each copy with a
new data_id and, seeded, a perturbed verdict, gold ranks, answer-in-context and Table 3 category, so that the
filters select real subsets. The site is built with `qkvqa.inspect.site.build_site`, then opened from file:// in
Debian's headless Chromium (/usr/bin/chromium via /usr/bin/chromedriver, no download), `--repeats` times each:
the figure is the time from navigation start until the table shows its first page (window.QKVQA_READY_MS, set
by the page right after it rendered). Also timed inside the page: a filter (wrong only), a free-text search and
opening one question (its trace shard loaded). A 1,000-row site is measured side by side. Writes
bench/out/inspect_load.json and bench/out/inspect_load.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
CACHE = REPO / ".cache" / "qkvqa" / "bench_inspect"
EVQA_TEST_ROWS = 71335
GOAL_MS = 2000.0
sys.path.insert(0, str(REPO))


def source_run(given: str | None) -> Path:
    """A finished evaluation run with traces.jsonl: `given`, else the demo's per_layer evaluation (run once)."""
    if given:
        return Path(given)
    run = CACHE / "runs" / "demo-eval-2"
    if not (run / "traces.jsonl").exists():
        from qkvqa.cli.main import main

        os.environ.setdefault("WANDB_MODE", "disabled")
        rc = main(
            ["demo", "--dir", str(CACHE / "work"), "--runs", str(CACHE / "runs"), "--entities", "14", "--epochs", "1"]
        )
        if rc != 0:
            raise SystemExit(f"qkvqa demo failed (exit {rc})")
    return run


def synthetic_run(source: Path, rows: int, out: Path, seed: int = 0) -> Path:
    """A run directory of `rows` traces replicated from `source`'s, perturbed (seeded)."""
    real = [json.loads(line) for line in (source / "traces.jsonl").read_text(encoding="utf-8").splitlines()]
    rng = random.Random(seed)
    run = out / f"bench-{rows}"
    run.mkdir(parents=True, exist_ok=True)
    with open(run / "traces.jsonl", "w", encoding="utf-8") as f:
        for i in range(rows):
            t = dict(real[i % len(real)])
            k = len(t.get("stage1") or []) or 20
            before = rng.choice([None] + list(range(1, k + 1)))
            after = None if before is None else rng.randint(1, k)
            correct = rng.random() < 0.35
            t["data_id"] = f"{t['data_id']}#{i}"
            t["verdict"] = {**(t.get("verdict") or {"references": []}), "correct": correct, "score": float(correct)}
            t["gold_rank"] = {"before": before, "after": after}
            t["answer_in_context"] = rng.random() < 0.4 if t.get("context") else None
            t["category"] = (
                None
                if t.get("question_type") == "2_hop"
                else (
                    ("R1-" if after == 1 else "NR-") + ("C" if correct else "W")
                    if before or correct
                    else "not_retrieved"
                )
            )
            f.write(json.dumps(t, ensure_ascii=False, separators=(",", ":")) + "\n")
    for name in ("scores.json",):
        if (source / name).exists():
            shutil.copy(source / name, run / name)
    (run / "status.json").write_text(json.dumps({"run_id": run.name, "state": "finished", "command": "evaluate"}))
    return run


def measure(site: Path, repeats: int) -> dict:
    """Open the site `repeats` times from file://; the page's timings in ms."""
    from tests.helpers.browser import chromium, wait_for

    first_page, wall, filt, search, question = [], [], [], [], []
    with chromium() as driver:
        for _ in range(repeats):
            driver.get("about:blank")
            start = time.perf_counter()
            driver.get((site / "index.html").as_uri())
            wait_for(driver, "document.body.dataset.ready === '1'", timeout=120)
            wall.append(1000 * (time.perf_counter() - start))
            first_page.append(driver.execute_script("return window.QKVQA_READY_MS;"))
            filt.append(
                driver.execute_script(
                    "const t = performance.now(); const s = document.getElementById('f-verdict'); s.value = '0';"
                    "s.dispatchEvent(new Event('change')); return performance.now() - t;"
                )
            )
            driver.execute_script(
                "const s = document.getElementById('f-verdict'); s.value = '';s.dispatchEvent(new Event('change'));"
            )
            # A search, timed without the page's 150 ms typing pause: the text is set, then the filters applied
            # (the first search also lower-cases every row's id, question and prediction once).
            search.append(
                driver.execute_script(
                    "document.getElementById('f-search').value = 'larvae'; const t = performance.now();"
                    "document.getElementById('f-verdict').dispatchEvent(new Event('change'));"
                    "return performance.now() - t;"
                )
            )
            pos = driver.execute_script("return window.QKVQA_INDEX.rows.length - 1;")
            t0 = driver.execute_script(
                "window.__t0 = performance.now(); location.hash = '#/q/' + arguments[0];return window.__t0;", pos
            )
            wait_for(driver, f"document.getElementById('view-question').dataset.loaded === '{pos}'", timeout=60)
            question.append(driver.execute_script("return performance.now();") - t0)
    return {
        "first_page_ms": statistics.median(first_page),
        "first_page_ms_all": first_page,
        "wall_ms_median": statistics.median(wall),
        "filter_ms": statistics.median(filt),
        "search_ms": statistics.median(search),
        "open_question_ms": statistics.median(question),
    }


def site_size(site: Path) -> dict:
    files = [p for p in site.rglob("*") if p.is_file()]
    return {
        "index_js_mb": (site / "data" / "index.js").stat().st_size / 1e6,
        "site_mb": sum(p.stat().st_size for p in files) / 1e6,
        "shard_files": len(list((site / "data" / "a").glob("*.js"))),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=EVQA_TEST_ROWS)
    parser.add_argument("--small", type=int, default=1000, help="the site measured side by side")
    parser.add_argument("--from", dest="source", help="a run directory with traces.jsonl (default: the demo's)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    from tests.helpers.browser import missing

    reason = missing()
    if reason:
        raise SystemExit(reason)
    from qkvqa.inspect.site import build_site

    source = source_run(args.source)
    results = {}
    with tempfile.TemporaryDirectory(prefix="inspect_load_") as tmp:
        for rows in (args.small, args.rows):
            run = synthetic_run(source, rows, Path(tmp))
            start = time.perf_counter()
            site = build_site(run, out=Path(tmp) / f"site-{rows}")
            build_s = time.perf_counter() - start
            results[str(rows)] = {
                "rows": rows,
                "build_s": build_s,
                **site_size(site.out),
                **measure(site.out, args.repeats),
            }
            print(json.dumps(results[str(rows)]), flush=True)
    big, small = results[str(args.rows)], results[str(args.small)]
    data = {
        "rows": args.rows,
        "first_page_ms": big["first_page_ms"],
        "goal_ms": GOAL_MS,
        "within_goal": big["first_page_ms"] < GOAL_MS,
        "source_run": str(source),
        "source_traces": sum(1 for _ in open(source / "traces.jsonl", encoding="utf-8")),
        "ratio_first_page_big_vs_small": big["first_page_ms"] / small["first_page_ms"],
        "results": results,
        "machine": {"node": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version()},
        "browser": "Debian chromium, headless=new, via selenium + /usr/bin/chromedriver",
    }
    OUT.mkdir(exist_ok=True)
    (OUT / "inspect_load.json").write_text(json.dumps(data, indent=2) + "\n")
    lines = [
        "| rows | first page (ms, median) | wall incl. WebDriver (ms) | filter (ms) | search (ms) | open a question "
        "(ms) | index.js (MB) | site (MB) | shard files | build (s) |",
        "|" + "---|" * 10,
    ]
    for r in results.values():
        lines.append(
            f"| {r['rows']:,} | {r['first_page_ms']:.0f} | {r['wall_ms_median']:.0f} | {r['filter_ms']:.0f} | "
            f"{r['search_ms']:.0f} | {r['open_question_ms']:.0f} | {r['index_js_mb']:.1f} | "
            f"{r['site_mb']:.0f} | {r['shard_files']} | {r['build_s']:.1f} |"
        )
    lines += [
        "",
        f"The {args.rows:,}-row table shows its first page {big['first_page_ms']:.0f} ms after navigation "
        f"starts (goal: under {GOAL_MS:.0f} ms), {data['ratio_first_page_big_vs_small']:.1f}x the "
        f"{args.small:,}-row site's, measured side by side; rows replicated and perturbed from "
        f"{data['source_traces']} real traces. Opening a question includes loading its shard of 500 traces.",
    ]
    (OUT / "inspect_load.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
