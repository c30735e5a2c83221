"""Tiny random retrieval encoders written to disk (CLIP tokenizer, EVA-CLIP / CLIP / timm towers) for tests, no hub.

The tiny CLIP tokenizer is a real `CLIPTokenizer` (byte-level BPE, `vocab.json` + `merges.txt`)
with a small vocabulary: the 256 byte symbols, the same with the end-of-word marker `</w>`, one
merge chain per known word, built on top of the merges that already apply to it (so every known
word is a single token and any other text still tokenises byte by byte) and `<|startoftext|>` / `<|endoftext|>`, in CLIP's own vocabulary order.

The tiny EVA-CLIP is a tiny `CLIPModel` whose directory carries a custom-code module
(`modeling_tiny_evaclip.py`, referenced by `auto_map` in config.json) defining
`encode_image(pixel_values)` / `encode_text(input_ids)`, the interface of BAAI/EVA-CLIP-8B's
remote code. The `evaclip_hf` builder therefore loads tiny and real models through the very same
`AutoModel.from_pretrained(path, trust_remote_code=True)` call.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable

from qkvqa.components.registry import register_tiny_code
from qkvqa.components.tiny_tokenizers import BASE_WORDS

CLIP_BOS, CLIP_EOS = "<|startoftext|>", "<|endoftext|>"
END_OF_WORD = "</w>"
TINY_CLIP_MAX_POSITIONS = 77
TINY_TOWER = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)
TINY_PROJECTION_DIM = 16
TINY_IMAGE_SIZE = 224
TINY_PATCH_SIZE = 32
TINY_TIMM = dict(
    architecture="eva_giant_patch14_clip_224",
    img_size=28,
    embed_dim=32,
    depth=2,
    num_heads=4,
    mlp_ratio=2.0,
    num_classes=TINY_PROJECTION_DIM,
)

TINY_EVACLIP_MODULE = "modeling_tiny_evaclip"
TINY_EVACLIP_CODE = '''"""Tiny EVA-CLIP stand-in: a CLIPModel exposing EVA-CLIP-8B's encode_image / encode_text (unnormalised)."""
from transformers import CLIPModel


class TinyEvaCLIPModel(CLIPModel):
    def encode_image(self, pixel_values):
        return self.get_image_features(pixel_values=pixel_values)

    def encode_text(self, input_ids):
        return self.get_text_features(input_ids=input_ids)
'''
register_tiny_code(f"{TINY_EVACLIP_MODULE}.py", TINY_EVACLIP_CODE)  # checked before every load


def _words(texts: Iterable[str]) -> list[str]:
    """Known words: BASE_WORDS, then the words of `texts` (lower-cased, CLIP lower-cases too), first seen first."""
    words = list(BASE_WORDS)
    for text in texts:
        words.extend(re.findall(r"[a-z]+", text.lower()))
    return list(dict.fromkeys(words))


def byte_symbols() -> list[str]:
    """The 256 printable stand-ins of bytes in GPT-2 / CLIP byte-level BPE, in CLIP's vocabulary order: bytes
    that are printable characters stand for themselves, the others map to chr(256 + i) in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(others))]


def _apply_merges(symbols: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Byte-pair merging as CLIP's tokenizer does it: repeatedly merge the lowest-ranked adjacent pair."""
    while len(symbols) > 1:
        pairs = [(ranks[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in ranks]
        if not pairs:
            break
        _, i = min(pairs)
        symbols = symbols[:i] + [symbols[i] + symbols[i + 1]] + symbols[i + 2 :]
    return symbols


def write_clip_tokenizer(out_dir: str | Path, texts: Iterable[str] = ()) -> Path:
    """Write a small byte-level BPE CLIP tokenizer (see the module docstring) into `out_dir`."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    symbols = byte_symbols()
    vocab = symbols + [s + END_OF_WORD for s in symbols]
    known = set(vocab)
    ranks: dict[tuple[str, str], int] = {}
    for word in _words(texts):
        symbols = _apply_merges(list(word[:-1]) + [word[-1] + END_OF_WORD], ranks)
        while len(symbols) > 1:  # new merges rank after every existing one, so they run last
            merged = symbols[0] + symbols[1]
            if (symbols[0], symbols[1]) not in ranks:
                ranks[(symbols[0], symbols[1])] = len(ranks)
                if merged not in known:
                    known.add(merged)
                    vocab.append(merged)
            symbols = [merged] + symbols[2:]
    merges = sorted(ranks, key=ranks.get)
    vocab += [CLIP_BOS, CLIP_EOS]
    (out_dir / "vocab.json").write_text(json.dumps({token: i for i, token in enumerate(vocab)}), encoding="utf-8")
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "CLIPTokenizer",
                "bos_token": CLIP_BOS,
                "eos_token": CLIP_EOS,
                "unk_token": CLIP_EOS,
                "pad_token": CLIP_EOS,
                "model_max_length": TINY_CLIP_MAX_POSITIONS,
                "errors": "replace",
            }
        ),
        encoding="utf-8",
    )
    return out_dir


def _tiny_clip_model(out_dir: Path, seed: int):
    """A random tiny CLIPModel sized to the tokenizer already written in `out_dir`."""
    import torch
    from transformers import CLIPConfig, CLIPModel, CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(str(out_dir))
    config = CLIPConfig(
        text_config=dict(
            vocab_size=len(tokenizer),
            max_position_embeddings=TINY_CLIP_MAX_POSITIONS,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **TINY_TOWER,
        ),
        vision_config=dict(image_size=TINY_IMAGE_SIZE, patch_size=TINY_PATCH_SIZE, **TINY_TOWER),
        projection_dim=TINY_PROJECTION_DIM,
    )
    torch.manual_seed(seed)
    return CLIPModel(config)


def write_tiny_clip(out_dir: str | Path, seed: int = 0, texts: Iterable[str] = ()) -> Path:
    """Write a random tiny `CLIPModel` and its tokenizer (loadable with CLIPModel.from_pretrained)."""
    out_dir = write_clip_tokenizer(out_dir, texts)
    _tiny_clip_model(out_dir, seed).save_pretrained(str(out_dir))
    return out_dir


def write_tiny_evaclip(out_dir: str | Path, seed: int = 0, texts: Iterable[str] = ()) -> Path:
    """Write a tiny EVA-CLIP stand-in: tiny CLIPModel weights + the custom-code module + auto_map."""
    out_dir = write_tiny_clip(out_dir, seed, texts)
    (out_dir / f"{TINY_EVACLIP_MODULE}.py").write_text(TINY_EVACLIP_CODE, encoding="utf-8")
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["architectures"] = ["TinyEvaCLIPModel"]
    config["auto_map"] = {"AutoModel": f"{TINY_EVACLIP_MODULE}.TinyEvaCLIPModel"}
    config_path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return out_dir


def write_tiny_timm(out_dir: str | Path, seed: int = 0) -> Path:
    """Write a random tiny timm EVA CLIP tower (timm's `save_for_hf` layout: config.json + model.safetensors)."""
    import timm
    import torch
    from timm.models import save_for_hf

    args = dict(TINY_TIMM)
    architecture = args.pop("architecture")
    torch.manual_seed(seed)
    model = timm.create_model(architecture, pretrained=False, **args)
    save_for_hf(model, str(out_dir), safe_serialization=True)
    return Path(out_dir)
