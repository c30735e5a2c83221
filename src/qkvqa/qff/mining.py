"""Hard-negative mining with OMGM's rule (method.md §3, data-formats §8): pools in the step1_HardNeg layout, per-sample candidates.

The pools file is OMGM's `step1_HardNeg.json`, keyed by query-image basename without extension:

    {"<image key>": {"gt_entity_pos_img": "<article image path>" | null,
                     "top_20": [{"entry": url, "title": str, "similarity": float}, ...]}}

`top_20` is the stage-1 top-K of that image (K = `qff.mining_top_k`). Beside it, `<name>.articles.json`
(qkvqa) holds what the rule needs of every article the pools name, so that training never re-reads
the title -> image CSVs: `{url: {"title", "image": path | null, "sections": [original indices of the
candidate sections], "num_sections"}}`. Image paths are relative to `data.images.kb_image_root` (as OMGM writes
them) or to `data.root`, else absolute.

The rule (`SamplePool`): positive = (gold article's evidence section, gold image); negatives = the
first `gold_sections` (3) other candidate sections of the gold article, paired with the gold image,
plus every candidate section of every top-K article other than the gold one, paired with that
article's main image; articles without an image are skipped. A sample whose gold article has no
image, or whose pool holds fewer than `num_negatives` (15) candidates, is dropped with its reason.
Candidate sections never include "external links" / "references"; every candidate keeps its
original section index.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

from qkvqa.errors import DataError, StaleArtifactError
from qkvqa.utils.io import atomic_write_json, read_json
from qkvqa.utils.logging import get_logger
from qkvqa.utils.progress import progress

log = get_logger(__name__)

TOP_K = 20
GOLD_SECTIONS = 3
NUM_NEGATIVES = 15
ARTICLES_SUFFIX = ".articles.json"
DROP_REASONS = ("gold_not_in_kb", "bad_evidence_section", "no_gold_image", "no_retrieval_results", "too_few_candidates")


@dataclass(frozen=True)
class ArticleFacts:
    """What the rule needs of one article: title, main image (stored path or None), candidate section indices."""

    url: str
    title: str
    image: Optional[str]
    sections: tuple[int, ...]  # original indices of the candidate sections (no references / external links)
    num_sections: int  # length of the unfiltered section lists


@dataclass(frozen=True)
class Candidate:
    """One (section, image) pair: the article URL, the section's original index and the article image path."""

    url: str
    section_index: int
    image: str


@dataclass(frozen=True)
class SamplePool:
    """The positive and the whole negative pool of one training sample (negatives are drawn from `negatives`)."""

    positive: Candidate
    negatives: tuple[Candidate, ...]


class ImagePaths:
    """Stores article image paths relative to `kb_image_root` (OMGM's convention) or `data_root`, and resolves them back."""

    def __init__(self, kb_image_root: Optional[Path], data_root: Optional[Path]):
        self.roots = [Path(r).resolve() for r in (kb_image_root, data_root) if r is not None]

    def relative(self, path: Path) -> str:
        """The stored form of an image file path."""
        path = Path(path).resolve()
        for root in self.roots:
            if path.is_relative_to(root):
                return path.relative_to(root).as_posix()
        return str(path)

    def resolve(self, stored: str) -> Path:
        """The file of a stored path: absolute as is, else the first root under which it exists (else the first root)."""
        path = Path(stored)
        if path.is_absolute() or not self.roots:
            return path
        for root in self.roots:
            if (root / path).is_file():
                return root / path
        return self.roots[0] / path


def image_paths_for(data_config) -> ImagePaths:
    """ImagePaths of a DataConfig (kb_image_root and root resolved as the data layer does)."""
    from qkvqa.data.config import resolve_data_path

    kb_root = resolve_data_path(data_config, data_config.images.kb_image_root)
    root = Path(data_config.root).expanduser() if data_config.root is not None else None
    return ImagePaths(kb_root, root)


