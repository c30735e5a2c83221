"""Every output file gets the mode a plain open() gives under the umask (0o666 & ~umask), so runs can be shared."""

from __future__ import annotations

import os
import stat
from contextlib import contextmanager
from pathlib import Path

import pytest

from qkvqa.utils.io import atomic_write, atomic_write_json, atomic_write_text, current_umask, make_shareable


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def tree_modes(root: Path) -> dict[str, int]:
    """Mode of every file and directory under `root`, by relative path (symlinks left out)."""
    return {str(p.relative_to(root)): mode(p) for p in [root, *root.rglob("*")] if not p.is_symlink()}


def test_current_umask_reads_without_changing_it():
    with umask(0o027):
        assert current_umask() == 0o027 and current_umask() == 0o027
    with umask(0o002):
        assert current_umask() == 0o002


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_atomic_writes_honour_the_umask(tmp_path, mask, expected):
    with umask(mask):
        atomic_write_json(tmp_path / "a" / "status.json", {"state": "finished"})
        atomic_write_text(tmp_path / "report.md", "# report\n")
        atomic_write(tmp_path / "index.faiss", lambda f: f.write(b"x"))
    assert mode(tmp_path / "a" / "status.json") == mode(tmp_path / "report.md") == expected
    assert mode(tmp_path / "index.faiss") == expected
    assert mode(tmp_path / "a") == 0o777 & ~mask  # the directory as mkdir makes it


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_make_shareable_fixes_a_safetensors_file_and_a_tree(tmp_path, mask):
    import tempfile

    import torch
    from safetensors.torch import save_file

    with umask(mask):
        save_file({"w": torch.zeros(2)}, str(tmp_path / "model.safetensors"))
        make_shareable(tmp_path / "model.safetensors")
        assert mode(tmp_path / "model.safetensors") == 0o666 & ~mask
        tree = Path(tempfile.mkdtemp(dir=tmp_path))  # 0700
        (tree / "sub").mkdir(mode=0o700)
        os.close(os.open(tree / "sub" / "f", os.O_CREAT | os.O_WRONLY, 0o600))
        (tree / "link").symlink_to(tmp_path / "model.safetensors")
        os.chmod(tmp_path / "model.safetensors", 0o600)
        make_shareable(tree)
    assert tree_modes(tree) == {".": 0o777 & ~mask, "sub": 0o777 & ~mask, "sub/f": 0o666 & ~mask}
    assert mode(tmp_path / "model.safetensors") == 0o600  # a symlink's target is not touched


def test_the_trained_qff_export_and_a_kb_store_honour_the_umask(tmp_path):
    import torch

    from qkvqa.components import build_component
    from qkvqa.data.kb import build_kb_store
    from tests.data_fixtures import kb_entry, write_kb_json

    torch.manual_seed(0)
    with umask(0o002):  # not SQLite's 0644 nor safetensors' 0600: what the user asked for
        comp = build_component({"kind": "blip2_qff", "tiny": True, "device": "cpu", "options": {"num_layers": 2}})
        out = comp.save_pretrained(tmp_path / "qff")
        build_kb_store(
            write_kb_json(tmp_path / "kb.json", {"https://e/a": kb_entry("https://e/a", "A")}), tmp_path / "store"
        )
    paths = [p for root in (out, tmp_path / "store") for p in [root, *root.rglob("*")]]
    assert {"model.safetensors", "kb.sqlite", "manifest.json"} <= {p.name for p in paths}
    wrong = {str(p): oct(mode(p)) for p in paths if mode(p) != (0o775 if p.is_dir() else 0o664)}
    assert wrong == {}


def test_run_and_sweep_locks_are_created_with_the_umask_mode(tmp_path):
    from qkvqa.run.lock import RunLock
    from qkvqa.run.sweep_manifest import RunnerLock

    with umask(0o002):
        lock = RunLock.acquire(tmp_path)
        try:
            files = [p for p in tmp_path.iterdir() if p.is_file()]
            assert files and all(mode(p) == 0o664 for p in files)
        finally:
            lock.release()
        with RunnerLock(tmp_path / "sweep") as held:
            assert mode(held.path) == 0o664  # a lock file, never executable
