"""Which section wins inside the gold article, fact by fact: one trained model of a `bench/qff_focus.py` study.

For every val + test question whose sample holds other sections of the gold article, the evidence either outscores
them all or loses to one; this prints how often the evidence wins per question type and per fact, and what kind of
section beats it (the other fact-holding section, the lead, a filler). docs/training.md ("Where section R@1 is
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

from tests.helpers.qff_study import EVAL_SPLITS, SPLIT_FILES, VARIANTS, compose_run, run_id, score  # noqa: E402

FILLERS = {"References", "External links", "Etymology", "Behaviour", "Taxonomy", "Name", "Legends", "Gallery"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n", 2)[2])
    parser.add_argument("work", type=Path, help="a study's world directory, e.g. /tmp/qff_focus_study/NAME/controlled")
    parser.add_argument("variant", choices=list(VARIANTS))
    parser.add_argument("seed", type=int)
    parser.add_argument("--split", choices=["eval", "train"], default="eval", help="val + test (default) or train")
    args = parser.parse_args(argv)

    import torch

    from qkvqa.qff.builder import build_qff_component

    torch.set_num_threads(1)
    overrides = json.loads((args.work / "study_settings.json").read_text())["overrides"]
    world = json.loads((args.work / "world/world.json").read_text())
    kb = json.loads((args.work / "world/kb/encyclopedic_kb_wiki.json").read_text())
    splits = {"train": SPLIT_FILES["train"]} if args.split == "train" else EVAL_SPLITS
    experiment, extra = VARIANTS[args.variant]
    component, hits = None, {}
    for split, file in splits.items():
        cfg = compose_run(experiment, [*overrides, *extra, f"seed={args.seed}", f"data.val_questions={file}",
                                       f"qff.val_negatives={args.work / f'pools/hardneg_{split}.json'}",
                                       f"qff.checkpoint={args.work / 'runs' / run_id(args.variant, args.seed) / 'qff'}",
                                       "qff.max_val_samples=null", "qff.vit_cache=null"])
        component = component or build_qff_component(cfg.components.qformer, cfg.qff)
        hits.update({f"{split}/{k}": v for k, v in score(component, cfg).items()})
    records = {f"{split}/{r['data_id']}": r for split, file in splits.items() for r in world["questions"][file]
               if "data_id" in r}
    losers, groups = Counter(), {}
    for key, hit in hits.items():
        (gold, gold_score), *rest = hit[4].items()
        siblings = [(candidate, s) for candidate, s in rest if candidate[0] == gold[0]]
        if not siblings:
            continue
        (_, index), best = max(siblings, key=lambda cs: cs[1])
        won = gold_score > best
        if not won:
            title = kb[gold[0]]["section_titles"][index]
            losers["a filler section" if title in FILLERS else "the lead section" if index == 0
                   else "another fact section"] += 1
        record = records[key]
        fact = record["fact"].removesuffix("_early").removesuffix("_recent")
        where = "evidence in the lead section" if record["evidence_section_id"] == 0 else "evidence in a fact section"
        for group in (f"type {record['question_type']}", f"fact {fact}", where, "all"):
            groups.setdefault(group, []).append(won)
    print(f"{args.variant} seed {args.seed}, {args.split} questions with siblings in the sample: evidence tops them "
          f"in {sum(groups['all'])} of {len(groups['all'])}; it loses to " +
          ", ".join(f"{kind} {n}" for kind, n in losers.most_common()))
    for group, wins in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        print(f"  {group:28s} {len(wins):4d} questions  {100 * sum(wins) / len(wins):5.1f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
