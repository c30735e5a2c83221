"""Tiny tokenizers written to disk for tests and demos (no hub): a BERT WordPiece vocab.txt."""

from __future__ import annotations

import json
import re
import string
from pathlib import Path
from typing import Iterable, Optional

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

# Common English words; together with single characters and '##' pieces any text tokenises.
BASE_WORDS = """
the a an of and or in on at to for from by with is are was were be been has have had it its this that these
those what which who whom whose where when why how many much does do did can could would should will not no
yes one two three four five six seven eight nine ten first second third year years name named called known
article section title wiki answer question image picture photo shown show located built found live lives
species family genus bird plant fish shell insect landmark tree flower animal building city country river
color colour red green blue yellow black white orange purple brown grey gray pink large small long tall short
height length weight wingspan size diet habitat history description location population range native found
during between after before about around near most more less than also which often usually typically
""".split()


def _normalise_words(texts: Iterable[str]) -> list[str]:
    words: list[str] = []
    for text in texts:
        words.extend(re.findall(r"[a-z0-9]+", text.lower()))
    return words


def write_bert_vocab(out_dir: str | Path, extra_texts: Iterable[str] = (), max_words: Optional[int] = None) -> Path:
    """Write vocab.txt + tokenizer_config.json for an uncased BERT tokenizer; returns the directory.

    The vocabulary is the special tokens, every ASCII letter and digit (plain and `##`), the
    punctuation characters, BASE_WORDS and the most frequent words of `extra_texts`.
    """
    from collections import Counter

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    chars = list(string.ascii_lowercase + string.digits)
    vocab = list(BERT_SPECIALS) + chars + ["##" + c for c in chars] + list(string.punctuation)
    seen = set(vocab)
    counts = Counter(_normalise_words(extra_texts))
    extra = [w for w, _ in counts.most_common(max_words)]
    for word in BASE_WORDS + extra:
        if word not in seen:
            seen.add(word)
            vocab.append(word)
    (out_dir / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "BertTokenizer", "do_lower_case": True, "model_max_length": 512}),
        encoding="utf-8",
    )
    return out_dir


def load_bert_tokenizer(path: str | Path, add_dec_token: bool = False):
    """Load a BERT tokenizer from a directory; optionally add BLIP-2's `[DEC]` bos token."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    if add_dec_token and tok.bos_token is None:
        tok.add_special_tokens({"bos_token": "[DEC]"})
    return tok
