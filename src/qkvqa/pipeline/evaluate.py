"""`qkvqa evaluate`: stage-1 results, the pipeline over a split with Trainer.predict, strict scoring and report.md."""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Sequence

from omegaconf import DictConfig

from qkvqa.errors import ConfigError, DataError, StaleArtifactError
from qkvqa.pipeline.build import build_judge, build_pipeline, preflight
from qkvqa.pipeline.filters import filter_kind
from qkvqa.retrieval.results import Retrieved, read_results, write_results
from qkvqa.utils.io import atomic_write_json, atomic_write_text
from qkvqa.utils.logging import get_logger
from qkvqa.utils.stop_signals import interruptible_barrier

log = get_logger(__name__)
RETRIEVAL_FILE = "retrieval.json"
RETRIEVAL_META = "retrieval_meta.json"
ANSWERED_WITH = "answered_with.json"  # the content of the weights that made this run's answers (issue 44)
ANSWERING_ROLES = ("qformer", "reranker", "generator")  # the components after stage 1 whose outputs are the answers


def answering_weights(cfg: DictConfig) -> dict:
    """{key: content fingerprint} of the weights that make the answers: `qff.checkpoint` (its file's sha256, or its
    folder's `tree_fingerprint`) and each answering component's local or hub-cached weights (tiny ones are their
    config, which resume already compares)."""
    from qkvqa.components.registry import spec_from_mapping
    from qkvqa.retrieval.encoders import weights_content
    from qkvqa.utils.io import sha256_file_cached, tree_fingerprint

    out: dict = {}
    kind = filter_kind(cfg.eval.filter)
    trained = kind.trained_weights(cfg)  # (key, value, what writes it): qff.checkpoint for the QFF kinds
    if trained and trained[1]:
        path = Path(str(trained[1])).expanduser()
        if path.is_file():
            out[trained[0]] = sha256_file_cached(path)[:16]
        elif path.is_dir():
            out[trained[0]] = tree_fingerprint(path)
    for role in ANSWERING_ROLES:
        spec = cfg.components.get(role)
        if spec is None or (role == "qformer" and role not in kind.components):
            continue
        try:
            content = weights_content(spec_from_mapping(spec))
        except Exception:  # noqa: BLE001 (a spec the preflight refuses by name; nothing to fingerprint here)
            content = None
        if content is not None:
            out[f"components.{role}.pretrained"] = content
    return out


def check_answering_weights(cfg: DictConfig, run_dir: Path, answered: int) -> None:
    """Record the weights' fingerprints before the first answer; on resume, refuse (one line naming the key) weights
    that differ from those that made the answers already stored: a QFF replaced at the same `qff.checkpoint` path once
    gave a run whose answers came from two models, exit 0, its card naming the second only."""
    path = run_dir / ANSWERED_WITH
    now = answering_weights(cfg)
    if path.is_file() and answered:
        before = json.loads(path.read_text(encoding="utf-8"))
        changed = [k for k in sorted(set(before) | set(now)) if before.get(k) != now.get(k)]
        if changed:
            key = changed[0]
            raise StaleArtifactError(
                f"{key}: the weights differ from those that made the {answered} answers already in {run_dir} "
                f"(sha256 {before.get(key)}, now {now.get(key)}); evaluate them as a new run (another run_id), or put "
                "back the weights this run answered with"
            )
        return
    atomic_write_json(path, now)


