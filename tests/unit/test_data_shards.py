"""webdataset shards: brace patterns, member names, the key index and its errors."""

from __future__ import annotations

import io
import tarfile

import pytest

from qkvqa.data.shards import ShardIndex, expand_braces, shard_paths, split_member_name
from qkvqa.errors import DataError


def test_brace_patterns_expand_like_the_shell():
    assert expand_braces("val-{0000..0002}.tar") == ["val-0000.tar", "val-0001.tar", "val-0002.tar"]
    assert expand_braces("val-{8..10}.tar") == ["val-8.tar", "val-9.tar", "val-10.tar"]
    assert expand_braces("{a,b}/x-{00..01}.tar") == ["a/x-00.tar", "a/x-01.tar", "b/x-00.tar", "b/x-01.tar"]
    assert expand_braces("plain.tar") == ["plain.tar"]
    assert len(expand_braces("val-{0000..0014}.tar")) == 15


def test_member_names_split_at_the_first_dot_of_the_base_name():
    assert split_member_name("infoseek_val_00000001.img.jpg") == ("infoseek_val_00000001", "img.jpg")
    assert split_member_name("dir/k1.question") == ("dir/k1", "question")
    assert split_member_name("noext") == ("noext", "")


def _shard(path, members: dict) -> None:
    with tarfile.open(path, "w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_the_index_reads_members_by_key_in_shard_order(tmp_path):
    _shard(tmp_path / "s-0.tar", {"k2.question": b"Why?", "k2.img.jpg": b"\xff\xd8", "k1.question": b"Who?"})
    _shard(tmp_path / "s-1.tar", {"k3.question": "Où?".encode()})
    index = ShardIndex.from_pattern("s-{0..1}.tar", tmp_path)
    assert list(index.keys()) == ["k2", "k1", "k3"]
    assert index.read(index.member("k3", "question")).decode() == "Où?"
    assert index.member("k1", "img.jpg") is None and index.read(index.member("k2", "img.jpg")) == b"\xff\xd8"


def test_missing_truncated_and_non_tar_shards_name_the_file(tmp_path):
    _shard(tmp_path / "s-0.tar", {"k1.question": b"x" * 5000})
    with pytest.raises(DataError, match=r"s-1\.tar: shard not found \(1 of the 2 shards"):
        shard_paths("s-{0..1}.tar", tmp_path)
    index = ShardIndex.from_pattern("s-0.tar", tmp_path)
    member = index.member("k1", "question")
    data = (tmp_path / "s-0.tar").read_bytes()
    (tmp_path / "s-0.tar").write_bytes(data[: member.offset + 100])
    with pytest.raises(DataError, match=r"s-0\.tar: truncated tar shard"):
        index.read(member)
    (tmp_path / "bad.tar").write_bytes(b"\x00garbage" * 10)
    with pytest.raises(DataError, match=r"bad\.tar: not a readable tar shard"):
        ShardIndex.from_pattern("bad.tar", tmp_path)
