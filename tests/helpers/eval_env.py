"""An experiments directory whose `world_eval` evaluates tiny components on a synthetic world, with its stage-1
index built: the integration tests' `eval_env` fixture and the SLURM evaluation test share it."""

from __future__ import annotations

import os
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def tiny(kind: str) -> dict:
    """A tiny CPU component spec."""
    return {"kind": kind, "tiny": True, "device": "cpu", "dtype": "fp32"}


def experiments_dir(tmp: Path, world: dict, name: str, config: dict) -> Path:
    """`tmp/experiments` with the repository's base and presets and `NAME.yaml`: the world's E-VQA data section
    (from its data_evqa.yaml) and `config` (its own `data` keys on top)."""
    root = tmp / "experiments"
    root.mkdir()
    for sub in ("base", "presets"):
        (root / sub).symlink_to(REPO / "experiments" / sub)
    data = yaml.safe_load((Path(world["dir"]) / "data_evqa.yaml").read_text(encoding="utf-8"))
    (root / f"{name}.yaml").write_text(
        yaml.safe_dump({**config, "data": {**data, **config.get("data", {})}}), encoding="utf-8"
    )
    return root


def build_eval_env(tmp: Path, world: dict) -> dict:
    """`tmp/experiments` with `world_eval.yaml` (its caches and runs under `tmp`), after `qkvqa embed` and
    `qkvqa index build` of it; {"root", "runs", "env"} (env: os.environ with QKVQA_EXPERIMENTS set)."""
    from qkvqa.cli.main import main
    from qkvqa.run.rundir import clear_run_env

    root = experiments_dir(
        tmp,
        world,
        "world_eval",
        {
            "data": {"batch_size": 4},
            "components": {
                "image_encoder": tiny("evaclip_hf"),
                "text_encoder": tiny("evaclip_hf"),
                "qformer": tiny("blip2_qff"),
                "reranker": tiny("bge_reranker"),
                "generator": tiny("llama3"),
                "judge": tiny("bem"),
            },
            "paths": {"cache_dir": str(tmp / "cache"), "checkpoints_root": str(tmp / "runs")},
            "trainer": {"accelerator": "cpu", "enable_progress_bar": False},
            "logger": {"wandb": {"enabled": False}},
            "generation": {"max_new_tokens": 4, "batch_size": 4},
            "qff": {"allow_untrained": True},  # the tiny QFF evaluated untrained, on purpose
            "retrieval": {"shard_size": 64},
        },
    )
    previous = os.environ.get("QKVQA_EXPERIMENTS")
    os.environ["QKVQA_EXPERIMENTS"] = str(root)  # only while building; tests set it themselves
    try:
        for command in (["embed", "experiment=world_eval"], ["index", "build", "experiment=world_eval"]):
            clear_run_env()
            assert main(command) == 0
    finally:
        if previous is None:
            os.environ.pop("QKVQA_EXPERIMENTS", None)
        else:
            os.environ["QKVQA_EXPERIMENTS"] = previous
        clear_run_env()
    return {"root": root, "runs": tmp / "runs", "env": {**os.environ, "QKVQA_EXPERIMENTS": str(root)}}
