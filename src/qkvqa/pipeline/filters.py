"""Article filters: turn a question's retrieved articles into `RankedArticle`s for CDA.

`RetrievalOrderFilter` keeps stage-1 order (the "retrieval only" baseline); `QFFFilter` scores every
candidate section with the question-focused Q-Former and fuses (method.md section 2);
`PrecomputedFilter` reads reranked results written by `qkvqa rerank` (OMGM step-2b layout).

Each `eval.filter` value is a `FilterKind` in `FILTER_KINDS` (how it builds, the components it loads, its preflight,
its protocol-card entry, whether it yields section scores or reads article images, its alpha, its caveats): the
evaluation, the protocol card and the report ask the kind instead of comparing strings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Protocol

from qkvqa.cda.select import RankedArticle
from qkvqa.data.kb import Article, KBStore
from qkvqa.errors import DataError
from qkvqa.retrieval.results import Retrieved


@dataclass
class Ranking:
    """A question's articles after filtering, best first, with the per-section scores CDA may use."""

    articles: list[RankedArticle]
    missing_urls: list[str] = field(default_factory=list)  # retrieved URLs absent from the KB

    @property
    def urls(self) -> list[str]:
        """Article URLs in ranked order."""
        return [r.article.url for r in self.articles]


class ArticleFilter(Protocol):
    """What the pipeline needs of a filter (the traces name it by `eval.filter`, as the card does)."""

    alpha: Optional[float]  # the fusion weight of the QFF (None without QFF, or unknown)

    def rank(self, data_id: str, question: str, image: Any, retrieved: Retrieved) -> Ranking: ...


def rank_many(article_filter: ArticleFilter, items: list[tuple[str, str, Any, Retrieved]]) -> list[Ranking]:
    """The rankings of several (data_id, question, image, Retrieved): in one call when the filter batches across
    questions (`rank_many`), else question by question."""
    batched = getattr(article_filter, "rank_many", None)
    if batched is not None:
        return batched(items)
    return [article_filter.rank(*item) for item in items]


def _articles(store: KBStore, retrieved: Retrieved) -> tuple[list[Article], list[float], list[str]]:
    articles, sims, missing = [], [], []
    for url, sim in zip(retrieved.urls, retrieved.similarities):
        if url in store:
            articles.append(store.get_by_url(url))
            sims.append(float(sim))
        else:
            missing.append(url)
    return articles, sims, missing


class RetrievalOrderFilter:
    """No filtering: articles in retrieval order, the retrieval similarity as their score."""

    alpha = None

    def __init__(self, store: KBStore):
        self.store = store

    def rank(self, data_id: str, question: str, image: Any, retrieved: Retrieved) -> Ranking:
        articles, sims, missing = _articles(self.store, retrieved)
        return Ranking([RankedArticle(a, s, sim_ret=s) for a, s in zip(articles, sims)], missing)


class QFFFilter:
    """Scores every candidate section of the retrieved articles with the QFF and fuses with alpha
    (`qkvqa.qff.rerank.QFFReranker`, the same code as `qkvqa rerank`)."""

    def __init__(self, reranker: Any):
        self.reranker = reranker
        self.store = reranker.store
        self.alpha = float(reranker.alpha)

    def rank(self, data_id: str, question: str, image: Any, retrieved: Retrieved) -> Ranking:
        return self.rank_many([(data_id, question, image, retrieved)])[0]

    def rank_many(self, items: list[tuple[str, str, Any, Retrieved]]) -> list[Ranking]:
        """The rankings of several questions, their sections scored in shared forwards (`rerank_many`)."""
        rankings = []
        for result in self.reranker.rerank_many(
            [(question, image, retrieved) for _, question, image, retrieved in items]
        ):
            ranked, missing = [], []
            for url, fused, scores, indices, sim, qff in zip(
                result.urls,
                result.fused_scores,
                result.section_scores,
                result.section_indices,
                result.stage1_similarities,
                result.qff_scores,
            ):
                if url not in self.store:
                    missing.append(url)
                    continue
                ranked.append(
                    RankedArticle(
                        self.store.get_by_url(url),
                        fused,
                        dict(zip(indices, scores)),
                        sim_ret=float(sim),
                        qff=float(qff),
                    )
                )
            rankings.append(Ranking(ranked, missing))
        return rankings


