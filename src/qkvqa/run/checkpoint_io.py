"""Lightning checkpoints saved atomically beside their target, with a sha256 sidecar checked before every load.

Why we own this:
- torch's zip reader does not check the bytes of a tensor, so a flipped byte in last.ckpt resumed
  into a non-finite weight and the run ended "finished";
- Lightning's fsspec save writes its temporary file in $TMPDIR and moves it, a copy when $TMPDIR is
  another filesystem (the usual cluster layout): a kill during the copy left a 0-byte last.ckpt, and
  each killed save leaked its temporary file.
So each save removes `NAME.sha256`, writes `.NAME.partial-PID` in the target's directory, fsyncs it,
renames it over the target (atomic on one filesystem) and then writes the sidecar. A kill leaves the
previous checkpoint whole (a stale partial of a dead process is removed by the next save); a full
disk leaves it whole too, and says so in one line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Optional

from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from qkvqa.errors import DataError
from qkvqa.utils.io import atomic_write, atomic_write_text, disk_error_message, remove_dead_partials, sha256_file

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
        raise DataError(
            f"{path}: corrupt checkpoint (sha256 {found[:12]}, {sidecar.name} records {wanted[:12]}): it "
            "changed after it was written; restore it from a copy, or start a new run (another run_id)"
        )


def _unreadable(path: str | os.PathLike, error: BaseException) -> DataError:
    return DataError(
        f"{path}: unreadable checkpoint ({' '.join(str(error).split())[:160]}); it is truncated or not a "
        "torch checkpoint: restore it, or start a new run (another run_id)"
    )


def _refused_pickle(path: str | os.PathLike, error: BaseException) -> DataError:
    return DataError(
        f"{path}: refused: it holds Python objects that a weights-only load does not allow "
        f"({' '.join(str(error).split())[:120]}), as a crafted or foreign pickle does; qkvqa never runs "
        "code from a checkpoint: use a checkpoint qkvqa wrote, or start a new run (another run_id)"
    )


def load_torch_checkpoint(path: str | os.PathLike, **kwargs: Any) -> dict:
    """`torch.load` of a checked checkpoint; an unreadable (truncated, foreign) file or a pickle that a weights-only
    load refuses is one DataError line."""
    import pickle

    import torch

    verify_checkpoint(path)
    try:
        return torch.load(path, **kwargs)
    except pickle.UnpicklingError as e:
        raise _refused_pickle(path, e) from None
    except (RuntimeError, EOFError, OSError) as e:
        raise _unreadable(path, e) from None


class _WriteErrors:
    """A file that remembers the OSError of a failed write before torch wraps it in a RuntimeError."""

    def __init__(self, f, errors: list[OSError]):
        self._f, self._errors = f, errors

    def write(self, data) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self._errors.append(e)
            raise

    def __getattr__(self, name: str):
        return getattr(self._f, name)


class CheckedCheckpointIO(TorchCheckpointIO):
    """TorchCheckpointIO that writes and checks a sha256 sidecar beside every checkpoint."""

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Optional[Any] = None
    ) -> None:
        import torch

        if storage_options is not None:
            raise TypeError("CheckedCheckpointIO takes no storage_options")
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        remove_dead_partials(path.parent)  # any killed save's, a top-k file's included
        sidecar = sidecar_of(path)
        previous = sidecar.read_text() if sidecar.is_file() and path.is_file() else None
        sidecar.unlink(missing_ok=True)
        failed: list[OSError] = []
        try:
            atomic_write(path, lambda f: torch.save(checkpoint, _WriteErrors(f, failed)))
        except (OSError, RuntimeError) as e:
            # torch's zip writer turns the OSError of a full disk into RuntimeError("unexpected pos ..."): the
            # wrapper kept the OSError, so both say the same line; any other RuntimeError is not ours to explain.
            error = e if isinstance(e, OSError) else (failed[0] if failed else None)
            if previous is not None:
                atomic_write_text(sidecar, previous)  # the previous checkpoint stays whole and checked
            if error is None:
                raise
            needed = path.stat().st_size if path.is_file() else None
            raise DataError(
                f"{path}: the checkpoint could not be saved; the previous one is intact. "
                f"{disk_error_message(error, path.parent, needed)}"
            ) from None
        except BaseException:
            if previous is not None:
                atomic_write_text(sidecar, previous)
            raise
        atomic_write_text(sidecar_of(path), sha256_file(path) + "\n")

    def load_checkpoint(
        self,
        path: str | os.PathLike,
        map_location: Optional[Callable] = lambda storage, loc: storage,
        weights_only: Optional[bool] = None,
    ) -> dict[str, Any]:
        import pickle

        verify_checkpoint(path)
        try:
            return super().load_checkpoint(path, map_location=map_location, weights_only=weights_only)
        except pickle.UnpicklingError as e:
            raise _refused_pickle(path, e) from None
        except (RuntimeError, EOFError) as e:
            raise _unreadable(path, e) from None

    def remove_checkpoint(self, path: str | os.PathLike) -> None:
        super().remove_checkpoint(path)
        sidecar_of(path).unlink(missing_ok=True)
