"""resolve_pretrained: a relative path with one slash below an existing folder is a local path, not a hub id."""

from __future__ import annotations

import pytest

from qkvqa.components.registry import ComponentSpec, resolve_pretrained
from qkvqa.errors import MissingWeightsError


def test_one_slash_path_below_an_existing_folder_names_the_local_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights").mkdir()
    spec = ComponentSpec(kind="reflectiva", pretrained="weights/llama31-8b-generator-ft")
    with pytest.raises(MissingWeightsError) as err:
        resolve_pretrained(spec)
    message = str(err.value)
    assert "no directory at weights/llama31-8b-generator-ft" in message
    assert str(tmp_path / "weights" / "llama31-8b-generator-ft") in message
    assert "hub id" not in message.split("Download")[0]  # not read as a hub id
    assert "qkvqa convert-llava" in message  # how to fill it, for this kind


def test_one_slash_local_directory_is_returned(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "weights" / "gen").mkdir(parents=True)
    (tmp_path / "weights" / "gen" / "config.json").write_text("{}")
    assert resolve_pretrained(ComponentSpec(kind="llama3", pretrained="weights/gen")) == "weights/gen"


def test_one_slash_file_is_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "owner").mkdir()
    (tmp_path / "owner" / "model.bin").write_bytes(b"x")
    with pytest.raises(MissingWeightsError, match="no directory at owner/model.bin"):
        resolve_pretrained(ComponentSpec(kind="llama3", pretrained="owner/model.bin"))


def test_neither_local_nor_cached_names_the_local_path_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no `nobody/` folder here: may be a hub id
    with pytest.raises(MissingWeightsError) as err:
        resolve_pretrained(ComponentSpec(kind="llama3", pretrained="nobody/no-such-model-xyz"))
    message = str(err.value)
    assert "not in the local cache" in message
    assert str(tmp_path / "nobody" / "no-such-model-xyz") in message
    assert "--local-dir nobody/no-such-model-xyz" in message
