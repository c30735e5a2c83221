"""Issue 44 class 4: run roots and caches in shared (1777) folders. Another user's folder, or a link someone planted
where qkvqa keeps its own file, is refused in one line and nothing is written through it; a `${oc.env:SECRET}` value
never reaches W&B's run file."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from qkvqa.config.load import compose
from qkvqa.errors import ConfigError

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a folder another user owns (chown)")


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file of the user's that a planted link points at."""
    path = tmp_path / "precious.txt"
    path.write_text("keep me\n")
    return path


@pytest.fixture
def shared_root(tmp_path) -> Path:
    root = tmp_path / "scratch"
    root.mkdir()
    os.chmod(root, 0o1777)  # a cluster's scratch
    return root


def _planted(run_dir: Path, victim: Path) -> None:
    run_dir.mkdir()
    (run_dir / ".lock").symlink_to(victim)
    (run_dir / "metrics.csv").symlink_to(victim)


@as_root
def test_a_run_folder_another_user_pre_created_in_a_shared_root_is_refused_and_nothing_is_written(shared_root, victim):
    from qkvqa.run.job import run_job

    _planted(shared_root / "mine", victim)
    os.chown(shared_root / "mine", NOBODY, NOBODY)
    cfg = compose(None, [], [f"paths.checkpoints_root={shared_root}", "run_id=mine"])
    with pytest.raises(ConfigError, match=r"run directory .*mine is owned by uid 65534, not by you.*run_id"):
        with run_job(cfg, "test"):
            pass
    assert victim.read_text() == "keep me\n"
    assert sorted(p.name for p in (shared_root / "mine").iterdir()) == [".lock", "metrics.csv"]


def test_a_world_writable_run_folder_is_refused(shared_root):
    from qkvqa.run.job import run_job

    (shared_root / "open").mkdir()
    os.chmod(shared_root / "open", 0o777)
    cfg = compose(None, [], [f"paths.checkpoints_root={shared_root}", "run_id=open"])
    with pytest.raises(ConfigError, match=r"is world-writable \(mode 0777\)"):
        with run_job(cfg, "test"):
            pass


def test_a_run_folder_that_is_a_planted_symlink_is_refused_before_it_is_followed(shared_root, tmp_path):
    from qkvqa.run.job import run_job

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (shared_root / "linked").symlink_to(elsewhere)
    cfg = compose(None, [], [f"paths.checkpoints_root={shared_root}", "run_id=linked"])
    with pytest.raises(ConfigError, match=r"run directory .*linked is a symlink"):
        with run_job(cfg, "test"):
            pass
    assert list(elsewhere.iterdir()) == []


def test_the_run_lock_never_truncates_through_a_link(tmp_path, victim):
    from qkvqa.run.lock import RunLock, is_held

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / ".lock").symlink_to(victim)
    with pytest.raises(ConfigError, match=r"\.lock is a symlink .* never written or read through a link"):
        RunLock.acquire(tmp_path / "run")
    assert victim.read_text() == "keep me\n" and not is_held(tmp_path / "run")


def test_run_record_files_are_never_appended_through_a_link(tmp_path, victim):
    from qkvqa.run.record import RunRecord
    from qkvqa.utils.io import append_jsonl

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "metrics.csv").symlink_to(victim)
    (tmp_path / "run" / "answers.jsonl").symlink_to(victim)
    with pytest.raises(ConfigError, match="metrics.csv is a symlink"):
        RunRecord(tmp_path / "run").append_metrics({"loss": 1.0}, step=0)
    with pytest.raises(ConfigError, match="answers.jsonl is a symlink"):
        append_jsonl(tmp_path / "run" / "answers.jsonl", [{"a": 1}])
    assert victim.read_text() == "keep me\n"


def test_a_symlinked_manifest_in_a_shared_cache_is_not_followed(tmp_path):
    from qkvqa.retrieval.embed import EmbeddingSet
    from qkvqa.retrieval.index import load_index

    theirs = tmp_path / "theirs.json"
    theirs.write_text(json.dumps({"what": "kb_text", "n_rows": 1, "n_shards": 1, "shard_size": 1}))
    for name in ("set", "index"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").symlink_to(theirs)
    with pytest.raises(ConfigError, match=r"set/manifest.json is a symlink"):
        EmbeddingSet.open(tmp_path / "set")
    with pytest.raises(ConfigError, match=r"index/manifest.json is a symlink"):
        load_index(tmp_path / "index", kb_store=None)


@as_root
def test_a_cache_entry_another_user_owns_is_refused(tmp_path, monkeypatch):
    from qkvqa.retrieval.embed import Embedder

    path = tmp_path / "cache" / "embeddings" / "kb_text-0123456789ab"
    path.mkdir(parents=True)
    os.chown(path, NOBODY, NOBODY)
    monkeypatch.setattr(Embedder, "set_path", lambda self: path)
    with pytest.raises(ConfigError, match=r"embedding set .* is owned by uid 65534, not by you"):
        Embedder.open_or_create(Embedder.__new__(Embedder))


@pytest.mark.slow
def test_a_value_read_from_the_environment_never_reaches_the_wandb_run_settings(monkeypatch, tmp_path):
    from qkvqa.loggers.wandb import run_settings
    from qkvqa.run.rundir import RunContext

    monkeypatch.setenv("QKVQA_TEST_SECRET", "sk-9f8e7d6c")
    cfg = compose(
        None,
        [],
        [
            "notes=token ${oc.env:QKVQA_TEST_SECRET}",
            "logger.wandb.group=${oc.env:QKVQA_TEST_SECRET}",
            "logger.wandb.tags=[plain,'${oc.env:QKVQA_TEST_SECRET}']",
        ],
    )
    assert cfg.logger.wandb.group == "sk-9f8e7d6c"  # used when read
    run = RunContext(run_id="r", run_dir=tmp_path, resumed=False, launched_by_sweep=False)
    settings = run_settings(cfg, run, "train")
    assert "sk-9f8e7d6c" not in json.dumps(settings, default=str)
    assert settings["group"] == "${oc.env:QKVQA_TEST_SECRET}" and "plain" in settings["tags"]
    assert settings["notes"] == "token ${oc.env:QKVQA_TEST_SECRET}"