class ArticleFactsSource:
    """ArticleFacts per URL from the KB store and the title -> image index, computed once per URL."""

    def __init__(self, store, article_images, image_paths: ImagePaths):
        self.store = store
        self.article_images = article_images
        self.image_paths = image_paths
        self._cache: dict[str, Optional[ArticleFacts]] = {}

    def __call__(self, url: str) -> Optional[ArticleFacts]:
        """The facts of `url`, or None when the KB does not have it."""
        if url not in self._cache:
            self._cache[url] = self._compute(url)
        return self._cache[url]

    def _compute(self, url: str) -> Optional[ArticleFacts]:
        try:
            article = self.store.get_by_url(url)
        except KeyError:
            return None
        image = self.article_images.main_image(article.title, article.image_urls)
        return ArticleFacts(
            url,
            article.title,
            None if image is None else self.image_paths.relative(image),
            tuple(c.index for c in article.candidate_sections()),
            min(len(article.section_titles), len(article.section_texts)),
        )

    def known(self) -> dict[str, ArticleFacts]:
        """Every article looked up so far (those in the KB)."""
        return {url: facts for url, facts in self._cache.items() if facts is not None}


def image_key(resolver, dataset_name: str, image_id: str) -> str:
    """The pool key of a query image: its file's basename without extension (the image id when it has no file name)."""
    candidates = resolver.candidates(dataset_name, image_id)
    return candidates[0].stem if candidates else image_id


def sample_pool(
    gold_url: str,
    evidence_section_id: Optional[int],
    top_urls: Sequence[str],
    facts: Callable[[str], Optional[ArticleFacts]],
    *,
    gold_image: Optional[str] = None,
    gold_sections: int = GOLD_SECTIONS,
    num_negatives: int = NUM_NEGATIVES,
) -> SamplePool | str:
    """The pool of one sample under OMGM's rule, or the reason (one of DROP_REASONS) it is dropped.

    `top_urls` are the stage-1 top-K URLs of the sample's image; `gold_image` overrides the gold
    article's main image (OMGM's `gt_entity_pos_img`).
    """
    gold = facts(gold_url)
    if gold is None:
        return "gold_not_in_kb"
    if evidence_section_id is None or not 0 <= evidence_section_id < gold.num_sections:
        return "bad_evidence_section"
    image = gold_image if gold_image is not None else gold.image
    if image is None:
        return "no_gold_image"
    if not top_urls:
        return "no_retrieval_results"
    negatives = [Candidate(gold_url, i, image) for i in gold.sections if i != evidence_section_id][:gold_sections]
    for url in dict.fromkeys(top_urls):
        if url == gold_url:
            continue
        other = facts(url)
        if other is None or other.image is None:
            continue
        negatives.extend(Candidate(url, i, other.image) for i in other.sections)
    if len(negatives) < num_negatives:
        return "too_few_candidates"
    return SamplePool(Candidate(gold_url, evidence_section_id, image), tuple(negatives))


# ---------------------------------------------------------------------------------------------- mining


@dataclass
class MiningResult:
    """Pools (OMGM layout), the facts of every article they name, and the report of kept and dropped samples."""

    pools: dict[str, dict]
    articles: dict[str, ArticleFacts]
    report: dict
    kb: Optional[dict] = None  # {"url_checksum", "articles"} of the KB store the facts come from


