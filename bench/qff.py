"""Benchmark: QFF section scoring with a per-article ViT cache vs OMGM's per-section loop, and FLOPs per training sample.

Usage: .venv/bin/python bench/qff.py [--parts abc] [--articles 20] [--sections 10] [--train-steps 3]

Parts (each a function in PARTS; results are merged into bench/out/qff.json, so one part can be rerun alone):
  (a) `scoring`: score every section of `--articles` articles (`--sections` each) for one question, on
      CPU with the mid-size random model MID_CONFIG: the component's batched path (each article image
      through the ViT once, sections in length-sorted batches of 64) vs a per-section loop that reruns
      the ViT for every section and encodes one section at a time (OMGM's way). Both paths run side by
      side in one process on the same model; the scores must agree.
  (b) `training`: training samples/s of the QFFTrainer (forward + backward + AdamW step, batch of
      TRAIN_BATCH samples, 1 positive + 15 negatives each, DISTINCT_IMAGES images per sample) on CPU
      with MID_CONFIG, side by side in one process: the frozen ViT run for every (text, image) pair
      at every step (the anchors' way), once per distinct image of the batch (the qkvqa collate),
      and no ViT at all, the features read from a ViT feature cache (`qkvqa cache-vit`).
  (c) `flops`: FLOPs of one training sample at the real config (ViT-g + 12-layer Q-Former + 12
      question-focused blocks), counted with torch.utils.flop_counter on the meta device: the frozen
      ViT forward per image, and the Q-Former forward + backward over 1 question + 16 sections
      (InfoNCE, 1 positive + 15 negatives), with and without a ViT feature cache; implied samples/s on
      an L40 (181 dense bf16 TFLOP/s) at 40 % utilisation, beside the paper's ~1.9 samples/s per GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parent / "out" / "qff.json"

# (a) Mid-size random model: ViT 12 x 256 at 224 px (257 tokens), Q-Former 4 x 128 with 32 queries, image
# cross-attention every 2nd layer, MLP ratio 4, 512 text positions. Sized so that one ViT image costs about 8
# section passes, as in the real model at the bench's mean section length (both ratios are reported), and
# small enough for the per-section loop to finish in minutes on 2 CPU cores.
MID_CONFIG = {
    "image_size": 224,
    "patch_size": 14,
    "vision_hidden_size": 256,
    "vision_layers": 12,
    "hidden_size": 128,
    "num_layers": 4,
    "num_heads": 4,
    "cross_attention_frequency": 2,
    "num_query_tokens": 32,
    "max_position_embeddings": 512,
    "embed_dim": 128,
    "mlp_ratio": 4,
}
SECTION_WORDS = (40, 480)  # section length range in words (one token each in the synthetic vocabulary)
CPU_SECTION_BATCH = 4  # the cpu preset's qff.section_batch_size: bigger batches are memory-bound on CPU

# (c) Real training sample (method.md §3) and the hardware figures.
QUESTION_TOKENS = 32
NEGATIVES = 15
DISTINCT_IMAGES = 14  # question image + gold image + the negatives' other article images
L40_BF16_FLOPS = 181e12  # dense bf16 tensor-core peak
UTILISATION = 0.40
PAPER_SAMPLES_PER_S = 1.9  # ~14 h for 190K samples on two L40s


def count_flops(fn) -> tuple[int, object]:
    """FLOPs counted by torch.utils.flop_counter while `fn()` runs, and its result."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        result = fn()
    return counter.get_total_flops(), result


def meta_model(config_options=None):
    """A QFF model on the meta device (no memory, no compute): the real config, or a tiny-builder config."""
    from transformers import Blip2Config, Blip2ForImageTextRetrieval

    from qkvqa.qff.builder import ITM_VIT_G_CONFIG, tiny_blip2_config
    from qkvqa.qff.model import QFFModel

    config = tiny_blip2_config(30523, **config_options) if config_options else Blip2Config(**ITM_VIT_G_CONFIG)
    config.vision_config._attn_implementation = "eager"  # plain matmuls, which the counter sees
    with torch.device("meta"):
        base = Blip2ForImageTextRetrieval(config)
    return QFFModel(base, focus="per_layer")


