"""Retrieval and analysis metrics: URL-deduplicated Recall@K, 2_hop policies, evidence-section recall, Table 3."""

from __future__ import annotations

import pytest

from qkvqa.errors import ConfigError, DataError
from qkvqa.metrics.analysis import (
    accuracy_summary,
    context_length_stats,
    error_analysis,
    evqa_hop_accuracy,
    grouped_accuracy,
)
from qkvqa.metrics.retrieval import (
    best_section_index,
    dedupe_keep_order,
    entry_urls,
    evidence_section_recall,
    evqa_gold_urls,
    evqa_recall_at_k,
    gold_rank,
    recall_at_k,
    recall_from_ranks,
)

QUESTIONS = [
    {"data_id": "q0", "wikipedia_url": "u/a", "question_type": "templated", "evidence_section_id": "2"},
    {"data_id": "q1", "wikipedia_url": "u/b", "question_type": "automatic", "evidence_section_id": "0"},
    {"data_id": "q2", "wikipedia_url": "u/c", "question_type": "multi_answer", "evidence_section_id": "1"},
    {"data_id": "q3", "wikipedia_url": "u/d|u/e", "question_type": "2_hop", "evidence_section_id": "3"},
]
RANKINGS = {
    "q0": ["u/a", "u/x"],  # rank 1
    "q1": ["u/x", "u/x", "u/x", "u/b"],  # rank 4 before dedup, 2 after
    "q2": [{"url": "u/y", "title": "Y"}, {"url": "u/z"}, {"url": "u/c"}],  # OMGM layout, rank 3
    "q3": ["u/e", "u/d"],  # second URL first
}


def test_dedupe_keeps_first_occurrences_in_order():
    assert dedupe_keep_order(["b", "a", "b", "c", "a"]) == ["b", "a", "c"]


def test_gold_rank_counts_after_deduplication():
    assert gold_rank(["x", "x", "x", "g"], {"g"}) == 2
    assert gold_rank(["x", "y"], {"g"}) == 0
    assert gold_rank([], {"g"}) == 0
    assert gold_rank([{"url": "g"}], ("g",)) == 1


def test_entry_urls_rejects_unknown_shapes():
    with pytest.raises(DataError, match="URL string or a dict"):
        entry_urls([{"title": "no url"}])


def test_recall_at_k_every_query_counts():
    gold = {"q0": ("u/a",), "q1": ("u/b",), "q2": ("u/c",), "q9": ("u/z",)}
    result = recall_at_k(RANKINGS, gold, ks=(1, 2, 3, 20))
    assert result["recall@1"] == 25.0  # q9 has no retrievals and still counts
    assert result["recall@2"] == 50.0  # q1 is a hit at 2 thanks to the dedup
    assert result["recall@3"] == 75.0 and result["recall@20"] == 75.0
    assert (result["n_queries"], result["n_without_results"], result["n_unknown_rankings"]) == (4, 1, 1)


@pytest.mark.parametrize(
    "policy, gold_q3, recall1, n_queries",
    [
        ("exclude", None, 100 / 3, 3),
        ("first", ("u/d",), 25.0, 4),  # u/d is at rank 2
        ("any", ("u/d", "u/e"), 50.0, 4),  # u/e is at rank 1
    ],
)
def test_two_hop_policies(policy, gold_q3, recall1, n_queries):
    assert evqa_gold_urls("u/d|u/e", "2_hop", policy) == gold_q3
    assert evqa_gold_urls("u/a", "templated", policy) == ("u/a",)
    result = evqa_recall_at_k(RANKINGS, QUESTIONS, ks=(1, 5), two_hop_policy=policy)
    assert result["recall@1"] == pytest.approx(recall1)
    assert result["n_queries"] == n_queries and result["two_hop_policy"] == policy
    assert result["n_excluded_two_hop"] == (1 if policy == "exclude" else 0)


def test_unknown_two_hop_policy_is_a_config_error():
    with pytest.raises(ConfigError, match="two_hop_policy"):
        evqa_gold_urls("u/a", "templated", "both")


def test_recall_from_ranks_and_empty_input():
    assert recall_from_ranks([1, 0, 3, 11], ks=(1, 10)) == {"recall@1": 25.0, "recall@10": 50.0}
    assert recall_from_ranks([], ks=(1,)) == {"recall@1": None}


