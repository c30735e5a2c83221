"""`components.qformer.init: pretrained_here`: the Q-Former's text layers pretrained here by masked-language modelling, cached by input.

A tiny random Q-Former trained on a few hundred questions memorises its training sections and never learns to read
which attribute a held-out question asks for (docs/training.md, "Where section R@1 is lost"); a pretrained BLIP-2
Q-Former starts with a text path that reads. This module makes such a start on this machine, never downloading one:
it builds the Q-Former `components.qformer` names (tiny or real, through the one builder), trains its text path (word
and position embeddings, every layer's self-attention and text feed-forward: `QFFModel.encode_text`) to predict
masked tokens of the KB's candidate sections and of the training questions (BERT's 80/10/10 rule, a head tied to the
word embeddings and dropped afterwards), and writes the result as a plain HF `Blip2ForImageTextRetrieval` directory
that the builder then loads like any pretrained one (`pretrained: DIR`).

The directory is `{paths.cache_dir}/qformer_init/<kind>-<key>`, `key` the sha256 of everything that changes its
weights: the base component (kind, pretrained / tiny, revision, the weight-defining options; a local base directory by
its files' names, sizes and mtimes), the corpus (sha256 of the KB file and of the training-question file, the text
preprocessing), `qff.text_pretrain` and the code (this file, the builder and the model, torch / transformers
versions). Any change gives another key, so another directory, built when first asked for. A reused one is checked:
its record holds the same inputs and the weights' sha256.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Mapping, Optional

from qkvqa.errors import ConfigError, DataError
from qkvqa.utils.derived_cache import code_version, keyed_dir, plain
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

RECORD = "pretrain_here.json"
FORMAT = "qkvqa-qformer-pretrained-here"
# the options of blip2_qff that change the base weights (the rest are runtime settings: qkvqa.qff.builder)
WEIGHT_OPTIONS = (
    "image_size",
    "patch_size",
    "vision_hidden_size",
    "vision_layers",
    "hidden_size",
    "num_layers",
    "num_heads",
    "cross_attention_frequency",
    "num_query_tokens",
    "max_position_embeddings",
    "embed_dim",
    "mlp_ratio",
    "vision_heads",
    "vocab_texts",
    "seed",
    "base_config",
    "tokenizer",
    "vision_checkpoint",
)


def _base_identity(spec: Mapping[str, Any]) -> dict:
    """What names the base weights: kind, tiny or the pretrained reference (a local directory by its files)."""
    options = spec.get("options") or {}
    identity = {
        "kind": spec.get("kind"),
        "tiny": bool(spec.get("tiny")),
        "revision": spec.get("revision"),
        "options": {k: options[k] for k in WEIGHT_OPTIONS if k in options},
    }
    if not spec.get("tiny"):
        ref = os.path.expanduser(str(spec.get("pretrained") or ""))
        identity["pretrained"] = ref
        if os.path.isdir(ref):
            identity["files"] = {
                str(p.relative_to(ref)): [p.stat().st_size, p.stat().st_mtime_ns]
                for p in sorted(Path(ref).rglob("*"))
                if p.is_file()
            }
        elif os.path.isfile(ref):
            identity["files"] = {os.path.basename(ref): [os.path.getsize(ref), os.stat(ref).st_mtime_ns]}
    return identity


def corpus_files(cfg: Any) -> dict[str, Path]:
    """The KB file and the training-question file of `cfg.data` (relative paths read against `data.root`)."""

    def under_root(name: str) -> Path:
        value = getattr(cfg.data, name)
        if not value:
            raise ConfigError(
                f"components.qformer.init=pretrained_here pretrains on data.kb_source and "
                f"data.train_questions; data.{name} is not set"
            )
        path = Path(os.path.expanduser(str(value)))
        if not path.is_absolute() and cfg.data.root:
            path = Path(os.path.expanduser(str(cfg.data.root))) / path
        if not path.is_file():
            raise DataError(f"{path}: no such file (data.{name}, read by components.qformer.init=pretrained_here)")
        return path

    return {"kb": under_root("kb_source"), "train_questions": under_root("train_questions")}


def init_inputs(cfg: Any) -> dict:
    """Every input of the pretrained-here weights of `cfg` (the cache key is their sha256)."""
    from qkvqa.utils.io import sha256_file

    spec = plain(cfg.components.qformer)
    files = corpus_files(cfg)
    return {
        "format": FORMAT,
        "base": _base_identity(spec),
        "corpus": {name: {"sha256": sha256_file(path), "name": path.name} for name, path in files.items()},
        "dataset": cfg.data.dataset,
        "reflectiva_passages": cfg.data.reflectiva_passages,
        "blip_text_preprocess": bool(cfg.qff.blip_text_preprocess),
        "max_text_tokens": int(cfg.qff.max_text_tokens),
        "settings": plain(cfg.qff.text_pretrain),
        "code": code_version(Path(__file__).with_name(n) for n in ("pretrain_here.py", "builder.py", "model.py")),
    }


def cache_dir(cfg: Any, inputs: Mapping[str, Any]) -> Path:
    """Where the pretrained-here weights of `inputs` live: {paths.cache_dir}/qformer_init/<kind>-<key16>."""
    return keyed_dir(cfg, "qformer_init", inputs, "pretrained-here Q-Former")


def corpus_texts(cfg: Any, files: Mapping[str, Path]) -> list[str]:
    """The texts MLM reads: every candidate section string of the KB (as the QFF sees it) and every training question."""
    from qkvqa.data.kb import iter_kb_source, normalise_entry
    from qkvqa.data.questions import read_evqa_csv, read_infoseek_csv
    from qkvqa.data.sections import candidate_sections

    texts = []
    for key, entry, _ in iter_kb_source(files["kb"]):
        title, fields, _ = normalise_entry(key, entry, cfg.data.reflectiva_passages)
        texts += [c.text for c in candidate_sections(title, fields["section_titles"], fields["section_texts"])]
    read = read_evqa_csv if cfg.data.dataset == "evqa" else read_infoseek_csv
    texts += [q.question for q in read(files["train_questions"], split="train")]
    return [t for t in texts if t.strip()]


class MLMHead:
    """BERT's prediction head on the Q-Former's text states: dense + GELU + LayerNorm, decoder tied to the word
    embeddings (plus a bias); dropped after pretraining."""

    def __init__(self, hidden: int, vocab: int, word_embeddings):
        import torch
        from torch import nn

        self.transform = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(), nn.LayerNorm(hidden))
        self.bias = nn.Parameter(torch.zeros(vocab))
        self.word_embeddings = word_embeddings

    def parameters(self) -> list:
        return [*self.transform.parameters(), self.bias]

    def __call__(self, states):
        return self.transform(states) @ self.word_embeddings.weight.t() + self.bias


def mask_tokens(input_ids, attention_mask, tokenizer, mask_prob: float, generator):
    """BERT masking: `mask_prob` of the real (non-special) tokens are targets; of those 80 % become [MASK], 10 % a
    random token, 10 % stay. Returns (inputs, labels with -100 off the targets)."""
    import torch

    special = torch.zeros_like(input_ids, dtype=torch.bool)
    for token_id in tokenizer.all_special_ids:
        special |= input_ids == token_id
    candidates = attention_mask.bool() & ~special
    chosen = (torch.rand(input_ids.shape, generator=generator) < mask_prob) & candidates
    # every text gets at least one target (a short question would otherwise often give none)
    none = ~chosen.any(dim=1) & candidates.any(dim=1)
    if none.any():
        scores = torch.rand(input_ids.shape, generator=generator).masked_fill(~candidates, -1.0)
        chosen[none, scores[none].argmax(dim=1)] = True
    labels = input_ids.masked_fill(~chosen, -100)
    inputs = input_ids.clone()
    roll = torch.rand(input_ids.shape, generator=generator)
    inputs[chosen & (roll < 0.8)] = tokenizer.mask_token_id
    randomised = chosen & (roll >= 0.8) & (roll < 0.9)
    inputs[randomised] = torch.randint(len(tokenizer), input_ids.shape, generator=generator)[randomised]
    return inputs, labels


def text_parameters(model) -> list:
    """The parameters of the Q-Former's text path (`QFFModel.encode_text`): word and position embeddings, the
    embedding LayerNorm, every layer's self-attention and text feed-forward."""
    base = model.base
    params = [*base.embeddings.parameters(), *base.qformer.layernorm.parameters()]
    for layer in base.qformer.encoder.layer:
        params += [*layer.attention.parameters(), *layer.intermediate.parameters(), *layer.output.parameters()]
    seen, unique = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            unique.append(p)
    return unique


