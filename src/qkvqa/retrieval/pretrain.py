"""`qkvqa pretrain-retriever`: the stage-1 image encoder trained here contrastively on the train split, cached by input.

No real EVA-CLIP ships in a package, and a random image tower retrieves the gold article in the top 20 for about half
of the demo world's questions. This module makes a tower that sees, on this machine, from the world's train split
only: it builds the image encoder `components.image_encoder` names (tiny or real, through the one builder) and trains
its image path with InfoNCE, each training question's image against a KB image of its gold article, the other KB
images of the batch as negatives (several positives when a batch holds two images of one article). Validation and
test questions are never read. The result is the encoder's own HF directory (weights, tokenizer, custom code) that
the builder then loads like any pretrained one (`components.image_encoder.pretrained=DIR tiny=false`), so the KB
embeddings and the index, keyed on the weights' content (`encoder_identity`), change with it.

The directory is `{paths.cache_dir}/retriever_init/<kind>-<key>`, `key` the sha256 of every input: the base encoder
(`encoder_identity`), the world (the KB images' and the training questions' image files, the question file, the KB
content: the embedding sources' identities), `retrieval.pretrain` and the code (this file, torch / transformers
versions). A reused one is checked: its record holds the same inputs and the weights' sha256.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from qkvqa.errors import ConfigError, DataError
from qkvqa.utils.derived_cache import code_version, keyed_dir, plain
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

RECORD = "pretrain_retriever.json"
FORMAT = "qkvqa-retriever-pretrained-here"
WEIGHTS = "model.safetensors"


def _sources(cfg: Any, benchmark: Any) -> tuple[Any, Any]:
    """(KB image source, train-split query image source): what `qkvqa embed` reads, so the same identities."""
    from qkvqa.retrieval.embed import Embedder

    kb = Embedder(cfg, "kb_images", benchmark=benchmark).source
    queries = Embedder(cfg, "query_images", split="train", benchmark=benchmark).source
    return kb, queries


def pretrain_inputs(cfg: Any, benchmark: Any) -> dict:
    """Every input of the trained weights of `cfg` (the cache key is their sha256)."""
    from qkvqa.retrieval.encoders import encoder_identity

    if not cfg.data.train_questions:
        raise ConfigError("qkvqa pretrain-retriever trains on data.train_questions; it is not set")
    kb, queries = _sources(cfg, benchmark)
    return {
        "format": FORMAT,
        "base": encoder_identity(plain(cfg.components.image_encoder)),
        "world": {"kb_images": kb.identity(), "train_queries": queries.identity()},
        "settings": plain(cfg.retrieval.pretrain),
        "code": code_version([Path(__file__), Path(__file__).with_name("encoders.py")]),
    }


def cache_dir(cfg: Any, inputs: Mapping[str, Any]) -> Path:
    """Where the trained encoder of `inputs` lives: {paths.cache_dir}/retriever_init/<kind>-<key16>."""
    return keyed_dir(cfg, "retriever_init", inputs, "trained retriever")


class _Unprocessed:
    """A preprocess that hands the decoded image back as it is (the KB images, kept to compose multi-entity views)."""

    @staticmethod
    def one(image):
        return image.convert("RGB")


def training_pairs(benchmark: Any, kb: Any, queries: Any, preprocess) -> tuple:
    """(query pixels [Q,3,S,S], gold article rows per query image, KB pixels [K,3,S,S], KB row per KB image, the KB
    images as decoded) of the train split: the query images whose gold article has a KB image, float16 to halve the
    memory."""
    from qkvqa.retrieval.embed import _ImageItems

    counts: dict = {}
    kb_items = _ImageItems(kb.items(0, kb.rows, counts), _Unprocessed(), benchmark.image_loader)
    kb_pixels, kb_rows, kb_images = [], [], []
    for position in range(len(kb_items)):
        _, image, _ = kb_items[position]
        if image is not None:
            kb_images.append(image)
            kb_pixels.append(np.asarray(preprocess.one(image), dtype=np.float16))
            kb_rows.append(int(kb_items.items[position].id[0]))
    with_images = set(kb_rows)
    store = benchmark.kb_store()
    gold: dict[tuple, set] = {}
    for question in benchmark.questions("train"):
        url = question.gold_urls[0] if question.gold_urls else None
        if url is not None and url in store:
            row = store.row_of(url)
            if row in with_images:
                gold.setdefault((question.dataset_name, question.image_id), set()).add(row)
    query_items = _ImageItems(
        [item for item in queries.items(0, queries.rows, counts) if tuple(item.id) in gold],
        preprocess,
        benchmark.image_loader,
    )
    query_pixels, query_gold = [], []
    for position in range(len(query_items)):
        _, pixels, _ = query_items[position]
        if pixels is not None:
            query_pixels.append(np.asarray(pixels, dtype=np.float16))
            query_gold.append(sorted(gold[tuple(query_items.items[position].id)]))
    if len(query_pixels) < 2 or len(set(kb_rows)) < 2:
        raise DataError(
            f"qkvqa pretrain-retriever: {len(query_pixels)} training question images with a KB image of their gold "
            f"article ({len(set(kb_rows))} articles with images); it needs at least 2 of each "
            "(data.train_questions, data.images)"
        )
    return np.stack(query_pixels), query_gold, np.stack(kb_pixels), np.asarray(kb_rows), kb_images


def composite(images: list, panel_width: float = 0.75, object_scale: float = 0.71):
    """Several KB pictures side by side, as the world's (and E-VQA's) multi-entity photos show 2-3 entities in one
    image: each picture shrunk by `object_scale` onto a panel `panel_width` of its width wide (filled with its corner
    colour, the picture's background), the panels in a row."""
    from PIL import Image

    panels = []
    for image in images:
        width, height = image.size
        panel = Image.new("RGB", (max(1, int(round(width * panel_width))), height), image.getpixel((0, 0)))
        small = image.resize((max(1, int(width * object_scale)), max(1, int(height * object_scale))))
        panel.paste(small, ((panel.size[0] - small.size[0]) // 2, (height - small.size[1]) // 2))
        panels.append(panel)
    out = Image.new("RGB", (sum(p.size[0] for p in panels), max(p.size[1] for p in panels)))
    x = 0
    for panel in panels:
        out.paste(panel, (x, 0))
        x += panel.size[0]
    return out


def info_nce(queries, keys, positive, temperature: float):
    """Symmetric InfoNCE with several positives (SupCon's mean over positives): each query should score every key of
    its gold articles above the other keys, and each key its queries above the other queries. `positive[i, j]` says
    whether key j shows an article of query i; rows or columns without a positive are left out."""
    logits = queries @ keys.t() / temperature
    mask = positive.float()

    def one_side(scores, pos):
        counts = pos.sum(dim=1)
        keep = counts > 0
        log_prob = scores.log_softmax(dim=1)
        return (-(log_prob * pos).sum(dim=1)[keep] / counts[keep]).mean()

    return 0.5 * (one_side(logits, mask) + one_side(logits.t(), mask.t()))


def augment(pixels, generator):
    """Query-like views of preprocessed images [B,3,S,S] (a synthetic or real photo differs from the KB's picture in
    framing, angle, light and noise): a random affine (scale 0.8-1.15, rotation up to 15 degrees, shift up to 10 %),
    brightness 0.85-1.1, a colour tint and pixel noise, drawn per image from `generator` (a torch.Generator)."""
    import torch
    import torch.nn.functional as F

    n = pixels.shape[0]

    def uniform(low: float, high: float, *shape: int):
        return low + (high - low) * torch.rand((n, *shape), generator=generator)

    scale, angle = uniform(0.8, 1.15), uniform(-0.26, 0.26)
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack(
        [torch.stack([cos, -sin, uniform(-0.2, 0.2)], 1), torch.stack([sin, cos, uniform(-0.2, 0.2)], 1)], 1
    )
    grid = F.affine_grid(theta.to(pixels.dtype), list(pixels.shape), align_corners=False)
    out = F.grid_sample(pixels, grid.to(pixels.device), padding_mode="border", align_corners=False)
    out = out * uniform(0.85, 1.1, 1, 1, 1).to(pixels) + uniform(-0.3, 0.3, 3, 1, 1).to(pixels)
    return out + 0.05 * torch.randn(out.shape, generator=generator).to(pixels)


def train(encoder, data: tuple, settings: Mapping[str, Any]) -> dict:
    """Train `encoder`'s image path in place on `data` (`training_pairs`) with `settings` (`retrieval.pretrain`);
    returns the per-step losses' first and last tenth means and the step count.

    Each step draws `batch_size` anchors: a quarter training-question images, a quarter KB images (every article with
    an image, so also those no training question asks about) and half compositions of 2-3 KB images of different
    articles (`composite`: one vector must find every entity of a multi-entity photo), each seen through `augment`; and for each anchor a KB image of each of its articles (another
    one where the article has several), plain, as the index embeds them."""
    import torch
    import torch.nn.functional as F

    from qkvqa.utils.progress import progress

    preprocess = encoder.preprocess
    query_pixels, query_gold, kb_pixels, kb_rows, kb_images = data
    steps = int(settings["steps"])
    batch_size = min(int(settings["batch_size"]), len(query_pixels) + len(kb_pixels))
    temperature = float(settings["temperature"])
    generator = np.random.default_rng(int(settings["seed"]))
    torch_generator = torch.Generator().manual_seed(int(settings["seed"]))
    torch.manual_seed(int(settings["seed"]))
    by_row = {int(row): np.flatnonzero(kb_rows == row) for row in np.unique(kb_rows)}
    model = encoder.model
    params = [p for p in model.parameters()]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=float(settings["lr"]), weight_decay=0.01)
    warmup = max(1, steps // 20)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: min((s + 1) / warmup, max(0.0, (steps - s) / max(1, steps - warmup)))
    )

    def embed(pixels):
        return F.normalize(encoder._image_features(pixels.to(encoder.device, encoder.dtype)).float(), dim=-1)

    def other_image(row: int, not_this: int = -1) -> int:
        choices = [k for k in by_row[row] if k != not_this]
        return int(generator.choice(choices or by_row[row]))

    rows = sorted(by_row)
    n_queries = min(len(query_pixels), batch_size // 4)
    n_composites = batch_size // 2 if len(rows) >= 3 else 0
    n_kb = min(len(kb_pixels), batch_size - n_queries - n_composites)
    model.train()
    losses, started = [], time.time()
    for _ in progress(range(steps), desc="pretrain the stage-1 image encoder (InfoNCE)", unit="step"):
        picked = generator.choice(len(query_pixels), size=n_queries, replace=False)
        kb_anchors = generator.choice(len(kb_pixels), size=n_kb, replace=False)
        golds = [set(query_gold[i]) for i in picked] + [{int(kb_rows[k])} for k in kb_anchors]
        keys = [other_image(row) for i in picked for row in query_gold[i]]
        keys += [other_image(int(kb_rows[k]), int(k)) for k in kb_anchors]
        pixels = [query_pixels[picked], kb_pixels[kb_anchors]]
        for _ in range(n_composites):
            members = [int(r) for r in generator.choice(rows, size=int(generator.integers(2, 4)), replace=False)]
            shown = [other_image(row) for row in members]
            pixels.append(preprocess.one(composite([kb_images[k] for k in shown]))[None].astype(np.float16))
            golds.append(set(members))
            keys += [other_image(row, k) for row, k in zip(members, shown)]
        keys = list(dict.fromkeys(keys))
        anchors = np.concatenate(pixels).astype(np.float32)
        positive = torch.tensor([[int(kb_rows[k]) in gold for k in keys] for gold in golds])
        anchor_vectors = embed(augment(torch.from_numpy(anchors), torch_generator))
        key_vectors = embed(torch.from_numpy(kb_pixels[keys].astype(np.float32)))
        loss = info_nce(anchor_vectors, key_vectors, positive.to(encoder.device), temperature)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    model.eval()
    for p in params:
        p.requires_grad_(False)
    tenth = max(1, len(losses) // 10)
    return {
        "train_loss_first_tenth": round(sum(losses[:tenth]) / tenth, 4),
        "train_loss_last_tenth": round(sum(losses[-tenth:]) / tenth, 4),
        "chance_loss": round(math.log(batch_size), 4),
        "query_images": int(len(query_pixels)),
        "kb_images": int(len(kb_pixels)),
        "steps": steps,
        "batch_size": batch_size,
        "seconds": round(time.time() - started, 1),
    }


def widen(encoder, width: int, seed: int) -> None:
    """Replace `encoder`'s CLIP-style model by one of the same kind with towers `width` wide (hidden size, feed-forward
    2x, projection `width`), new random weights drawn with `seed`."""
    import torch

    config = encoder.model.config
    if not (hasattr(config, "vision_config") and hasattr(config, "projection_dim")):
        raise ConfigError(
            f"retrieval.pretrain.width={width}: the image encoder's model ({type(encoder.model).__name__}) is not "
            "CLIP-shaped; leave retrieval.pretrain.width null to train it as it is"
        )
    for tower in (config.vision_config, config.text_config):
        if width % tower.num_attention_heads:
            raise ConfigError(
                f"retrieval.pretrain.width={width} is not a multiple of the towers' {tower.num_attention_heads} heads"
            )
        tower.hidden_size, tower.intermediate_size = width, 2 * width
        tower.projection_dim = width
    config.projection_dim = width
    torch.manual_seed(seed)
    model = type(encoder.model)(config)
    model.name_or_path = encoder.model.name_or_path
    encoder.model = model.eval().to(encoder.device, encoder.dtype)
    encoder.dim = width


def _save(encoder, out: Path) -> None:
    """The encoder's HF directory: weights and config, tokenizer, and the base directory's code and preprocessing
    files (a tiny EVA-CLIP's `modeling_tiny_evaclip.py`), so the builder loads it as it loads the base."""
    encoder.model.save_pretrained(str(out))
    tokenizer = getattr(encoder, "tokenizer", None)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(out))
    base = Path(str(getattr(encoder.model, "name_or_path", "") or ""))
    if base.is_dir():
        for path in base.iterdir():
            if path.is_file() and (path.suffix == ".py" or path.name == "preprocessor_config.json"):
                shutil.copy2(path, out / path.name)


def build(cfg: Any, benchmark: Any, force: bool = False) -> tuple[Path, dict]:
    """The trained encoder directory of `cfg` on `benchmark` (its data; trained now when missing, or when `force`)
    and its record."""
    from qkvqa.components.registry import build_component, spec_from_mapping
    from qkvqa.utils.io import atomic_write_json, make_shareable, sha256_file, verify_sha256_once

    inputs = pretrain_inputs(cfg, benchmark)
    out = cache_dir(cfg, inputs)
    record = out / RECORD
    if out.is_dir() and not force:
        found = json.loads(record.read_text(encoding="utf-8")) if record.is_file() else None
        if found and found.get("inputs") == json.loads(json.dumps(inputs, default=str)):
            verify_sha256_once(
                out / WEIGHTS,
                found["weights_sha256"],
                "trained retriever",
                f"delete {out} and run `qkvqa pretrain-retriever` again",
            )
            log.info("stage-1 image encoder trained here: reusing %s", out)
            return out, found
        log.warning("%s holds other or unrecorded inputs; training it again", out)
    spec = spec_from_mapping({**plain(cfg.components.image_encoder), "device": "cpu", "dtype": "fp32"})
    encoder = build_component(spec)
    if not hasattr(encoder.model, "save_pretrained"):
        raise ConfigError(
            f"qkvqa pretrain-retriever: components.image_encoder kind {spec.kind!r} has no HF directory to write; "
            "use kind evaclip_hf or clip_hf"
        )
    if cfg.retrieval.pretrain.width:
        widen(encoder, int(cfg.retrieval.pretrain.width), int(cfg.retrieval.pretrain.seed))
    kb, queries = _sources(cfg, benchmark)
    data = training_pairs(benchmark, kb, queries, encoder.preprocess)
    log.info(
        "training the stage-1 image encoder on %d train-split question images against %d KB images, %d steps of %d",
        len(data[0]),
        len(data[2]),
        cfg.retrieval.pretrain.steps,
        cfg.retrieval.pretrain.batch_size,
    )
    figures = train(encoder, data, plain(cfg.retrieval.pretrain))
    log.info(
        "InfoNCE loss %.3f in the first tenth of the steps, %.3f in the last (chance %.3f), in %.0f s",
        figures["train_loss_first_tenth"],
        figures["train_loss_last_tenth"],
        figures["chance_loss"],
        figures["seconds"],
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    _save(encoder, partial)
    for path in partial.iterdir():
        make_shareable(path)
    found = {
        "format": FORMAT,
        "inputs": json.loads(json.dumps(inputs, default=str)),
        "figures": figures,
        "weights_sha256": sha256_file(partial / WEIGHTS),
        "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    atomic_write_json(partial / RECORD, found)
    if out.exists():
        shutil.rmtree(out)
    partial.rename(out)
    log.info("stage-1 image encoder trained here written to %s", out)
    return out, found


def encoder_overrides(out: Path) -> list[str]:
    """The overrides that make every stage-1 command load the trained encoder in `out`."""
    return [f"components.image_encoder.pretrained={out}", "components.image_encoder.tiny=false"]
