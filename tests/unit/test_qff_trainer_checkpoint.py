"""QFFTrainer hyper-parameters: plain values that rebuild the model, so QFFTrainer.load_from_checkpoint(path) needs no arguments."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from qkvqa.config.schema import QFFConfig
from qkvqa.errors import ConfigError, MissingWeightsError, StaleArtifactError
from qkvqa.models.qff_module import QFFTrainer
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
    settings = QFFConfig(focus="per_layer", lr=3e-5, betas=[0.8, 0.9])  # the one settings object, saved whole
    module = QFFTrainer(component.model, settings, model_spec={"qformer": SPEC}, vision_fingerprint=fingerprint)
    torch.save(dict(module.hparams), tmp_path / "hparams.pt")
    hparams = torch.load(tmp_path / "hparams.pt", weights_only=True)  # plain values only
    rebuilt = QFFTrainer(**hparams)
    assert rebuilt.qff == settings and rebuilt.model.focus == "per_layer"
    assert rebuilt.vision_fingerprint == fingerprint
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
    module = QFFTrainer(component.model, QFF, model_spec={"qformer": SPEC}, vision_fingerprint=fingerprint)
    checkpoint = {"state_dict": module.state_dict()}
    module.on_save_checkpoint(checkpoint)
    other_vit = {**SPEC, "options": {**SPEC["options"], "seed": 4}}
    rebuilt = QFFTrainer(**{**module.hparams, "model_spec": {"qformer": other_vit}})
    with pytest.raises(StaleArtifactError, match="another frozen ViT"):
        rebuilt.on_load_checkpoint(checkpoint)


def test_without_a_component_spec_the_architecture_is_recorded():
    component = build_qff_component(SPEC, QFF)
    module = QFFTrainer(component.model, QFFConfig())
    assert set(module.hparams["model_spec"]) == {"architecture"}
    rebuilt = QFFTrainer(**module.hparams)
    assert rebuilt.state_dict().keys() == module.state_dict().keys()
    rebuilt.load_state_dict(module.state_dict())
    with pytest.raises(MissingWeightsError, match="leaves the frozen ViT out"):
        QFFTrainer(**{**module.hparams, "vision_fingerprint": "blake2b:x"})
    with pytest.raises(ConfigError, match="needs settings"):
        QFFTrainer(component.model)


@pytest.mark.slow
def test_a_checkpoint_from_before_one_settings_object_still_loads(tmp_path):
    """Checkpoints written with the trainer's own copy of the settings (`QFFTrainSettings`: 16 fields, the ViT
    fingerprint among them, the scorer's complete options) and the qff section in `model_spec` rebuild as before."""
    component = build_qff_component(SPEC, QFF)
    fingerprint = vision_fingerprint(component.model, component.image_processor)
    old = {
        "temperature": 0.05,
        "learnable_temperature": False,
        "in_batch_negatives": True,
        "lr": 3e-5,
        "weight_decay": 0.05,
        "betas": (0.8, 0.9),
        "eps": 1e-7,
        "pct_start": 0.3,
        "div_factor": 100.0,
        "new_block_lr_scale": 2.0,
        "alpha": 0.8,
        "scorer": "late_interaction",
        "scorer_options": {"score_direction": "section_to_question", "question_norm": "across_tokens"},
        "schedule_steps": None,
        "dropout": None,
        "vision_fingerprint": fingerprint,
    }
    torch.save({"settings": old, "model_spec": {"qformer": SPEC, "qff": QFF}}, tmp_path / "hparams.pt")
    rebuilt = QFFTrainer(**torch.load(tmp_path / "hparams.pt", weights_only=True))
    assert rebuilt.vision_fingerprint == fingerprint and rebuilt.model.focus == "per_layer"
    assert (rebuilt.qff.lr, rebuilt.qff.betas, rebuilt.qff.alpha, rebuilt.qff.in_batch_negatives) == (
        3e-5,
        [0.8, 0.9],
        0.8,
        True,
    )
    assert rebuilt.scorer.options == {"score_direction": "section_to_question", "question_norm": "across_tokens"}
    assert rebuilt.hparams["vision_fingerprint"] == fingerprint  # saved again in today's layout
    assert "qff" not in rebuilt.hparams["model_spec"]  # the section is saved once, as the settings
    assert QFFTrainer(**dict(rebuilt.hparams)).qff == rebuilt.qff
    with pytest.raises(ConfigError, match="model_spec holds a qff section beside the settings"):
        QFFTrainer(component.model, QFFConfig(), model_spec={"qformer": SPEC, "qff": QFF})  # never two copies