def mlm_loss(model, head: MLMHead, inputs, attention_mask, labels):
    """Cross-entropy of the masked tokens."""
    import torch.nn.functional as F

    states = model.encode_text(inputs, attention_mask)
    logits = head(states)
    return F.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1), ignore_index=-100)


def pretrain(component, texts: list[str], settings: Mapping[str, Any], max_text_tokens: int = 512) -> dict:
    """Masked-language modelling of `component`'s text path on `texts` (`qff.text_pretrain` settings), in place;
    returns the MLM loss of a fixed held-aside batch before and after, and the per-step losses' first and last
    tenth means."""
    import torch

    model = component.model
    steps, batch_size = int(settings["steps"]), int(settings["batch_size"])
    max_tokens = min(int(settings["max_tokens"]), max_text_tokens, model.max_text_tokens)
    generator = torch.Generator().manual_seed(int(settings["seed"]))
    torch.manual_seed(int(settings["seed"]))
    tokenizer = component.tokenizer
    encoded = tokenizer([component.prepare_text(t) for t in texts], truncation=True, max_length=max_tokens)["input_ids"]
    order = torch.randperm(len(encoded), generator=generator).tolist()
    probe_rows, train_rows = order[: min(256, len(order) // 10)], order[min(256, len(order) // 10) :] or order

    def batch_of(rows):
        length = max(len(encoded[r]) for r in rows)
        ids = torch.full((len(rows), length), tokenizer.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(encoded[r])] = torch.tensor(encoded[r])
            mask[i, : len(encoded[r])] = 1
        return ids.to(component.device), mask.to(component.device)

    head = MLMHead(model.hidden_size, len(tokenizer), model.base.embeddings.word_embeddings)
    head.transform.to(component.device)
    head.bias.data = head.bias.data.to(component.device)
    params = text_parameters(model)
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(
        [{"params": params, "weight_decay": 0.01}, {"params": head.parameters(), "weight_decay": 0.0}],
        lr=float(settings["lr"]),
    )
    warmup = max(1, steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup)))
    )
    probe_generator = torch.Generator().manual_seed(int(settings["seed"]) + 1)
    probe_ids, probe_mask = batch_of(probe_rows) if probe_rows else batch_of(train_rows[:batch_size])
    probe_inputs, probe_labels = mask_tokens(
        probe_ids.cpu(), probe_mask.cpu(), tokenizer, float(settings["mask_prob"]), probe_generator
    )
    probe_inputs, probe_labels = probe_inputs.to(component.device), probe_labels.to(component.device)

    def probe() -> float:
        model.eval()
        with torch.no_grad():
            return float(mlm_loss(model, head, probe_inputs, probe_mask, probe_labels))

    from qkvqa.utils.progress import progress

    before = probe()
    model.train()
    losses, cursor, started = [], len(train_rows), time.time()
    for _ in progress(range(steps), desc="pretrain the Q-Former's text layers (MLM)", unit="step"):
        if cursor + batch_size > len(train_rows):
            perm = torch.randperm(len(train_rows), generator=generator).tolist()
            train_rows = [train_rows[i] for i in perm]
            cursor = 0
        ids, mask = batch_of(train_rows[cursor : cursor + batch_size])
        cursor += batch_size
        inputs, labels = mask_tokens(ids.cpu(), mask.cpu(), tokenizer, float(settings["mask_prob"]), generator)
        loss = mlm_loss(model, head, inputs.to(ids.device), mask, labels.to(ids.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params + head.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    after = probe()
    model.eval()
    tenth = max(1, len(losses) // 10)
    return {
        "probe_loss_before": round(before, 4),
        "probe_loss_after": round(after, 4),
        "chance_loss": round(math.log(len(tokenizer)), 4),
        "train_loss_first_tenth": round(sum(losses[:tenth]) / tenth, 4),
        "train_loss_last_tenth": round(sum(losses[-tenth:]) / tenth, 4),
        "texts": len(texts),
        "probe_texts": len(probe_rows),
        "steps": steps,
        "seconds": round(time.time() - started, 1),
    }


def base_spec(cfg: Any) -> dict:
    """`components.qformer` as the builder takes it for the base weights: init checkpoint, on the CPU."""
    return {**plain(cfg.components.qformer), "init": "checkpoint", "device": "cpu"}


def build(cfg: Any, force: bool = False) -> tuple[Path, dict]:
    """The pretrained-here directory of `cfg` (built now when missing, or when `force`) and its record."""
    from qkvqa.qff.builder import build_qff_component
    from qkvqa.utils.io import atomic_write_json, make_shareable, sha256_file, verify_sha256_once

    inputs = init_inputs(cfg)
    out = cache_dir(cfg, inputs)
    record = out / RECORD
    if out.is_dir() and not force:
        found = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else None
        if found and found.get("inputs") == json.loads(json.dumps(inputs, default=str)):
            verify_sha256_once(
                out / "model.safetensors",
                found["weights_sha256"],
                "pretrained-here Q-Former",
                f"delete {out} and run `qkvqa pretrain-qformer` again",
            )
            log.info("Q-Former text layers pretrained here: reusing %s", out)
            return out, found
        log.warning("%s holds other or unrecorded inputs; building it again", out)
    files = corpus_files(cfg)
    texts = corpus_texts(cfg, files)
    log.info(
        "pretraining the Q-Former's text layers on %d texts (%s, %s), %d steps of %d",
        len(texts),
        files["kb"],
        files["train_questions"],
        cfg.qff.text_pretrain.steps,
        cfg.qff.text_pretrain.batch_size,
    )
    component = build_qff_component(
        base_spec(cfg),
        {
            "focus": "none",
            "blip_text_preprocess": cfg.qff.blip_text_preprocess,
            "max_text_tokens": cfg.qff.max_text_tokens,
        },
    )
    figures = pretrain(component, texts, plain(cfg.qff.text_pretrain), int(cfg.qff.max_text_tokens))
    log.info(
        "MLM loss on %d held-aside texts: %.3f before, %.3f after (chance %.3f), in %.0f s",
        figures["probe_texts"],
        figures["probe_loss_before"],
        figures["probe_loss_after"],
        figures["chance_loss"],
        figures["seconds"],
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    component.model.base.save_pretrained(str(partial))
    component.tokenizer.save_pretrained(str(partial))
    for path in partial.iterdir():
        make_shareable(path)
    found = {
        "format": FORMAT,
        "inputs": json.loads(json.dumps(inputs, default=str)),
        "figures": figures,
        "weights_sha256": sha256_file(partial / "model.safetensors"),
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_json(partial / RECORD, found)
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    log.info("Q-Former with pretrained-here text layers written to %s", out)
    return out, found


def resolve_qformer_spec(cfg: Any, spec: Optional[Mapping[str, Any]] = None) -> dict:
    """`components.qformer` (or `spec`) as a plain dict the builder can build: unchanged for init checkpoint; for
    init pretrained_here, `pretrained` is the pretrained-here directory (built first when missing: `build`)."""
    spec = dict(plain(spec if spec is not None else cfg.components.qformer))
    if spec.get("init", "checkpoint") != "pretrained_here":
        return spec
    out, _ = build(cfg)
    return {**spec, "pretrained": str(out), "tiny": False, "init": "checkpoint"}
