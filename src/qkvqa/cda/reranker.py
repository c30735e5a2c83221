"""Chunk reranker (kind `bge_reranker`): BGE-Reranker-v2-m3 via FlagEmbedding, or a native transformers port of its scoring rules."""

from __future__ import annotations

import math
import os
import string
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Optional, Sequence

from qkvqa.components.hub import check_head, check_tokenizer_files
from qkvqa.components.registry import ComponentKind, ComponentSpec, register_kind, resolve_pretrained, tiny_model
from qkvqa.components.tiny_tokenizers import BASE_WORDS
from qkvqa.errors import ConfigError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

BACKENDS = ("flagembedding", "native")
OPTION_KEYS = {"backend", "batch_size", "max_length", "normalize", "query_max_length", "seed"}
DEFAULT_BATCH_SIZE = 64
DEFAULT_MAX_LENGTH = 512
BGE_M3_POSITIONS = 8192  # BGE-Reranker-v2-m3 (XLM-R) reads pairs of up to 8192 tokens

# The tiny XLM-R cross-encoder of models.md section 8, with BGE-M3's 8192 positions (they start at pad + 1, hence
# + 2), so that OMGM's 6000-token top-1 section pairs fit as they do in the real model; a wide initialisation
# spreads its random scores, so that backend comparisons are not trivially equal.
TINY_XLMR = dict(
    hidden_size=32,
    num_hidden_layers=2,
    num_attention_heads=4,
    intermediate_size=64,
    max_position_embeddings=BGE_M3_POSITIONS + 2,
    type_vocab_size=1,
    pad_token_id=1,
    bos_token_id=0,
    eos_token_id=2,
    num_labels=1,
    initializer_range=0.5,
)


def sigmoid(x: float) -> float:
    """1 / (1 + exp(-x)) without overflow for large |x|."""
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


class Reranker(ABC):
    """Scores (query, passage) pairs; subclasses implement `_score` on a non-empty list of pairs.

    `score(pairs, batch_size=None, max_length=None, normalize=None)` returns one float per pair, in
    input order; each keyword defaults to the value given at construction. `normalize` applies the
    sigmoid (Eq. 12). The query is truncated to `query_max_length` tokens (default
    `max_length * 3 // 4`), the pair to `max_length` tokens by truncating the passage.
    """

    def __init__(
        self,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_length: int = DEFAULT_MAX_LENGTH,
        normalize: bool = True,
        query_max_length: Optional[int] = None,
    ):
        self.batch_size = batch_size
        self.max_length = max_length
        self.normalize = normalize
        self.query_max_length = query_max_length
        self.positions: Optional[int] = None  # the longest pair the model reads (set by the subclasses)

    def score(
        self,
        pairs: Sequence[tuple[str, str]],
        batch_size: Optional[int] = None,
        max_length: Optional[int] = None,
        normalize: Optional[bool] = None,
    ) -> list[float]:
        """One score per (query, passage) pair, in input order."""
        pairs = [(str(q), str(p)) for q, p in pairs]
        if not pairs:
            return []
        max_length = self.max_length if max_length is None else int(max_length)
        if self.positions is not None and max_length > self.positions:
            raise ConfigError(
                f"the reranker reads pairs of at most {self.positions} tokens, but {max_length} were "
                "asked for (cda.reranker_max_length / cda.top1_section_max_length); lower it"
            )
        query_max_length = self.query_max_length if self.query_max_length is not None else max_length * 3 // 4
        return self._score(
            pairs,
            self.batch_size if batch_size is None else int(batch_size),
            max_length,
            query_max_length,
            self.normalize if normalize is None else bool(normalize),
        )

    @abstractmethod
    def _score(
        self, pairs: list[tuple[str, str]], batch_size: int, max_length: int, query_max_length: int, normalize: bool
    ) -> list[float]:
        """Scores of a non-empty list of pairs, with every setting resolved."""


class ChunkScorerKind(ComponentKind):
    """The chunk scorer extension point (`components.reranker`): `build(spec)` returns a `Reranker`, whose `_score`
    gives one float per (query, passage) pair. A user's is a subclass named by import path (docs/extending.md)."""

    point = "chunk_scorer"


