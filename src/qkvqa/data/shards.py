"""webdataset tar shards (ReflectiVA's InfoSeek queries): brace patterns, a key -> member index, member bytes.

A shard is a plain tar whose members are named `{key}.{extension}` (the webdataset convention: the
extension starts at the first dot of the base name), e.g. `0001.img.jpg` and `0001.question`. The
index scans the tar headers once (no member data is read) and reads a member's bytes by offset.
"""

from __future__ import annotations

import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional

from qkvqa.errors import DataError
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
_CHOICE = re.compile(r"\{([^{}]*,[^{}]*)\}")


def expand_braces(pattern: str) -> list[str]:
    """Shell-style brace expansion of `{0000..0014}` (zero padding kept) and `{a,b}`, leftmost brace first."""
    found = [m for m in (_RANGE.search(pattern), _CHOICE.search(pattern)) if m]
    if not found:
        return [pattern]
    match = min(found, key=lambda m: m.start())
    if match.re is _RANGE:
        first, last = match.group(1), match.group(2)
        width = len(first) if first.startswith("0") or len(first) == len(last) else 0
        step = 1 if int(last) >= int(first) else -1
        values = [str(i).zfill(width) for i in range(int(first), int(last) + step, step)]
    else:
        values = match.group(1).split(",")
    return [out for value in values for out in expand_braces(pattern[: match.start()] + value + pattern[match.end() :])]


def is_shard_pattern(path: str | os.PathLike) -> bool:
    """True for a `.tar` path or pattern (webdataset shards)."""
    return str(path).endswith(".tar")


def split_member_name(name: str) -> tuple[str, str]:
    """(key, extension) of a member name: `dir/0001.img.jpg` -> (`dir/0001`, `img.jpg`)."""
    directory, _, base = name.rpartition("/")
    stem, dot, extension = base.partition(".")
    return (f"{directory}/{stem}" if directory else stem), extension if dot else ""


@dataclass(frozen=True)
class ShardMember:
    """Where one member's bytes are: its shard, data offset and size."""

    shard: Path
    offset: int
    size: int


class ShardIndex:
    """Every sample of a list of shards: key -> {extension: member}, keys in shard order."""

    def __init__(self, shards: list[Path]):
        self.shards = shards
        self.samples: dict[str, dict[str, ShardMember]] = {}
        for shard in shards:
            self._scan(shard)

    @classmethod
    def from_pattern(cls, pattern: str | os.PathLike, root: Optional[str | os.PathLike] = None) -> "ShardIndex":
        """The index of every shard a brace pattern names (relative to `root`); a missing shard is an error."""
        return cls(shard_paths(pattern, root))

    def _scan(self, shard: Path) -> None:
        try:
            with tarfile.open(shard, mode="r:") as tar:
                for member in tar:
                    if not member.isfile():
                        continue
                    key, extension = split_member_name(member.name)
                    self.samples.setdefault(key, {})[extension] = ShardMember(shard, member.offset_data, member.size)
        except (tarfile.TarError, OSError, EOFError) as e:
            raise DataError(f"{shard}: not a readable tar shard ({type(e).__name__}: {e}); re-download it") from None

    def keys(self) -> Iterator[str]:
        """Every sample key, in shard and member order."""
        return iter(self.samples)

    def member(self, key: str, extension: str) -> Optional[ShardMember]:
        """The member `{key}.{extension}`, or None."""
        return self.samples.get(key, {}).get(extension)

    def read(self, member: ShardMember) -> bytes:
        """A member's bytes; a shard shorter than its header says is a DataError naming it."""
        with open(member.shard, "rb") as f:
            f.seek(member.offset)
            data = f.read(member.size)
        if len(data) != member.size:
            raise DataError(
                f"{member.shard}: truncated tar shard (a member at byte {member.offset} has "
                f"{len(data)} of {member.size} bytes); re-download it"
            )
        return data


def shard_paths(pattern: str | os.PathLike, root: Optional[str | os.PathLike] = None) -> list[Path]:
    """The shard files of a brace pattern, made absolute against `root`; DataError naming the first missing one."""
    paths = []
    for name in expand_braces(str(pattern)):
        path = Path(name).expanduser()
        if not path.is_absolute() and root is not None:
            path = Path(root).expanduser() / path
        paths.append(path)
    missing = [p for p in paths if not p.is_file()]
    if missing:
        raise DataError(
            f"{missing[0]}: shard not found ({len(missing)} of the {len(paths)} shards of {pattern} are "
            f"missing); fix the pattern or data.root"
        )
    return paths
