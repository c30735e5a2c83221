"""Which section wins inside the gold article, fact by fact: one trained model of a `bench/qff_focus.py` study.

For every val + test question whose sample holds other sections of the gold article, the evidence either outscores
them all or loses to one; this prints how often the evidence wins per question type and per fact, and what kind of
section beats it (another fact-holding section, the lead, a section without facts). docs/training.md ("Where section R@1 is
lost") quotes it for a 240-entity study:

    python bench/qff_focus_facts.py /tmp/qff_focus_study/<name>/controlled none 0
    python bench/qff_focus_facts.py /tmp/qff_focus_study/<name>/controlled none 0 --split train   # memorised?
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from qkvqa.synth.world import unsurveyed_key  # noqa: E402
from tests.helpers.qff_study import EVAL_SPLITS, SPLIT_FILES, VARIANTS, best_sibling, run_id, score_splits  # noqa: E402


def section_kind(entity: dict, index: int) -> str:
    """What a section of an entity's article is, from the world's record of where each fact stands."""
    if index == 0:
        return "the lead section"
    holds_fact = any(fact["section_id"] == index for fact in entity["facts"].values())
    return "another fact section" if holds_fact else "a section without facts"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n", 2)[2],
    )
    parser.add_argument("work", type=Path, help="a study's world directory, e.g. /tmp/qff_focus_study/NAME/controlled")
    parser.add_argument("variant", choices=list(VARIANTS))
    parser.add_argument("seed", type=int)
    parser.add_argument("--split", choices=["eval", "train"], default="eval", help="val + test (default) or train")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(1)
    overrides = json.loads((args.work / "study_settings.json").read_text())["overrides"]
    world = json.loads((args.work / "world/world.json").read_text())
    entities = {e["entity_id"]: e for e in world["entities"]}
    splits = {"train": SPLIT_FILES["train"]} if args.split == "train" else EVAL_SPLITS
    hits = score_splits(
        args.variant,
        args.work / "runs" / run_id(args.variant, args.seed) / "qff",
        overrides,
        args.work,
        args.seed,
        splits,
    )
    records = {
        f"{split}/{r['data_id']}": r
        for split, file in splits.items()
        for r in world["questions"][file]
        if "data_id" in r
    }
    losers, groups = Counter(), {}
    for key, hit in hits.items():
        scores = hit[4]
        sibling = best_sibling(scores)
        if sibling is None:
            continue
        record = records[key]
        won = next(iter(scores.values())) > sibling[1]  # the positive comes first
        if not won:
            losers[section_kind(entities[record["entity"]], sibling[0])] += 1
        fact = unsurveyed_key(record["fact"])
        where = "evidence in the lead section" if record["evidence_section_id"] == 0 else "evidence in a fact section"
        for group in (f"type {record['question_type']}", f"fact {fact}", where, "all"):
            groups.setdefault(group, []).append(won)
    if not groups:
        raise SystemExit(
            f"no {args.split} sample under {args.work} holds another section of its gold article; "
            "study a world with qff.keep_gold_negatives=true"
        )
    print(
        f"{args.variant} seed {args.seed}, {args.split} questions with siblings in the sample: evidence tops them "
        f"in {sum(groups['all'])} of {len(groups['all'])}; it loses to "
        + ", ".join(f"{kind} {n}" for kind, n in losers.most_common())
    )
    for group, wins in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"  {group:28s} {len(wins):4d} questions  {100 * sum(wins) / len(wins):5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
