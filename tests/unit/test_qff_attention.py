"""The fused (sdpa) Q-Former attention against the eager HF modules: every pass, every focus mode, gradients."""

from __future__ import annotations

import pytest
import torch

from qkvqa.errors import ConfigError
from tests.unit.test_qff_model import SECTIONS, inputs, tiny

TOLERANCE = 1e-5  # fp32, the bound


pytestmark = pytest.mark.usefixtures("single_thread")


def both(comp, fn):
    """fn(model) under eager and under sdpa attention."""
    model = comp.model
    model.attention = "eager"
    eager = fn(model)
    model.attention = "sdpa"
    return eager, fn(model)


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


@torch.no_grad()
def test_the_default_is_sdpa_and_an_unknown_implementation_is_refused():
    comp = tiny()
    assert comp.model.attention == "sdpa"
    with pytest.raises(ConfigError, match="qff.attention must be one of"):
        comp.model.attention = "flash"


@torch.no_grad()
def test_text_and_question_passes_match_eager():
    comp = tiny()
    sec, qs, images = inputs(comp)
    assert sec["attention_mask"].min() == 0 and qs["attention_mask"].min() == 0, "both batches must be padded"
    eager, sdpa = both(comp, lambda m: m.encode_text(sec["input_ids"], sec["attention_mask"]))
    real = sec["attention_mask"].bool()  # padded rows are garbage in both; compare real tokens
    assert max_diff(eager[real], sdpa[real]) <= TOLERANCE
    eager, sdpa = both(comp, lambda m: m.encode_question(qs["input_ids"], qs["attention_mask"], images))
    assert len(eager.layer_states) == len(sdpa.layer_states) == comp.model.num_layers
    for e, s in zip(eager.layer_states, sdpa.layer_states):
        assert e.shape == s.shape and max_diff(e, s) <= TOLERANCE


@pytest.mark.slow
@torch.no_grad()
@pytest.mark.parametrize("focus", ["per_layer", "input", "none"])
def test_section_pass_with_open_gates_matches_eager(focus):
    comp = tiny(focus=focus)
    if focus == "per_layer":
        comp.model.q_gate.fill_(0.7)
    elif focus == "input":
        comp.model.input_gate.fill_(0.7)
    sec, qs, images = inputs(comp)
    question = comp.model.encode_question(qs["input_ids"], qs["attention_mask"], images)
    image_index, question_index = torch.tensor([0, 0, 1]), torch.tensor([1, 0, 1])

    def run(m):
        return m.encode_sections(
            sec["input_ids"],
            sec["attention_mask"],
            images,
            question,
            image_index=image_index,
            question_index=question_index,
        )

    eager, sdpa = both(comp, run)
    assert eager.shape == sdpa.shape == (3, comp.model.num_queries, comp.model.hidden_size)
    assert max_diff(eager, sdpa) <= TOLERANCE
    if focus != "none":  # the comparison is not vacuous: focus changes the pass
        generic = comp.model.encode_sections(
            sec["input_ids"], sec["attention_mask"], images, question, image_index=image_index, focus="none"
        )
        assert not torch.equal(generic, sdpa)  # a property, not a gap measured on one CPU


@pytest.mark.slow
def test_gradients_match_eager_in_training_mode_without_dropout():
    comp = tiny(focus="per_layer")
    model = comp.model
    model.train()
    for module in model.modules():  # dropout draws differ between the paths; switch it off
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    with torch.no_grad():
        model.q_gate.fill_(0.3)
    sec, qs, images = inputs(comp)
    grads = []
    for attention in ("eager", "sdpa"):
        model.attention = attention
        model.zero_grad()
        question = model.encode_question(qs["input_ids"], qs["attention_mask"], images)
        states = model.encode_sections(
            sec["input_ids"],
            sec["attention_mask"],
            images,
            question,
            image_index=torch.tensor([0, 0, 1]),
            question_index=torch.tensor([0, 0, 1]),
        )
        states.pow(2).mean().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and any(k.startswith("q_xattn") for k in grads[0])
    for name in grads[0]:
        assert max_diff(grads[0][name], grads[1][name]) <= 1e-4 * max(1.0, grads[0][name].abs().max().item()), name


def _image(seed: int):
    from PIL import Image

    rng = torch.Generator().manual_seed(seed)
    return Image.fromarray((torch.rand(40, 40, 3, generator=rng) * 255).byte().numpy())


@torch.no_grad()
def test_a_scored_question_matches_eager_through_the_component():
    comp = tiny(focus="per_layer")
    comp.model.q_gate.fill_(0.5)
    sections = [SECTIONS[:2], SECTIONS[2:]]
    eager, sdpa = both(
        comp, lambda m: comp.score_sections("what is this bird?", _image(1), [_image(2), _image(3)], sections)
    )
    assert [len(s) for s in eager] == [len(s) for s in sdpa] == [2, 1]
    for e, s in zip(eager, sdpa):
        assert max(abs(a - b) for a, b in zip(e, s)) <= TOLERANCE


@torch.no_grad()
def test_each_section_meets_the_question_question_index_names():
    comp = tiny(focus="per_layer")
    comp.model.q_gate.fill_(0.7)
    sec, qs, images = inputs(comp)
    question = comp.model.encode_question(qs["input_ids"], qs["attention_mask"], images)
    image_index = torch.tensor([0, 0, 1])

    def run(question_index):
        return comp.model.encode_sections(
            sec["input_ids"],
            sec["attention_mask"],
            images,
            question,
            image_index=image_index,
            question_index=torch.tensor(question_index),
        )

    mixed, first, second = run([0, 1, 0]), run([0, 0, 0]), run([1, 1, 1])
    assert max_diff(mixed[0], first[0]) == 0.0 and max_diff(mixed[1], second[1]) == 0.0
    assert not torch.equal(first[1], second[1])  # two questions: states differ (no figure from one CPU)
