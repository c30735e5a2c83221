"""Issue 31 item 6: a full disk, a read-only folder and a crafted pickle are one line each (path, free space, the
fix), never a traceback; partial files of killed builds are removed by the next build. The full disk is a real
small tmpfs and the read-only folder a real read-only bind mount (root, as CI runs; skipped where mounting is not
allowed)."""

from __future__ import annotations

import os
import pickle
import subprocess
import uuid
from pathlib import Path

import pytest
import torch

from qkvqa.cli.main import main
from qkvqa.errors import DataError
from qkvqa.run.checkpoint_io import CheckedCheckpointIO, load_torch_checkpoint, sidecar_of
from qkvqa.run.rundir import clear_run_env
from tests.integration.test_retrieval_pipeline import experiments  # noqa: F401 (fixture)


def _mount(*args: str) -> bool:
    return subprocess.run(["mount", *args], capture_output=True, timeout=30).returncode == 0


def _umount(path: Path) -> None:
    subprocess.run(["umount", str(path)], capture_output=True, timeout=30)


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or not _mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)):
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    yield mount
    _umount(mount)


@pytest.fixture
def read_only(tmp_path):
    """An empty folder bind-mounted read-only (root ignores mode bits, a read-only mount it cannot)."""
    source, mount = tmp_path / "ro-source", tmp_path / "ro"
    source.mkdir()
    mount.mkdir()
    if os.geteuid() != 0 or not _mount("--bind", str(source), str(mount)):
        pytest.skip("a bind mount needs root (CI runs as root)")
    if not _mount("-o", "remount,bind,ro", str(mount)):
        _umount(mount)
        pytest.skip("remounting read-only is not allowed here")
    yield mount
    _umount(mount)


def _fill(folder: Path) -> None:
    """Leave a few KiB free."""
    with open(folder / "ballast", "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 4096)
                f.flush()
        except OSError:
            pass
    os.truncate(folder / "ballast", max(0, (folder / "ballast").stat().st_size - 16 * 1024))


def test_a_checkpoint_save_on_a_full_disk_is_one_line_and_keeps_the_previous_one(full_disk):
    io = CheckedCheckpointIO()
    path = full_disk / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(16)}, "global_step": 1}, path)
    _fill(full_disk)
    with pytest.raises(DataError) as caught:
        io.save_checkpoint({"state_dict": {"w": torch.zeros(200_000)}, "global_step": 2}, path)
    line = str(caught.value)
    assert "\n" not in line
    assert f"{path}: the checkpoint could not be saved; the previous one is intact" in line
    assert "No space left on device" in line and "free there" in line
    assert io.load_checkpoint(path)["global_step"] == 1 and sidecar_of(path).is_file()
    assert not list(full_disk.glob(".last.ckpt.partial-*"))


def _kb_build(world, out: Path, capsys) -> tuple[int, str]:
    rc = main(
        ["kb", "build", "--source", str(Path(world["dir"]) / "kb" / "encyclopedic_kb_wiki.json"), "--out", str(out)]
    )
    return rc, capsys.readouterr().err


def test_kb_build_on_a_full_disk_is_one_line_with_the_space_needed(world, full_disk, capsys):
    _fill(full_disk)
    rc, err = _kb_build(world, full_disk / "store", capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("qkvqa kb: error: ") and str(full_disk / "store") in err
    assert "free there, and this needs about" in err and "Traceback" not in err
    assert not list((full_disk / "store").glob(".*.partial-*"))


def test_kb_build_into_a_read_only_folder_is_one_line(world, read_only, capsys):
    rc, err = _kb_build(world, read_only / "store", capsys)
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert "Read-only file system" in err and str(read_only / "store") in err


def test_a_read_only_run_root_is_one_line_naming_it(experiments, read_only, capsys):
    clear_run_env()
    rc = main(["embed", "experiment=world", f"paths.checkpoints_root={read_only}"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    line = [ln for ln in err.splitlines() if "error:" in ln]
    assert line and str(read_only) in line[0] and "read-only" in line[0]


def test_a_read_only_cache_is_one_line_naming_it(experiments, read_only, capsys):
    clear_run_env()
    rc = main(["embed", "experiment=world", f"paths.cache_dir={read_only}"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err, err
    assert any(str(read_only) in ln and "read-only" in ln for ln in err.splitlines() if "error:" in ln), err


def test_a_killed_kb_build_leaves_no_partial_after_the_next_build(world, tmp_path, capsys):
    out = tmp_path / "store"
    out.mkdir()
    dead = out / ".kb.sqlite.partial-999999999"  # a SIGKILLed build of a process that is gone
    dead.write_bytes(b"\0" * 4096)
    assert _kb_build(world, out, capsys)[0] == 0
    assert not dead.exists() and (out / "kb.sqlite").is_file()


def test_a_killed_index_build_leaves_no_partial_after_the_next_build(tmp_path):
    import faiss
    import numpy as np

    from qkvqa.retrieval.index import _write_index_files

    index = faiss.IndexFlatIP(4)
    index.add(np.eye(4, dtype="float32"))
    dead = tmp_path / ".index.faiss.partial-999999999"
    dead.write_bytes(b"\0" * 4096)
    _write_index_files(index, np.arange(4), tmp_path)
    assert not dead.exists() and (tmp_path / "index.faiss").is_file()


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))  # would create the marker when unpickled


def test_a_crafted_pickle_as_a_checkpoint_is_refused_in_one_line_and_never_runs(tmp_path):
    marker = tmp_path / f"ran-{uuid.uuid4().hex}"
    path = tmp_path / "last.ckpt"
    torch.save({"state_dict": {}, "payload": _Payload(str(marker))}, path, pickle_module=pickle)
    for load in (
        lambda: load_torch_checkpoint(path, weights_only=True),
        lambda: CheckedCheckpointIO().load_checkpoint(path),
    ):
        with pytest.raises(
            DataError,
            match=r"last\.ckpt: refused: it holds Python objects that a weights-only load "
            r"does not allow.*never runs code",
        ):
            load()
    assert not marker.exists()
