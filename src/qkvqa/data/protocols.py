"""The published evaluation protocols a run's files can follow (`data.protocol`): their KB, question counts and peers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Protocol:
    """One published protocol: which KB and question files, how many questions, whose numbers it is comparable to."""

    name: str
    dataset: str  # evqa | infoseek | any
    questions: dict  # split -> the protocol's question count
    kb: str  # the KB, in words
    comparable_to: str  # whose published numbers follow this protocol


PROTOCOLS = {
    p.name: p
    for p in (
        Protocol(
            "evqa_2m",
            "evqa",
            {"test": 5750},
            "E-VQA's 2M-article encyclopedic_kb_wiki.json",
            "the QKVQA paper (Tables 2-6) and the E-VQA literature",
        ),
        Protocol(
            "echosight_100k",
            "infoseek",
            {"test": 71335},
            "EchoSight's 100K InfoSeek KB (wiki_100_dict_v4.json)",
            "the QKVQA paper (Tables 2-6), EchoSight, OMGM",
        ),
        Protocol(
            "reflectiva_wiki100k",
            "infoseek",
            {"test": 73620},
            "ReflectiVA's Wiki100k_ver_1_0-all.json with its knn.index / knn.json",
            "ReflectiVA-protocol InfoSeek results (ReAG 47.2 fine-tuned, CC-VQA 45.1 training-free), "
            "not the QKVQA paper's InfoSeek numbers",
        ),
        Protocol("custom", "any", {}, "a KB or question set of the user's own", "no published numbers"),
    )
}
# The protocol the paper's numbers use, per dataset (section 4.1).
PAPER_PROTOCOLS = {"evqa": "evqa_2m", "infoseek": "echosight_100k"}


def protocol_named(name: Optional[str]) -> Optional[Protocol]:
    """The protocol of `data.protocol` (None when unset; the schema refuses unknown names)."""
    return None if name is None else PROTOCOLS[name]


def expected_questions(dataset: str, split: str, protocol: Optional[str]) -> Optional[int]:
    """The question count of `split` under `protocol` (the paper's protocol when unset), or None when none is known."""
    chosen = protocol_named(protocol) or protocol_named(PAPER_PROTOCOLS.get(dataset))
    return None if chosen is None or chosen.dataset not in (dataset, "any") else chosen.questions.get(split)
