"""BEM answer-equivalence judge in PyTorch with the official input contract, registered as component kind `bem`.

Input (metrics.md section 2.5): the raw strings, each wordpiece-tokenised on its own, laid out as
`[CLS] candidate [SEP] reference [SEP] question [SEP]`, segment ids 0 / 1 / 2 (each `[SEP]` takes the
id of its segment). A model with fewer than 3 token types (e.g. `kortukov/answer-equivalence-bem`)
gets 0 / 1 (reference and question share 1), and its label says "approximate". The score is
softmax(logits)[1]; E-VQA counts a score >= 0.5 as correct (threshold applied by the caller).

Length: the official model pads to 512 and fails on anything longer. qkvqa's default
(`overflow: raise`) raises a DataError naming the lengths. `overflow: truncate` instead drops tokens
from the end of the longest segment until the input fits, counts every truncated input in
`truncated_count` and logs a warning with the count. No input is ever truncated silently.
Every result is a "BEM (PyTorch reproduction)": no public PyTorch checkpoint reproduces TF-Hub BEM.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from qkvqa.components.hub import check_head
from qkvqa.components.registry import ComponentSpec, register_kind, resolve_pretrained, tiny_model
from qkvqa.components.tiny_tokenizers import write_bert_vocab
from qkvqa.errors import ConfigError, DataError, MissingWeightsError
from qkvqa.metrics.judge import JudgeKind
from qkvqa.utils.logging import get_logger
from qkvqa.utils.progress import progress

log = get_logger(__name__)

DEFAULT_PRETRAINED = "kortukov/answer-equivalence-bem"
BEM_LABEL = "BEM (PyTorch reproduction)"
APPROXIMATE_LABEL = f"{BEM_LABEL}, approximate: segment ids 0/1 (model has fewer than 3 token types)"
OFFICIAL_MAX_LENGTH = 512
OVERFLOW_POLICIES = ("raise", "truncate")
# models.md section 8; three token types so that the official 0/1/2 segment path is what tests exercise.
TINY_BEM = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=512,
    num_labels=2,
    type_vocab_size=3,
)
OPTIONS = {"batch_size", "overflow", "vocab_texts", "seed", "type_vocab_size", "max_position_embeddings"}

Triple = tuple[str, str, str]  # (question, reference, candidate), the order of `equivalent`'s arguments


class BemJudge:
    """Scores (question, reference, candidate) triples with a BERT sequence classifier, batched."""

    def __init__(self, model, tokenizer, device, batch_size: int = 32, overflow: str = "raise"):
        if overflow not in OVERFLOW_POLICIES:
            raise ConfigError(f"bem: options.overflow must be one of {list(OVERFLOW_POLICIES)}, got {overflow!r}")
        self.model = model.eval().to(device)
        self.tokenizer = tokenizer
        self.device = device
        self.batch_size = int(batch_size)
        self.overflow = overflow
        self.max_length = min(OFFICIAL_MAX_LENGTH, int(model.config.max_position_embeddings))
        self.three_segments = int(model.config.type_vocab_size) >= 3
        self.label = BEM_LABEL if self.three_segments else APPROXIMATE_LABEL
        self.truncated_count = 0
        if not self.three_segments:
            log.warning(
                "BEM model has type_vocab_size=%d < 3: the question gets segment id 1, not 2; results are labelled %r",
                model.config.type_vocab_size,
                self.label,
            )

    def _token_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """Wordpiece ids of each text on its own; `[SEP]` written in an answer stays text, as in tf-text."""
        if not texts:
            return []
        return self.tokenizer(list(texts), add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def _fit(self, segments: list[list[int]], index: int) -> list[list[int]]:
        """Apply the overflow policy to one input's (candidate, reference, question) token lists."""
        excess = sum(map(len, segments)) + 4 - self.max_length
        if excess <= 0:
            return segments
        if self.overflow == "raise":
            raise DataError(
                f"BEM input {index} has {excess + self.max_length} tokens (candidate {len(segments[0])}, reference "
                f"{len(segments[1])}, question {len(segments[2])}, 4 special) > {self.max_length}; the official BEM "
                "fails here. Shorten the answer or build the judge with options.overflow: truncate"
            )
        segments = [list(s) for s in segments]
        for _ in range(excess):
            max(segments, key=len).pop()
        self.truncated_count += 1
        return segments

    def encode(self, triples: Sequence[Triple]) -> list[tuple[list[int], list[int]]]:
        """(input_ids, token_type_ids) per triple, unpadded, in the official layout."""
        questions, references, candidates = zip(*triples) if triples else ((), (), ())
        question_type = 2 if self.three_segments else 1
        cls, sep = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        truncated_before = self.truncated_count
        encoded = []
        for index, segments in enumerate(
            zip(self._token_ids(candidates), self._token_ids(references), self._token_ids(questions))
        ):
            candidate, reference, question = self._fit(list(segments), index)
            input_ids = [cls, *candidate, sep, *reference, sep, *question, sep]
            token_types = (
                [0] * (len(candidate) + 2) + [1] * (len(reference) + 1) + [question_type] * (len(question) + 1)
            )
            encoded.append((input_ids, token_types))
        if self.truncated_count > truncated_before:
            log.warning(
                "BEM: truncated %d of %d inputs to %d tokens (%d truncated so far)",
                self.truncated_count - truncated_before,
                len(encoded),
                self.max_length,
                self.truncated_count,
            )
        return encoded

    def collate(self, encoded: Sequence[tuple[list[int], list[int]]]) -> dict:
        """Right-pad a batch to its longest input: input_ids, token_type_ids, attention_mask tensors."""
        import torch

        width = max(len(ids) for ids, _ in encoded)
        pad = self.tokenizer.pad_token_id
        input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
        token_type_ids = torch.zeros((len(encoded), width), dtype=torch.long)
        attention_mask = torch.zeros((len(encoded), width), dtype=torch.long)
        for row, (ids, types) in enumerate(encoded):
            input_ids[row, : len(ids)] = torch.tensor(ids)
            token_type_ids[row, : len(types)] = torch.tensor(types)
            attention_mask[row, : len(ids)] = 1
        return {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}

    def score_batch(self, triples: Sequence[Triple]) -> list[float]:
        """P(equivalent) = softmax(logits)[1] for each (question, reference, candidate), in input order.

        Inputs are sorted by length and scored `batch_size` at a time to limit padding.
        """
        import torch

        encoded = self.encode(triples)
        order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]))
        scores = [0.0] * len(encoded)
        starts = range(0, len(order), self.batch_size)
        batches = progress(starts, desc="BEM", unit="batch") if len(starts) >= 10 else starts
        with torch.inference_mode():
            for start in batches:
                chunk = order[start : start + self.batch_size]
                batch = {k: v.to(self.device) for k, v in self.collate([encoded[i] for i in chunk]).items()}
                probabilities = torch.softmax(self.model(**batch).logits.float(), dim=-1)[:, 1].cpu().tolist()
                for i, p in zip(chunk, probabilities):
                    scores[i] = p
        return scores

    def equivalent(self, question: str, reference: str, candidate: str) -> float:
        """P(candidate is equivalent to reference, given the question)."""
        return self.score_batch([(question, reference, candidate)])[0]

    def save_pretrained(self, path: str | Path) -> None:
        """Write model and tokenizer so that `pretrained: path` loads them back (with the umask's file modes)."""
        from qkvqa.utils.io import make_shareable

        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))
        make_shareable(path)