class PrecomputedFilter:
    """Reads reranked results (OMGM step-2b layout with `sec_sim` and, when present, `sec_idx`) and, from the
    sidecar `qkvqa rerank` writes beside them, what produced them (`produced_by`; None for a file of unknown origin)."""

    def __init__(self, path: str | Path, store: KBStore):
        from qkvqa.qff.rerank import read_reranked_provenance

        self.path = Path(path)
        self.store = store
        if not self.path.is_file():
            raise DataError(
                f"{self.path}: no such reranked-results file (eval.reranked_results; write it with `qkvqa rerank`)"
            )
        data = self.path.read_bytes()
        try:
            self.results = json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{self.path}: not a reranked-results JSON file ({e})") from None
        self.produced_by: Optional[dict] = read_reranked_provenance(self.path, data)
        alpha = (self.produced_by or {}).get("qff.alpha")
        self.alpha = float(alpha) if alpha is not None else None

    def rank(self, data_id: str, question: str, image: Any, retrieved: Retrieved) -> Ranking:
        entry = self.results.get(data_id)
        if entry is None:
            raise DataError(f"{self.path}: no reranked results for data_id {data_id}")
        entities = entry.get("retrieved_entities", [])
        scores = entry.get("retrieval_similarities", [])
        sec_sim = entry.get("sec_sim", [[] for _ in entities])
        sec_idx = entry.get("sec_idx")
        sims, qffs = entry.get("stage1_similarities"), entry.get("qff_scores")  # `qkvqa rerank`'s extras
        ranked, missing = [], []
        for k, (entity, score) in enumerate(zip(entities, scores)):
            url = entity["url"] if isinstance(entity, dict) else entity
            if url not in self.store:
                missing.append(url)
                continue
            article = self.store.get_by_url(url)
            indices = sec_idx[k] if sec_idx else [i for i, _, _ in article.candidate_sections()]
            if len(indices) != len(sec_sim[k]):  # zip would pair scores with the wrong sections in silence
                raise DataError(
                    f"{self.path}: data_id {data_id}, article {url}: {len(sec_sim[k])} sec_sim scores "
                    f"for {len(indices)} {'sec_idx entries' if sec_idx else 'candidate sections'}; "
                    "write the file with `qkvqa rerank` (it records sec_idx)"
                )
            ranked.append(
                RankedArticle(
                    article, float(score), dict(zip(indices, sec_sim[k])), sim_ret=_at(sims, k), qff=_at(qffs, k)
                )
            )
        return Ranking(ranked, missing)


def top1_section(ranking: Ranking) -> Optional[tuple[str, int]]:
    """(url, original section index) of the best-scored section of the top-1 article, if it has scores."""
    if not ranking.articles or not ranking.articles[0].section_scores:
        return None
    top = ranking.articles[0]
    index = max(top.section_scores.items(), key=lambda kv: (kv[1], -kv[0]))[0]
    return top.article.url, int(index)


def _at(values: Optional[list], k: int) -> Optional[float]:
    """values[k] as a float, None when the file has no such list or entry."""
    return float(values[k]) if isinstance(values, list) and k < len(values) and values[k] is not None else None


# ---------------------------------------------------------------------------------------------- the filter kinds
class FilterKind:
    """One `eval.filter` value, everything the evaluation, the protocol card, the report and the traces ask of it.

    A new kind is one subclass registered here (`@register_filter_kind`) plus its name in the schema's
    `EVAL_FILTERS`; nothing else compares `eval.filter` with a string."""

    name: str = ""
    components: tuple[str, ...] = ()  # the components it loads (`protocol.used_components`, preflight)
    section_scores: bool = False  # its ranking carries per-section scores (CDA's top-1 section by qff/fused)
    qff_scores: bool = False  # its ranking may carry each article's QFF score (cda.theta_on=qff)
    reads_article_images: bool = False  # it scores the articles' images (articles without one are counted)
    stage1_from_file: bool = False  # its candidates come from a file it reads, not from stage 1's index
    # the config keys (a trailing "." for a prefix) that only this kind reads in an evaluation: `qkvqa compare` shows
    # them for its runs and leaves them empty for the others' (`reads_filter_key`)
    config_keys: tuple[str, ...] = ()
    plugin: Optional[dict] = None  # a kind from the user's own code: its import path and source sha256 (the card)

    def build(self, cfg: Any, benchmark: Any) -> ArticleFilter:
        """The filter of this run."""
        raise NotImplementedError

    def preflight(self, cfg: Any, benchmark: Any) -> Optional[dict]:
        """Checks before stage 1 (its inputs exist and fit this run); what produced precomputed results, if any."""
        return None

    def card(self, cfg: Any, produced_by: Optional[dict] = None) -> dict:
        """The protocol card's `filter` entry (a QFF-based kind has `alpha` and `focus`; None: not known)."""
        return {"kind": self.name}

    def alpha(self, cfg: Any) -> Optional[float]:
        """The fusion weight of the ranking it writes into the traces (None: no fusion here)."""
        return None

    def caveats(self, cfg: Any) -> list[str]:
        """Notes for the report (an untrained filter, ...)."""
        return []

    def trained_weights(self, cfg: Any) -> Optional[tuple[str, Optional[str], str]]:
        """(config key, its value or None, what writes it) of the trained weights an evaluation with this kind reads;
        None when it reads none (`qkvqa doctor` checks the path, or says the weights are not set)."""
        return None

    def reads_key(self, key: str) -> bool:
        """Whether config `key` is one that only this kind reads (`config_keys`)."""
        return any(key == k or (k.endswith(".") and key.startswith(k)) for k in self.config_keys)


