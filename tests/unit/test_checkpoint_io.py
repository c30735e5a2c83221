"""CheckedCheckpointIO: atomic saves beside the target, the sha256 sidecar, and clear errors."""

from __future__ import annotations

import os

import pytest
import torch

from qkvqa.errors import DataError
from qkvqa.run.checkpoint_io import CheckedCheckpointIO, sidecar_of


def test_a_save_is_atomic_leaves_no_debris_and_a_failed_one_keeps_the_previous_checkpoint(tmp_path):
    io = CheckedCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"state_dict": {"w": torch.ones(3)}, "global_step": 1}, path)
    assert io.load_checkpoint(path)["global_step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "last.ckpt.sha256"]
    (tmp_path / ".last.ckpt.partial-999999999").write_bytes(b"left by a killed save")  # no such process
    with pytest.raises(Exception):
        io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "bad": lambda: None}, path)  # unpicklable
    assert not list(tmp_path.glob(".last.ckpt.partial-*"))  # its own partial and the dead one are gone
    assert sidecar_of(path).is_file()  # restored: the previous checkpoint stays checked
    assert torch.load(path, weights_only=True)["global_step"] == 1  # the previous checkpoint is whole
    io.save_checkpoint({"state_dict": {"w": torch.zeros(3)}, "global_step": 2}, path)
    assert io.load_checkpoint(path)["global_step"] == 2
    io.remove_checkpoint(path)
    assert list(tmp_path.iterdir()) == []


def test_a_save_that_cannot_be_written_is_one_line_and_keeps_the_previous_checkpoint(tmp_path):
    """An OSError while writing (disk full, permissions; here the partial's name is taken by a directory)."""
    io = CheckedCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    blocker = tmp_path / f".last.ckpt.partial-{os.getpid()}"
    blocker.mkdir()
    with pytest.raises(DataError, match=r"last\.ckpt: the checkpoint could not be saved.*previous one is intact"):
        io.save_checkpoint({"global_step": 2}, path)
    blocker.rmdir()
    assert io.load_checkpoint(path)["global_step"] == 1 and sidecar_of(path).is_file()