def write_tiny_bem(out_dir: Path, texts: Sequence[str] = (), seed: int = 0, **overrides) -> Path:
    """Write a random tiny BertForSequenceClassification (2 labels) and its vocab to `out_dir`."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    write_bert_vocab(out_dir, texts)
    vocab_size = len((Path(out_dir) / "vocab.txt").read_text(encoding="utf-8").splitlines())
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = BertForSequenceClassification(BertConfig(vocab_size=vocab_size, **{**TINY_BEM, **overrides}))
    model.save_pretrained(str(out_dir))
    return Path(out_dir)


def _check_tokenizer_files(path: str) -> None:
    directory = Path(path)
    if directory.is_dir() and not any((directory / f).exists() for f in ("vocab.txt", "tokenizer.json")):
        raise MissingWeightsError(
            f"component 'bem': {path} has no tokenizer (vocab.txt or tokenizer.json); save the "
            "tokenizer beside the model (`tokenizer.save_pretrained(dir)`)"
        )


def build_bem(spec: ComponentSpec) -> BemJudge:
    """Load a BEM judge from `pretrained` (kortukov/answer-equivalence-bem or a local BERT sequence-classifier
    directory), or write a tiny random one and load it through the same path.

    Options: batch_size (32), overflow (raise | truncate); tiny only: vocab_texts, seed (0),
    type_vocab_size (3), max_position_embeddings (512, as the real BEM).
    """
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    unknown = set(spec.options) - OPTIONS
    if unknown:
        raise ConfigError(f"component 'bem': unknown option(s) {sorted(unknown)}; valid: {sorted(OPTIONS)}")
    if spec.tiny:
        overrides = {
            k: int(spec.options[k]) for k in ("type_vocab_size", "max_position_embeddings") if k in spec.options
        }
        path = str(
            tiny_model(
                spec, write_tiny_bem, spec.options.get("vocab_texts", ()), int(spec.options.get("seed", 0)), **overrides
            )
        )
        local_only = True
    else:
        path = resolve_pretrained(spec)
        local_only = not spec.allow_download
        _check_tokenizer_files(path)
        if os.path.isdir(path):  # BEM reads softmax(logits)[:, 1] of a two-label classifier: another head is refused
            check_head(path, "components.judge", ("ForSequenceClassification",), num_labels=2)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    model = AutoModelForSequenceClassification.from_pretrained(
        path, dtype=spec.torch_dtype(), local_files_only=local_only
    )
    if model.config.num_labels != 2:
        raise ConfigError(
            f"component 'bem': {path} has {model.config.num_labels} labels; BEM needs 2 (not equivalent, equivalent)"
        )
    judge = BemJudge(
        model,
        tokenizer,
        spec.torch_device(),
        int(spec.options.get("batch_size", 32)),
        spec.options.get("overflow", "raise"),
    )
    log.info("BEM judge from %s on %s: %s", "a tiny random model" if spec.tiny else path, judge.device, judge.label)
    return judge


class BemKind(JudgeKind):
    """BEM, the E-VQA answer-equivalence judge (build_bem)."""

    name = "bem"

    def build(self, spec: ComponentSpec) -> BemJudge:
        """The judge."""
        return build_bem(spec)


register_kind(BemKind())
