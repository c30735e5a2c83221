"""`qkvqa train` with the Q-Former started from a real BERT (components.qformer.init=bert:<MiniLM>) on the world."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from qkvqa.cli.main import main
from qkvqa.run.record import RunRecord
from qkvqa.run.rundir import clear_run_env
from tests.helpers.qff_study import init_overrides, mine_world

pytestmark = [pytest.mark.slow, pytest.mark.real]

MINILM = "sentence-transformers/all-MiniLM-L6-v2"


def test_training_from_the_bert_runs_end_to_end_and_the_focus_path_learns(world, tmp_path):
    """Four steps: the run finishes, the zero-initialised gates move and the focus blocks get gradient from then on; the exported QFF is MiniLM's shape and says which BERT it started from."""
    overrides = mine_world(world, tmp_path)
    clear_run_env()
    code = main(
        [
            "train",
            "experiment=demo/qff_per_layer",
            "run_id=bert-init",
            *overrides,
            *init_overrides(f"bert:{MINILM}"),
            "trainer.max_steps=4",
            "trainer.limit_val_batches=0",
            "checkpoint.monitor=null",
            "trainer.enable_progress_bar=false",
            "trainer.log_every_n_steps=1",
        ]
    )
    assert code == 0
    run = tmp_path / "runs" / "bert-init"
    assert json.loads((run / "status.json").read_text())["state"] == "finished"
    grads = [row["value"] for row in RunRecord(run).read_metrics() if row["name"] == "train/focus_grad_norm"]
    # step 1: the zero-initialised gates pass the focus blocks no gradient (tanh(0) = 0); once they moved, they do
    assert len(grads) == 4 and grads[0] == 0 and all(g > 0 for g in grads[1:]), grads
    exported = load_file(str(run / "qff" / "model.safetensors"))
    assert exported["q_gate"].abs().min() > 0, "every layer's zero-initialised gate moved"
    config = json.loads((run / "qff" / "qff_config.json").read_text())
    assert config["base_config"]["qkvqa_init"]["bert"] == MINILM
    shape = config["base_config"]["qformer_config"]
    assert (shape["hidden_size"], shape["num_hidden_layers"], shape["vocab_size"]) == (384, 6, 30523)
