"""Apply a trained QFF to stage-1 results: score every candidate section of the top-K articles, fuse with alpha, OMGM step-2b layout.

In-process API (what the pipeline evaluator calls):

    reranker = QFFReranker.from_config(cfg, benchmark)       # qff.checkpoint: a `qkvqa train` RUN/qff dir or a .ckpt
    reranked = reranker.rerank(question_text, query_image, retrieved)   # retrieved: qkvqa.retrieval.results.Retrieved
    reranked.urls, reranked.fused_scores, reranked.section_scores, reranked.section_indices

Questions go in micro-batches of `qff.question_batch_size`: each article's main image goes through the ViT once
(and stays in an LRU of `qff.vit_lru_size` articles across questions), and the candidate sections of every
question of the batch (no "references" / "external links"; original KB indices kept in `section_indices`) are
encoded together in length-sorted batches of `qff.section_batch_size`; the article score is its best section's, fused
as `S = alpha * sim_ret + (1 - alpha) * QFF`; articles without an image or sections get QFF 0 (OMGM). The section
scores normalise the question tokens as `qff.question_norm` says (the component's `question_norm`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from qkvqa.errors import MissingWeightsError, StaleArtifactError
from qkvqa.utils.logging import get_logger
from qkvqa.utils.progress import progress

log = get_logger(__name__)


@dataclass
class RerankedQuestion:
    """The top-K articles of one question in fused-score order, with their per-section scores."""

    urls: list[str]
    titles: list[Optional[str]]
    fused_scores: list[float]
    qff_scores: list[float]
    stage1_similarities: list[float]
    section_scores: list[list[float]]  # `sec_sim`: one score per candidate section, per article
    section_indices: list[list[int]]  # the original KB section index of each score

    def to_omgm(self) -> dict:
        """The OMGM step-2b value (`retrieved_entities`, fused `retrieval_similarities`, `sec_sim`) plus qkvqa's extras."""
        return {
            "retrieved_entities": [{"url": u, "title": t} for u, t in zip(self.urls, self.titles)],
            "retrieval_similarities": self.fused_scores,
            "sec_sim": self.section_scores,
            "sec_idx": self.section_indices,
            "qff_scores": self.qff_scores,
            "stage1_similarities": self.stage1_similarities,
        }

    def best_section(self) -> Optional[tuple[str, int]]:
        """(URL, original section index) of the top article's best section; None when it has no scored section."""
        if not self.urls or not self.section_scores[0]:
            return None
        scores = self.section_scores[0]
        return self.urls[0], self.section_indices[0][max(range(len(scores)), key=scores.__getitem__)]


def load_qff_component(cfg):
    """The QFF component of `cfg`: `qff.checkpoint` may be a `qkvqa train` RUN/qff directory, or a Lightning .ckpt
    of a QFFTrainer, whose weights are loaded into the architecture `components.qformer` builds."""
    import dataclasses

    from qkvqa.config.schema import qff_settings
    from qkvqa.qff.builder import build_qff_component
    from qkvqa.qff.model import CHECKPOINT_CONFIG

    checkpoint = cfg.qff.checkpoint
    if checkpoint and not str(checkpoint).endswith(".ckpt"):
        run_dir = Path(checkpoint).expanduser()
        if (run_dir / "status.json").is_file() and not (run_dir / CHECKPOINT_CONFIG).is_file():
            raise MissingWeightsError(
                f"qff.checkpoint {run_dir} is a run directory; point it at the trained QFF "
                f"inside it, {run_dir / 'qff'} (or one of its .ckpt files)"
            )
    if not checkpoint or not str(checkpoint).endswith(".ckpt"):
        return build_qff_component(cfg.components.qformer, cfg.qff)
    from qkvqa.run.checkpoint_io import load_torch_checkpoint

    path = Path(checkpoint).expanduser()
    if not path.is_file():
        raise MissingWeightsError(f"qff.checkpoint {path}: no such checkpoint")
    qff = dataclasses.replace(qff_settings(cfg.qff), checkpoint=None)  # the .ckpt's weights are loaded below
    component = build_qff_component(cfg.components.qformer, qff)
    saved = load_torch_checkpoint(path, map_location="cpu", weights_only=True)
    state = {k[len("model.") :]: v for k, v in saved["state_dict"].items() if k.startswith("model.")}
    result = component.model.load_state_dict(state, strict=False)
    frozen = saved.get("qff_frozen_vit")
    if frozen is not None:
        from qkvqa.qff.vit_cache import vision_fingerprint

        if vision_fingerprint(component.model, component.image_processor) != frozen["fingerprint"]:
            raise StaleArtifactError(f"{path} was trained with another frozen ViT than components.qformer builds")
    missing = [k for k in result.missing_keys if not (frozen and k.startswith("base.vision_model."))]
    if missing or result.unexpected_keys:
        raise MissingWeightsError(
            f"{path} does not fit components.qformer: {len(missing)} missing key(s) "
            f"{missing[:3]}, {len(result.unexpected_keys)} unexpected {result.unexpected_keys[:3]}"
        )
    component.model.eval()
    return component