FILTER_KINDS: dict[str, FilterKind] = {}
_PLUGIN_KINDS: dict[str, FilterKind] = {}  # kinds named by import path, one instance each


def reads_filter_key(name: Optional[str], key: str) -> Optional[bool]:
    """For a run with `eval.filter` = `name`: whether `key` is read, when it is a key that only some kinds read
    (`FilterKind.config_keys`); None when `key` is no kind's own (it applies, or not, by other rules)."""
    if not any(kind.reads_key(key) for kind in FILTER_KINDS.values()):
        return None
    kind = FILTER_KINDS.get(name or "") or _PLUGIN_KINDS.get(name or "")
    return kind is not None and kind.reads_key(key)


def register_filter_kind(cls: type) -> type:
    """Class decorator: make `cls().name` an `eval.filter` kind."""
    from qkvqa.components.plugins import register_plugin

    kind = cls()
    register_plugin("eval.filter", kind.name, cls)
    FILTER_KINDS[kind.name] = kind
    return cls


def filter_kind(name: str) -> FilterKind:
    """The kind named by `eval.filter`: a registered name, or the import path `module:Class` of a FilterKind subclass
    in the user's own code (its `name` is then that path); a ConfigError naming the registered kinds otherwise."""
    from qkvqa.components.plugins import is_import_path, plugin_record, resolve_plugin

    kind = FILTER_KINDS.get(name) or _PLUGIN_KINDS.get(name)
    if kind is not None:
        return kind
    if not is_import_path(name):
        from qkvqa.errors import ConfigError

        raise ConfigError(f"eval.filter must be one of {', '.join(FILTER_KINDS)}, got {name!r}")
    cls = resolve_plugin("eval.filter", name, FilterKind)
    kind = cls()
    kind.name, kind.plugin = name, plugin_record(cls)
    _PLUGIN_KINDS[name] = kind
    return kind


@register_filter_kind
class RetrievalKind(FilterKind):
    """No filter: stage 1's order (the "retrieval only" baseline)."""

    name = "retrieval"

    def build(self, cfg: Any, benchmark: Any) -> ArticleFilter:
        return RetrievalOrderFilter(benchmark.kb_store())


def untrained_qff_refusal(cfg: Any) -> str:
    """The one line that refuses an evaluation of an untrained QFF (eval.filter=qff without qff.checkpoint), naming
    the runs under paths.checkpoints_root that hold a trained `qff/`."""
    from qkvqa.run.rundir import trained_qff_dirs

    root = cfg.paths.checkpoints_root
    trained = trained_qff_dirs(root)
    where = (
        f"trained QFFs under {root}/: {', '.join(map(str, trained))}; pass qff.checkpoint={trained[0]}"
        if trained
        else f"no run under {root}/ holds a trained qff/ (train one with `qkvqa train`, then pass "
        "qff.checkpoint=RUN/qff)"
    )
    return (
        f"eval.filter=qff needs qff.checkpoint, the trained QFF to evaluate; it is not set, so the filter would "
        f"be an untrained, randomly initialised QFF. {where}. Or eval.filter=retrieval for no filter, or "
        f"qff.allow_untrained=true to evaluate an untrained QFF on purpose (the report says so)"
    )