def stage1(
    cfg: DictConfig, benchmark: Any, split: str, run_dir: Path, rank_zero: bool
) -> tuple[dict[str, Retrieved], dict]:
    """The split's stage-1 results and their metrics, computed once by rank zero and reused on restart (the answers
    already written used them), refused when the KB store changed since."""
    from qkvqa.retrieval.embed import kb_content

    path, meta_path = run_dir / RETRIEVAL_FILE, run_dir / RETRIEVAL_META
    kb = benchmark.kb_store().url_checksum
    content = kb_content(benchmark.kb_store())  # text edited under the same URLs is another KB (issue 44)
    if rank_zero and not (path.exists() and meta_path.exists()):
        from qkvqa.retrieval.retrieve import retrieve_split

        start = time.perf_counter()
        result = retrieve_split(cfg, split, benchmark=benchmark)
        seconds = (time.perf_counter() - start) / max(len(result.results), 1)
        write_results(path, result.results)
        atomic_write_json(
            meta_path,
            {
                "seconds_per_question": 0.0 if cfg.retrieval.results else seconds,
                "metrics": result.metrics,
                "source": cfg.retrieval.results or "in-process",
                "kb_url_checksum": kb,
                "kb_content": content,
                "stage1_text": result.stage1_text,
            },
        )
    if not rank_zero:
        _wait_for_rank_zero(meta_path, run_dir, float(cfg.eval.stage1_wait_s))
    meta = json.loads(meta_path.read_text(encoding="utf-8"))
    if meta.get("kb_url_checksum", kb) != kb or (meta.get("kb_content") or content) != content:
        raise StaleArtifactError(
            f"{meta_path}: this run's stage-1 results and answers were made over another KB "
            f"(URL checksum {meta['kb_url_checksum']}, content {str(meta.get('kb_content'))[:12]}; the KB store now has "
            f"{kb}, {str(content)[:12]}); evaluate "
            "again as a new run (another run_id)"
        )
    return read_results(path), meta


def _wait_for_rank_zero(path: Path, run_dir: Path, timeout_s: float) -> None:
    """Ranks >= 1 started by torchrun or srun with rank zero wait here until its stage-1 results exist (the barrier
    after stage 1: the process group is not up yet), stopping early when rank zero's record says it ended."""
    from qkvqa.run.record import RunRecord

    deadline, next_log = time.monotonic() + timeout_s, time.monotonic() + 60
    attempts = len(RunRecord(run_dir).status().get("attempts", []))
    this_attempt = False
    while not path.exists():
        status = RunRecord(run_dir).status()
        state = status.get("state")
        # A resumed run's status.json holds the previous attempt's end until rank zero starts this attempt: only an
        # end recorded once this attempt started counts.
        this_attempt = this_attempt or state == "running" or len(status.get("attempts", [])) > attempts
        if state in ("failed", "interrupted") and this_attempt:
            raise StaleArtifactError(
                f"{path}: rank zero ended ({state}) before writing the stage-1 results; see {run_dir / 'status.json'}"
            )
        if time.monotonic() > deadline:
            raise StaleArtifactError(
                f"{path}: rank zero wrote no stage-1 results within eval.stage1_wait_s="
                f"{timeout_s:g} s; raise it for a long stage 1, or check rank zero's log"
            )
        if time.monotonic() > next_log:
            log.warning("waiting for rank zero's stage-1 results (%s)", path)
            next_log = time.monotonic() + 60
        time.sleep(0.5)


def caveats(cfg: DictConfig, scores: dict) -> list[str]:
    """Honest notes for the report: tiny or random components, skipped questions."""
    from qkvqa.pipeline.protocol import used_components

    notes = []
    if cfg.eval.stop_after != "filter" and cfg.generation.reader == "extractive":
        notes.append(
            "Answers come from a tiny extractive reader (generation.reader=extractive), not from "
            f"components.generator ({cfg.components.generator.kind}): the span after the linking word of the "
            "context sentence that shares the most words with the question. Its accuracy says whether "
            "the filter and CDA put the answer sentence into the context, not what a language model would answer."
        )
    notes += filter_kind(cfg.eval.filter).caveats(cfg)
    if cfg.eval.stop_after == "filter":
        notes.append(
            "Stopped after the filter (eval.stop_after=filter): no context was built and no answer "
            "generated, so only the retrieval and filter figures (Recall@K, section R@1) exist."
        )
    tiny = [name for name in used_components(cfg) if cfg.components[name].tiny]
    if tiny:
        reader = cfg.generation.reader == "extractive"
        notes.append(
            f"Tiny, randomly initialised components: {', '.join(tiny)}. An untrained tiny generator's "
            "answers are noise, so its accuracy means nothing"
            + (" (here an extractive reader answers instead, below)" if reader else "")
            + "; retrieval, filter and context metrics (Recall@K, R1, section R@1, answer-in-context) do."
        )
    if scores["n_skipped"]:
        counted = (
            "They are left out of every metric (eval.exclude_skipped=true, for diagnosis): these numbers "
            "are NOT comparable to the paper's, which count every question."
            if scores["exclude_skipped"]
            else "Each counts as a wrong answer and a retrieval miss, so n is the whole split."
        )
        notes.append(
            f"{scores['n_skipped']} questions could not be answered because their query image is missing "
            f"or unreadable (listed in predictions.jsonl with `skipped`, in scores.json and in "
            f"skipped_images.json). {counted}"
        )
    images = scores.get("qff_article_images") or {}
    if images.get("without_image"):
        notes.append(
            f"{images['without_image']} of the {images['ranked_articles']} ranked articles have no main image, "
            "so the QFF scored them 0 and only their stage-1 similarity ranked them (set "
            "data.images.kb_image_csvs to the title -> image CSVs)."
        )
    if scores["dataset"] == "evqa" and not scores.get("two_hop_rows"):
        notes.append(
            "data.include_two_hop=false: only single-hop rows were evaluated, so accuracy is the "
            "single-hop figure, NOT comparable to the paper's headline over all 5,750 test rows."
        )
    return notes


