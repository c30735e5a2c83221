"""Does a real language model read the context? SmolLM2-135M-Instruct (kind chat_lm, from its pinned wheel) on the
synthetic world's single-hop E-VQA questions, given the gold evidence section, then another article's section.

    python bench/real_generator.py                  # 40 test questions of the default world (about 4 min on 2 cores)
    python bench/real_generator.py --questions 80 --batch-size 16

For each question the context is one section in CDA's chunk format ("# Wiki Article: ...", "## Section Title: ...",
the text), the prompt the paper's E-VQA LLM prompt (appendix 6.1), decoding greedy. It reports the share of answers
that contain a reference answer (`&&`-separated alternatives, case-insensitive), E-VQA's official exact match
(qkvqa.metrics.evqa.exact_match), and seconds per answer generated in batches against one at a time, measured
side by side in this run. Writes bench/out/real_generator.{json,md}.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
OUT = REPO / "bench" / "out"

from qkvqa.config.schema import GenerationConfig  # noqa: E402
from qkvqa.generation.backends import build_generator  # noqa: E402
from qkvqa.generation.prompts import GenerationRequest  # noqa: E402
from qkvqa.metrics.evqa import exact_match  # noqa: E402
from qkvqa.synth.world import generate_world  # noqa: E402

MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def section_context(article: dict, index: int) -> str:
    return (
        f"# Wiki Article: {article['title']}\n## Section Title: {article['section_titles'][index]}\n"
        f"{article['section_texts'][index]}"
    )


def cases(root: Path, count: int) -> list[dict]:
    """Single-hop test questions with their gold section and another article's section of the same title."""
    kb = json.loads((root / "kb" / "encyclopedic_kb_wiki.json").read_text())
    articles = list(kb.values())
    out = []
    with open(root / "evqa" / "test.csv", newline="") as handle:
        for row in csv.DictReader(handle):
            if row["question_type"] == "2_hop" or "|" in row["wikipedia_url"]:
                continue
            article = kb[row["wikipedia_url"]]
            index = int(row["evidence_section_id"])
            title = article["section_titles"][index]
            others = [a for a in articles if a["url"] != article["url"]]
            rotated = others[len(out) % len(others) :] + others
            # another article's section of the same title (its own facts), else its lead section
            other = next((a for a in rotated if title in a["section_titles"]), rotated[0])
            other_index = other["section_titles"].index(title) if title in other["section_titles"] else 0
            out.append(
                {
                    "question": row["question"],
                    "answers": row["answer"].split("&&"),
                    "reference": row["answer"],
                    "question_type": row["question_type"],
                    "gold": section_context(article, index),
                    "distractor": section_context(other, other_index),
                }
            )
            if len(out) == count:
                break
    return out


def score(answers: list[str], items: list[dict]) -> dict:
    contains = [any(a.lower() in ans.lower() for a in item["answers"]) for ans, item in zip(answers, items)]
    exact = [exact_match(item["reference"], ans, item["question_type"]) for ans, item in zip(answers, items)]
    return {"contains": 100 * sum(contains) / len(items), "exact_match": 100 * sum(exact) / len(items)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate_world(tmp, build_store=False)
        items = cases(Path(tmp), args.questions)
    settings = GenerationConfig(batch_size=args.batch_size, max_new_tokens=args.max_new_tokens)
    generator = build_generator({"kind": "chat_lm", "pretrained": MODEL, "device": "cpu"}, settings)
    result = {"model": MODEL, "questions": len(items), "batch_size": args.batch_size, "rows": {}}
    examples = []
    for context in ("gold", "distractor"):
        requests = [GenerationRequest(item["question"], item[context]) for item in items]
        started = time.perf_counter()
        answers = generator.generate(requests)
        elapsed = time.perf_counter() - started
        result["rows"][context] = {**score(answers, items), "s_per_answer_batched": elapsed / len(items)}
        examples += [
            {"context": context, "question": i["question"], "answers": i["answers"], "generated": a}
            for i, a in list(zip(items, answers))[:5]
        ]
        print(context, result["rows"][context], flush=True)
    # one at a time, on the first batch-size-times-two questions with their gold context, for the speed ratio
    timed = items[: 2 * args.batch_size]
    started = time.perf_counter()
    single = [generator.generate([GenerationRequest(i["question"], i["gold"])])[0] for i in timed]
    one = (time.perf_counter() - started) / len(timed)
    started = time.perf_counter()
    batched = generator.generate([GenerationRequest(i["question"], i["gold"]) for i in timed])
    many = (time.perf_counter() - started) / len(timed)
    result["speed"] = {
        "questions": len(timed),
        "s_per_answer_one_at_a_time": one,
        "s_per_answer_batched": many,
        "speedup": one / many,
        "same_answers": single == batched,
    }
    result["examples"] = examples
    OUT.mkdir(exist_ok=True)
    (OUT / "real_generator.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        f"# {MODEL} on the synthetic world ({len(items)} single-hop E-VQA test questions)",
        "",
        "Command: `.venv/bin/python bench/real_generator.py`",
        "",
        f"| context | answer contains the reference | exact match | s / answer (batch {args.batch_size}) |",
        "|---|---|---|---|",
    ]
    for context, row in result["rows"].items():
        lines.append(
            f"| {context} | {row['contains']:.1f} % | {row['exact_match']:.1f} % | {row['s_per_answer_batched']:.2f} |"
        )
    s = result["speed"]
    lines += [
        "",
        f"Batched against one at a time ({s['questions']} answers, side by side): "
        f"{s['s_per_answer_batched']:.2f} s against {s['s_per_answer_one_at_a_time']:.2f} s per answer "
        f"({s['speedup']:.1f}x); the same answers: {s['same_answers']}.",
    ]
    (OUT / "real_generator.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