@register_filter_kind
class QFFKind(FilterKind):
    """The trained QFF scores every candidate section and fuses with stage 1 (alpha)."""

    name = "qff"
    components = ("qformer",)
    section_scores = True
    qff_scores = True
    reads_article_images = True
    config_keys = ("qff.", "components.qformer.", "trained.")

    def build(self, cfg: Any, benchmark: Any) -> ArticleFilter:
        from qkvqa.qff.rerank import QFFReranker

        return QFFFilter(QFFReranker.from_config(cfg, benchmark))

    def preflight(self, cfg: Any, benchmark: Any) -> Optional[dict]:
        from qkvqa.errors import ConfigError, MissingWeightsError

        checkpoint = cfg.qff.checkpoint
        if checkpoint and not Path(checkpoint).expanduser().exists():
            raise MissingWeightsError(
                f"qff.checkpoint {checkpoint}: not found (a `qkvqa train` RUN/qff directory or a .ckpt file)"
            )
        if not checkpoint and not cfg.qff.allow_untrained:
            raise ConfigError(untrained_qff_refusal(cfg))
        if checkpoint:
            from qkvqa.qff.model import missing_file

            missing_file(Path(checkpoint).expanduser())  # before stage 1, not when the filter loads it
        benchmark.article_images()  # a KB image root one folder off stops here, before stage 1
        return None

    def card(self, cfg: Any, produced_by: Optional[dict] = None) -> dict:
        from qkvqa.config.schema import qff_settings

        qff = qff_settings(cfg.qff)  # the one settings object the component and the trainer read
        card = {
            "kind": self.name,
            "focus": qff.focus,
            "alpha": qff.alpha,
            "question_norm": qff.question_norm,
            "scorer": qff.scorer,
            # settings that change speed or memory, not the scores (a trained QFF may run with other values)
            "runtime_settings": {
                "attention": qff.attention,
                "section_batch_size": qff.section_batch_size,
                "question_batch_size": qff.question_batch_size,
                "vit_lru_size": qff.vit_lru_size,
            },
        }
        if qff.scorer_options:
            card["scorer_options"] = dict(qff.scorer_options)
        if not qff.checkpoint:
            card["weights"] = "untrained, on purpose (qff.allow_untrained=true)" if qff.allow_untrained else "untrained"
        return card

    def alpha(self, cfg: Any) -> Optional[float]:
        return float(cfg.qff.alpha)

    def trained_weights(self, cfg: Any) -> Optional[tuple[str, Optional[str], str]]:
        if not cfg.qff.checkpoint and cfg.qff.allow_untrained:
            return None  # an untrained QFF, on purpose
        return ("qff.checkpoint", cfg.qff.checkpoint or None, "qkvqa train experiment=evqa_qff writes it as RUN/qff")

    def caveats(self, cfg: Any) -> list[str]:
        if cfg.qff.checkpoint:
            return []
        return [
            "The QFF is untrained: no qff.checkpoint was given and qff.allow_untrained=true asked for an "
            "untrained, randomly initialised filter, so the filter figures are not those of a trained QFF."
        ]