def mine_pools(
    questions: Iterable[Any],
    results: Mapping[str, Any],
    facts: ArticleFactsSource,
    key_of: Callable[[Any], str],
    *,
    top_k: int = TOP_K,
    gold_sections: int = GOLD_SECTIONS,
    num_negatives: int = NUM_NEGATIVES,
    split: str = "",
) -> MiningResult:
    """Build the pools of `questions` from their stage-1 `results` (data_id -> Retrieved) and report every drop.

    Only training question types are mined (2_hop rows are counted and skipped). Questions that share
    a query image share its pool key; their gold articles' facts are all in `articles`.
    """
    from qkvqa.data.questions import is_training_question

    pools: dict[str, dict] = {}
    dropped: list[dict] = []
    reasons: Counter[str] = Counter()
    sizes: list[int] = []
    keys_with_several_golds: set[str] = set()
    gold_of_key: dict[str, str] = {}
    not_training = conflicting = 0
    kept = 0
    questions = list(questions)
    for question in progress(questions, desc=f"mining {split}", unit="question"):
        if not is_training_question(question):
            not_training += 1
            continue
        key = key_of(question)
        retrieved = results.get(question.data_id)
        urls = list(retrieved.urls[:top_k]) if retrieved is not None else []
        for url in urls:
            facts(url)
        gold_url = question.gold_url
        gold = facts(gold_url)
        if key not in pools:
            pools[key] = {
                "gt_entity_pos_img": gold.image if gold is not None else None,
                "top_20": [
                    {"entry": u, "title": t, "similarity": float(s)}
                    for u, t, s in zip(urls, retrieved.titles[:top_k], retrieved.similarities[:top_k])
                ]
                if retrieved is not None
                else [],
            }
            gold_of_key[key] = gold_url
        else:
            if [e["entry"] for e in pools[key]["top_20"]] != urls:
                conflicting += 1
            if gold_of_key[key] != gold_url:
                keys_with_several_golds.add(key)
        pool = sample_pool(
            gold_url,
            question.evidence_section_id,
            [e["entry"] for e in pools[key]["top_20"]],
            facts,
            gold_sections=gold_sections,
            num_negatives=num_negatives,
        )
        if isinstance(pool, str):
            reasons[pool] += 1
            dropped.append({"data_id": question.data_id, "image_key": key, "gold_url": gold_url, "reason": pool})
        else:
            kept += 1
            sizes.append(len(pool.negatives))
    if conflicting:
        log.warning(
            "%d questions share a query image with an earlier question but have another stage-1 ranking; "
            "the first ranking was kept",
            conflicting,
        )
    mined = kept + len(dropped)
    report = {
        "split": split,
        "questions": len(questions),
        "mined": mined,
        "kept": kept,
        "dropped": len(dropped),
        "dropped_by_reason": {reason: reasons.get(reason, 0) for reason in DROP_REASONS},
        "not_training_type": not_training,
        "image_keys": len(pools),
        "image_keys_with_several_gold_articles": len(keys_with_several_golds),
        "conflicting_rankings": conflicting,
        "pool_size": {"min": min(sizes), "mean": sum(sizes) / len(sizes), "max": max(sizes)} if sizes else None,
        "rule": {"top_k": top_k, "gold_sections": gold_sections, "num_negatives": num_negatives},
        "articles_without_image": sum(1 for f in facts.known().values() if f.image is None),
        "dropped_samples": dropped,
    }
    log.info(
        "mined %s: %d of %d samples kept; dropped %s",
        split or "pools",
        kept,
        mined,
        ", ".join(f"{r} {n}" for r, n in report["dropped_by_reason"].items() if n) or "none",
    )
    store = getattr(facts, "store", None)
    from qkvqa.data.kb import kb_content

    kb = (
        {"url_checksum": store.url_checksum, "articles": len(store), "content": kb_content(store)}
        if store is not None
        else None
    )
    return MiningResult(pools, facts.known(), report, kb)


def articles_path(pools_path: str | os.PathLike) -> Path:
    """The article-facts file that goes with a pools file: `X.json` -> `X.articles.json`."""
    path = Path(pools_path)
    return path.with_name(
        path.name[: -len(".json")] + ARTICLES_SUFFIX if path.name.endswith(".json") else path.name + ARTICLES_SUFFIX
    )