QUESTION_IDS = "question_ids.json"


def record_earlier_skips(benchmark: Any, rows: Sequence[dict], questions: Sequence[Any]) -> None:
    """A resumed evaluation loads only the images of the questions it answers now (none when it only re-scores),
    so skipped_images.json was rewritten with 0 missing while the scores kept the earlier skips: each skipped row's
    image is looked up again here, so the file lists every skip the predictions hold."""
    import logging

    loader, by_id = benchmark.image_loader, {q.data_id: q for q in questions}
    quiet = logging.getLogger("qkvqa.data.images")  # warned by the attempt that skipped them: not again
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        for row in rows:
            q = by_id.get(row.get("data_id"))
            if row.get("skipped") and q is not None and (q.dataset_name, q.image_id) not in loader.skipped:
                loader.load(q.dataset_name, q.image_id)
    finally:
        quiet.setLevel(level)


def query_image_path(benchmark: Any):
    """`question -> the absolute path of its query image file`, None when none resolves (missing, or in shards)."""
    resolver = benchmark.image_loader.resolver

    def path_of(question: Any) -> Optional[str]:
        if question.dataset_name in resolver.shard_patterns:  # a shard member has no path of its own
            return None
        path = resolver.resolve(question.dataset_name, question.image_id)
        return str(path.absolute()) if path is not None else None

    return path_of


def ranked_articles_without_image(benchmark: Any, rows: Sequence[dict]) -> dict:
    """How many distinct ranked articles have no main image (the QFF scores them 0, as OMGM does): a KB without
    images (ReflectiVA's) and no title -> image CSVs make the QFF a no-op, which the report must say."""
    return articles_without_image(benchmark, [a["url"] for r in rows for a in (r.get("ranking") or [])])


def articles_without_image(benchmark: Any, urls: Sequence[str]) -> dict:
    """{ranked_articles, without_image} over the distinct `urls` (KB articles whose main image is not found)."""
    urls = list(dict.fromkeys(urls))
    store = benchmark.kb_store()
    try:
        images = benchmark.article_images()
    except ConfigError:  # no title -> image CSVs: every article is without its image
        return {"ranked_articles": len(urls), "without_image": len(urls)}
    missing = 0
    for article in store.get_many([store.row_of(url) for url in urls if url in store]):
        missing += images.main_image(article.title, article.image_urls) is None
    return {"ranked_articles": len(urls), "without_image": missing}


def warn_articles_without_image(benchmark: Any, retrieved: dict, top_k: int) -> None:
    """Before the QFF runs (hours on a full split): say when stage 1's articles lack the main image it scores by."""
    counts = articles_without_image(benchmark, [u for r in retrieved.values() for u in r.urls[:top_k]])
    if counts["without_image"]:
        share = counts["without_image"] / max(counts["ranked_articles"], 1)
        log.warning(
            "%d of the %d stage-1 articles (%.0f%%) have no main image: the QFF scores them 0, so only their "
            "stage-1 similarity ranks them; set data.images.kb_image_csvs to the title -> image CSVs",
            counts["without_image"],
            counts["ranked_articles"],
            100 * share,
        )


