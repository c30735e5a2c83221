"""Issue 44 class 1: a resumed training whose hard-negative pool file was edited since it started went on without a
word (to other weights than the unedited run's). The pool files' sha256 is recorded when training starts and checked
when it resumes from last.ckpt."""

from __future__ import annotations

import json

import pytest

from qkvqa.config.load import compose, to_yaml
from qkvqa.errors import ConfigError
from qkvqa.run.resume import INPUTS_FILE, prepare_resume
from qkvqa.run.rundir import clear_run_env, resolve_run


def _prepare(tmp_path, pools, *extra):
    clear_run_env()
    cfg = compose(
        None, [], [f"paths.checkpoints_root={tmp_path / 'runs'}", "run_id=t", f"qff.negatives={pools}", *extra]
    )
    run = resolve_run(cfg)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    return cfg, run


@pytest.mark.slow
def test_a_pool_file_edited_before_a_resume_is_refused_naming_the_key(tmp_path):
    pools = tmp_path / "train_pools.json"
    pools.write_text(json.dumps({"a.jpg": {"top_20": []}}))
    cfg, run = _prepare(tmp_path, pools)
    assert prepare_resume(cfg, run, trains=True) == (None, {})  # the first launch records the file
    recorded = json.loads((run.run_dir / INPUTS_FILE).read_text())
    assert set(recorded) == {"qff.negatives"} and len(recorded["qff.negatives"]["sha256"]) == 64
    (run.run_dir / "config.yaml").write_text(to_yaml(cfg))  # what run_job writes after it
    (run.run_dir / "last.ckpt").write_bytes(b"saved")
    cfg, run = _prepare(tmp_path, pools, "resume=auto")
    assert prepare_resume(cfg, run, trains=True)[0] == str(run.run_dir / "last.ckpt")  # unchanged: resumes
    pools.write_text(json.dumps({"a.jpg": {"top_20": [{"entry": "x"}]}}))  # edited in place
    with pytest.raises(ConfigError, match=r"^qff.negatives: .*train_pools.json changed since run t started training"):
        prepare_resume(cfg, run, trains=True)
