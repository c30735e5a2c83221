"""Output folders a command writes only when it created them or its marker is there, and whose old files it alone removes.

`qkvqa inspect --out DIR` and `qkvqa synth --out DIR` are pointed at folders by hand. Each keeps a marker file in its
folder listing the files it wrote; a rebuild removes only files of that list that it does not write again, so a
user's own file in the folder survives, and a folder that is neither new, empty nor marked is refused
(docs/security.md).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Iterable

from qkvqa.errors import ConfigError
from qkvqa.utils.io import atomic_write_json, path_within


class OwnedDir:
    """A folder that `what` (e.g. "qkvqa inspect --out") writes, recognised by its marker file `marker`."""

    def __init__(self, path: str | os.PathLike, marker: str, what: str):
        self.path, self.marker, self.what = Path(path), marker, what

    @property
    def marker_path(self) -> Path:
        return self.path / self.marker

    def files(self) -> list[str]:
        """The relative paths the last build listed (empty for a new folder)."""
        try:
            record = json.loads(self.marker_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        files = record.get("files") if isinstance(record, dict) else None
        return [f for f in files if isinstance(f, str)] if isinstance(files, list) else []

    def claim(self) -> set[str]:
        """Make sure the folder is ours (created now, empty, or marked) and return the files the last build wrote."""
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_dir()):
            raise ConfigError(f"{self.what} {self.path}: not a folder; choose a new folder")
        if self.path.is_dir() and not self.marker_path.is_file() and any(self.path.iterdir()):
            raise ConfigError(
                f"{self.what} {self.path}: this folder holds files that {self.what} did not write (no "
                f"{self.marker}), and they could be lost or served; choose a new or empty folder"
            )
        previous = set(self.files())
        self.path.mkdir(parents=True, exist_ok=True)
        if not self.marker_path.is_file():
            self.record(())
        return previous

    def record(self, files: Iterable[str]) -> None:
        """Write the marker listing `files` (relative paths)."""
        atomic_write_json(self.marker_path, {"written_by": self.what, "files": sorted(set(files))})

    def inside(self, relative: str) -> Path | None:
        """`relative` as a path under the folder, or None when it leaves it (absolute, `..`, a symlink out)."""
        root = self.path.resolve()
        target = (root / relative).resolve()
        return target if target != root and path_within(target, root) else None

    def remove_old(self, previous: Iterable[str], keep: Iterable[str]) -> None:
        """Remove the files of an earlier build (`previous`) that this one did not write (`keep`), and the folders
        that leaves empty; nothing outside the list is touched."""
        kept = set(keep)
        folders = set()
        for relative in sorted(set(previous) - kept):
            path = self.inside(relative)
            if path is None or path.is_symlink() or not path.is_file():
                continue
            path.unlink()
            folders.update(p for p in path.parents if self.path.resolve() in p.parents)
        for folder in sorted(folders, key=lambda p: len(p.parts), reverse=True):
            try:
                folder.rmdir()  # only when empty
            except OSError:
                pass

    def all_files(self) -> set[str]:
        """Every regular file under the folder (relative paths), the marker left out."""
        out = set()
        for parent, _dirs, names in os.walk(self.path):
            for name in names:
                path = Path(parent) / name
                if not path.is_symlink():
                    out.add(str(path.relative_to(self.path)))
        out.discard(self.marker)
        return out
