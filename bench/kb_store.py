"""Benchmark: the SQLite KB store vs json.load of the same KB JSON (build, open, peak memory, per-article access).

Usage: .venv/bin/python bench/kb_store.py [--articles 200000] [--keep DIR] [--store-only] [--name NAME]

Everything is measured in one run, side by side; each measurement that reports a peak RSS runs in
its own subprocess so that neither side sees the other's memory. Writes bench/out/kb_store.json
(`--name` changes the file name) and prints a markdown table.

`--store-only` skips the json.load baseline (and the ratios that need it): at full scale it cannot run, since
json.load of a 20 GB KB needs about three times that in RAM. The full-scale run, 2M articles of ~10.5 KB each
(~21 GB JSON, about the real E-VQA KB's size), measured with one core (about 14 minutes here, ~45 GB of scratch disk):
    OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python bench/kb_store.py --articles 2000000 --sections 12 \
        --sentences 10 --store-only --name kb_store_2m --keep /tmp/kb2m && rm -rf /tmp/kb2m
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parent / "out"
ACCESSES = 2000  # random articles read per access measurement
OPEN_REPEATS = 5  # store opens timed (the median is reported)
WORDS = (
    "river",
    "stone",
    "early",
    "northern",
    "species",
    "tower",
    "built",
    "found",
    "century",
    "large",
    "small",
    "island",
    "named",
    "after",
    "known",
    "for",
    "its",
    "the",
    "of",
    "and",
    "in",
    "was",
    "is",
    "a",
    "by",
    "local",
    "coast",
    "winter",
    "summer",
    "museum",
    "bridge",
    "forest",
    "leaves",
    "feathers",
    "Zürich",
    "Łódź",
)


def _peak_rss_mb() -> float:
    """Peak resident set size of this process, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def write_kb(path: Path, articles: int, sections: int, sentences: int, seed: int = 0) -> None:
    """A KB JSON dict of `articles` Wikipedia-like entries, streamed to disk (E-VQA schema)."""
    rng = random.Random(seed)
    pool = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 20))).capitalize() + "." for _ in range(3000)]
    with open(path, "w", encoding="utf-8") as f:
        f.write("{")
        for i in range(articles):
            title = f"Article {i} {rng.choice(WORDS)}"
            url = "https://en.wikipedia.org/wiki/" + title.replace(" ", "_")
            titles = [title] + [f"Section {k}" for k in range(1, sections - 2)] + ["References", "External links"]
            n_images = rng.randint(0, 3)
            entry = {
                "url": url,
                "title": title,
                "section_titles": titles,
                "section_texts": [" ".join(rng.choices(pool, k=sentences)) for _ in titles],
                "image_urls": [
                    f"https://upload.wikimedia.org/wikipedia/commons/{i % 10}/{i}_{k}.jpg" for k in range(n_images)
                ],
                "image_reference_descriptions": [f"Image {k} of {title}" for k in range(n_images)],
                "image_section_indices": [rng.randrange(len(titles)) for _ in range(n_images)],
            }
            f.write(("" if i == 0 else ", ") + json.dumps(url) + ": " + json.dumps(entry, ensure_ascii=False))
        f.write("}\n")


def child_json_load(source: str, articles: int) -> dict:
    """Baseline: json.load the KB, then random per-article access (url -> entry, touching its fields)."""
    started = time.perf_counter()
    with open(source, encoding="utf-8") as f:
        kb = json.load(f)
    load_seconds = time.perf_counter() - started
    urls = list(kb)
    picks = [urls[i] for i in random.Random(1).sample(range(articles), min(ACCESSES, articles))]
    started = time.perf_counter()
    for url in picks:
        entry = kb[url]
        _ = (entry["title"], entry["section_texts"][0], entry["image_urls"])
    access = (time.perf_counter() - started) / len(picks)
    return {"load_seconds": load_seconds, "access_seconds": access, "peak_rss_mb": _peak_rss_mb()}


