"""Issue 31 item 1: a planted tiny-model folder never runs its code (the tiny EVA-CLIP loads with trust_remote_code)."""

from __future__ import annotations

import json
import os
import stat

import pytest

from qkvqa.components.registry import TINY_RECORD, _file_sizes, build_component, tiny_root
from qkvqa.errors import ConfigError
from qkvqa.retrieval.tiny import TINY_EVACLIP_CODE, TINY_EVACLIP_MODULE

SPEC = {"kind": "evaclip_hf", "tiny": True, "device": "cpu"}


def _planted(root, marker):
    """Build the tiny EVA-CLIP once, then do what an attacker would: put a payload in its module and update the
    record so that the file sizes it lists still match."""
    build_component(SPEC)
    (model_dir,) = [p for p in root.iterdir() if p.name.startswith("evaclip_hf-")]
    module = model_dir / f"{TINY_EVACLIP_MODULE}.py"
    module.write_text(f"open({str(marker)!r}, 'w').write('ran')\n" + TINY_EVACLIP_CODE, encoding="utf-8")
    record = json.loads((model_dir / TINY_RECORD).read_text())
    record["files"] = _file_sizes(model_dir)
    (model_dir / TINY_RECORD).write_text(json.dumps(record))
    return model_dir, module


def test_a_new_root_is_created_private(tmp_path, monkeypatch):
    monkeypatch.setenv("QKVQA_TINY_DIR", str(tmp_path / "cache" / "tiny"))
    root = tiny_root()
    assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_the_default_root_is_in_the_users_cache_not_the_shared_temp_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("QKVQA_TINY_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert tiny_root() == tmp_path / "xdg" / "qkvqa" / "tiny"


def test_a_world_writable_root_with_a_planted_payload_is_refused_and_the_payload_never_runs(tmp_path, monkeypatch):
    root, marker = tmp_path / "tiny", tmp_path / "payload-ran"
    monkeypatch.setenv("QKVQA_TINY_DIR", str(root))
    _planted(tiny_root(), marker)
    os.chmod(root, 0o777)
    with pytest.raises(ConfigError, match=r"tiny-model cache .*tiny is group- or world-writable.*QKVQA_TINY_DIR"):
        build_component(SPEC)
    assert not marker.exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root (CI runs as root)")
def test_a_root_owned_by_another_user_is_refused(tmp_path, monkeypatch):
    root, marker = tmp_path / "tiny", tmp_path / "payload-ran"
    monkeypatch.setenv("QKVQA_TINY_DIR", str(root))
    _planted(tiny_root(), marker)
    os.chown(root, 65534, 65534)
    with pytest.raises(ConfigError, match=r"is owned by uid 65534, not by you"):
        build_component(SPEC)
    assert not marker.exists()


def test_a_symlinked_root_is_refused(tmp_path, monkeypatch):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "tiny").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv("QKVQA_TINY_DIR", str(tmp_path / "tiny"))
    with pytest.raises(ConfigError, match="is a symlink"):
        tiny_root()


@pytest.mark.slow
def test_edited_code_in_an_own_root_is_rewritten_from_the_package_before_loading(tmp_path, monkeypatch):
    root, marker = tmp_path / "tiny", tmp_path / "payload-ran"
    monkeypatch.setenv("QKVQA_TINY_DIR", str(root))
    model_dir, module = _planted(tiny_root(), marker)
    encoder = build_component(SPEC)
    assert not marker.exists()
    assert module.read_text(encoding="utf-8") == TINY_EVACLIP_CODE
    assert callable(encoder.model.encode_image)


def test_an_unknown_code_file_makes_the_model_be_written_again(tmp_path, monkeypatch):
    root, marker = tmp_path / "tiny", tmp_path / "payload-ran"
    monkeypatch.setenv("QKVQA_TINY_DIR", str(root))
    build_component(SPEC)
    (model_dir,) = [p for p in root.iterdir() if p.name.startswith("evaclip_hf-")]
    (model_dir / "extra.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    record = json.loads((model_dir / TINY_RECORD).read_text())
    record["files"] = _file_sizes(model_dir)
    (model_dir / TINY_RECORD).write_text(json.dumps(record))
    build_component(SPEC)
    assert not (model_dir / "extra.py").exists() and not marker.exists()