class QFFReranker:
    """Reranks stage-1 results of questions, one or a micro-batch at a time, with a QFF component (see the module
    docstring)."""

    def __init__(
        self, component, store, article_images, *, alpha: float = 0.9, top_k: int = 20, question_batch_size: int = 8
    ):
        self.component = component
        self.question_batch_size = int(question_batch_size)
        self.store = store
        self.article_images = article_images
        self.alpha = float(alpha)
        self.top_k = int(top_k)
        self.articles_without_image: set[str] = set()

    @classmethod
    def from_config(cls, cfg, benchmark, component=None) -> "QFFReranker":
        """A reranker with the benchmark's KB and article images, the config's `qff.alpha`, `retrieval.top_k` and QFF
        (`qff.checkpoint`)."""
        component = component if component is not None else load_qff_component(cfg)
        component.model.eval()
        return cls(
            component,
            benchmark.kb_store(),
            benchmark.article_images(),
            alpha=cfg.qff.alpha,
            top_k=cfg.retrieval.top_k,
            question_batch_size=cfg.qff.question_batch_size,
        )

    def rerank(self, question: str, image, retrieved) -> RerankedQuestion:
        """Rerank the top-K of `retrieved` (a Retrieved) for one question and its query image (PIL)."""
        return self.rerank_many([(question, image, retrieved)])[0]

    def rerank_many(self, items) -> list[RerankedQuestion]:
        """`rerank` of several (question, query image, Retrieved) at once: the sections of each `question_batch_size`
        of them are scored in shared forwards (`QFFComponent.score_sections_many`); each result is the
        one-question result."""
        from qkvqa.qff.builder import SectionRequest
        from qkvqa.qff.scoring import rerank

        gathered, requests = [], []
        for question, image, retrieved in items:
            urls = list(retrieved.urls[: self.top_k])
            titles = list(retrieved.titles[: self.top_k]) + [None] * max(0, len(urls) - len(retrieved.titles))
            sims = [float(s) for s in retrieved.similarities[: self.top_k]]
            images, sections, indices = [None] * len(urls), [[] for _ in urls], [[] for _ in urls]
            for k, url in enumerate(urls):
                if url not in self.store:
                    log.warning("stage-1 result %s is not in the KB; its QFF score is 0", url)
                    continue
                article = self.store.get_by_url(url)
                titles[k] = titles[k] if titles[k] is not None else article.title
                candidates = list(article.candidate_sections())
                images[k] = self.article_images.load_main_image(article.title, article.image_urls)
                if images[k] is None:
                    self.articles_without_image.add(url)
                sections[k] = [c.text for c in candidates]
                indices[k] = [c.index for c in candidates]
            gathered.append((urls, titles, sims, indices))
            requests.append(SectionRequest(question, image, images, sections))
        step = self.question_batch_size  # bounds the memory of one shared forward set
        all_scores = [
            scores
            for s in range(0, len(requests), step)
            for scores in self.component.score_sections_many(requests[s : s + step])
        ]
        out = []
        for (urls, titles, sims, indices), scores in zip(gathered, all_scores):
            result = rerank(sims, scores, self.alpha)
            scored_indices = [indices[i] if scores[i] else [] for i in range(len(urls))]
            out.append(
                RerankedQuestion(
                    urls=[urls[i] for i in result.order],
                    titles=[titles[i] for i in result.order],
                    fused_scores=result.fused_scores,
                    qff_scores=result.qff_scores,
                    stage1_similarities=[sims[i] for i in result.order],
                    section_scores=result.section_scores,
                    section_indices=[scored_indices[i] for i in result.order],
                )
            )
        return out