def duplicate_rows(questions: Sequence[Any]) -> list[tuple[str, str]]:
    """(source of the repeat, source of the first) for every question row that repeats an earlier one in every column
    (ids aside: E-VQA numbers its rows, so an exact repeat gets an id of its own and would be scored twice)."""
    first: dict[str, str] = {}
    repeats = []
    for q in questions:
        row = (
            q.row
            if q.row
            else {
                "question": q.question,
                "image": q.image_ids,
                "answer": q.raw_answer,
                "type": q.question_type,
                "urls": q.gold_urls,
            }
        )
        key = json.dumps({k: v for k, v in row.items() if k != "data_id"}, sort_keys=True, default=str)
        if key in first:
            repeats.append((q.source, first[key]))
        else:
            first[key] = q.source
    return repeats


def question_set(
    dataset: str, split: str, questions: Sequence[Any], data: Any, source: Optional[Path], strict: bool = False
) -> dict:
    """The evaluated question set (file, n per question type and split, sampling), refused before any model
    runs when it cannot give a meaningful headline: InfoSeek's harmonic mean is 0 when a split is empty."""
    if not questions:
        raise DataError(f"{source}: no questions to evaluate in the {split} split (check data.{split}_questions)")
    repeats = duplicate_rows(questions)
    if repeats:
        shown = "; ".join(f"{a} repeats {b}" for a, b in repeats[:3])
        if strict:
            raise DataError(
                f"{source}: {len(repeats)} question rows repeat another row exactly ({shown}): remove them, "
                "or run without --strict (eval.strict) to score them as the file has them, warned"
            )
        log.warning(
            "%s: %d question rows repeat another row exactly and are scored as extra questions (%s); "
            "eval.strict=true (--strict) refuses them",
            source,
            len(repeats),
            shown,
        )
    types = Counter(q.question_type for q in questions)
    out = {
        "file": str(source),
        "n": len(questions),
        "duplicate_rows": len(repeats),
        "per_question_type": dict(sorted(types.items())),
        "sample_questions": data.sample_questions,
        "sample_seed": data.sample_seed,
        "max_questions": data.max_questions,
    }
    if dataset == "infoseek":
        from qkvqa.metrics.infoseek import UNSEEN_ENTITY, UNSEEN_QUESTION, split_of

        unreferenced = [q.data_id for q in questions if q.reference is None]
        if unreferenced:
            raise DataError(
                f"{source}: {len(unreferenced)} questions have no official reference (first: "
                f"{unreferenced[:3]}); set data.infoseek_references / data.infoseek_qtypes to the "
                "official infoseek_val.jsonl / infoseek_val_qtype.jsonl"
            )
        splits = Counter(split_of(q.reference.data_split) for q in questions)
        out["per_split"] = {name: splits.get(name, 0) for name in (UNSEEN_QUESTION, UNSEEN_ENTITY)}
        out["per_question_type"] = dict(sorted(Counter(q.reference.question_type for q in questions).items()))
        empty = [name for name, n in out["per_split"].items() if n == 0]
        if empty:
            raise DataError(
                f"{source}: the {len(questions)} questions evaluated hold no {empty[0]} question, so "
                f"InfoSeek's overall score (the harmonic mean of both splits) would be 0; use "
                f"data.sample_questions (a seeded random sample) instead of data.max_questions "
                f"(the first rows), or evaluate the whole file"
            )
    from qkvqa.data.protocols import PAPER_PROTOCOLS, expected_questions

    protocol = data.protocol or PAPER_PROTOCOLS.get(dataset)
    expected = expected_questions(dataset, split, data.protocol)
    out["protocol_questions"] = expected
    log.info(
        "evaluating %d %s %s questions from %s (%s); protocol %s%s",
        len(questions),
        dataset,
        split,
        source,
        ", ".join(f"{k} {v}" for k, v in out["per_question_type"].items()),
        protocol,
        ""
        if expected is None
        else f" has {expected:,}" + (" (the same count)" if expected == len(questions) else " (a different count)"),
    )
    return out


@dataclass
class Prepared:
    """An evaluation after its checks, before its run: the benchmark, the split's questions and what they are."""

    cfg: DictConfig
    benchmark: Any
    split: str
    questions: list
    evaluated: dict  # the question set (file, counts per type and split, images found)
    produced_by: Optional[dict]  # what produced precomputed reranked results (the filter kind's preflight)

    @property
    def dataset(self) -> str:
        return self.benchmark.config.dataset


