"""Whole-pipeline throughput on CPU with tiny components: questions/s and each stage's share of the time.

Generates a synthetic world, builds the stage-1 index with tiny encoders, then runs `qkvqa evaluate`
(QFF filter, full CDA, tiny Llama generator) over the test split and reads the per-stage seconds
that every prediction row records. Writes bench/out/pipeline.json and bench/out/pipeline.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench" / "out"
STAGES = ("retrieve", "filter", "select", "generate")


def tiny(kind: str) -> dict:
    return {"kind": kind, "tiny": True, "device": "cpu", "dtype": "fp32"}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entities", type=int, default=60, help="synthetic world size")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    args = parser.parse_args(argv)
    os.environ.setdefault("WANDB_MODE", "disabled")
    os.environ.setdefault("QKVQA_PROGRESS", "0")
    import torch
    import yaml

    from qkvqa.cli.main import main as qkvqa
    from qkvqa.run.rundir import clear_run_env
    from qkvqa.synth.world import generate_world

    with tempfile.TemporaryDirectory(prefix="qkvqa-bench-pipeline-") as tmp:
        tmp = Path(tmp)
        generate_world(tmp / "world", entities=args.entities, seed=0)
        root = tmp / "experiments"
        root.mkdir()
        for name in ("base", "presets"):
            (root / name).symlink_to(REPO / "experiments" / name)
        data = yaml.safe_load((tmp / "world" / "data_evqa.yaml").read_text())
        (root / "bench.yaml").write_text(
            yaml.safe_dump(
                {
                    "data": data,
                    "paths": {"cache_dir": str(tmp / "cache"), "checkpoints_root": str(tmp / "runs")},
                    "components": {
                        "image_encoder": tiny("evaclip_hf"),
                        "text_encoder": tiny("evaclip_hf"),
                        "qformer": tiny("blip2_qff"),
                        "reranker": tiny("bge_reranker"),
                        "generator": tiny("llama3"),
                        "judge": tiny("bem"),
                    },
                    "trainer": {"accelerator": "cpu", "enable_progress_bar": False},
                    "logger": {"wandb": {"enabled": False}},
                    "generation": {"max_new_tokens": args.max_new_tokens},
                    "eval": {"judge": "em_only"},
                    "qff": {"allow_untrained": True},
                }
            )
        )
        os.environ["QKVQA_EXPERIMENTS"] = str(root)
        for command in (["embed", "experiment=bench"], ["index", "build", "experiment=bench"]):
            clear_run_env()
            qkvqa(command)
        clear_run_env()
        start = time.perf_counter()
        qkvqa(["evaluate", "experiment=bench", "run_id=bench"])
        wall = time.perf_counter() - start
        scores = json.loads((tmp / "runs" / "bench" / "scores.json").read_text())
    seconds = scores["seconds_per_question"]
    per_question = sum(seconds.values())
    result = {
        "benchmark": "pipeline",
        "entities": args.entities,
        "questions": scores["n_scored"],
        "torch_threads": torch.get_num_threads(),
        "load_average_1min": os.getloadavg()[0],
        "evaluate_wall_s": wall,
        "seconds_per_question": seconds,
        "questions_per_s_stages": 1.0 / per_question if per_question else None,
        "questions_per_s_wall": scores["n_scored"] / wall,
        "stage_share": {s: seconds[s] / per_question for s in STAGES} if per_question else {},
    }
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "pipeline.json").write_text(json.dumps(result, indent=2))
    lines = [
        f"{result['questions']} questions, tiny components on CPU ({result['torch_threads']} threads); "
        f"{result['questions_per_s_wall']:.2f} questions/s over the whole `qkvqa evaluate` "
        f"(start-up and model building included), {result['questions_per_s_stages']:.2f} questions/s in the stages.",
        "",
        "| stage | s/question | share |",
        "|---|---|---|",
    ]
    lines += [f"| {s} | {seconds[s]:.4f} | {100 * result['stage_share'][s]:.1f}% |" for s in STAGES]
    (OUT / "pipeline.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
