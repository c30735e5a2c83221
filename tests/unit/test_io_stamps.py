"""`verify_sha256_once`: a file is hashed once per version, also where its directory takes no stamp file."""

from __future__ import annotations

import hashlib
import os

import pytest

from qkvqa.errors import DataError
from qkvqa.utils.io import verify_sha256_once


def _same_size_flip(path, stat) -> None:
    """Change a byte but keep size and mtime: only a re-hash can notice."""
    data = bytearray(path.read_bytes())
    data[0] ^= 1
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


def test_a_verified_file_is_not_hashed_again_and_force_hashes_it(tmp_path, monkeypatch):
    monkeypatch.setenv("QKVQA_STAMP_DIR", str(tmp_path / "stamps"))
    f = tmp_path / "store.bin"
    f.write_bytes(b"kb content" * 100)
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    verify_sha256_once(f, sha, "KB store", "rebuild it")
    assert (tmp_path / ".store.bin.verified").is_file()
    _same_size_flip(f, f.stat())
    verify_sha256_once(f, sha, "KB store", "rebuild it")  # trusted: the stamp matches size and mtime
    with pytest.raises(DataError, match=r"store\.bin: corrupt KB store"):
        verify_sha256_once(f, sha, "KB store", "rebuild it", force=True)


def test_where_no_stamp_can_go_beside_the_file_it_goes_to_the_user_cache(tmp_path, monkeypatch):
    """Review item: a read-only KB directory re-hashed its store (seconds per GB) on every open."""
    stamps = tmp_path / "stamps"
    monkeypatch.setenv("QKVQA_STAMP_DIR", str(stamps))
    f = tmp_path / "index.faiss"
    f.write_bytes(b"index" * 100)
    (tmp_path / ".index.faiss.verified").mkdir()  # nothing can be written where the stamp goes
    sha = hashlib.sha256(f.read_bytes()).hexdigest()
    verify_sha256_once(f, sha, "index file", "rebuild the index")
    assert len(list(stamps.iterdir())) == 1
    _same_size_flip(f, f.stat())
    verify_sha256_once(f, sha, "index file", "rebuild the index")  # the cached stamp spares the re-hash
    with pytest.raises(DataError, match="corrupt index file"):
        verify_sha256_once(f, sha, "index file", "rebuild the index", force=True)