def child_store(store_dir: str, articles: int, source: str) -> dict:
    """KB store: open (median of several) without and with the source check (sampled fingerprint), the full
    sha256 check of the source, then random access by row id and by URL."""
    from qkvqa.data.kb import KBStore

    opens, checked = [], []
    for _ in range(OPEN_REPEATS):
        started = time.perf_counter()
        store = KBStore.open(store_dir)
        store.get(0)
        opens.append(time.perf_counter() - started)
        store.close()
        started = time.perf_counter()
        KBStore.open(store_dir, source=source).close()
        checked.append(time.perf_counter() - started)
    started = time.perf_counter()
    store.check_source(source, full=True)
    full_check = time.perf_counter() - started
    rows = random.Random(1).sample(range(articles), min(ACCESSES, articles))
    started = time.perf_counter()
    for row in rows:
        article = store.get(row)
        _ = (article.title, article.section_texts[0], article.image_urls)
    by_row = (time.perf_counter() - started) / len(rows)
    urls = [store.get(row).url for row in rows]
    started = time.perf_counter()
    for url in urls:
        store.get_by_url(url)
    by_url = (time.perf_counter() - started) / len(urls)
    return {
        "open_seconds": sorted(opens)[len(opens) // 2],
        "access_seconds": by_row,
        "access_by_url_seconds": by_url,
        "open_with_source_check_seconds": sorted(checked)[len(checked) // 2],
        "full_source_check_seconds": full_check,
        "peak_rss_mb": _peak_rss_mb(),
    }


def child_build(source: str, store_dir: str) -> dict:
    """Build the store (streamed), reporting its time and the peak RSS of the building process."""
    from qkvqa.data.kb import build_kb_store

    started = time.perf_counter()
    manifest = build_kb_store(source, store_dir)
    return {
        "build_seconds": time.perf_counter() - started,
        "peak_rss_mb": _peak_rss_mb(),
        "articles": manifest["articles"],
    }


def child_baseline() -> dict:
    """An interpreter that imports what the store child imports, and does nothing: the RSS floor."""
    import qkvqa.data.kb  # noqa: F401

    return {"peak_rss_mb": _peak_rss_mb()}


def _run_child(*args: str) -> dict:
    env = dict(os.environ, QKVQA_PROGRESS="0", QKVQA_LOG_LEVEL="WARNING")
    result = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"child {args[0]} failed:\n{result.stderr}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def _table(r: dict) -> str:
    s, j, b = r["store"], r["json_load"], r["build"]
    if j is None:  # --store-only
        return _table_store_only(r)
    rows = [
        ("build (stream into SQLite)", f"{b['build_seconds']:.1f} s, peak RSS {b['peak_rss_mb']:.0f} MiB", "-", "-"),
        (
            "open",
            f"{s['open_seconds'] * 1e3:.2f} ms",
            f"{j['load_seconds']:.1f} s (json.load)",
            f"{r['ratios']['open_speedup']:.0f}x faster",
        ),
        (
            "peak RSS (open + {} reads)".format(ACCESSES),
            f"{s['peak_rss_mb']:.0f} MiB",
            f"{j['peak_rss_mb']:.0f} MiB",
            f"{r['ratios']['peak_memory_reduction']:.1f}x less",
        ),
        (
            "per-article access (row id)",
            f"{s['access_seconds'] * 1e6:.0f} us",
            f"{j['access_seconds'] * 1e6:.2f} us",
            f"{r['ratios']['access_slowdown']:.0f}x slower",
        ),
        ("per-article access (URL)", f"{s['access_by_url_seconds'] * 1e6:.0f} us", "-", "-"),
        (
            "open + source check: sampled 4 MiB vs full sha256",
            f"{s['open_with_source_check_seconds'] * 1e3:.1f} ms",
            f"{s['full_source_check_seconds']:.2f} s (full)",
            f"{r['ratios']['sampled_check_speedup']:.0f}x faster",
        ),
    ]
    lines = [
        f"KB: {r['articles']} articles, {r['kb_json_mb']:.0f} MiB JSON; store {r['store_mb']:.0f} MiB; "
        f"interpreter floor {r['baseline']['peak_rss_mb']:.0f} MiB",
        "",
        "| measure | KB store | json.load dict | ratio |",
        "|---|---|---|---|",
    ]
    lines += [f"| {a} | {b_} | {c} | {d} |" for a, b_, c, d in rows]
    return "\n".join(lines)


def _table_store_only(r: dict) -> str:
    """The store's figures alone (no json.load baseline), for the full-scale run."""
    s, b = r["store"], r["build"]
    rows = [
        ("write the synthetic KB JSON (bench only)", f"{r['write_seconds'] / 60:.1f} min"),
        (
            "build (stream into SQLite)",
            f"{b['build_seconds'] / 60:.1f} min "
            f"({r['kb_json_mb'] / b['build_seconds']:.1f} MiB/s), peak RSS {b['peak_rss_mb']:.0f} MiB",
        ),
        (
            "store size (kb.sqlite; whole directory)",
            f"{r['store_mb'] / 1024:.1f} GiB; {r['store_dir_mb'] / 1024:.1f} GiB",
        ),
        (f"open (median of {OPEN_REPEATS})", f"{s['open_seconds'] * 1e3:.2f} ms"),
        (f"peak RSS (open + {ACCESSES} reads)", f"{s['peak_rss_mb']:.0f} MiB"),
        ("per-article access (row id)", f"{s['access_seconds'] * 1e6:.0f} us"),
        ("per-article access (URL)", f"{s['access_by_url_seconds'] * 1e6:.0f} us"),
        ("open + sampled source check (4 MiB)", f"{s['open_with_source_check_seconds'] * 1e3:.1f} ms"),
        ("full sha256 source check", f"{s['full_source_check_seconds']:.1f} s"),
    ]
    lines = [
        f"KB: {r['articles']:,} articles ({r['sections']} sections x {r['sentences']} sentences), "
        f"{r['kb_json_mb'] / 1024:.1f} GiB JSON; json.load baseline not run (--store-only); interpreter floor "
        f"{r['baseline']['peak_rss_mb']:.0f} MiB",
        "",
        "| measure | KB store |",
        "|---|---|",
    ]
    lines += [f"| {a} | {b_} |" for a, b_ in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--articles", type=int, default=200_000)
    parser.add_argument(
        "--sections", type=int, default=8, help="sections per article (incl. References, External links)"
    )
    parser.add_argument("--sentences", type=int, default=5, help="sentences per section")
    parser.add_argument("--keep", help="work directory to keep the KB and store in (default: a temp dir, removed)")
    parser.add_argument(
        "--store-only",
        action="store_true",
        help="skip the json.load baseline (it needs ~3x the JSON's size in RAM: impossible at 20 GB)",
    )
    parser.add_argument("--name", default="kb_store", help="output name: bench/out/NAME.json (default kb_store)")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        mode, *rest = args.child
        funcs = {
            "json_load": lambda: child_json_load(rest[0], int(rest[1])),
            "store": lambda: child_store(rest[0], int(rest[1]), rest[2]),
            "build": lambda: child_build(rest[0], rest[1]),
            "baseline": child_baseline,
        }
        print(json.dumps(funcs[mode]()))
        return

    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kb_bench_"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        source, store_dir = work / "kb.json", work / "store"
        started = time.perf_counter()
        write_kb(source, args.articles, args.sections, args.sentences)
        write_seconds = time.perf_counter() - started
        print(f"wrote {source} ({source.stat().st_size / 2**20:.0f} MiB) in {write_seconds:.0f} s", file=sys.stderr)
        build = _run_child("build", str(source), str(store_dir))
        print(f"built the store in {build['build_seconds']:.0f} s", file=sys.stderr)
        store = _run_child("store", str(store_dir), str(args.articles), str(source))
        json_load = None if args.store_only else _run_child("json_load", str(source), str(args.articles))
        baseline = _run_child("baseline")
        ratios = {"sampled_check_speedup": store["full_source_check_seconds"] / store["open_with_source_check_seconds"]}
        if json_load is not None:
            ratios = {
                "peak_memory_reduction": json_load["peak_rss_mb"] / store["peak_rss_mb"],
                "open_speedup": json_load["load_seconds"] / store["open_seconds"],
                "access_slowdown": store["access_seconds"] / json_load["access_seconds"],
                **ratios,
            }
        result = {
            "articles": args.articles,
            "sections": args.sections,
            "sentences": args.sentences,
            "kb_json_mb": source.stat().st_size / 2**20,
            "write_seconds": write_seconds,
            "store_mb": (store_dir / "kb.sqlite").stat().st_size / 2**20,
            "store_dir_mb": sum(f.stat().st_size for f in store_dir.iterdir()) / 2**20,
            "build": build,
            "store": store,
            "json_load": json_load,
            "baseline": baseline,
            "ratios": ratios,
            "goals": {"peak_memory_reduction": 10, "open_speedup": 100},
            "machine": {
                "cpus": os.cpu_count(),
                "python": sys.version.split()[0],
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "date": time.strftime("%Y-%m-%d"),
            },
        }
        result["goals_met"] = {k: result["ratios"][k] >= v for k, v in result["goals"].items() if k in ratios}
        out = OUT_DIR / f"{args.name}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2) + "\n")
        print(_table(result))
        print(f"\nfigures in {out}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
