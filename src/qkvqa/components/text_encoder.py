"""A BERT text encoder component (tokenizer + encoder, [CLS] features, L2-normalised)."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from qkvqa.components.registry import ComponentSpec, register_component, resolve_pretrained, tiny_model
from qkvqa.components.tiny_tokenizers import write_bert_vocab

TINY_BERT = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, max_position_embeddings=128
)


class BertTextEncoder:
    """Encodes texts into L2-normalised [CLS] vectors with a BERT model."""

    def __init__(self, model, tokenizer, device, max_length: int = 512):
        self.model = model.eval().to(device)
        self.tokenizer = tokenizer
        self.device = device
        self.max_length = max_length

    @property
    def dim(self) -> int:
        """Size of the output vectors."""
        return self.model.config.hidden_size

    def encode(self, texts: Sequence[str], batch_size: int = 32):
        """Return a float32 tensor [N, dim] of L2-normalised [CLS] features."""
        import torch
        import torch.nn.functional as F

        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                batch = self.tokenizer(
                    list(texts[i : i + batch_size]),
                    padding=True,
                    truncation=True,
                    max_length=self.max_length,
                    return_tensors="pt",
                ).to(self.device)
                hidden = self.model(**batch).last_hidden_state[:, 0]
                out.append(F.normalize(hidden.float(), dim=-1).cpu())
        return torch.cat(out) if out else torch.zeros(0, self.dim)

    def save_pretrained(self, path: str | Path) -> None:
        """Write model and tokenizer so that `pretrained: path` loads them back (with the umask's file modes)."""
        from qkvqa.utils.io import make_shareable

        self.model.save_pretrained(str(path))
        self.tokenizer.save_pretrained(str(path))
        make_shareable(path)


def write_tiny_bert(out_dir: Path, texts: Sequence[str] = (), seed: int = 0, **overrides) -> Path:
    """Write a random tiny BERT model and its vocab to `out_dir`."""
    import torch
    from transformers import BertConfig, BertModel

    write_bert_vocab(out_dir, texts)
    vocab_size = len((out_dir / "vocab.txt").read_text(encoding="utf-8").splitlines())
    torch.manual_seed(seed)
    BertModel(BertConfig(vocab_size=vocab_size, **{**TINY_BERT, **overrides})).save_pretrained(str(out_dir))
    return out_dir


@register_component("bert_text_encoder")
def build_bert_text_encoder(spec: ComponentSpec) -> BertTextEncoder:
    """Load a BERT encoder from `pretrained`, or write a tiny random one and load it the same way."""
    from transformers import AutoModel, AutoTokenizer

    if spec.tiny:
        path = str(tiny_model(spec, write_tiny_bert, spec.options.get("vocab_texts", ()), spec.options.get("seed", 0)))
        local_only = True
    else:
        path = resolve_pretrained(spec)
        local_only = not spec.allow_download
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local_only)
    model = AutoModel.from_pretrained(path, dtype=spec.torch_dtype(), local_files_only=local_only)
    return BertTextEncoder(model, tokenizer, spec.torch_device(), int(spec.options.get("max_length", 512)))