@dataclass
class SplitRerank:
    """Reranked results of one split (data_id -> RerankedQuestion) with Recall@K before and after the QFF."""

    split: str
    results: dict[str, RerankedQuestion]
    metrics: dict
    stage1_metrics: dict
    produced_by: dict = field(default_factory=dict)  # what made these results (`reranked_provenance`)


def rerank_split(cfg, split: Optional[str] = None, *, benchmark, reranker: Optional[QFFReranker] = None) -> SplitRerank:
    """Rerank the stage-1 results of every question of `split` (default retrieval.split) of `benchmark` and score them.

    Stage-1 results are `retrieval.results` when set, else retrieved now (`retrieve_split`). A question
    whose query image is missing keeps its stage-1 order (QFF 0 everywhere) and is counted.
    """
    from qkvqa.retrieval.results import Retrieved
    from qkvqa.retrieval.retrieve import retrieve_split

    split = split or cfg.retrieval.split
    reranker = reranker if reranker is not None else QFFReranker.from_config(cfg, benchmark)
    stage1 = retrieve_split(cfg, split, benchmark=benchmark)
    questions = benchmark.questions(split)
    results: dict[str, RerankedQuestion] = {}
    without_image = 0
    pending: list = []  # (data_id, question, image, Retrieved) of one micro-batch

    def flush() -> None:
        for (data_id, *_), result in zip(pending, reranker.rerank_many([item[1:] for item in pending])):
            results[data_id] = result
        pending.clear()

    for question in progress(questions, desc=f"rerank {split}", unit="question"):
        retrieved = stage1.results.get(question.data_id, Retrieved())
        image = benchmark.image_loader.load(question.dataset_name, question.image_id)
        if image is None:
            without_image += 1
            results[question.data_id] = stage1_only(retrieved, reranker.top_k, reranker.alpha)
            continue
        pending.append((question.data_id, question.question, image, retrieved))
        if len(pending) >= reranker.question_batch_size:
            flush()
    flush()
    results = {q.data_id: results[q.data_id] for q in questions if q.data_id in results}  # the split's order
    metrics = split_metrics(results, questions, benchmark.config.dataset, cfg)
    metrics.update(
        {"n_without_query_image": without_image, "n_articles_without_image": len(reranker.articles_without_image)}
    )
    return SplitRerank(split, results, metrics, stage1.metrics, reranked_provenance(cfg, reranker, split, benchmark))


def reranked_provenance(cfg, reranker: QFFReranker, split: str, benchmark) -> dict:
    """What determines a reranked-results file: the fusion weight, question normalisation, scorer and top-K the reranker used,
    the QFF's focus, the
    KB, the questions (dataset, split, file) and the stage-1 results (`qkvqa rerank` adds the QFF's weights and
    fingerprint and its run id); recorded beside the file (`write_reranked`)."""
    return {
        "qff.alpha": reranker.alpha,
        "qff.question_norm": getattr(reranker.component, "question_norm", "per_token"),
        "qff.scorer": reranker.component.scorer.record() if hasattr(reranker.component, "scorer") else None,
        "retrieval.top_k": reranker.top_k,
        "qff.focus": getattr(reranker.component.model, "focus", None),
        "kb_url_checksum": reranker.store.url_checksum,
        "split": split,
        "questions": benchmark.questions_identity(split),
        "stage1": cfg.retrieval.results
        or {"mode": cfg.retrieval.mode, "index": cfg.retrieval.index_dir or cfg.retrieval.index_factory},
    }


