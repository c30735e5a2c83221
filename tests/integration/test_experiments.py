"""Every experiment in experiments/ runs with tiny components on the synthetic world (ashleve's experiment=glob(*))."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from qkvqa.cli.main import main
from qkvqa.config.load import compose, list_experiments
from qkvqa.run.rundir import clear_run_env
from tests.integration.conftest import REPO

EXPERIMENTS = list_experiments(REPO / "experiments")
COMMANDS = {"evaluate": ["evaluate"], "train": ["train"], "retrieve": ["retrieve"], "rerank": ["rerank"]}


def dotlist(prefix: str, mapping: dict) -> list[str]:
    """`key=value` overrides for a nested mapping (lists in YAML flow style)."""
    out = []
    for key, value in mapping.items():
        name = f"{prefix}.{key}"
        if isinstance(value, dict):
            out += dotlist(name, value)
        elif isinstance(value, list):
            out.append(f"{name}=[{','.join(json.dumps(v) for v in value)}]")
        else:
            out.append(f"{name}={'null' if value is None else value}")
    return out


def tiny_overrides(world: dict, dataset: str, runs: Path, cache: Path) -> list[str]:
    """Replace the real data, weights and hardware of an experiment by the synthetic world and tiny components."""
    data = yaml.safe_load((Path(world["dir"]) / f"data_{dataset}.yaml").read_text(encoding="utf-8"))
    tokens = ["~data", *dotlist("data", {**data, "max_questions": 3, "batch_size": 3})]
    for name, kind in {
        "image_encoder": "evaclip_hf",
        "text_encoder": "evaclip_hf",
        "qformer": "blip2_qff",
        "reranker": "bge_reranker",
        "judge": "bem",
    }.items():
        tokens += [
            f"components.{name}.kind={kind}",
            f"components.{name}.tiny=true",
            f"components.{name}.device=cpu",
            f"components.{name}.dtype=fp32",
        ]
    tokens += [
        "components.generator.tiny=true",
        "components.generator.device=cpu",
        "components.generator.dtype=fp32",
        "qff.checkpoint=null",
        "qff.allow_untrained=true",
        "generation.max_new_tokens=3",
        "retrieval.shard_size=64",
        "retrieval.mode=image_to_summary",  # the index the eval_env fixture built
        f"paths.checkpoints_root={runs}",
        f"paths.cache_dir={cache}",
        "preset=cpu",
        "trainer.max_steps=2",
        "trainer.limit_val_batches=1",
        "trainer.enable_progress_bar=false",
        "logger.wandb.enabled=false",
    ]
    return tokens


def test_every_experiment_is_listed():
    assert "table5/evqa_full_cda" in EXPERIMENTS and len(EXPERIMENTS) >= 15


@pytest.mark.slow
@pytest.mark.parametrize("name", EXPERIMENTS)
def test_experiment_runs_with_tiny_components(name, eval_env, world, monkeypatch):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(REPO / "experiments"))
    cfg = compose(name, [], [])
    overrides = tiny_overrides(world, cfg.data.dataset, eval_env["runs"], eval_env["runs"].parent / "cache")
    composed = compose(name, ["cpu"], [t for t in overrides if not t.startswith("preset=")])
    assert composed.components.generator.tiny and composed.data.root == world["dir"]
    clear_run_env()
    run_id = "exp-" + name.replace("/", "-")
    assert main([*COMMANDS[cfg.task], f"experiment={name}", f"run_id={run_id}", *overrides]) == 0
    run_dir = eval_env["runs"] / run_id
    status = json.loads((run_dir / "status.json").read_text())
    assert status["state"] == "finished"
    if cfg.task == "evaluate":
        rows = (run_dir / "predictions.jsonl").read_text().splitlines()
        assert len(rows) == 3 and (run_dir / "report.md").exists()
        traces = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
        assert [t["data_id"] for t in traces] == [json.loads(row)["data_id"] for row in rows]
        assert all(t["dataset"] == cfg.data.dataset and t["filter"]["name"] == cfg.eval.filter for t in traces)