def write_pools(path: str | os.PathLike, result: MiningResult) -> tuple[Path, Path]:
    """Write the pools (OMGM layout) and their article facts atomically; returns both paths."""
    path = Path(path)
    atomic_write_json(path, result.pools, indent=None)
    side = articles_path(path)
    articles = {
        url: {"title": f.title, "image": f.image, "sections": list(f.sections), "num_sections": f.num_sections}
        for url, f in sorted(result.articles.items())
    }
    atomic_write_json(side, {"kb": result.kb, "articles": articles}, indent=None)
    return path, side


# ---------------------------------------------------------------------------------------------- reading


class PoolFile:
    """A pools file read for training: per image key the gold image and top-K URLs, with article facts.

    With the qkvqa sidecar (`.articles.json`) no KB access is needed; for a pools file without one
    (OMGM's own), `fallback` (an ArticleFactsSource) supplies the facts, and `gt_entity_pos_img` is
    the gold image as OMGM uses it.
    """

    def __init__(
        self,
        path: str | os.PathLike,
        fallback: Optional[Callable[[], ArticleFactsSource]] = None,
        kb_checksum: Optional[str] = None,
        kb_content: Optional[str] = None,
    ):
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"{self.path}: hard-negative pools not found; write them with `qkvqa mine`")
        try:
            pools = read_json(self.path)
        except ValueError as e:
            raise DataError(str(e)) from None
        if not isinstance(pools, dict):
            raise DataError(
                f"{self.path}: expected an object keyed by query-image basename, found {type(pools).__name__}"
            )
        self.entries: dict[str, tuple[Optional[str], tuple[str, ...], tuple[float, ...]]] = {}
        for key, value in pools.items():
            try:
                top = value["top_20"]
                urls = tuple(str(e["entry"]) for e in top)
                sims = tuple(float(e.get("similarity", 0.0)) for e in top)
                self.entries[str(key)] = (value.get("gt_entity_pos_img"), urls, sims)
            except (KeyError, TypeError, AttributeError, ValueError):
                raise DataError(
                    f"{self.path}: key {key!r}: expected {{'gt_entity_pos_img', 'top_20': [{{'entry': url, ...}}]}}"
                ) from None
        side = articles_path(self.path)
        self.has_facts = side.is_file()
        self._facts: dict[str, Optional[ArticleFacts]] = {}
        if self.has_facts:
            facts = read_json(side)
            kb = facts.get("kb") if "articles" in facts and "kb" in facts else None
            facts = facts["articles"] if kb is not None or set(facts) == {"kb", "articles"} else facts
            if kb_checksum is not None and kb and kb.get("url_checksum") != kb_checksum:
                raise StaleArtifactError(
                    f"{side}: mined over another KB (URL checksum {kb.get('url_checksum')}, {kb.get('articles')} "
                    f"articles; the config's KB store has {kb_checksum}): its section indexes would point at other "
                    f"sections. Mine again with `qkvqa mine`, or set qff.negatives to pools of this KB"
                )
            if kb_content and kb and kb.get("content") and kb.get("content") != kb_content:
                raise StaleArtifactError(  # text edited under the same URLs: other facts (issue 44)
                    f"{side}: mined over another version of the KB (content sha256 {str(kb.get('content'))[:12]}, the "
                    f"config's KB store has {kb_content[:12]}: its text changed under the same URLs). Mine again "
                    "with `qkvqa mine`, or set qff.negatives to pools of this KB"
                )
            for url, f in facts.items():
                self._facts[url] = ArticleFacts(
                    url, f["title"], f["image"], tuple(int(i) for i in f["sections"]), int(f["num_sections"])
                )
        self._fallback_factory = fallback
        self._fallback: Optional[ArticleFactsSource] = None

    def facts(self, url: str) -> Optional[ArticleFacts]:
        """The facts of `url` (sidecar first, then the KB fallback when there is one)."""
        if url in self._facts:
            return self._facts[url]
        if self._fallback_factory is None:
            if self.has_facts:
                return None
            raise DataError(
                f"{self.path}: no {articles_path(self.path).name} beside it, and no KB to read article facts from"
            )
        if self._fallback is None:
            self._fallback = self._fallback_factory()
        self._facts[url] = self._fallback(url)
        return self._facts[url]

    def gold_image_override(self, key: str) -> Optional[str]:
        """OMGM's `gt_entity_pos_img` for pools without qkvqa facts (one entity per image there); None otherwise."""
        if self.has_facts or key not in self.entries:
            return None
        return self.entries[key][0]

    def pool(
        self, question, key: str, *, gold_sections: int = GOLD_SECTIONS, num_negatives: int = NUM_NEGATIVES
    ) -> SamplePool | str:
        """The sample pool of `question` (whose image has pool key `key`), or its drop reason."""
        _, urls, _ = self.entries.get(key, (None, (), ()))
        return sample_pool(
            question.gold_url,
            question.evidence_section_id,
            urls,
            self.facts,
            gold_image=self.gold_image_override(key),
            gold_sections=gold_sections,
            num_negatives=num_negatives,
        )

    def ranking(self, key: str) -> tuple[tuple[str, ...], tuple[float, ...]]:
        """The stage-1 URLs and similarities stored for an image key (empty when absent)."""
        _, urls, sims = self.entries.get(key, (None, (), ()))
        return urls, sims