def stage1_only(retrieved, top_k: int, alpha: float) -> RerankedQuestion:
    """The stage-1 top-K unchanged, in the reranked layout (QFF 0 for every article)."""
    from qkvqa.qff.scoring import rerank

    urls = list(retrieved.urls[:top_k])
    sims = [float(s) for s in retrieved.similarities[:top_k]]
    titles = (list(retrieved.titles[:top_k]) + [None] * len(urls))[: len(urls)]
    result = rerank(sims, [None] * len(urls), alpha)
    return RerankedQuestion(
        urls=[urls[i] for i in result.order],
        titles=[titles[i] for i in result.order],
        fused_scores=result.fused_scores,
        qff_scores=result.qff_scores,
        stage1_similarities=[sims[i] for i in result.order],
        section_scores=[[] for _ in urls],
        section_indices=[[] for _ in urls],
    )


def split_metrics(results: dict[str, RerankedQuestion], questions, dataset: str, cfg) -> dict:
    """Recall@K of the reranked order (qkvqa.metrics) and the top-1 evidence-section recall."""
    from qkvqa.metrics.retrieval import evidence_section_recall
    from qkvqa.retrieval.retrieve import retrieval_metrics

    metrics = retrieval_metrics(
        results, questions, dataset=dataset, top_k=int(cfg.retrieval.top_k), two_hop_policy=cfg.retrieval.two_hop_policy
    )
    rows = [
        {
            "data_id": q.data_id,
            "wikipedia_url": "|".join(q.gold_urls),
            "question_type": q.question_type,
            "evidence_section_id": q.evidence_section_id,
            "evidence_section_ids": q.evidence_section_ids or None,
        }
        for q in questions
        if q.gold_urls and q.evidence_section_id is not None
    ]
    top1 = {qid: best for qid, r in results.items() if (best := r.best_section()) is not None}
    section = evidence_section_recall(top1, rows, cfg.retrieval.two_hop_policy)
    metrics["evidence_section_recall@1"] = section["evidence_section_recall@1"]
    return metrics


def write_reranked(path, results: dict[str, RerankedQuestion], produced_by: Optional[dict] = None) -> Path:
    """Write reranked results in the OMGM step-2b layout (plus `sec_idx`, `qff_scores`, `stage1_similarities`),
    atomically, and `produced_by` (what made them) with the file's sha256 in the sidecar `NAME.meta.json`."""
    import json

    from qkvqa.utils.io import write_described

    path = Path(path)
    text = json.dumps({qid: r.to_omgm() for qid, r in results.items()}, ensure_ascii=False)
    write_described(path, text, None if produced_by is None else {"produced_by": produced_by})
    return path


def reranked_meta_path(path) -> Path:
    """The sidecar recording what produced a reranked-results file: `reranked_test.json` -> `reranked_test.meta.json`."""
    from qkvqa.utils.io import sidecar_path

    return sidecar_path(path)


def read_reranked_provenance(path, data: Optional[bytes] = None) -> Optional[dict]:
    """`produced_by` of a reranked-results file from its sidecar, or None when it has none (a file not written by
    `qkvqa rerank`, e.g. OMGM's). DataError when the sidecar describes another version of the file (`data`: the
    file's bytes, when already read)."""
    from qkvqa.utils.io import read_description

    meta = read_description(
        path,
        data,
        fix="rerun `qkvqa rerank` to write both, or delete the .meta.json to evaluate the file as of unknown origin",
    )
    return None if meta is None else meta.get("produced_by")