def check_precomputed_provenance(path: Path, made: Optional[dict], cfg: Any, benchmark: Any) -> None:
    """Refuse reranked results (`made`: what produced them) made with another qff.alpha or qff.question_norm than this
    run's config records (its config.yaml, summary and report would show a weight that did not produce them), over another KB,
    or for other questions (another split or question file: E-VQA ids repeat per file, so coverage cannot tell)."""
    from qkvqa.errors import ConfigError
    from qkvqa.qff.rerank import reranked_meta_path
    from qkvqa.utils.logging import get_logger

    store = benchmark.kb_store()
    if made is None:
        get_logger(__name__).warning(
            "%s has no %s: what produced it (qff.alpha, the QFF) is unknown and reported so",
            path,
            reranked_meta_path(path).name,
        )
        return
    meta = reranked_meta_path(path)
    if made.get("kb_url_checksum") not in (None, store.url_checksum):
        raise DataError(
            f"{path}: reranked over another KB (URL checksum {made['kb_url_checksum']}, "
            f"{meta}); this evaluation's KB has {store.url_checksum}: rerank over it"
        )
    alpha = made.get("qff.alpha")
    if alpha is not None and float(alpha) != float(cfg.qff.alpha):
        raise ConfigError(
            f"{path} was reranked with qff.alpha={alpha} ({meta}) but this evaluation has "
            f"qff.alpha={cfg.qff.alpha}: set qff.alpha={alpha}, or rerank with qff.alpha={cfg.qff.alpha}"
        )
    # a sidecar written before qff.question_norm existed was scored per token (the only normalisation then)
    norm = made.get("qff.question_norm", "per_token")
    if norm != cfg.qff.question_norm:
        raise ConfigError(
            f"{path} was reranked with qff.question_norm={norm} ({meta}) but this evaluation has "
            f"qff.question_norm={cfg.qff.question_norm}: set qff.question_norm={norm}, or rerank with "
            f"qff.question_norm={cfg.qff.question_norm}"
        )
    scorer = (made.get("qff.scorer") or {}).get("scorer", "late_interaction")  # before qff.scorer: late interaction
    if scorer != cfg.qff.scorer:
        raise ConfigError(
            f"{path} was reranked with qff.scorer={scorer} ({meta}) but this evaluation has "
            f"qff.scorer={cfg.qff.scorer}: set qff.scorer={scorer}, or rerank with qff.scorer={cfg.qff.scorer}"
        )
    made_for, evaluated = made.get("questions"), benchmark.questions_identity(cfg.eval.split)
    if made_for is not None and evaluated is not None and made_for != evaluated:
        raise DataError(
            f"{path} was reranked for the {made.get('split')} questions {made_for} ({meta}) but this "
            f"evaluation's {cfg.eval.split} questions are {evaluated}: rerank with split={cfg.eval.split}"
        )


@register_filter_kind
class PrecomputedKind(FilterKind):
    """Reranked results written by `qkvqa rerank` (eval.reranked_results), with what produced them."""

    name = "precomputed"
    section_scores = True
    qff_scores = True  # when the file records them (`qkvqa rerank` does; OMGM's step 2b does not)
    stage1_from_file = True
    # the alpha and question normalisation it must have been reranked with
    config_keys = ("qff.alpha", "qff.question_norm", "qff.scorer", "eval.reranked_results")

    def build(self, cfg: Any, benchmark: Any) -> ArticleFilter:
        from qkvqa.errors import ConfigError
        from qkvqa.retrieval.results import check_coverage_of

        if not cfg.eval.reranked_results:
            raise ConfigError("eval.filter=precomputed needs eval.reranked_results (written by `qkvqa rerank`)")
        precomputed = PrecomputedFilter(cfg.eval.reranked_results, benchmark.kb_store())
        check_precomputed_provenance(precomputed.path, precomputed.produced_by, cfg, benchmark)
        check_coverage_of(
            precomputed.path,
            precomputed.results,
            benchmark.questions(cfg.eval.split),
            float(cfg.retrieval.min_results_coverage),
            "retrieval.min_results_coverage",
        )
        return precomputed

    def preflight(self, cfg: Any, benchmark: Any) -> Optional[dict]:
        path = cfg.eval.reranked_results
        if not (path and Path(path).is_file()):
            return None
        from qkvqa.qff.rerank import read_reranked_provenance

        made = read_reranked_provenance(path)  # a sidecar of another version is refused here
        if made:
            check_precomputed_provenance(Path(path), made, cfg, benchmark)
        return made

    def card(self, cfg: Any, produced_by: Optional[dict] = None) -> dict:
        """What produced the reranked file (its `qkvqa rerank` sidecar: alpha, focus, the QFF's weights); alpha None
        when the file does not say (never the config's alpha, which did not produce it)."""
        from qkvqa.qff.rerank import read_reranked_provenance, reranked_meta_path

        path = cfg.eval.reranked_results
        made = produced_by
        if made is None and path and Path(path).is_file():
            made = read_reranked_provenance(path)
        if made is None:
            return {
                "kind": self.name,
                "file": str(path),
                "alpha": None,
                "question_norm": None,
                "focus": None,
                "produced_by": f"unknown (no {reranked_meta_path(path).name}: not written by `qkvqa rerank`)",
            }
        return {
            "kind": self.name,
            "file": str(path),
            "alpha": made.get("qff.alpha"),
            "question_norm": made.get("qff.question_norm", "per_token"),
            "focus": made.get("qff.focus"),
            "top_k": made.get("retrieval.top_k"),
            "qformer": made.get("qformer"),
            "produced_by": f"qkvqa rerank run {made.get('run_id')}",
        }