class FlagEmbeddingReranker(Reranker):
    """FlagEmbedding's `FlagReranker` on one explicit device (no multi-process pool), fp16 only on GPU."""

    def __init__(self, path: str, device: str, use_fp16: bool, **defaults):
        from FlagEmbedding import FlagReranker

        _silence_flag_progress_bars()
        super().__init__(**defaults)
        self.device = device
        self.model = FlagReranker(
            path,
            use_fp16=use_fp16,
            devices=[device],
            batch_size=self.batch_size,
            max_length=self.max_length,
            query_max_length=self.query_max_length,
            normalize=self.normalize,
        )
        # FlagReranker tokenizes, then pads with `tokenizer.pad`, which makes transformers print "You're using a
        # XLMRobertaTokenizerFast tokenizer ... faster than ... `pad`" once per run: advice for FlagEmbedding, not
        # for our users. The tokenizer's own once-only record of that advice is set, as if it had been given.
        tokenizer = getattr(self.model, "tokenizer", None)
        if isinstance(getattr(tokenizer, "deprecation_warnings", None), dict):
            tokenizer.deprecation_warnings["Asking-to-pad-a-fast-tokenizer"] = True
        self.positions = pair_positions(getattr(self.model.model, "config", None))

    def _score(self, pairs, batch_size, max_length, query_max_length, normalize):
        scores = self.model.compute_score(
            pairs, batch_size=batch_size, max_length=max_length, query_max_length=query_max_length, normalize=normalize
        )
        return [float(s) for s in scores]


def pair_positions(config: Any) -> Optional[int]:
    """The longest token sequence a cross-encoder's position table holds (RoBERTa-style tables start at pad + 1)."""
    positions = getattr(config, "max_position_embeddings", None)
    if positions is None:
        return None
    offset = int(getattr(config, "pad_token_id", 0) or 0) + 1 if config.model_type in ("xlm-roberta", "roberta") else 0
    return int(positions) - offset


def _silence_flag_progress_bars() -> None:
    """FlagReranker draws two bars per call with at least a batch of pairs ("pre tokenize" from `trange`, "Compute
    Scores" from `tqdm`); the pipeline calls it once per question, so an evaluation printed a bar per question.
    FlagEmbedding 1.4.2 has no switch for them: `compute_score` and the constructor take none, and each bar is built
    with `disable=len(pairs) < batch_size` passed explicitly, which overrides tqdm's TQDM_DISABLE default. So both
    names its scoring module imported are replaced, in that module only, by disabled bars (the per-question loop has
    its own progress lines); tests/integration/test_evaluate.py checks that no bar is left in an evaluation's output."""
    import FlagEmbedding.inference.reranker.encoder_only.base as flag_base
    from tqdm import tqdm, trange

    def quiet(bar):
        def make(*args, **kwargs):
            kwargs["disable"] = True
            return bar(*args, **kwargs)

        return make

    flag_base.tqdm, flag_base.trange = quiet(tqdm), quiet(trange)


class NativeReranker(Reranker):
    """FlagReranker's encoder-only scoring rules reimplemented with transformers (models.md section 4).

    Query and passage are tokenised without special tokens (query truncated to `query_max_length`,
    passage to `max_length`), combined by `prepare_for_model(..., truncation="only_second")`,
    sorted by length, padded per batch; the score is `logits.view(-1).float()`, sigmoid if normalised.
    """

    def __init__(self, model, tokenizer, device, **defaults):
        super().__init__(**defaults)
        self.model = model.eval().to(device)
        self.tokenizer = tokenizer
        self.device = device
        self.positions = pair_positions(model.config)

    def _score(self, pairs, batch_size, max_length, query_max_length, normalize):
        import torch

        tok = self.tokenizer
        query_ids = tok([q for q, _ in pairs], add_special_tokens=False, max_length=query_max_length, truncation=True)[
            "input_ids"
        ]
        passage_ids = tok([p for _, p in pairs], add_special_tokens=False, max_length=max_length, truncation=True)[
            "input_ids"
        ]
        items = [
            tok.prepare_for_model(q, p, truncation="only_second", max_length=max_length, padding=False)
            for q, p in zip(query_ids, passage_ids)
        ]
        order = sorted(range(len(items)), key=lambda i: -len(items[i]["input_ids"]))
        scores = [0.0] * len(items)
        with torch.inference_mode():
            for start in range(0, len(order), batch_size):
                batch_index = order[start : start + batch_size]
                features = {key: [items[i][key] for i in batch_index] for key in items[batch_index[0]]}
                inputs = tok.pad(features, padding=True, return_tensors="pt").to(self.device)
                logits = self.model(**inputs, return_dict=True).logits.view(-1).float().cpu().tolist()
                for i, value in zip(batch_index, logits):
                    scores[i] = value
        return [sigmoid(s) for s in scores] if normalize else scores


