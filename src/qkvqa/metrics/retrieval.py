"""Retrieval metrics: Recall@K over URL-deduplicated rankings (EchoSight's eval_recall), top-1 evidence-section recall.

Conventions (metrics.md section 3): a ranking is deduplicated keeping first occurrences; a query is
a hit at K iff a gold URL is among the first K entries; every query counts, including queries with
no retrievals. Values are percentages.

E-VQA 2_hop rows carry `url1|url2` as their gold URL, which never equals a retrieved URL. The policy
is explicit, `two_hop_policy`:
- `"exclude"` (default, EchoSight and its followers): 2_hop queries are left out and counted.
- `"first"`: the gold is the first URL (the entity in the image).
- `"any"`: a hit on either URL counts.
"""

from __future__ import annotations

from typing import Any, Collection, Iterable, Mapping, Optional, Sequence

from qkvqa.errors import ConfigError, DataError

TWO_HOP = "2_hop"
TWO_HOP_POLICIES = ("exclude", "first", "any")
DEFAULT_KS = (1, 5, 10, 20)


def dedupe_keep_order(ids: Iterable[str]) -> list[str]:
    """The ids in order, each kept at its first occurrence."""
    return list(dict.fromkeys(ids))


def entry_urls(entries: Sequence[Any]) -> list[str]:
    """URLs of a ranked list given as URL strings (EchoSight `retrieved_entries`) or `{url, ...}` dicts
    (OMGM `retrieved_entities`)."""
    urls = []
    for entry in entries:
        if isinstance(entry, str):
            urls.append(entry)
        elif isinstance(entry, Mapping) and isinstance(entry.get("url"), str):
            urls.append(entry["url"])
        else:
            raise DataError(f"a retrieved entry must be a URL string or a dict with a 'url', got {entry!r}")
    return urls


def gold_rank(ranked: Sequence[Any], gold: Collection[str]) -> int:
    """1-based rank of the first gold URL in the deduplicated ranking, 0 when no gold URL is retrieved."""
    for rank, url in enumerate(dedupe_keep_order(entry_urls(ranked)), 1):
        if url in gold:
            return rank
    return 0


def recall_from_ranks(ranks: Sequence[int], ks: Sequence[int] = DEFAULT_KS) -> dict:
    """`recall@K` in percent from gold ranks (0 = not retrieved); None for every K when there is no query."""
    return {f"recall@{k}": (100.0 * sum(1 for r in ranks if 0 < r <= k) / len(ranks) if ranks else None) for k in ks}


def recall_at_k(
    rankings: Mapping[str, Sequence[Any]], gold: Mapping[str, Collection[str]], ks: Sequence[int] = DEFAULT_KS
) -> dict:
    """Recall@K over the queries of `gold` (qid -> acceptable URLs); a query absent from `rankings` counts
    as a miss. Rankings of ids that are not in `gold` are ignored and counted."""
    ranks = [gold_rank(rankings.get(qid, ()), urls) for qid, urls in gold.items()]
    return {
        **recall_from_ranks(ranks, ks),
        "n_queries": len(ranks),
        "n_without_results": sum(1 for qid in gold if not rankings.get(qid)),
        "n_unknown_rankings": len(rankings.keys() - gold.keys()),
    }


def evqa_gold_urls(wikipedia_url: str, question_type: str, two_hop_policy: str) -> Optional[tuple[str, ...]]:
    """The acceptable gold URLs of one E-VQA row under `two_hop_policy`; None when the row is excluded."""
    if two_hop_policy not in TWO_HOP_POLICIES:
        raise ConfigError(f"two_hop_policy must be one of {list(TWO_HOP_POLICIES)}, got {two_hop_policy!r}")
    if question_type != TWO_HOP:
        return (wikipedia_url,)
    if two_hop_policy == "exclude":
        return None
    urls = tuple(wikipedia_url.split("|"))
    return urls[:1] if two_hop_policy == "first" else urls


def evqa_gold(questions: Iterable[Mapping[str, Any]], two_hop_policy: str = "exclude") -> tuple[dict, int]:
    """(data_id -> gold URLs, number of excluded 2_hop rows) from `{data_id, wikipedia_url, question_type}` rows."""
    gold: dict[str, tuple[str, ...]] = {}
    excluded = 0
    for row in questions:
        urls = evqa_gold_urls(row["wikipedia_url"], row["question_type"], two_hop_policy)
        if urls is None:
            excluded += 1
        else:
            gold[row["data_id"]] = urls
    return gold, excluded


def evqa_recall_at_k(
    rankings: Mapping[str, Sequence[Any]],
    questions: Iterable[Mapping[str, Any]],
    ks: Sequence[int] = DEFAULT_KS,
    two_hop_policy: str = "exclude",
) -> dict:
    """E-VQA Recall@K with the 2_hop policy made explicit; reports the policy and the excluded count."""
    gold, excluded = evqa_gold(questions, two_hop_policy)
    return {**recall_at_k(rankings, gold, ks), "two_hop_policy": two_hop_policy, "n_excluded_two_hop": excluded}


def best_section_index(section_scores: Sequence[float], section_indices: Optional[Sequence[int]] = None) -> int:
    """The KB section index of the best-scoring section (first on ties). `section_indices` maps score
    positions to original KB indices when some sections were filtered out (external links, references)."""
    if len(section_scores) == 0:
        raise DataError("no section scores to choose the best section from")
    if section_indices is not None and len(section_indices) != len(section_scores):
        raise DataError(f"{len(section_scores)} section scores but {len(section_indices)} section indices")
    best = max(range(len(section_scores)), key=lambda i: section_scores[i])
    return int(section_indices[best]) if section_indices is not None else best


def evidence_section_recall(
    top1: Mapping[str, tuple[str, int]], questions: Iterable[Mapping[str, Any]], two_hop_policy: str = "exclude"
) -> dict:
    """Top-1 evidence-section recall (OMGM), in percent: a hit iff the top-1 article is a gold URL and its
    best section is the row's `evidence_section_id` (an index into the unfiltered KB section list).

    `top1` maps data_id -> (top-1 article URL, its best section's KB index); a query without an
    entry is a miss. Rows are `{data_id, wikipedia_url, question_type, evidence_section_id}`, optionally with
    `evidence_section_ids`, one per URL of `wikipedia_url` (a 2_hop row's `a|b`): then under the `first` and `any`
    policies a hit is the top-1 article of a hop with that hop's evidence section.
    """
    hits = 0
    n = 0
    excluded = 0
    for row in questions:
        urls = evqa_gold_urls(row["wikipedia_url"], row["question_type"], two_hop_policy)
        if urls is None:
            excluded += 1
            continue
        per_hop = row.get("evidence_section_ids")
        values = list(per_hop) if per_hop is not None else [row["evidence_section_id"]] * len(urls)
        if len(values) < len(urls):
            raise DataError(f"data_id {row['data_id']}: {len(urls)} gold URLs but evidence_section_ids {values!r}")
        try:
            evidence = {(url, int(value)) for url, value in zip(urls, values)}
        except (TypeError, ValueError):
            raise DataError(
                f"data_id {row['data_id']}: evidence_section_id must be an integer, got {values!r}"
            ) from None
        n += 1
        found = top1.get(row["data_id"])
        hits += found is not None and (found[0], int(found[1])) in evidence
    return {
        "evidence_section_recall@1": 100.0 * hits / n if n else None,
        "n_queries": n,
        "two_hop_policy": two_hop_policy,
        "n_excluded_two_hop": excluded,
    }
