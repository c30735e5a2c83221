"""The component registry: tiny and pretrained paths share one loader; missing weights fail clearly."""

from __future__ import annotations

import pytest
import torch

from qkvqa.components import ComponentSpec, build_component, registered_kinds
from qkvqa.errors import ConfigError, MissingWeightsError


def test_tiny_text_encoder_round_trip(tmp_path):
    enc = build_component({"kind": "bert_text_encoder", "tiny": True, "device": "cpu"})
    texts = ["the heron has a long wingspan", "a red flower"]
    vecs = enc.encode(texts)
    assert vecs.shape == (2, enc.dim)
    torch.testing.assert_close(vecs.norm(dim=-1), torch.ones(2))
    enc.save_pretrained(tmp_path / "enc")
    again = build_component(ComponentSpec(kind="bert_text_encoder", pretrained=str(tmp_path / "enc"), device="cpu"))
    torch.testing.assert_close(again.encode(texts), vecs, rtol=0, atol=0)


def test_missing_local_dir_says_where_to_put_weights(tmp_path):
    with pytest.raises(MissingWeightsError, match="huggingface-cli download"):
        build_component({"kind": "bert_text_encoder", "pretrained": str(tmp_path / "nowhere")})


def test_uncached_hub_id_is_refused_offline():
    with pytest.raises(MissingWeightsError, match="not in the local cache"):
        build_component({"kind": "bert_text_encoder", "pretrained": "nobody/no-such-model-xyz"})


def test_incomplete_directory_is_refused(tmp_path):
    (tmp_path / "half").mkdir()
    with pytest.raises(MissingWeightsError, match="config.json"):
        build_component({"kind": "bert_text_encoder", "pretrained": str(tmp_path / "half")})


def test_spec_errors():
    with pytest.raises(ConfigError, match="unknown component kind"):
        build_component({"kind": "bert_text_encodr", "tiny": True})
    with pytest.raises(ConfigError, match="pretrained"):
        build_component({"kind": "bert_text_encoder"})
    with pytest.raises(ConfigError, match="unknown field"):
        build_component({"kind": "bert_text_encoder", "tiny": True, "depth": 3})


def test_registered_kinds_include_the_text_encoder():
    assert "bert_text_encoder" in registered_kinds()


@pytest.mark.parametrize(
    "local_rank, cuda, expected",
    [(None, False, "cpu"), ("1", False, "cpu"), (None, True, "cuda"), ("1", True, "cuda:1"), ("3", True, "cuda:1")],
)
def test_auto_device_is_this_ranks_gpu(monkeypatch, local_rank, cuda, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    assert ComponentSpec(kind="bert_text_encoder", device="auto").torch_device() == torch.device(expected)
    assert ComponentSpec(kind="bert_text_encoder", device="cpu").torch_device() == torch.device("cpu")