def prepare(cfg: DictConfig) -> Prepared:
    """Everything checked before the run opens: the hardware, the questions and their images, every model's weights
    and the filter's own inputs (preflight), so a mistake stops in seconds."""
    from qkvqa.components.hardware import warn_cpu_fallback
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.data.config import data_config_from_dict, for_evaluation
    from qkvqa.pipeline.protocol import used_components
    from qkvqa.run.trainer import check_hardware

    check_hardware(cfg, used_components(cfg))
    warn_cpu_fallback(cfg, used_components(cfg))  # real models on device: auto without a usable GPU: one line
    benchmark = build_benchmark(for_evaluation(data_config_from_dict(cfg.data)))
    split = cfg.eval.split
    questions = benchmark.questions(split)
    evaluated = question_set(
        benchmark.config.dataset,
        split,
        questions,
        benchmark.config,
        benchmark.path(f"{split}_questions"),
        strict=cfg.eval.strict,
    )
    evaluated["images"] = benchmark.image_loader.resolver.check_images(questions, split)
    return Prepared(cfg, benchmark, split, questions, evaluated, preflight(cfg, benchmark))


def predict(prep: Prepared, trainer: Any, store: Any, retrieved: dict, meta: dict) -> None:
    """Answer the questions not answered yet (all of them on a fresh run), each rank its batches, with
    Trainer.predict; a finished prediction set is only re-scored (a new judge: `qkvqa score run RUN_DIR`)."""
    from qkvqa.data_modules.evaluation import EvaluationDataModule
    from qkvqa.pipeline.evaluator import PipelineEvaluator
    from qkvqa.run.lightning_noise import srun_hint_only_when_useful
    from qkvqa.run.trainer import closes_its_process_group, world_size_of

    cfg, done = prep.cfg, store.done_ids()
    if done:
        log.info("resuming: %d questions already answered in %s", len(done), store.run_dir)
    if all(q.data_id in done for q in prep.questions):
        # The scoring keys may change on resume, the answers stay: nothing is loaded.
        log.info("every question of %s is answered: scoring only", store.run_dir)
        return
    pipeline = build_pipeline(cfg, prep.benchmark, meta["seconds_per_question"])
    data = EvaluationDataModule(prep.benchmark, prep.split, done, batch_size=cfg.generation.batch_size)
    # every rank past the barrier: no collective follows, ranks >= 1 exit at once, and the group predict opened is
    # closed first (qkvqa.run.trainer.close_process_group)
    with closes_its_process_group():
        with srun_hint_only_when_useful(world_size_of(cfg)):
            trainer.predict(
                PipelineEvaluator(pipeline, store, retrieved, prep.dataset, done),
                datamodule=data,
                return_predictions=False,
            )
        # Every rank's part is written before rank zero merges them. Here, not in a predict hook: Lightning's predict
        # loop returns before its epoch hooks on a rank with no batch (fewer remaining batches than ranks, as near
        # the end of a resumed run), and the other ranks would wait for it forever. A barrier a stop signal
        # interrupts: rank zero may wait here for hours of the others' answers.
        interruptible_barrier()


def score(prep: Prepared, rows: list[dict], retrieved: dict, meta: dict, store: Any) -> tuple[dict, Any, list]:
    """The strict scores of the merged answers (with the protocol card), the per-question verdicts and the traces."""
    from qkvqa.pipeline.protocol import protocol_card
    from qkvqa.pipeline.scoring import PER_QUESTION_DETAILS, PER_QUESTION_KEY, score_run
    from qkvqa.pipeline.traces import build_traces

    cfg, benchmark, dataset = prep.cfg, prep.benchmark, prep.dataset
    judge = build_judge(cfg, dataset) if cfg.eval.stop_after != "filter" else None
    scores = score_run(
        dataset,
        rows,
        prep.questions,
        retrieved,
        judge,
        int(cfg.retrieval.top_k),
        cfg.retrieval.two_hop_policy,
        exclude_skipped=cfg.eval.exclude_skipped,
        stop_after=cfg.eval.stop_after,
    )
    correct = scores.pop(PER_QUESTION_KEY)
    kind = filter_kind(cfg.eval.filter)
    traces = build_traces(
        rows,
        prep.questions,
        retrieved,
        scores.pop(PER_QUESTION_DETAILS),
        dataset=dataset,
        split=prep.split,
        top_k=int(cfg.retrieval.top_k),
        filter_name=cfg.eval.filter,
        alpha=kind.alpha(cfg),
        image_path=query_image_path(benchmark),
    )
    scores["two_hop_rows"] = dataset == "evqa" and benchmark.config.include_two_hop
    scores["question_set"] = prep.evaluated
    scores["stage1_text"] = meta.get("stage1_text")
    scores["protocol"] = protocol_card(cfg, scores, benchmark.kb_store(), prep.produced_by)
    if kind.reads_article_images:
        scores["qff_article_images"] = ranked_articles_without_image(benchmark, rows)
    scores["retrieval_source"] = meta["source"]
    scores["duplicate_rows_dropped"] = store.duplicates()
    return scores, correct, traces