def test_best_section_index_maps_filtered_positions_to_kb_indices():
    assert best_section_index([0.1, 0.9, 0.9]) == 1  # first on ties
    assert best_section_index([0.1, 0.9, 0.3], section_indices=[0, 2, 5]) == 2
    with pytest.raises(DataError):
        best_section_index([])
    with pytest.raises(DataError, match="2 section scores but 3"):
        best_section_index([0.1, 0.2], [0, 1, 2])


def test_top1_evidence_section_recall():
    top1 = {
        "q0": ("u/a", 2),  # right article, right section: hit
        "q1": ("u/b", 3),  # right article, wrong section
        "q2": ("u/x", 1),  # wrong article
        "q3": ("u/d", 3),
    }  # 2_hop
    result = evidence_section_recall(top1, QUESTIONS)
    assert result["evidence_section_recall@1"] == pytest.approx(100 / 3) and result["n_queries"] == 3
    assert evidence_section_recall(top1, QUESTIONS, "first")["evidence_section_recall@1"] == 50.0
    assert evidence_section_recall({}, QUESTIONS)["evidence_section_recall@1"] == 0.0
    with pytest.raises(DataError, match="q0: evidence_section_id"):
        evidence_section_recall(top1, [{**QUESTIONS[0], "evidence_section_id": "intro"}])


# --- analysis --------------------------------------------------------------------------------------


def test_error_analysis_table3():
    gold_at_top1 = {"a": True, "b": True, "c": True, "d": False, "e": False}
    scores = {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0, "e": 0.0}
    result = error_analysis(gold_at_top1, scores)
    assert result["r1"] == 60.0
    assert result["r1_c"] == pytest.approx(200 / 3)
    assert result["nr_c"] == 20.0  # share of all questions (paper's wording)
    assert result["nr_c_conditional"] == 50.0  # accuracy among not-rank-1 questions
    assert (result["n"], result["n_top1"], result["n_not_top1"]) == (5, 3, 2)
    all_top1 = error_analysis({"a": True}, {"a": 1.0})
    assert all_top1["nr_c"] == 0.0 and all_top1["nr_c_conditional"] is None
    with pytest.raises(DataError, match="same question ids"):
        error_analysis({"a": True}, {"b": 1.0})


def test_error_categories_partition_table3():
    from collections import Counter

    from qkvqa.metrics.analysis import error_category

    gold_at_top1 = {"a": True, "b": True, "c": True, "d": False, "e": False, "f": False}
    scores = {"a": 1.0, "b": 1.0, "c": 0.0, "d": 1.0, "e": 0.0, "f": 0.0}
    retrieved = {"a": True, "b": True, "c": True, "d": False, "e": True, "f": False}
    cells = Counter(error_category(gold_at_top1[q], scores[q], retrieved[q]) for q in scores)
    assert cells == {"R1-C": 2, "R1-W": 1, "NR-C": 1, "NR-W": 1, "not_retrieved": 1}
    table3 = error_analysis(gold_at_top1, scores)
    assert table3["r1"] == 100.0 * (cells["R1-C"] + cells["R1-W"]) / len(scores)
    assert table3["r1_c"] == 100.0 * cells["R1-C"] / (cells["R1-C"] + cells["R1-W"])
    assert table3["nr_c"] == 100.0 * cells["NR-C"] / len(scores)


def test_context_length_stats():
    stats = context_length_stats([100, 200, 300, 400, 1000])
    assert stats == {"n": 5, "mean": 400.0, "median": 300.0, "p95": pytest.approx(880.0)}  # linear interpolation
    assert context_length_stats([]) == {"n": 0, "mean": None, "median": None, "p95": None}


def test_grouped_and_hop_accuracy():
    scores = [1.0, 0.0, 1.0, 1.0, 0.0]
    types = ["templated", "templated", "multi_answer", "2_hop", "automatic"]
    by_type = grouped_accuracy(scores, types)
    assert list(by_type) == ["2_hop", "automatic", "multi_answer", "templated"]
    assert by_type["templated"] == {"n": 2, "correct": 1.0, "accuracy": 50.0}
    hops = evqa_hop_accuracy(scores, types)
    assert hops["single_hop"] == {"n": 4, "correct": 2.0, "accuracy": 50.0}
    assert hops["two_hop"]["accuracy"] == 100.0 and hops["all"]["accuracy"] == 60.0
    assert accuracy_summary([]) == {"n": 0, "correct": 0.0, "accuracy": None}
    with pytest.raises(DataError):
        grouped_accuracy([1.0], [])
