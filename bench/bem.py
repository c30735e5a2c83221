"""BEM judge throughput on CPU (answers/s), batched vs one at a time, tiny and BERT-base configs side by side.

Run: `.venv/bin/python bench/bem.py [--answers N] [--single N] [--batch-size B]`. The BERT-base judge
has random weights built from a config (no download); timing depends only on the shapes. Inputs are
E-VQA-like triples (question ~10 words, reference 1-4 words, candidate 1-12 words) whose words are all
in the vocabulary, so lengths match what a real uncased vocab would give. Writes bench/out/bem.json
and prints a markdown table.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from qkvqa.components.tiny_tokenizers import write_bert_vocab
from qkvqa.metrics.bem import TINY_BEM, BemJudge
from qkvqa.utils.io import atomic_write_json

OUT = Path(__file__).resolve().parent / "out" / "bem.json"
WORDS = (
    "species family genus bird plant flower tree shell insect landmark river mountain city tower bridge "
    "church castle museum colour height length wingspan diet habitat range native europe asia africa "
    "america island coast forest desert meadow wetland crow sparrow oak maple rose lily granite marble "
    "gothic baroque century king queen river valley lake north south east west"
).split()
QUESTION_STARTS = ["what is the", "where does this", "how tall is the", "which family does this", "when was the"]
BERT_BASE = dict(
    hidden_size=768,
    num_hidden_layers=12,
    num_attention_heads=12,
    intermediate_size=3072,
    max_position_embeddings=512,
    num_labels=2,
    type_vocab_size=3,
    vocab_size=30522,
)


def make_triples(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """n deterministic (question, reference, candidate) triples of E-VQA-like lengths."""
    rng = random.Random(seed)
    triples = []
    for _ in range(n):
        question = f"{rng.choice(QUESTION_STARTS)} {' '.join(rng.choices(WORDS, k=rng.randint(5, 9)))}?"
        reference = " ".join(rng.choices(WORDS, k=rng.randint(1, 4)))
        candidate = " ".join(rng.choices(WORDS, k=rng.randint(1, 12)))
        triples.append((question, reference, candidate))
    return triples


def build_judge(config: dict, vocab_dir: Path, batch_size: int) -> BemJudge:
    """A judge with random weights of the given shape and the shared tiny vocab."""
    tokenizer = AutoTokenizer.from_pretrained(str(vocab_dir), local_files_only=True)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(**config))
    return BemJudge(model, tokenizer, torch.device("cpu"), batch_size=batch_size)


def answers_per_second(run, n: int) -> float:
    """Throughput of `run()`, which scores n answers."""
    start = time.perf_counter()
    run()
    return n / (time.perf_counter() - start)


def measure(name: str, judge: BemJudge, triples, n_single: int, rounds: int) -> dict:
    """Batched and one-at-a-time throughput of one judge: after a warm-up, `rounds` alternating
    measurements of each path (so that load from other processes hits both alike); medians reported."""
    judge.score_batch(triples[: judge.batch_size])
    judge.equivalent(*triples[0])
    batched, single = [], []
    for _ in range(rounds):
        batched.append(answers_per_second(lambda: judge.score_batch(triples), len(triples)))
        single.append(answers_per_second(lambda: [judge.equivalent(*t) for t in triples[:n_single]], n_single))
    lengths = [len(ids) for ids, _ in judge.encode(triples)]
    return {
        "config": name,
        "parameters": sum(p.numel() for p in judge.model.parameters()),
        "batch_size": judge.batch_size,
        "answers_batched": len(triples),
        "answers_single": n_single,
        "rounds": rounds,
        "mean_tokens": sum(lengths) / len(lengths),
        "batched_answers_per_s": statistics.median(batched),
        "single_answers_per_s": statistics.median(single),
        "speedup_batched_vs_single": statistics.median(b / s for b, s in zip(batched, single)),
        "batched_rounds": batched,
        "single_rounds": single,
    }


def markdown(rows: list[dict]) -> str:
    """The results as a markdown table."""
    lines = [
        "| config | params | mean tokens | batched (answers/s) | one at a time (answers/s) | speed-up |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} (batch {r['batch_size']}) | {r['parameters'] / 1e6:.2f} M | "
            f"{r['mean_tokens']:.1f} | {r['batched_answers_per_s']:.1f} | {r['single_answers_per_s']:.1f} | "
            f"{r['speedup_batched_vs_single']:.1f}x |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    """Measure both configs in one run, write bench/out/bem.json and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--answers", type=int, default=128, help="answers per batched round, BERT-base")
    parser.add_argument("--single", type=int, default=32, help="answers per one-at-a-time round, BERT-base")
    parser.add_argument("--tiny-scale", type=int, default=8, help="the tiny config scores this many times more")
    parser.add_argument("--rounds", type=int, default=3, help="alternating measurement rounds per path")
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args(argv)

    tiny_answers, tiny_single = args.answers * args.tiny_scale, args.single * args.tiny_scale
    triples = make_triples(max(args.answers, tiny_answers))
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as vocab_dir:
        write_bert_vocab(vocab_dir, [" ".join(t) for t in triples])
        vocab_size = len((Path(vocab_dir) / "vocab.txt").read_text(encoding="utf-8").splitlines())
        tiny = build_judge({**TINY_BEM, "vocab_size": vocab_size}, Path(vocab_dir), args.batch_size)
        base = build_judge(BERT_BASE, Path(vocab_dir), args.batch_size)
        rows = [
            measure("tiny (models.md 8)", tiny, triples[:tiny_answers], tiny_single, args.rounds),
            measure("BERT-base shape", base, triples[: args.answers], args.single, args.rounds),
        ]
    record = {
        "benchmark": "bem",
        "device": "cpu",
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]},
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "machine": platform.machine(),
        "results": rows,
    }
    atomic_write_json(OUT, record)
    print(markdown(rows))
    print(
        f"\n{torch.get_num_threads()} torch threads; 1-min load average {load_before[0]:.1f} before, "
        f"{record['load_average_1min']['after']:.1f} after (other processes share the CPU); written to {OUT}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
