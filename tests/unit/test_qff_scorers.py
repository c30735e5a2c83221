"""The QFF section scorer as an extension point (issue 45): one resolver, typed options, the built-in bit for bit."""

from __future__ import annotations

import pytest
import torch

from qkvqa.config.load import compose
from qkvqa.errors import ConfigError
from qkvqa.qff.scorers import LateInteraction, Option, SectionScorer, resolve_scorer, scorer_from_qff, scorer_spec
from qkvqa.qff.scoring import late_interaction

pytestmark = pytest.mark.usefixtures("single_thread")

PLUGIN = "examples.mean_cosine_scorer:MeanCosine"


def tokens(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("direction", ["question_to_section", "section_to_question"])
@pytest.mark.parametrize("norm", ["per_token", "across_tokens"])
def test_the_built_in_scores_bit_for_bit_as_late_interaction(direction, norm):
    """The shipped scorer is the function it wraps, exactly; the training call normalises per token, as before."""
    q, s = tokens(0, 3, 1, 4, 8), tokens(1, 3, 5, 6, 8)
    scorer = scorer_from_qff({"score_direction": direction, "question_norm": norm})
    assert isinstance(scorer, LateInteraction)
    assert torch.equal(scorer.score(q, s), late_interaction(q, s, direction, norm))
    assert torch.equal(scorer.score(q, s, training=True), late_interaction(q, s, direction))


@pytest.mark.slow
def test_the_default_config_selects_the_late_interaction_of_the_paper():
    cls, options = scorer_spec(compose("demo/qff_per_layer").qff)
    assert cls is LateInteraction and options == {
        "score_direction": "question_to_section",
        "question_norm": "per_token",
    }


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["qff.scorer=mean_cosine"], r"qff.scorer 'mean_cosine' is not one of late_interaction"),
        (
            ["qff.scorer=no_such_lab.scorers:X"],
            r"module 'no_such_lab.scorers' does not import.*registered: late_interaction",
        ),
        (["qff.scorer=examples.mean_cosine_scorer:Missing"], r"has no 'Missing'; registered: late_interaction"),
        (["qff.scorer_options.bogus=1"], r"qff.scorer_options: unknown key\(s\) \['bogus'\] for kind late_interaction"),
        ([f"qff.scorer={PLUGIN}", "qff.scorer_options.scale=500"], r"qff.scorer_options.scale=500 is out of range"),
        ([f"qff.scorer={PLUGIN}", "qff.scorer_options.scale=big"], r"qff.scorer_options.scale='big' must be a number"),
        (["qff.scorer_options.question_norm=across_tokens"], r"but qff.question_norm='per_token': set one of them"),
        (
            [f"qff.scorer={PLUGIN}", "qff.score_direction=section_to_question"],
            r"qff.score_direction='section_to_question' is an option of the late_interaction scorer, which "
            rf"qff.scorer={PLUGIN} does not read",
        ),
    ],
)
def test_a_bad_scorer_or_option_is_refused_when_the_config_is_composed(overrides, message):
    with pytest.raises(ConfigError, match=message):
        compose("demo/qff_per_layer", overrides=overrides)


@pytest.mark.slow
def test_a_plugin_named_by_import_path_is_resolved_with_its_declared_options():
    cls = resolve_scorer(PLUGIN)
    assert issubclass(cls, SectionScorer) and cls.__name__ == "MeanCosine"
    cfg = compose("demo/qff_per_layer", overrides=[f"qff.scorer={PLUGIN}", "qff.scorer_options.scale=2"])
    scorer = scorer_from_qff(cfg.qff)
    assert scorer.options == {"scale": 2.0}
    q, s = tokens(0, 2, 4, 8), tokens(1, 2, 6, 8)
    expected = 2.0 * torch.nn.functional.cosine_similarity(q.mean(-2), s.mean(-2), dim=-1)
    assert torch.allclose(scorer.score(q, s), expected, atol=1e-6)
    record = scorer.record()
    assert record["scorer"] == PLUGIN and len(record["scorer_source_sha256"]) == 64


def test_options_are_typed_and_bounded():
    option = Option(int, 3, low=1, high=5)
    assert option.check("k", 4.0) == 4 and isinstance(option.check("k", 4.0), int)
    for bad, message in ((4.5, "whole number"), (True, "number"), (9, "out of range")):
        with pytest.raises(ConfigError, match=message):
            option.check("k", bad)
    with pytest.raises(ConfigError, match="not one of a, b"):
        Option(str, "a", choices=("a", "b")).check("k", "c")


@pytest.mark.parametrize(
    ("focus", "message"),
    [
        ("per_layers", r"qff.focus='per_layers' is not one of per_layer, input, none"),
        ("no_such_lab.focus:X", r"module 'no_such_lab.focus' does not import.*registered: input, none, per_layer"),
        (
            "examples.mean_cosine_scorer:MeanCosine",
            r"'examples.mean_cosine_scorer:MeanCosine' is not a subclass of qkvqa.qff.model.QFFModel",
        ),
    ],
)
def test_a_focus_that_is_no_mode_nor_a_focus_class_is_refused_when_the_config_is_composed(focus, message):
    with pytest.raises(ConfigError, match=message):
        compose("demo/qff_per_layer", overrides=[f"qff.focus={focus}"])


@pytest.mark.slow
def test_a_plugin_focus_declares_its_parameters_and_scores_alike_in_both_attention_paths():
    from PIL import Image

    from qkvqa.qff.builder import build_qff_component

    image = Image.new("RGB", (50, 40), (200, 10, 10))
    scores = {}
    for attention in ("sdpa", "eager"):
        overrides = ["qff.focus=examples.question_keys_focus:QuestionKeys", "qff.gate_init=0.5"]
        cfg = compose("demo/qff_per_layer", overrides=[*overrides, f"qff.attention={attention}"])
        comp = build_qff_component(cfg.components.qformer, cfg.qff)
        assert [n for n, _ in comp.model.named_parameters() if not n.startswith("base.")] == ["key_gate"]
        assert comp.model.focus_parameters() == ([], [comp.model.key_gate])
        scores[attention] = comp.score_sections("what colour is it", image, [image], [["it is red", "a moth"]])[0]
        off = comp.score_sections("what colour is it", image, [image], [["it is red", "a moth"]], focus="none")[0]
        assert off != scores[attention]  # the open gate lets the question in
    assert scores["sdpa"] == pytest.approx(scores["eager"], abs=1e-5)


def test_a_trainer_checkpoint_saved_before_qff_scorer_keeps_its_late_interaction_switches():
    """Lightning checkpoints written before qff.scorer hold score_direction / question_norm in their settings."""
    from qkvqa.components import build_component
    from qkvqa.models.qff_module import QFFTrainer

    comp = build_component({"kind": "blip2_qff", "tiny": True, "device": "cpu", "options": {"num_layers": 2}})
    old = {"lr": 1e-5, "score_direction": "section_to_question", "question_norm": "across_tokens"}
    module = QFFTrainer(comp.model, old)
    assert module.qff.scorer == "late_interaction" and isinstance(module.scorer, LateInteraction)
    assert module.scorer.options == {"score_direction": "section_to_question", "question_norm": "across_tokens"}
