"""`qkvqa cache-vit`: write the frozen ViT's features of every image the QFF training needs, once, to qff.vit_cache."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

from qkvqa.config.cli import add_override_args, config_from_args


def register(subparsers) -> None:
    """Add the `cache-vit` command."""
    parser = subparsers.add_parser(
        "cache-vit",
        help="cache the frozen ViT features of the QFF training images (fp16, memory-mapped shards)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="As a run, compute the ViT last hidden states of every distinct image the training and\n"
        "validation samples use (query images, gold and negative article images, the validation\n"
        "top-K article images) and write them to qff.vit_cache as fp16 .npy shards of\n"
        "qff.vit_cache_shard_size images with an index; `qkvqa train` with the same qff.vit_cache\n"
        "then reads them instead of running the ViT. A rerun skips finished shards. A cache written\n"
        "by another ViT or for another image set is refused (StaleArtifactError).\n\n"
        "Several GPUs: one process per GPU, each writing every num-shards-th shard, e.g.\n"
        "  for i in 0 1 2 3; do CUDA_VISIBLE_DEVICES=$i qkvqa cache-vit experiment=X \\\n"
        "      --shard-index $i --num-shards 4 & done; wait\n"
        "or `torchrun --nproc_per_node=4 -m qkvqa.cli cache-vit experiment=X` (and `srun` under\n"
        "SLURM): without the flags, RANK/WORLD_SIZE (SLURM_PROCID/SLURM_NTASKS) choose the shards.",
    )
    parser.add_argument("--shard-index", type=int, default=None, help="this process's index (default: RANK or 0)")
    parser.add_argument("--num-shards", type=int, default=None, help="number of processes (default: WORLD_SIZE or 1)")
    add_override_args(parser)
    parser.set_defaults(func=_run, opens_run=True)


def _run(args: argparse.Namespace) -> int:
    from qkvqa.errors import ConfigError
    from qkvqa.qff.vit_cache import env_shard_split
    from qkvqa.run.job import run_job

    if (args.shard_index is None) != (args.num_shards is None):
        raise ConfigError("give both --shard-index and --num-shards, or neither")
    shard_index, num_shards = (args.shard_index, args.num_shards) if args.num_shards is not None else env_shard_split()
    if not 0 <= shard_index < num_shards:
        raise ConfigError(f"--shard-index {shard_index} is outside 0..{num_shards - 1}")
    cfg = config_from_args(args)
    if args.num_shards is not None and num_shards > 1 and cfg.run_id:
        cfg.run_id = f"{cfg.run_id}-shard{shard_index}"  # separate processes: one run directory each
    with run_job(cfg, "cache-vit") as job:
        result = build_cache_from_config(cfg, shard_index, num_shards, pools_dir=job.run.run_dir)
        job.record.update_summary({f"vit_cache/{k}": v for k, v in result.items()})
    print(json.dumps({"run_dir": str(job.run.run_dir), **result}))
    return 0


def miner_for(cfg):
    """The pools miner of a training DataModule (`miner(split, out_dir) -> pools path`): `qkvqa.qff.mining.mine_to_dir`
    over the config's benchmark, built for the mining as `qkvqa mine` builds it."""
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.qff.mining import mine_to_dir

    return lambda split, out_dir: mine_to_dir(cfg, split, out_dir, build_benchmark(cfg.data))


def build_cache_from_config(
    cfg, shard_index: Optional[int] = None, num_shards: Optional[int] = None, pools_dir: Optional[Path] = None
) -> dict:
    """`qkvqa cache-vit`: write the features of every image the config's training (and validation) samples need.

    Pools that the config does not name are mined into `pools_dir` first, as `qkvqa train` would. It lives here,
    above both the cache (`qkvqa.qff.vit_cache`) and the training DataModule that reads it, as `train_qff` does.
    """
    import dataclasses

    from qkvqa.data_modules.qff_train import QFFTrainDataModule, settings_from_config
    from qkvqa.errors import StaleArtifactError
    from qkvqa.qff.builder import build_qff_component
    from qkvqa.qff.vit_cache import (
        ViTFeatureCache,
        env_shard_split,
        feature_shape,
        fill_cache,
        image_sources,
        vision_fingerprint,
    )

    if not cfg.qff.vit_cache:
        raise StaleArtifactError("qff.vit_cache is not set: name the directory the ViT features go to")
    if shard_index is None or num_shards is None:
        shard_index, num_shards = env_shard_split()
    component = build_qff_component(cfg.components.qformer, cfg.qff)  # device auto: this rank's GPU
    model = component.model.eval()
    fingerprint = vision_fingerprint(model, component.image_processor)
    settings = settings_from_config(cfg, component, fingerprint)
    settings = dataclasses.replace(settings, qff=dataclasses.replace(settings.qff, vit_cache=None))
    dm = QFFTrainDataModule(
        cfg.data, settings, component.tokenizer, component.image_processor, miner=miner_for(cfg), pools_dir=pools_dir
    )
    dm.prepare_data()
    needed = dm.needed_images()
    cache = ViTFeatureCache.create(
        cfg.qff.vit_cache,
        needed,
        fingerprint,
        feature_shape(model),
        cfg.qff.vit_cache_shard_size,
        sources=image_sources(dm.config),
    )
    counts = fill_cache(
        cache,
        model,
        component.image_processor,
        dm.collator().load_image,
        batch_size=cfg.qff.vit_cache_batch_size,
        num_workers=cfg.data.num_workers,
        shard_index=shard_index,
        num_shards=num_shards,
    )
    done = sum(cache.done_record(i) is not None for i in range(cache.num_shards))
    return {
        **counts,
        "cache": str(cache.path),
        "images_total": len(cache.image_ids),
        "shards_total": cache.num_shards,
        "shards_done": done,
        "complete": done == cache.num_shards,
        "shard_index": shard_index,
        "num_shards": num_shards,
    }