def write_tiny_xlmr_reranker(out_dir: Path, words: Sequence[str] = (), seed: int = 0) -> Path:
    """Write a random tiny XLM-R cross-encoder (Unigram tokenizer, one label) loadable by FlagReranker and transformers."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import XLMRobertaConfig, XLMRobertaForSequenceClassification

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    specials = ["<s>", "<pad>", "</s>", "<unk>"]
    pieces = [(token, 0.0) for token in specials]
    seen = set(specials)
    for word in [*BASE_WORDS, *words]:
        piece = "\u2581" + word
        if piece not in seen:
            seen.add(piece)
            pieces.append((piece, -1.0))
    # The word-boundary piece and single characters, so that any ASCII text tokenises without <unk>.
    for piece, logp in [("\u2581", -3.0)] + [
        (c, -5.0) for c in string.ascii_letters + string.digits + string.punctuation
    ]:
        if piece not in seen:
            seen.add(piece)
            pieces.append((piece, logp))
    pieces.append(("<mask>", 0.0))
    backend = Tokenizer(models.Unigram(pieces, unk_id=3))
    backend.pre_tokenizer = pre_tokenizers.Metaspace()
    backend.decoder = decoders.Metaspace()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tokenizer_class = getattr(transformers, "XLMRobertaTokenizerFast", None) or transformers.XLMRobertaTokenizer
    tokenizer = tokenizer_class(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        sep_token="</s>",
        cls_token="<s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        model_max_length=BGE_M3_POSITIONS,
    )
    tokenizer.save_pretrained(str(out_dir))
    torch.manual_seed(seed)
    model = XLMRobertaForSequenceClassification(XLMRobertaConfig(vocab_size=len(pieces), **TINY_XLMR))
    model.save_pretrained(str(out_dir))
    return out_dir


def local_model_dir(spec: ComponentSpec) -> str:
    """A local directory holding the checkpoint: the configured directory, or the hub-cache snapshot of a hub id."""
    ref = resolve_pretrained(spec)
    if os.path.isdir(ref):
        return ref
    from huggingface_hub import snapshot_download

    return snapshot_download(ref, local_files_only=not spec.allow_download)


def build_bge_reranker(spec: ComponentSpec) -> Reranker:
    """The chunk reranker; options: backend (flagembedding | native), batch_size, max_length, normalize, query_max_length.

    On CPU the model runs in fp32 whatever `dtype` says (FlagReranker forces fp16 off there too).
    """
    import torch

    options = dict(spec.options)
    unknown = set(options) - OPTION_KEYS
    if unknown:
        raise ConfigError(
            f"components.reranker.options: unknown key(s) {sorted(unknown)}; valid: {sorted(OPTION_KEYS)}"
        )
    backend = options.get("backend", "flagembedding")
    if backend not in BACKENDS:
        raise ConfigError(f"components.reranker.options.backend: {backend!r} is not one of {', '.join(BACKENDS)}")
    defaults = dict(
        batch_size=int(options.get("batch_size", DEFAULT_BATCH_SIZE)),
        max_length=int(options.get("max_length", DEFAULT_MAX_LENGTH)),
        normalize=bool(options.get("normalize", True)),
        query_max_length=options.get("query_max_length"),
    )
    path = (
        str(tiny_model(spec, write_tiny_xlmr_reranker, seed=int(options.get("seed", 0))))
        if spec.tiny
        else local_model_dir(spec)
    )
    # BGE-Reranker-v2-m3 is a one-logit cross-encoder: FlagReranker and the native port read logits.view(-1), so a
    # two-label classifier would give two scores per pair, shifted onto the next pairs, with no error
    check_head(path, "components.reranker", ("ForSequenceClassification",), num_labels=1)
    check_tokenizer_files(path, "components.reranker")
    device = spec.torch_device()
    dtype = spec.torch_dtype()
    if device.type == "cpu" and dtype != torch.float32:
        log.info("reranker on CPU: running in fp32 instead of %s", spec.dtype)
        dtype = torch.float32
    if backend == "flagembedding":
        if dtype == torch.bfloat16:
            raise ConfigError(
                "components.reranker: FlagReranker runs in fp32 or fp16; set dtype: fp16 or fp32, "
                "or options.backend: native for bf16"
            )
        return FlagEmbeddingReranker(path, str(device), use_fp16=dtype == torch.float16, **defaults)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype, local_files_only=True)
    return NativeReranker(model, tokenizer, device, **defaults)


class BgeRerankerKind(ChunkScorerKind):
    """BGE-Reranker-v2-m3 (build_bge_reranker)."""

    name = "bge_reranker"

    def build(self, spec: ComponentSpec) -> Reranker:
        """The reranker."""
        return build_bge_reranker(spec)

    def preflight(self, role, spec, folder):
        """A local folder's head (one logit) and tokenizer files, checked before stage 1."""
        if folder is not None:
            check_head(folder, f"components.{role}", ("ForSequenceClassification",), num_labels=1)
            check_tokenizer_files(folder, f"components.{role}")


register_kind(BgeRerankerKind())
