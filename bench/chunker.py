"""Benchmark: CDA chunker throughput (sections/s) beside the raw generator tokenizer's on the same sections.

Usage: .venv/bin/python bench/chunker.py [--sections 3000] [--repeats 5] [--corpus FILE ...]

The chunker splits each section into sentences (spaCy blank English + sentencizer) and greedily
packs them into chunks of at most L generator tokens, counting every sentence with the generator
tokenizer; the baseline counts the tokens of each whole section once with the same counting call.
Both run in this process, single-threaded, interleaved, after a warm-up; throughput is sections
per second of process CPU time (median of `--repeats` runs), so that other processes sharing the
cores do not skew the ratio. Two tokenizers: the tiny generators' byte-level BPE and a realistic
byte-level BPE (Qwen2 / GPT-4 style pre-tokenizer, vocabulary up to 16k; about 2.9k from the paper
text) trained offline on the corpus itself. Sections are paragraphs of real English prose (the
QKVQA paper text when it is beside this checkout, else this repository's docs), grouped 1-4
paragraphs per section. Writes bench/out/chunker.json and bench/out/chunker.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time
from pathlib import Path

OUT_DIR = Path(__file__).resolve().parent / "out"
REPO = Path(__file__).resolve().parents[1]
PAPER = REPO.parent / "shared" / "paper" / "qkvqa-paper.txt"
L_VALUES = (60, 90)  # E-VQA, InfoSeek
GOAL = 0.5  # chunker throughput / tokenizer throughput
# Qwen2's pre-tokenizer pattern (splits before spaces, so sentence token counts add up).
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+"
)


def default_corpus() -> list[Path]:
    """The paper text when present, else the repository's prose (README and docs)."""
    if PAPER.exists():
        return [PAPER]
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def make_sections(files: list[Path], count: int, seed: int = 0) -> list[str]:
    """`count` sections of 1-4 prose paragraphs (lines of 200+ characters), joined by newlines."""
    paragraphs = [
        line.strip()
        for f in files
        for line in f.read_text(encoding="utf-8").splitlines()
        if len(line.strip()) >= 200 and not line.lstrip().startswith(("|", "```", "#", "-", "*"))
    ]
    if not paragraphs:
        raise SystemExit(f"no prose paragraphs in {files}")
    rng = random.Random(seed)
    return ["\n".join(rng.sample(paragraphs, min(len(paragraphs), rng.randint(1, 4)))) for _ in range(count)]


def realistic_counter(paragraphs: list[str]):
    """count_tokens of a byte-level BPE trained on the corpus, through the generator's counting path."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from qkvqa.generation.backends import LLAMA3_SPECIAL_TOKENS, Llama3Format

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.train_from_iterator(
        paragraphs,
        trainers.BpeTrainer(
            vocab_size=16000, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        ),
    )
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|end_of_text|>")
    tokenizer.add_special_tokens({"additional_special_tokens": list(LLAMA3_SPECIAL_TOKENS)})  # kind llama3 needs them
    return Llama3Format(tokenizer).count_tokens, backend.get_vocab_size()


def tiny_counter():
    """count_tokens of the tiny generators' tokenizer (byte-level, one token per UTF-8 byte)."""
    import tempfile

    from transformers import AutoTokenizer

    from qkvqa.generation.backends import Llama3Format
    from qkvqa.generation.tiny import write_tiny_llama3

    path = write_tiny_llama3(Path(tempfile.mkdtemp(prefix="bench-chunker-")))
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    return Llama3Format(tokenizer).count_tokens, len(tokenizer)


def cpu_seconds(fn) -> float:
    """Process CPU time of one call of fn() (robust to other processes sharing the cores)."""
    started = time.process_time()
    fn()
    return time.process_time() - started


def measure(name: str, count_tokens, vocab: int, splitter, sections: list[str], repeats: int) -> list[dict]:
    """Tokenizer, splitter and chunker throughput for one tokenizer at each L."""
    from qkvqa.cda.chunker import Chunker

    chunkers = {L: Chunker(splitter, count_tokens, L) for L in L_VALUES}
    for chunker in chunkers.values():  # warm-up: spaCy vocab, tokenizer caches
        chunker.chunk_texts(sections)
    tokens = [count_tokens(s) for s in sections]
    rows = []
    for L, chunker in chunkers.items():
        seconds = {"tokenizer": [], "splitter": [], "chunker": []}
        for _ in range(repeats):  # interleaved, so drift hits all three alike
            seconds["tokenizer"].append(cpu_seconds(lambda: [count_tokens(s) for s in sections]))
            seconds["splitter"].append(cpu_seconds(lambda: splitter.split_many(sections)))
            seconds["chunker"].append(cpu_seconds(lambda: chunker.chunk_texts(sections)))
        best = {k: len(sections) / statistics.median(v) for k, v in seconds.items()}
        chunks = [c for per_section in chunker.chunk_texts(sections) for c in per_section]
        rows.append(
            {
                "tokenizer": name,
                "vocab": vocab,
                "L": L,
                "sections": len(sections),
                "mean_section_tokens": sum(tokens) / len(tokens),
                "chunks": len(chunks),
                "mean_chunk_tokens": sum(n for _, n in chunks) / len(chunks),
                "over_L_chunks": sum(n > L for _, n in chunks),
                "tokenizer_sections_per_s": best["tokenizer"],
                "splitter_sections_per_s": best["splitter"],
                "chunker_sections_per_s": best["chunker"],
                "ratio": best["chunker"] / best["tokenizer"],
                "goal": GOAL,
                "meets_goal": best["chunker"] / best["tokenizer"] >= GOAL,
            }
        )
    return rows


def markdown(rows: list[dict]) -> str:
    """The results as a markdown table."""
    lines = [
        "| tokenizer | L | sections | tokens/section | chunks | tokens/chunk | tokenizer sec/s | "
        "splitter sec/s | chunker sec/s | chunker / tokenizer |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tokenizer']} (vocab {r['vocab']}) | {r['L']} | {r['sections']} | "
            f"{r['mean_section_tokens']:.0f} | {r['chunks']} | {r['mean_chunk_tokens']:.1f} | "
            f"{r['tokenizer_sections_per_s']:.0f} | {r['splitter_sections_per_s']:.0f} | "
            f"{r['chunker_sections_per_s']:.0f} | {r['ratio']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--corpus", nargs="*", type=Path, default=None, help="prose files (default: see module doc)")
    args = parser.parse_args()
    import torch

    from qkvqa.cda.splitter import SentenceSplitter

    torch.set_num_threads(1)
    corpus = args.corpus or default_corpus()
    sections = make_sections(corpus, args.sections)
    splitter = SentenceSplitter()
    realistic, realistic_vocab = realistic_counter(sections)
    tiny, tiny_vocab = tiny_counter()
    rows = measure("tiny byte-level", tiny, tiny_vocab, splitter, sections, args.repeats) + measure(
        "trained byte-level BPE", realistic, realistic_vocab, splitter, sections, args.repeats
    )
    result = {
        "benchmark": "chunker",
        "corpus": [str(p) for p in corpus],
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "TOKENIZERS_PARALLELISM": os.environ.get("TOKENIZERS_PARALLELISM"),
        "repeats": args.repeats,
        "rows": rows,
    }
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    (OUT_DIR / "chunker.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    table = markdown(rows)
    (OUT_DIR / "chunker.md").write_text(table, encoding="utf-8")
    print(table, end="")


if __name__ == "__main__":
    main()