def vit_and_section_flops(model, section_tokens: int) -> tuple[int, int]:
    """Inference FLOPs of one image through the ViT and of one section pass (`section_tokens` text tokens)."""
    size = model.image_size
    with torch.device("meta"), torch.no_grad():
        vit, states = count_flops(lambda: model.encode_image(torch.zeros(1, 3, size, size)))
        ids = torch.zeros(1, QUESTION_TOKENS, dtype=torch.long)
        question = model.encode_question(ids, torch.ones_like(ids), states)
        ids = torch.zeros(1, section_tokens, dtype=torch.long)
        section, _ = count_flops(lambda: model.encode_sections(ids, torch.ones_like(ids), states, question))
    return vit, section


# ---------------------------------------------------------------------- (a) scoring
def synthetic_inputs(articles: int, sections: int, seed: int = 0):
    """A question, its image, `articles` article images and section strings of varied length."""
    import numpy as np
    from PIL import Image

    rng = random.Random(seed)
    words = [f"w{i}" for i in range(2000)]

    def picture(i):
        h, w = rng.randint(200, 600), rng.randint(200, 600)
        return Image.fromarray(np.random.default_rng(seed + i).integers(0, 255, (h, w, 3), dtype=np.uint8))

    texts = [
        [
            f"# Wiki Article: A{a}\n## Section Title: S{s}\n"
            + " ".join(rng.choices(words, k=rng.randint(*SECTION_WORDS)))
            for s in range(sections)
        ]
        for a in range(articles)
    ]
    return "what is shown in this picture", picture(0), [picture(a + 1) for a in range(articles)], texts, words


def pass_seconds(comp, question, question_image, image, section: str, repeats: int = 5) -> tuple[float, float]:
    """Seconds of one ViT image pass and of one pass of `section` (batch 1) on this machine."""
    with torch.inference_mode():
        question_enc = comp.encode_question(question, question_image)
        pixels = comp.preprocess_images([image])
        image_states = comp.model.encode_image(pixels)
        tokens = comp.tokenize_sections([section])
        started = time.perf_counter()
        for _ in range(repeats):
            comp.model.encode_image(pixels)
        vit = (time.perf_counter() - started) / repeats
        started = time.perf_counter()
        for _ in range(repeats):
            comp.model.encode_sections(tokens["input_ids"], tokens["attention_mask"], image_states, question_enc)
        return vit, (time.perf_counter() - started) / repeats