def write(
    prep: Prepared, job: Any, trainer: Any, scores: dict, correct: Any, traces: list, rows: list[dict], retrieved: dict
) -> None:
    """scores.json, traces.jsonl, report.md, skipped_images.json, the loggers' metrics and the run summary."""
    from qkvqa.loggers.wandb import log_predictions_table, log_run_files
    from qkvqa.pipeline.report import render_report
    from qkvqa.pipeline.scoring import flat_metrics
    from qkvqa.pipeline.traces import write_traces

    cfg, benchmark, run_dir = prep.cfg, prep.benchmark, job.run.run_dir
    write_traces(run_dir, traces)
    atomic_write_json(run_dir / "scores.json", scores)
    label = (scores.get("benchmark") or {}).get("label")
    atomic_write_text(run_dir / "report.md", render_report(job.run.run_id, cfg, scores, label, caveats(cfg, scores)))
    record_earlier_skips(benchmark, rows, prep.questions)  # a resumed run: the skips of the attempts before it
    benchmark.image_loader.write_skipped(run_dir)
    flat = flat_metrics(scores)
    # No step: a re-score (`qkvqa score run`) is a new W&B step, not one the resumed run has passed (dropped).
    for logger in trainer.loggers:
        logger.log_metrics(flat)
    if cfg.logger.wandb.eval_table:
        log_predictions_table(
            rows,
            prep.questions,
            retrieved,
            correct,
            benchmark.image_loader if cfg.logger.wandb.eval_table_images else None,
            traces=traces,
        )
    job.record.update_summary({**flat, "report": str(run_dir / "report.md"), "protocol": scores["protocol"]})
    log_run_files(run_dir)
    log.info("report: %s", run_dir / "report.md")


def run_evaluation(cfg: DictConfig) -> dict:
    """Evaluate `cfg` as one run, in the steps training has too: prepare, predict, score, write. Returns the scores
    on rank zero (an empty dict elsewhere)."""
    import lightning.pytorch as pl

    from qkvqa.pipeline.predictions import PredictionStore
    from qkvqa.run.job import run_job
    from qkvqa.run.trainer import build_trainer, world_size_of

    prep = prepare(cfg)
    with run_job(cfg, "evaluate", world_size_of(cfg)) as job:
        run_dir, rank_zero = job.run.run_dir, job.run.is_rank_zero
        if rank_zero:
            atomic_write_json(run_dir / QUESTION_IDS, {**prep.evaluated, "ids": [q.data_id for q in prep.questions]})
        store = PredictionStore(run_dir)
        retrieved, meta = stage1(cfg, prep.benchmark, prep.split, run_dir, rank_zero)
        if rank_zero:  # before any answer: the weights that make them; on resume, the same as the stored answers'
            check_answering_weights(cfg, run_dir, len(store.done_ids()))
        if filter_kind(cfg.eval.filter).reads_article_images and rank_zero:
            warn_articles_without_image(prep.benchmark, retrieved, int(cfg.retrieval.top_k))
        pl.seed_everything(cfg.seed, verbose=False)  # every rank builds the components from the same RNG state
        trainer = build_trainer(job)
        predict(prep, trainer, store, retrieved, meta)
        if not (rank_zero and trainer.is_global_zero):
            return {}
        rows = store.merge([q.data_id for q in prep.questions])
        scores, correct, traces = score(prep, rows, retrieved, meta, store)
        write(prep, job, trainer, scores, correct, traces, rows, retrieved)
        return scores
