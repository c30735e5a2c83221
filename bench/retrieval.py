"""faiss index types for stage-1 retrieval on CPU: Flat vs IVF vs HNSW vs IVF-PQ, side by side in one run.

Run: `.venv/bin/python bench/retrieval.py [--n N] [--dim 1280] [--queries Q] [--factories "Flat;IVF1024,Flat;..."]`.

Vectors are synthetic but clustered like real embeddings: N unit vectors around N/500 shared
random centres, spread along a shared 64-d subspace plus isotropic noise (isotropic Gaussian
vectors have no near neighbours and make every approximate index look bad). They are written as
float16 shards of a kb_text embedding set over a KB store of N stub articles, and every index is
built and searched through the library (`build_index`, `load_index`, `search_articles`), exactly
as `qkvqa index build` / `qkvqa retrieve` do. For each factory the bench reports the build time,
the index size (serialised bytes, about its RAM), the peak growth of anonymous RSS during the build
(vectors come memory-mapped and are added in batches, so a Flat index needs about its own size plus
one batch and the training sample, not twice its size),
and, per search setting (nprobe / efSearch), queries per second and recall@K against exact (Flat)
search of the same queries. Writes bench/out/retrieval.json and bench/out/retrieval.md (`--name` changes
the file names). The default N = 200,000 runs in about 2-5 minutes on 2 cores; HNSW's build time at
d = 1280 rules it out at 1M there, so the 1M run is IVF-only:
`--n 1000000 --factories "Flat;IVF2048,Flat;IVF2048,SQ8" --name retrieval_1m`. The 2M run, with one faiss
thread (about 15 minutes; the Flat index peaks near 10 GB of RAM, 15 GB of scratch disk):
`--n 2000000 --factories "Flat;IVF2048,SQ8" --threads 1 --name retrieval_2m`. faiss uses OMP_NUM_THREADS (or all
cores) unless `--threads` says otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from qkvqa.data.kb import KBStore, build_kb_store
from qkvqa.retrieval.embed import EmbeddingSet
from qkvqa.retrieval.index import build_index, factory_slug, load_index, search_articles
from qkvqa.utils.io import atomic_write_json, atomic_write_text

OUT = Path(__file__).resolve().parent / "out"
ENCODER = {"kind": "bench_synthetic", "weights": "clustered-gaussian", "options": {}}
LATENT = 64
SHARD = 50000
NPROBES = (4, 8, 16, 32, 64)
EF_SEARCHES = (32, 64, 128, 256)
GOAL_SPEEDUP, GOAL_RECALL = 20.0, 0.98


def default_nlist(n: int) -> int:
    """IVF lists: the power of two nearest to 2 sqrt(N) (512 for 100K, 2048 for 1M and 2M)."""
    return 1 << max(4, int(round(np.log2(2 * np.sqrt(n)))))


def default_factories(n: int) -> list[str]:
    """Flat, IVF-Flat, HNSW32, IVF with 8-bit scalar quantisation and IVF-PQ with 64-byte codes."""
    nlist = default_nlist(n)
    return ["Flat", f"IVF{nlist},Flat", "HNSW32", f"IVF{nlist},SQ8", f"IVF{nlist},PQ64"]


class Centres:
    """The shared structure of the synthetic embedding space."""

    def __init__(self, n: int, dim: int, seed: int = 7):
        rng = np.random.default_rng(seed)
        self.centres = rng.standard_normal((max(8, n // 500), dim), dtype=np.float32)
        self.basis = rng.standard_normal((LATENT, dim), dtype=np.float32) / np.sqrt(LATENT)

    def sample(self, n: int, seed: int) -> np.ndarray:
        """n unit vectors: a centre + 0.6 x a 64-d subspace draw + 0.3 x isotropic noise."""
        rng = np.random.default_rng(seed)
        x = self.centres[rng.integers(0, len(self.centres), n)]
        x += 0.6 * (rng.standard_normal((n, LATENT), dtype=np.float32) @ self.basis)
        x += 0.3 * rng.standard_normal(x.shape, dtype=np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x


def stub_kb(work: Path, n: int) -> KBStore:
    """A KB store of n stub articles (what an index manifest is checked against)."""
    with open(work / "kb.jsonl", "w", encoding="utf-8") as f:
        for i in range(n):
            url = f"https://en.wikipedia.org/wiki/Synthetic_{i}"
            f.write(
                json.dumps(
                    {
                        url: {
                            "url": url,
                            "title": f"Synthetic {i}",
                            "section_titles": ["lead"],
                            "section_texts": [""],
                            "image_urls": [],
                            "image_reference_descriptions": [],
                            "image_section_indices": [],
                        }
                    }
                )
                + "\n"
            )
    build_kb_store(work / "kb.jsonl", work / "store")
    return KBStore.open(work / "store")


def vector_set(work: Path, store: KBStore, space: Centres) -> EmbeddingSet:
    """The N vectors as a float16 kb_text embedding set, generated shard by shard."""
    emb = EmbeddingSet.create(
        work / "set",
        {
            "what": "kb_text",
            "encoder": ENCODER,
            "dtype": "float16",
            "shard_size": SHARD,
            "source": {
                "kb_url_checksum": store.url_checksum,
                "kb_articles": len(store),
                "summary_source": "lead_section",
            },
        },
        len(store),
    )
    for i in range(emb.n_shards):
        start, stop = emb.shard_rows(i)
        emb.write_shard(i, space.sample(stop - start, seed=1000 + i), list(range(start, stop)))
    return emb


class PeakRss:
    """Samples this process's anonymous resident memory (RssAnon: heap and arrays, not the memory-mapped shard
    files, which the page cache can drop) every 20 ms; `peak` is the largest value seen."""

    def __init__(self):
        self.peak = self.now()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @staticmethod
    def now() -> int:
        with open("/proc/self/status") as f:
            kb = next(line.split()[1] for line in f if line.startswith("RssAnon:"))
        return int(kb) * 1024

    def _run(self):
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.now())

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def recall(approx: list, exact: list, k: int) -> float:
    """Mean share of the exact top-k articles found in the approximate top-k."""
    return float(np.mean([len({r for r, _ in a[:k]} & {r for r, _ in e[:k]}) / k for a, e in zip(approx, exact)]))


def timed_search(index, queries: np.ndarray, k: int, **params) -> tuple[list, float]:
    """(results, queries per second) of one batched search call."""
    start = time.perf_counter()
    hits = search_articles(index, queries, k, **params)
    return hits, len(queries) / (time.perf_counter() - start)


def settings_for(factory: str) -> list[dict]:
    """The search settings swept for a factory string."""
    if factory.startswith("IVF"):
        return [{"nprobe": p} for p in NPROBES]
    if factory.startswith("HNSW"):
        return [{"ef_search": e} for e in EF_SEARCHES]
    return [{}]


def run(n: int, dim: int, n_queries: int, k: int, factories: list[str], train_size: int, work: Path) -> dict:
    import faiss

    started = time.time()
    space = Centres(n, dim)
    store = stub_kb(work, n)
    emb = vector_set(work, store, space)
    queries = space.sample(n_queries, seed=1)
    setup_s = time.time() - started
    print(f"{n} x {dim} vectors ({n // 500} clusters), {n_queries} queries: set up in {setup_s:.1f}s", flush=True)
    rows, exact, flat_qps = [], None, None
    for factory in factories:
        index_dir = work / factory_slug(factory)
        before = PeakRss.now()
        with PeakRss() as rss:
            t0 = time.perf_counter()
            manifest = build_index(
                emb,
                index_dir,
                kb_store=store,
                factory=factory,
                query_encoder=ENCODER,
                train_size=train_size,
                use_gpu=False,
            )
            build_s = time.perf_counter() - t0
        index = load_index(index_dir, kb_store=store, mode="image_to_summary")
        # the index file holds exactly faiss.serialize_index's bytes, without a second in-memory copy of the index
        size = (index_dir / manifest["index_file"]).stat().st_size
        for params in settings_for(factory):
            hits, qps = timed_search(index, queries, k, **params)
            if factory == "Flat":
                exact, flat_qps = hits, qps
            row = {
                "factory": factory,
                "params": params,
                "build_s": round(build_s, 2),
                "trained_on": manifest["trained_on"],
                "index_mb": round(size / 2**20, 1),
                "peak_anon_rss_growth_mb": round((rss.peak - before) / 2**20, 1),
                "qps": round(qps, 1),
                f"recall@{k}": round(recall(hits, exact, k), 4) if exact is not None else None,
                "speedup_vs_flat": round(qps / flat_qps, 1) if flat_qps else None,
            }
            rows.append(row)
            print(json.dumps(row), flush=True)
        del index
        shutil.rmtree(index_dir)
    meeting = [
        r for r in rows if r[f"recall@{k}"] is not None and r[f"recall@{k}"] >= GOAL_RECALL and r["factory"] != "Flat"
    ]
    best = max(meeting, key=lambda r: r["qps"], default=None)
    return {
        "n": n,
        "dim": dim,
        "queries": n_queries,
        "k": k,
        "clusters": n // 500,
        "train_size": train_size,
        "vector_dtype": "float16 shards, float32 in the index",
        "flat_index_mb": round(n * dim * 4 / 2**20, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "faiss_threads": faiss.omp_get_max_threads(),
            "faiss": faiss.__version__,
            "python": platform.python_version(),
            "load_average_at_start": os.getloadavg(),
            "date": time.strftime("%Y-%m-%d"),
        },
        "setup_s": round(setup_s, 1),
        "total_s": round(time.time() - started, 1),
        "results": rows,
        "goal": {
            "speedup_vs_flat": GOAL_SPEEDUP,
            f"recall@{k}": GOAL_RECALL,
            "best": best,
            "met": bool(best and best["speedup_vs_flat"] >= GOAL_SPEEDUP),
        },
    }


def markdown(report: dict) -> str:
    """The results as a markdown table."""
    k = report["k"]
    lines = [
        f"N = {report['n']:,} x {report['dim']}-d clustered unit vectors, {report['queries']} queries, "
        f"K = {k}, {report['machine']['faiss_threads']} faiss threads (faiss {report['machine']['faiss']}).",
        "",
        f"| factory | search setting | build s | index MB | peak anon RSS growth MB | queries/s | x Flat | recall@{k} |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        setting = ", ".join(f"{key}={value}" for key, value in r["params"].items()) or "exact"
        lines.append(
            f"| `{r['factory']}` | {setting} | {r['build_s']} | {r['index_mb']} | {r['peak_anon_rss_growth_mb']} "
            f"| {r['qps']} | {r['speedup_vs_flat']} | {r[f'recall@{k}']} |"
        )
    best = report["goal"]["best"]
    lines += [
        "",
        f"Goal (>= {GOAL_SPEEDUP:g}x Flat at recall@{k} >= {GOAL_RECALL}): "
        + (
            f"{'met' if report['goal']['met'] else 'not met'}; fastest configuration at that recall: `{best['factory']}` "
            f"{best['params']} at {best['speedup_vs_flat']}x"
            if best
            else "no configuration reached the recall"
        ),
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200000, help="number of KB vectors (default 200000)")
    parser.add_argument("--dim", type=int, default=1280, help="vector size (default 1280, EVA-CLIP-8B)")
    parser.add_argument("--queries", type=int, default=500, help="number of query vectors (default 500)")
    parser.add_argument("--k", type=int, default=20, help="articles per query (default 20)")
    parser.add_argument(
        "--train-size",
        type=int,
        default=None,
        help="IVF/PQ training vectors (default 40 per IVF list of the default factories)",
    )
    parser.add_argument(
        "--factories",
        default=None,
        help="';'-separated factory strings (default: Flat;IVF<nlist>,Flat;HNSW32;IVF<nlist>,SQ8;"
        "IVF<nlist>,PQ64 with nlist the power of two nearest to 2 sqrt(N))",
    )
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one)")
    parser.add_argument("--name", default="retrieval", help="output name: bench/out/NAME.json and NAME.md")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="faiss (OpenMP) threads (default: faiss's own, i.e. OMP_NUM_THREADS or every core)",
    )
    args = parser.parse_args()
    if args.threads:
        import faiss

        faiss.omp_set_num_threads(args.threads)
    factories = args.factories.split(";") if args.factories else default_factories(args.n)
    if factories[0] != "Flat":
        factories.insert(0, "Flat")  # the exact reference comes first
    work = Path(args.workdir or tempfile.mkdtemp(prefix="qkvqa-bench-retrieval-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        train_size = args.train_size or 40 * default_nlist(args.n)
        report = run(args.n, args.dim, args.queries, args.k, factories, train_size, work)
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    atomic_write_json(OUT / f"{args.name}.json", report)
    table = markdown(report)
    atomic_write_text(OUT / f"{args.name}.md", table)
    print(table)


if __name__ == "__main__":
    os.environ.setdefault("QKVQA_PROGRESS", "0")
    main()
