"""QFFTrainer hyper-parameters: plain values that rebuild the model, so QFFTrainer.load_from_checkpoint(path) needs no arguments."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from qkvqa.config.schema import QFFConfig
from qkvqa.errors import ConfigError, MissingWeightsError, StaleArtifactError
from qkvqa.models.qff_module import QFFTrainer, QFFTrainSettings
from qkvqa.qff.builder import build_qff_component
from qkvqa.qff.vit_cache import vision_fingerprint

SPEC = {"kind": "blip2_qff", "tiny": True, "device": "cpu", "options": {"num_layers": 2, "seed": 3}}
QFF = dataclasses.asdict(QFFConfig(focus="per_layer"))


def trained_like(component) -> None:
    """Move every weight off its initial value, as training would."""
    with torch.no_grad():
        for param in component.model.parameters():
            param.add_(0.01)


def test_the_hyper_parameters_are_plain_and_rebuild_the_model_with_its_frozen_vit(tmp_path):
    component = build_qff_component(SPEC, QFF)
    fingerprint = vision_fingerprint(component.model, component.image_processor)
    settings = QFFTrainSettings(lr=3e-5, betas=(0.8, 0.9), vision_fingerprint=fingerprint)
    module = QFFTrainer(component.model, settings, model_spec={"qformer": SPEC, "qff": QFF})
    torch.save(dict(module.hparams), tmp_path / "hparams.pt")
    hparams = torch.load(tmp_path / "hparams.pt", weights_only=True)  # plain values only
    rebuilt = QFFTrainer(**hparams)
    assert rebuilt.settings == settings and rebuilt.model.focus == "per_layer"
    assert vision_fingerprint(rebuilt.model, component.image_processor) == fingerprint
    # the checkpoint's trained weights then replace the rebuilt ones (Lightning's load_state_dict)
    trained_like(component)
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    assert not any(k.startswith("model.base.vision_model.") for k in checkpoint["state_dict"])
    rebuilt.on_load_checkpoint(checkpoint)
    rebuilt.load_state_dict(checkpoint["state_dict"])
    state = rebuilt.state_dict()
    for key, value in module.state_dict().items():
        if not key.startswith("model.base.vision_model."):  # the ViT is the component's, unchanged
            assert torch.equal(state[key], value), key


def test_a_rebuilt_vit_that_differs_from_the_checkpoints_is_refused():
    component = build_qff_component(SPEC, QFF)
    fingerprint = vision_fingerprint(component.model, component.image_processor)
    module = QFFTrainer(
        component.model, QFFTrainSettings(vision_fingerprint=fingerprint), model_spec={"qformer": SPEC, "qff": QFF}
    )
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    other_vit = {**SPEC, "options": {**SPEC["options"], "seed": 4}}
    rebuilt = QFFTrainer(settings=dict(module.hparams)["settings"], model_spec={"qformer": other_vit, "qff": QFF})
    with pytest.raises(StaleArtifactError, match="another frozen ViT"):
        rebuilt.on_load_checkpoint(checkpoint)


def test_without_a_component_spec_the_architecture_is_recorded():
    component = build_qff_component(SPEC, QFF)
    module = QFFTrainer(component.model, QFFTrainSettings())
    assert set(module.hparams["model_spec"]) == {"architecture"}
    rebuilt = QFFTrainer(**module.hparams)
    assert rebuilt.state_dict().keys() == module.state_dict().keys()
    rebuilt.load_state_dict(module.state_dict())
    with pytest.raises(MissingWeightsError, match="leaves the frozen ViT out"):
        QFFTrainer(
            settings={**module.hparams["settings"], "vision_fingerprint": "blake2b:x"},
            model_spec=module.hparams["model_spec"],
        )
    with pytest.raises(ConfigError, match="needs settings"):
        QFFTrainer(component.model)
