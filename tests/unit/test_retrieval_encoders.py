"""Retrieval encoders: tiny models load through the real paths, vectors are unit-norm and batch-invariant."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from qkvqa.components import ComponentSpec, build_component, registered_kinds
from qkvqa.errors import ConfigError, MissingWeightsError
from qkvqa.retrieval.encoders import build_encoders, encoder_identity
from qkvqa.retrieval.tiny import byte_symbols, write_clip_tokenizer, write_tiny_evaclip, write_tiny_timm

TEXTS = ["the grey heron is a bird", "a red flower with long petals", "Zürich landmark", "x", "an unusual shell"]


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core box their barriers cost 10x."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _images() -> list[Image.Image]:
    rng = np.random.default_rng(1)
    return [
        Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8), "RGB")
        for w, h in [(64, 48), (30, 90), (120, 120)]
    ]


def _tiny(kind: str, **options) -> dict:
    return {"kind": kind, "tiny": True, "device": "cpu", "options": options}


@pytest.fixture(scope="module")
def encoders(tmp_path_factory):
    """One tiny encoder of each kind (batch size 2, so batching is exercised), built once for the module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QKVQA_TINY_DIR", str(tmp_path_factory.mktemp("tiny")))
        return {kind: build_component(_tiny(kind, batch_size=2)) for kind in ("evaclip_hf", "clip_hf", "timm_image")}


def test_retrieval_kinds_are_registered():
    assert {"evaclip_hf", "clip_hf", "timm_image"} <= set(registered_kinds())


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["evaclip_hf", "clip_hf", "timm_image"])
def test_image_vectors_are_unit_norm_and_batch_invariant(kind, encoders):
    encoder = encoders[kind]
    images = _images()
    vectors = encoder.embed_images(images)
    assert vectors.shape == (3, encoder.dim) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(encoder.embed_images(images[1:2]), vectors[1:2], atol=1e-5)
    assert not np.allclose(vectors[0], vectors[2])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["evaclip_hf", "clip_hf"])
def test_text_vectors_do_not_depend_on_padding_or_batching(kind, encoders):
    encoder = encoders[kind]
    together = encoder.embed_texts(TEXTS)
    assert together.shape == (len(TEXTS), encoder.dim)
    np.testing.assert_allclose(np.linalg.norm(together, axis=1), 1.0, atol=1e-5)
    alone = np.concatenate([encoder.embed_texts([t]) for t in TEXTS])
    np.testing.assert_allclose(together, alone, atol=1e-5)
    assert encoder.embed_texts([]).shape == (0, encoder.dim)


def test_tiny_evaclip_goes_through_remote_code_and_pretrained_dir_gives_the_same_vectors(tmp_path, encoders):
    tiny = encoders["evaclip_hf"]
    assert type(tiny.model).__name__ == "TinyEvaCLIPModel"  # loaded by trust_remote_code from auto_map
    write_tiny_evaclip(tmp_path / "weights" / "BAAI" / "EVA-CLIP-tiny", seed=0)
    spec = ComponentSpec(
        kind="evaclip_hf", pretrained=str(tmp_path / "weights" / "BAAI" / "EVA-CLIP-tiny"), device="cpu"
    )
    loaded = build_component(spec)
    np.testing.assert_allclose(loaded.embed_images(_images()), tiny.embed_images(_images()), atol=1e-6)
    np.testing.assert_allclose(loaded.embed_texts(TEXTS), tiny.embed_texts(TEXTS), atol=1e-6)
    assert encoder_identity(spec)["weights"] == "BAAI/EVA-CLIP-tiny"  # a local copy is named like its hub id


def test_evaclip_refuses_a_model_without_encode_methods(tmp_path):
    from qkvqa.retrieval.tiny import write_tiny_clip

    write_tiny_clip(tmp_path / "clip")
    with pytest.raises(ConfigError, match="encode_image"):
        build_component({"kind": "evaclip_hf", "pretrained": str(tmp_path / "clip"), "device": "cpu"})


def test_timm_tower_loads_from_a_saved_directory(tmp_path, encoders):
    write_tiny_timm(tmp_path / "eva", seed=0)
    encoder = build_component({"kind": "timm_image", "pretrained": str(tmp_path / "eva"), "device": "cpu"})
    tiny = encoders["timm_image"]
    assert encoder.preprocess.size == 28
    np.testing.assert_allclose(encoder.embed_images(_images()), tiny.embed_images(_images()), atol=1e-6)
    with pytest.raises(ConfigError, match="no text tower"):
        encoder.embed_texts(["a"])


def test_missing_weights_are_reported_with_where_to_put_them(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(MissingWeightsError, match="config.json"):
        build_component({"kind": "timm_image", "pretrained": str(tmp_path / "empty")})
    with pytest.raises(MissingWeightsError, match="huggingface-cli download"):
        build_component({"kind": "timm_image", "pretrained": "eva_giant_patch14_clip_224.laion400m"})
    with pytest.raises(MissingWeightsError, match="not in the local cache"):
        build_component({"kind": "evaclip_hf", "pretrained": "BAAI/EVA-CLIP-8B-not-cached"})


def test_tiny_clip_tokenizer_knows_words_and_still_tokenises_anything(tmp_path):
    from transformers import CLIPTokenizer

    tokenizer = CLIPTokenizer.from_pretrained(str(write_clip_tokenizer(tmp_path / "tok", texts=["Kestrel"])))
    ids = tokenizer("the kestrel")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and ids[-1] == tokenizer.eos_token_id and len(ids) == 4
    assert tokenizer.decode(tokenizer("Qzx ørn!")["input_ids"], skip_special_tokens=True) == "qzx ørn !"
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    assert byte_symbols() == list(bytes_to_unicode().values())


def test_identity_and_shared_encoders():
    image_spec = _tiny("evaclip_hf", image_size=224, batch_size=8)  # the size its tower takes (issue 44: 64 is refused)
    assert encoder_identity(image_spec) == {
        "kind": "evaclip_hf",
        "weights": "tiny(seed=0)",
        "options": {"image_size": 224},
    }
    image, text = build_encoders(image_spec, dict(image_spec))
    assert image is text and image.preprocess.size == 224
    image, text = build_encoders(image_spec, _tiny("clip_hf"))
    assert image is not text
