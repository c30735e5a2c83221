"""Stage 1 from a config: the KB set and index of `retrieval.mode`, top-K articles for a split, Recall@K.

These are the in-process entry points of the pipeline and the QFF trainer:
`build_index_from_config(cfg, benchmark)`, `load_index_from_config(cfg, benchmark)` and
`retrieve_split(cfg, split, benchmark=benchmark)`; the caller passes the benchmark (`qkvqa.data.benchmark`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from qkvqa.errors import ConfigError, StaleArtifactError
from qkvqa.retrieval.embed import Embedder, EmbeddingSet, check_mode, kb_set_kind
from qkvqa.retrieval.index import LoadedIndex, build_index, factory_slug, load_index, search_articles
from qkvqa.retrieval.results import Retrieved, check_coverage_of, read_results, read_results_stage1
from qkvqa.utils.logging import get_logger
from qkvqa.utils.own_files import check_own_dir, refuse_link

log = get_logger(__name__)

RECALL_KS = (1, 5, 10, 20)


# The overrides of the running command that an embed / index build command needs too (where the data, caches and
# encoders are); run_id, resume, eval.*, qff.*, generation.* ... stay with the command that was run.
REBUILD_KEYS = ("paths", "data", "components.image_encoder", "components.text_encoder", "retrieval", "seed")


def rebuild_hint(cfg) -> str:
    """The commands that (re)build the KB embeddings and index of this config, with the user's own overrides that
    decide them (`paths.world_dir=...`, a preset), so that the copied command builds what this one reads."""
    from qkvqa.utils.command_line import suggest

    extra = [f"retrieval.mode={cfg.retrieval.mode}"]
    if cfg.retrieval.index_dir:
        extra.append(f"retrieval.index_dir={cfg.retrieval.index_dir}")
    fallback = [f"experiment={cfg.experiment}"]
    return " && ".join(
        suggest(command, REBUILD_KEYS, extra=extra, fallback=fallback) for command in ("embed", "index build")
    )


def expected_encoders(cfg) -> dict:
    """Identities of the encoders of both index sides under this config: {"kb": ..., "query": ...}."""
    from qkvqa.retrieval.encoders import encoder_identity

    kb_spec = (
        cfg.components.text_encoder if kb_set_kind(cfg.retrieval.mode) == "kb_text" else cfg.components.image_encoder
    )
    return {"kb": encoder_identity(kb_spec), "query": encoder_identity(cfg.components.image_encoder)}


def index_dir_for(cfg, kb_set_path: Path) -> Path:
    """retrieval.index_dir, else {paths.cache_dir}/indexes/{KB embedding set}/{factory}."""
    if cfg.retrieval.index_dir:
        return Path(cfg.retrieval.index_dir).expanduser()
    path = (
        Path(cfg.paths.cache_dir).expanduser()
        / "indexes"
        / kb_set_path.name
        / factory_slug(cfg.retrieval.index_factory)
    )
    check_own_dir(path, "index folder", "remove it, or use a paths.cache_dir of your own (docs/security.md)")
    return path


def build_index_from_config(cfg, benchmark) -> tuple[Path, dict]:
    """Build the index of `retrieval.mode` over the config's (complete) KB embedding set of `benchmark`; (index dir,
    manifest)."""
    embedder = Embedder(cfg, kb_set_kind(cfg.retrieval.mode), benchmark=benchmark)
    path = embedder.set_path()
    hint = rebuild_hint(cfg).split(" && ")[0]
    if not refuse_link(path / "manifest.json").is_file():
        raise StaleArtifactError(f"no {embedder.kind} embeddings for this config at {path}; compute them with `{hint}`")
    out_dir = index_dir_for(cfg, path)
    r = cfg.retrieval
    manifest = build_index(
        EmbeddingSet.open(path),
        out_dir,
        kb_store=benchmark.kb_store(),
        factory=r.index_factory,
        query_encoder=expected_encoders(cfg)["query"],
        train_size=r.index_train_size,
        add_batch=r.index_add_batch,
        use_gpu=r.index_gpu,
        seed=cfg.seed,
        rebuild_hint=hint,
    )
    return out_dir, manifest


def load_index_from_config(cfg, benchmark) -> LoadedIndex:
    """The config's index, checked against the benchmark's KB store, mode and encoders (StaleArtifactError
    otherwise)."""
    if cfg.retrieval.index_dir:
        index_dir = Path(cfg.retrieval.index_dir).expanduser()
    else:
        index_dir = index_dir_for(cfg, Embedder(cfg, kb_set_kind(cfg.retrieval.mode), benchmark=benchmark).set_path())
    return load_index(
        index_dir,
        kb_store=benchmark.kb_store(),
        mode=check_mode(cfg.retrieval.mode),
        encoders=expected_encoders(cfg),
        factory=cfg.retrieval.index_factory,
        use_gpu=cfg.retrieval.index_gpu,
        rebuild_hint=rebuild_hint(cfg),
    )


def recall_ks(top_k: int) -> list[int]:
    """Recall cut-offs reported for a top-K retrieval: 1, 5, 10, 20 up to K, and K itself."""
    return sorted({k for k in RECALL_KS if k <= top_k} | {top_k})


def retrieval_metrics(
    results: dict[str, Retrieved],
    questions: Sequence[Any],
    *,
    dataset: str,
    top_k: int,
    two_hop_policy: str = "exclude",
) -> dict:
    """Recall@K (percent, qkvqa.metrics.retrieval) of `results` over `questions` (E-VQA: with the 2_hop policy;
    InfoSeek: questions without a gold URL, as in the official JSONL, are left out and counted)."""
    from qkvqa.metrics.retrieval import evqa_recall_at_k, recall_at_k

    rankings = {qid: r.urls for qid, r in results.items()}
    ks = recall_ks(top_k)
    if dataset == "evqa":
        rows = [
            {"data_id": q.data_id, "wikipedia_url": "|".join(q.gold_urls), "question_type": q.question_type}
            for q in questions
        ]
        return evqa_recall_at_k(rankings, rows, ks, two_hop_policy)
    gold = {q.data_id: tuple(q.gold_urls) for q in questions if q.gold_urls}
    return {**recall_at_k(rankings, gold, ks), "n_without_gold": len(questions) - len(gold)}


@dataclass
class SplitRetrieval:
    """Results of one split with their metrics and the query images that could not be used."""

    split: str
    results: dict[str, Retrieved]
    metrics: dict
    skipped_images: list[dict] = field(default_factory=list)
    query_set: Optional[Path] = None
    stage1_text: Optional[dict] = None  # what the index embedded (`index_text_source`); None: unknown


def retrieve_split(
    cfg, split: Optional[str] = None, *, benchmark, index: Optional[LoadedIndex] = None, encoder=None
) -> SplitRetrieval:
    """Top-`retrieval.top_k` articles for every question of `split` (default retrieval.split) and their Recall@K.

    Query images are embedded into (or read from) the resumable query_images set, then searched in
    the config's index (loaded and checked unless `index` is given); `benchmark` (a `qkvqa.data.benchmark.Benchmark`
    or a DataModule holding one) gives the questions, their images and the KB store; questions whose image is missing
    get an empty ranking (counted). With `retrieval.results` set, that file (OMGM or EchoSight layout)
    is read instead and only scored. `encoder` is the image encoder to reuse for query images.
    """
    split = split or cfg.retrieval.split
    questions = benchmark.questions(split)
    top_k = int(cfg.retrieval.top_k)
    if top_k < 1:
        raise ConfigError(f"retrieval.top_k must be >= 1, got {top_k}")
    text = None
    if cfg.retrieval.results:
        results, skipped, query_set = _read_for_split(cfg, benchmark, questions), [], None
        text = read_results_stage1(Path(cfg.retrieval.results).expanduser())  # None: the file does not say
    else:
        benchmark.image_loader.resolver.check_images(questions, split)
        if index is None:
            index = load_index_from_config(cfg, benchmark)
        text = index_text_source(index.manifest, str(index.path))
        results, skipped, query_set = _search_split(cfg, benchmark, split, questions, top_k, index, encoder)
    metrics = retrieval_metrics(
        results, questions, dataset=benchmark.config.dataset, top_k=top_k, two_hop_policy=cfg.retrieval.two_hop_policy
    )
    metrics["n_missing_query_images"] = sum(1 for q in questions if not results.get(q.data_id, Retrieved()).urls)
    return SplitRetrieval(split, results, metrics, skipped, query_set, text)


# What stage 1's KB side is, as the protocol card names it (`text`): OMGM's LLaMA-3 summaries (an imported index
# whose rows are in KB order, OMGM's `summary_llama3.index`, or summaries written by `qkvqa summarize`), the lead
# sections, another imported index, or images.
def index_text_source(manifest: dict, index_dir: str) -> dict:
    """{"text": llama3_summaries | lead_section | imported <format> | images, "index": dir, "detail": ...}."""
    from qkvqa.config.paper_rows import LLAMA3_SUMMARIES

    imported = manifest.get("imported")
    if manifest.get("mode") == "image_to_image":
        text, detail = "images", "KB images"
    elif imported:
        summaries = imported.get("format") == "kb_order"
        text = LLAMA3_SUMMARIES if summaries else f"imported {imported.get('format')}"
        detail = (
            f"imported {'OMGM summary ' if summaries else ''}index {imported['index']['path']} "
            f"(sha256 {str(imported['index'].get('sha256', ''))[:12]})"
        )
    else:
        source = (manifest.get("text_source") or {}).get("summary_source", "lead_section")
        text = LLAMA3_SUMMARIES if source == "summaries" else str(source)
        detail = (
            f"summaries {manifest['text_source'].get('summaries')} (qkvqa summarize)"
            if source == "summaries"
            else "each article's lead section (retrieval.summary_source=lead_section)"
        )
    return {"text": text, "index": index_dir, "detail": detail}


def _read_for_split(cfg, benchmark, questions) -> dict[str, Retrieved]:
    """retrieval.results restricted to the split's questions, titles filled from the KB where the file has none."""
    path = Path(cfg.retrieval.results).expanduser()
    stored = read_results(path)
    store = benchmark.kb_store()
    results = {}
    for q in questions:
        r = stored.get(q.data_id, Retrieved())
        titles = [
            t if t is not None else (store.get_by_url(u).title if u in store else None)
            for u, t in zip(r.urls, r.titles)
        ]
        results[q.data_id] = Retrieved(r.urls, titles, r.similarities)
    check_coverage_of(
        path, stored, questions, float(cfg.retrieval.min_results_coverage), "retrieval.min_results_coverage"
    )
    return results