# ---------------------------------------------------------------------------------------------- from a config


def mine_split(cfg, split: Optional[str], benchmark) -> MiningResult:
    """Mine the pools of `split` (default retrieval.split) of `benchmark` from its stage-1 results under `cfg`.

    The results are `retrieval.results` when set (OMGM or EchoSight layout), else retrieved now from
    the config's index (`qkvqa.retrieval.retrieve.retrieve_split`).
    """
    from qkvqa.config.schema import qff_settings
    from qkvqa.retrieval.retrieve import retrieve_split

    split = split or cfg.retrieval.split
    retrieval = retrieve_split(cfg, split, benchmark=benchmark)
    facts = ArticleFactsSource(benchmark.kb_store(), benchmark.article_images(), image_paths_for(benchmark.config))
    resolver = benchmark.image_loader.resolver
    qff = qff_settings(cfg.qff)  # the one settings object
    return mine_pools(
        benchmark.questions(split),
        retrieval.results,
        facts,
        lambda question: image_key(resolver, question.dataset_name, question.image_id),
        top_k=qff.mining_top_k,
        gold_sections=qff.mining_gold_sections,
        num_negatives=qff.num_negatives,
        split=split,
    )


def mine_to_dir(cfg, split: str, out_dir: str | os.PathLike, benchmark) -> Path:
    """Mine `split` of `benchmark` and write `hardneg_{split}.json`, its `.articles.json` and
    `mining_report_{split}.json` to `out_dir`."""
    result = mine_split(cfg, split, benchmark)
    out_dir = Path(out_dir)
    report_path = out_dir / f"mining_report_{split}.json"
    atomic_write_json(report_path, result.report)
    check_kept(result.report, report_path)
    path, _ = write_pools(out_dir / f"hardneg_{split}.json", result)
    return path


def check_kept(report: dict, report_path: Optional[Path] = None) -> None:
    """DataError when mining kept no sample of the questions it mined (no pools are written then: a training run
    would have nothing to learn from), naming the drop reasons; `no_gold_image` for all of them is a KB image root
    or title -> image CSVs that do not match the KB."""
    if report["kept"] or not report["mined"]:
        return
    reasons = ", ".join(f"{r} {n}" for r, n in report["dropped_by_reason"].items() if n)
    hint = (
        " Every gold article lacks its main image: check data.images.kb_image_csvs and data.images.kb_image_root "
        "(the folder holding full/)."
        if report["dropped_by_reason"].get("no_gold_image") == report["mined"]
        else ""
    )
    raise DataError(
        f"mining {report['split']} kept 0 of {report['mined']} samples (dropped: {reasons})"
        f"{f'; the report is {report_path}' if report_path else ''}.{hint}"
    )
