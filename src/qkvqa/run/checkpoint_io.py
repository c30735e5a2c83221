"""Lightning checkpoints with a sha256 sidecar: written after every save, checked before every load.

Why we own this: torch's zip reader does not check the bytes of a tensor, so a flipped byte in
last.ckpt resumed into a non-finite weight and the run ended "finished". Each save first removes
`NAME.sha256`, writes the checkpoint, then writes the sidecar; a kill in between leaves no sidecar
(the checkpoint is then either complete and accepted, or truncated and refused by torch's reader),
never a stale hash.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from qkvqa.errors import DataError
from qkvqa.utils.io import atomic_write_text, sha256_file

SIDECAR_SUFFIX = ".sha256"


def sidecar_of(path: str | os.PathLike) -> Path:
    """The sidecar that holds a checkpoint's sha256 (`last.ckpt` -> `last.ckpt.sha256`)."""
    return Path(str(path) + SIDECAR_SUFFIX)


def verify_checkpoint(path: str | os.PathLike) -> None:
    """DataError naming the file when it does not match the sha256 written at save time (no sidecar: not checked)."""
    sidecar = sidecar_of(path)
    if not sidecar.is_file():
        return
    wanted = sidecar.read_text().strip()
    found = sha256_file(path)
    if found != wanted:
        raise DataError(f"{path}: corrupt checkpoint (sha256 {found[:12]}, {sidecar.name} records {wanted[:12]}): it "
                        "changed after it was written; restore it from a copy, or start a new run (another run_id)")


def _unreadable(path: str | os.PathLike, error: BaseException) -> DataError:
    return DataError(f"{path}: unreadable checkpoint ({' '.join(str(error).split())[:160]}); it is truncated or not a "
                     "torch checkpoint: restore it, or start a new run (another run_id)")


def load_torch_checkpoint(path: str | os.PathLike, **kwargs: Any) -> dict:
    """`torch.load` of a checked checkpoint; an unreadable (truncated, foreign) file is one DataError line."""
    import torch

    verify_checkpoint(path)
    try:
        return torch.load(path, **kwargs)
    except (RuntimeError, EOFError, OSError) as e:
        raise _unreadable(path, e) from None


class CheckedCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO that writes and checks a sha256 sidecar beside every checkpoint."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike,
                        storage_options: Optional[Any] = None) -> None:
        sidecar_of(path).unlink(missing_ok=True)
        super().save_checkpoint(checkpoint, path, storage_options)
        atomic_write_text(sidecar_of(path), sha256_file(path) + "\n")

    def load_checkpoint(self, path: str | os.PathLike, map_location: Optional[Callable] = lambda storage, loc: storage,
                        weights_only: Optional[bool] = None) -> dict[str, Any]:
        verify_checkpoint(path)
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except (RuntimeError, EOFError) as e:
            raise _unreadable(path, e) from None

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        super().remove_checkpoint(path)
        sidecar_of(path).unlink(missing_ok=True)