def _search_split(cfg, benchmark, split, questions, top_k, index, encoder):
    r = cfg.retrieval
    if index is None:
        index = load_index_from_config(cfg, benchmark)
    report = Embedder(cfg, "query_images", split, benchmark=benchmark).run(encoder)
    vectors, ids = report.set.load_all()
    hits = search_articles(
        index,
        vectors,
        top_k,
        nprobe=r.nprobe,
        ef_search=r.hnsw_ef_search,
        image_search_factor=r.image_search_factor,
        batch_size=r.search_batch_size,
    )
    store = benchmark.kb_store()
    rows = sorted({row for hit in hits for row, _ in hit})
    articles = {a.row_id: a for a in store.get_many(rows)}
    by_image = {tuple(key): hit for key, hit in zip(ids, hits)}
    results = {}
    for q in questions:
        hit = by_image.get((q.dataset_name, q.image_id), [])
        results[q.data_id] = Retrieved(
            [articles[row].url for row, _ in hit], [articles[row].title for row, _ in hit], [float(s) for _, s in hit]
        )
    return results, report.set.skipped(), report.set.path


def summary_values(split: str, metrics: dict) -> dict:
    """Run-summary keys `retrieval/{split}/{name}` of the numeric and policy metrics."""
    return {f"retrieval/{split}/{name}": value for name, value in metrics.items()}
