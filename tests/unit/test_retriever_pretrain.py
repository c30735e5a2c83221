"""`qkvqa pretrain-retriever` (qkvqa.retrieval.pretrain): the stage-1 image encoder trained here on the train split,
cached under a key of its inputs, reused, and loaded by the encoder builder with its own identity."""

from __future__ import annotations

import json

import pytest

from qkvqa.cli.main import main
from qkvqa.config.load import compose
from qkvqa.data.benchmark import build_benchmark
from qkvqa.retrieval.encoders import encoder_identity
from qkvqa.retrieval.pretrain import build as build_on
from qkvqa.retrieval.pretrain import encoder_overrides

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("single_thread")]


def build(cfg, force=False):
    """The trained encoder of `cfg`, on the benchmark its data section names."""
    return build_on(cfg, build_benchmark(cfg.data), force=force)


def _overrides(world, tmp_path, *extra):
    return [
        f"paths.world_dir={world['dir']}",
        f"paths.cache_dir={tmp_path / 'cache'}",
        "retrieval.pretrain.steps=30",
        "retrieval.pretrain.batch_size=12",
        "components.image_encoder.options.preprocess=targetpad",
        *extra,
    ]


def test_the_encoder_learns_on_the_train_split_and_is_cached_under_its_inputs(world, tmp_path, capsys):
    cfg = compose("demo/evaluate", [], _overrides(world, tmp_path))
    out, record = build(cfg)
    figures = record["figures"]
    assert figures["train_loss_last_tenth"] < figures["train_loss_first_tenth"]
    assert figures["query_images"] >= 2 and figures["steps"] == 30
    # only the train split's questions are read: their image files key the result, never val's or test's
    assert record["inputs"]["world"]["train_queries"]["split"] == "train"
    weights = (out / "model.safetensors").stat().st_mtime_ns

    # the command finds the same directory and trains nothing again
    assert main(["pretrain-retriever", "experiment=demo/evaluate", *_overrides(world, tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["pretrained"] == str(out) and printed["use"] == " ".join(encoder_overrides(out))
    assert (out / "model.safetensors").stat().st_mtime_ns == weights

    # a changed setting or encoder option is another key, so another directory
    other_steps, _ = build(compose("demo/evaluate", [], _overrides(world, tmp_path, "retrieval.pretrain.steps=31")))
    other_seed, _ = build(compose("demo/evaluate", [], _overrides(world, tmp_path, "retrieval.pretrain.seed=1")))
    assert len({out, other_steps, other_seed}) == 3

    # stage 1 loads the trained weights, and the KB embeddings' key (the encoder identity) follows them
    trained = compose("demo/evaluate", [], [*_overrides(world, tmp_path), *encoder_overrides(out)])
    again = compose("demo/evaluate", [], [*_overrides(world, tmp_path), *encoder_overrides(other_seed)])
    identities = [encoder_identity(c.components.image_encoder) for c in (cfg, trained, again)]
    assert identities[1]["weights_sha256"] != identities[2]["weights_sha256"]
    assert identities[0] != identities[1]
    from omegaconf import OmegaConf

    from qkvqa.components.registry import build_component, spec_from_mapping

    encoder = build_component(spec_from_mapping(OmegaConf.to_container(trained.components.image_encoder)))
    from PIL import Image

    vectors = encoder.embed_images([Image.new("RGB", (96, 64), (200, 30, 30))])
    assert vectors.shape == (1, encoder.dim)