def part_scoring(args) -> tuple[dict, list[str]]:
    """(a) batched scoring with a per-article ViT cache vs the per-section loop, same model, same inputs."""
    from qkvqa.qff.builder import build_qff_component
    from qkvqa.qff.scoring import per_section_loop

    question, question_image, images, sections, vocab = synthetic_inputs(args.articles, args.sections)
    torch.manual_seed(0)
    comp = build_qff_component(
        {
            "kind": "blip2_qff",
            "tiny": True,
            "device": "cpu",
            "options": {**MID_CONFIG, "vocab_texts": [" ".join(vocab)]},
        },
        {"section_batch_size": CPU_SECTION_BATCH},
    )
    comp.model.q_gate.data.fill_(0.5)
    comp.score_sections(question, question_image, images[:1], [sections[0][:2]])  # warm-up
    started = time.perf_counter()
    batched = comp.score_sections(question, question_image, images, sections)
    batched_s = time.perf_counter() - started
    started = time.perf_counter()
    with torch.inference_mode():
        looped = per_section_loop(comp, question, question_image, images, sections)  # OMGM's way
    loop_s = time.perf_counter() - started
    max_diff = max(abs(a - b) for ra, rb in zip(batched, looped) for a, b in zip(ra, rb))
    flat = [t for s in sections for t in s]
    n_sections = len(flat)
    tokens = [len(ids) for ids in comp.tokenizer(flat, truncation=True, max_length=comp.max_text_tokens)["input_ids"]]
    mean_tokens = round(sum(tokens) / len(tokens))
    median_section = flat[sorted(range(n_sections), key=tokens.__getitem__)[n_sections // 2]]
    vit_pass, section_pass = pass_seconds(comp, question, question_image, images[0], median_section)
    mid_vit, mid_section = vit_and_section_flops(meta_model(MID_CONFIG), mean_tokens)
    real_vit, real_section = vit_and_section_flops(meta_model(), mean_tokens)
    result = {
        "config": MID_CONFIG,
        "threads": torch.get_num_threads(),
        "articles": args.articles,
        "section_batch_size": CPU_SECTION_BATCH,
        "sections": n_sections,
        "mean_section_tokens": mean_tokens,
        "batched_seconds": batched_s,
        "per_section_loop_seconds": loop_s,
        "speedup": loop_s / batched_s,
        "vit_images_batched": 1 + args.articles,
        "vit_images_loop": 1 + n_sections,
        "max_abs_score_difference": max_diff,
        "mid_vit_to_section_flop_ratio": mid_vit / mid_section,
        "real_vit_to_section_flop_ratio": real_vit / real_section,
        "vit_pass_seconds": vit_pass,
        "section_pass_seconds": section_pass,
        # the best ratio these per-pass times allow: the loop's cost over the batched path's, overheads left out
        "speedup_bound": ((1 + n_sections) * vit_pass + n_sections * section_pass)
        / ((1 + args.articles) * vit_pass + n_sections * section_pass),
    }
    table = [
        "| (a) scoring one question's sections, CPU | batched + per-article ViT cache | per-section loop (OMGM) |",
        "|---|---|---|",
        f"| {n_sections} sections of {args.articles} articles (mean {mean_tokens} tokens) | {batched_s:.1f} s | "
        f"{loop_s:.1f} s |",
        f"| ViT images run | {1 + args.articles} | {1 + n_sections} |",
        f"| speed-up | **{loop_s / batched_s:.1f}x** | 1x |",
        f"| max abs score difference | {max_diff:.1e} | |",
        f"| ViT-image / section-pass FLOPs | mid config {mid_vit / mid_section:.1f} | "
        f"real config {real_vit / real_section:.1f} |",
    ]
    return result, table


# ---------------------------------------------------------------------- (b) training throughput
TRAIN_BATCH = 4
TRAIN_SECTION_WORDS = (40, 200)  # section lengths of the training batch, in words


def training_batch(comp, layout: str, cache=None, seed: int = 0) -> dict:
    """A training batch as the QFF collate builds it, with its images laid out as `layout`:
    `per_pair` (one ViT input per (text, image) pair, repeats included), `dedup` (one per distinct
    image) or `cache` (features of the distinct images read from `cache`)."""
    import numpy as np
    from PIL import Image

    rng = random.Random(seed)
    words = [f"w{i}" for i in range(2000)]
    n = 1 + NEGATIVES
    pixels = {}  # image id -> PIL image, in first-use order
    question_ids, section_ids, texts = [], [], []
    for b in range(TRAIN_BATCH):
        query, gold = f"q{b}", f"a{b}-gold"
        others = [f"a{b}-{k}" for k in range(DISTINCT_IMAGES - 2)]
        # positive + 3 other gold sections share the gold image; the 12 negatives spread over the others
        candidates = [gold] * 4 + others + others[: n - 4 - len(others)]
        for image_id in [query, *candidates]:
            if image_id not in pixels:
                size = rng.randint(200, 600)
                array = np.random.default_rng(len(pixels)).integers(0, 255, (size, size, 3), dtype=np.uint8)
                pixels[image_id] = Image.fromarray(array)
        question_ids.append(query)
        section_ids.extend(candidates)
        texts.extend(" ".join(rng.choices(words, k=rng.randint(*TRAIN_SECTION_WORDS))) for _ in range(n))
    questions = comp.tokenize_questions(["what is shown in this picture"] * TRAIN_BATCH)
    batch = {
        "size": TRAIN_BATCH,
        "num_candidates": n,
        "question": questions,
        "sections": comp.tokenize_sections(texts),
        "dropped": [],
    }
    if layout == "per_pair":
        order = [i for b in range(TRAIN_BATCH) for i in [question_ids[b], *section_ids[b * n : (b + 1) * n]]]
        batch["question_image_index"] = torch.tensor([b * (n + 1) for b in range(TRAIN_BATCH)])
        batch["section_image_index"] = torch.tensor([b * (n + 1) + 1 + k for b in range(TRAIN_BATCH) for k in range(n)])
    else:
        order = list(pixels)
        position = {image_id: i for i, image_id in enumerate(order)}
        batch["question_image_index"] = torch.tensor([position[i] for i in question_ids])
        batch["section_image_index"] = torch.tensor([position[i] for i in section_ids])
    if layout == "cache":
        batch["image_features"] = torch.from_numpy(cache.stack([cache.get(i) for i in order]))
    else:
        batch["pixel_values"] = comp.preprocess_images([pixels[i] for i in order])
    batch["images"] = pixels
    return batch


def bench_training_throughput(args) -> tuple[dict, list[str]]:
    """(b) training samples/s with the ViT per (text, image) pair, per distinct image, and from a feature cache."""
    import tempfile

    from qkvqa.components import build_component
    from qkvqa.config.schema import QFFConfig
    from qkvqa.models.qff_module import QFFTrainer
    from qkvqa.qff.vit_cache import ViTFeatureCache, feature_shape, fill_cache, vision_fingerprint

    torch.manual_seed(0)
    comp = build_component(
        {
            "kind": "blip2_qff",
            "tiny": True,
            "device": "cpu",
            "options": {**MID_CONFIG, "vocab_texts": [" ".join(f"w{i}" for i in range(2000))]},
        }
    )
    module = QFFTrainer(comp.model, QFFConfig())
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-5)
    probe = training_batch(comp, "dedup")
    with tempfile.TemporaryDirectory() as tmp:
        cache = ViTFeatureCache.create(
            tmp,
            list(probe["images"]),
            vision_fingerprint(comp.model, comp.image_processor),
            feature_shape(comp.model),
            shard_size=64,
        )
        started = time.perf_counter()
        fill_cache(cache, comp.model, comp.image_processor, probe["images"].get, batch_size=16)
        cache_seconds = time.perf_counter() - started
        batches = {layout: training_batch(comp, layout, cache) for layout in ("per_pair", "dedup", "cache")}

        def step(batch):
            loss = module.contrastive_loss(module.logits(batch, *module.encode(batch)))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()

        timings = {}
        for layout, batch in batches.items():
            step(batch)  # warm-up
            started = time.perf_counter()
            for _ in range(args.train_steps):
                step(batch)
            timings[layout] = time.perf_counter() - started
    samples = TRAIN_BATCH * args.train_steps
    rates = {layout: samples / seconds for layout, seconds in timings.items()}
    vit_inputs = {
        layout: (batches[layout]["pixel_values"].shape[0] if "pixel_values" in batches[layout] else 0)
        for layout in batches
    }
    result = {
        "config": MID_CONFIG,
        "threads": torch.get_num_threads(),
        "batch": TRAIN_BATCH,
        "steps": args.train_steps,
        "section_words": list(TRAIN_SECTION_WORDS),
        "vit_images_per_step": vit_inputs,
        "seconds": timings,
        "samples_per_s": rates,
        "speedup_vs_per_pair": {layout: rates[layout] / rates["per_pair"] for layout in rates},
        "cache_write_seconds_for_the_batch_images": cache_seconds,
    }
    labels = {
        "per_pair": "ViT per (text, image) pair (anchors)",
        "dedup": "ViT once per distinct image",
        "cache": "ViT feature cache (no ViT)",
    }
    table = [
        "| (b) training step, CPU, batch 4 x (1 + 15) | ViT images / step | samples/s | speed-up |",
        "|---|---|---|---|",
    ]
    for layout, label in labels.items():
        table.append(
            f"| {label} | {vit_inputs[layout]} | {rates[layout]:.2f} | {rates[layout] / rates['per_pair']:.1f}x |"
        )
    return result, table


# ---------------------------------------------------------------------- (c) FLOPs
def training_flops(model, section_tokens: int) -> dict:
    """FLOPs of one training sample: ViT forward per image; Q-Former forward + backward over 1 + 16 texts."""
    import torch.nn.functional as F

    from qkvqa.qff.scoring import late_interaction

    size, n = model.image_size, 1 + NEGATIVES
    with torch.device("meta"):
        with torch.no_grad():
            vit, _ = count_flops(lambda: model.encode_image(torch.zeros(1, 3, size, size)))
        vcfg = model.base.config.vision_config
        states = torch.zeros(DISTINCT_IMAGES, (size // vcfg.patch_size) ** 2 + 1, vcfg.hidden_size)
        q_ids = torch.zeros(1, QUESTION_TOKENS, dtype=torch.long)
        s_ids = torch.zeros(n, section_tokens, dtype=torch.long)
        image_index = torch.arange(n) % (DISTINCT_IMAGES - 1)

        def forward():
            question = model.encode_question(q_ids, torch.ones_like(q_ids), states[:1])
            sections = model.encode_sections(
                s_ids, torch.ones_like(s_ids), states[1:], question, image_index=image_index
            )
            logits = late_interaction(question.tokens, sections)[None] / 0.07
            return F.cross_entropy(logits, torch.zeros(1, dtype=torch.long))

        fwd, loss = count_flops(forward)
        bwd, _ = count_flops(loss.backward)
    qformer = fwd + bwd
    variants = {
        "vit_per_text_pair": (1 + n) * vit,
        "vit_per_distinct_image": DISTINCT_IMAGES * vit,
        "vit_feature_cache": 0,
    }
    rate = UTILISATION * L40_BF16_FLOPS
    return {
        "section_tokens": section_tokens,
        "vit_gflop_per_image": vit / 1e9,
        "qformer_fwd_tflop": fwd / 1e12,
        "qformer_bwd_tflop": bwd / 1e12,
        "per_sample": {
            name: {
                "tflop": (qformer + v) / 1e12,
                "l40_samples_per_s_at_40pct": rate / (qformer + v),
                "utilisation_implied_by_paper": PAPER_SAMPLES_PER_S * (qformer + v) / L40_BF16_FLOPS,
            }
            for name, v in variants.items()
        },
    }


def part_flops(args) -> tuple[dict, list[str]]:
    """(c) FLOPs per training sample at the real config, for 512- and 256-token sections."""
    model = meta_model().train()
    rows = [training_flops(model, tokens) for tokens in (512, 256)]
    result = {
        "question_tokens": QUESTION_TOKENS,
        "negatives": NEGATIVES,
        "distinct_images": DISTINCT_IMAGES,
        "l40_bf16_flops": L40_BF16_FLOPS,
        "utilisation": UTILISATION,
        "paper_samples_per_s_per_gpu": PAPER_SAMPLES_PER_S,
        "rows": rows,
    }
    names = {
        "vit_per_text_pair": f"ViT per (text, image) pair ({2 + NEGATIVES} images)",
        "vit_per_distinct_image": f"ViT once per distinct image ({DISTINCT_IMAGES})",
        "vit_feature_cache": "ViT feature cache (0 ViT FLOPs)",
    }
    table = [
        "| (c) one training sample, real config | section tokens | TFLOP | L40 samples/s at 40 % | "
        f"utilisation the paper's {PAPER_SAMPLES_PER_S} samples/s implies |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        for key, label in names.items():
            v = row["per_sample"][key]
            table.append(
                f"| {label} | {row['section_tokens']} | {v['tflop']:.2f} | "
                f"{v['l40_samples_per_s_at_40pct']:.1f} | {100 * v['utilisation_implied_by_paper']:.1f} % |"
            )
    table.append(
        f"| (ViT-g forward per image: {rows[0]['vit_gflop_per_image']:.0f} GFLOP; Q-Former fwd+bwd over 17 "
        f"texts: {rows[0]['qformer_fwd_tflop'] + rows[0]['qformer_bwd_tflop']:.2f} TFLOP at 512 tokens, "
        f"{rows[1]['qformer_fwd_tflop'] + rows[1]['qformer_bwd_tflop']:.2f} at 256) | | | | |"
    )
    return result, table


PARTS = {"a": ("scoring", part_scoring), "b": ("training", bench_training_throughput), "c": ("flops", part_flops)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="".join(PARTS), help=f"which parts to run, from {''.join(PARTS)}")
    parser.add_argument("--articles", type=int, default=20)
    parser.add_argument("--sections", type=int, default=10, help="sections per article")
    parser.add_argument("--train-steps", type=int, default=3, help="(b) timed training steps per image layout")
    args = parser.parse_args(argv)
    os.environ.setdefault("QKVQA_LOG_LEVEL", "WARNING")
    results = json.loads(OUT.read_text()) if OUT.exists() else {}
    for letter in args.parts:
        name, run = PARTS[letter]
        result, table = run(args)
        results[name] = {**result, "measured_at": time.strftime("%Y-%m-%d %H:%M:%S")}
        print("\n".join(table) + "\n")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    tmp = OUT.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(OUT)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
