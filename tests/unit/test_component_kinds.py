"""Each component kind is one class: the registry, the preflight, the doctor and the card ask it, never its name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from qkvqa.components.registry import ComponentKind, component_kind, registered_kinds
from qkvqa.errors import ConfigError

SRC = Path(__file__).resolve().parents[2] / "src" / "qkvqa"
# `x.kind == "name"`, `kind != 'name'`, `kind in ("a", "b")`, `kind not in ("a",)`
COMPARISON = re.compile(r"kind\s*(?:==|!=)\s*['\"](\w+)['\"]|kind\s+(?:not\s+)?in\s+\(([^)]*)\)")


def test_every_registered_kind_is_a_component_kind_and_the_extension_points_are_theirs():
    from qkvqa.cda.reranker import ChunkScorerKind
    from qkvqa.generation.backends import GENERATOR_KINDS, GeneratorKind
    from qkvqa.metrics.judge import JudgeKind

    kinds = {name: component_kind(name) for name in registered_kinds()}
    assert all(isinstance(k, ComponentKind) and k.name == n for n, k in kinds.items())
    assert {n for n, k in kinds.items() if isinstance(k, GeneratorKind)} == set(GENERATOR_KINDS)
    assert {n for n, k in kinds.items() if isinstance(k, ChunkScorerKind)} == {"bge_reranker", "sentence_transformer"}
    assert {n for n, k in kinds.items() if isinstance(k, JudgeKind)} == {"bem"}
    assert [n for n, k in kinds.items() if k.remote_code] == ["evaclip_hf"]
    assert [n for n, k in kinds.items() if "decoding" in k.readings] == ["reflectiva"]


def test_no_code_compares_a_component_kind_name_outside_its_class():
    names = set(registered_kinds())
    found = []
    for path in sorted(SRC.rglob("*.py")):
        if "data_modules" in path.parts:
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in COMPARISON.finditer(line):
                compared = {match.group(1)} if match.group(1) else set(re.findall(r"['\"](\w+)['\"]", match.group(2)))
                if compared & names:
                    found.append(f"{path.relative_to(SRC)}:{number}: {line.strip()}")
    assert not found, "\n".join(found)
    assert COMPARISON.search('if spec.kind == "reflectiva":')  # the pattern sees what it looks for


def test_a_generator_kind_without_its_own_chat_is_never_loaded_as_another_kind(tmp_path):
    from qkvqa.generation.backends import build_generator
    from qkvqa.generation.tiny import write_tiny_chatml_lm

    folder = write_tiny_chatml_lm(tmp_path / "lm")
    kind = "tests.helpers.plugin_kinds:NoChatGenerator"
    with pytest.raises(NotImplementedError, match="does not define load_chat"):
        build_generator({"kind": kind, "pretrained": str(folder), "device": "cpu"})
    with pytest.raises(ConfigError, match="has no tiny model; set pretrained"):  # no tiny writer: real weights only
        build_generator({"kind": kind, "tiny": True, "device": "cpu"})


def test_an_unknown_kind_names_the_registered_ones():
    from qkvqa.generation.backends import build_generator

    with pytest.raises(ConfigError, match=r"generator 'bem' is not one of chat_lm, llama3, qwen2_5_vl, reflectiva"):
        build_generator({"kind": "bem", "tiny": True})
    with pytest.raises(ConfigError, match="unknown component kind 'nope'.*import path"):
        component_kind("nope")


SCORER = "tests.helpers.plugin_kinds:WordOverlapKind"


@pytest.mark.slow
@pytest.mark.parametrize(
    "override, message",
    [
        (f"components.reranker.kind={SCORER}", None),
        ("components.reranker.options.weight=10.5", r"^components.reranker.options.weight=10.5 is out of range"),
        ("components.reranker.options.wieght=1", r"^components.reranker.options: unknown key\(s\) \['wieght'\]"),
        ("components.reranker.options.weight=heavy", r"^components.reranker.options.weight='heavy'"),
        (
            "components.reranker.kind=tests.helpers.plugin_kinds:NotAKind",
            r"^components.reranker.kind: chunk_scorer .* is not a subclass of qkvqa.cda.reranker.ChunkScorerKind",
        ),
        (f"components.judge.kind={SCORER}", r"^components.judge.kind: judge .* is not a subclass of .*JudgeKind"),
        (
            "components.generator.kind=my_lab_absent.gen:MyLM",
            r"^components.generator.kind: generator 'my_lab_absent.gen:MyLM': module 'my_lab_absent.gen' does not "
            r"import .*; registered: chat_lm, llama3, qwen2_5_vl, reflectiva; or a class by import path",
        ),
        (
            "components.generator.kind=tests.helpers.plugin_kinds:Absent",
            r"^components.generator.kind: .* has no 'Absent'; registered: chat_lm",
        ),
        ("components.generator.kind=chatlm", r"is not one of chat_lm, llama3, qwen2_5_vl, reflectiva \(did you mean"),
        ("components.generator.options.seed=-1", r"^components.generator.options.seed=-1 is out of range"),
        ("components.generator.options.min_pixels=4", r"unknown key\(s\) \['min_pixels'\] for kind qwen2_5_vl|^$"),
    ],
)
def test_a_plugin_kind_and_its_options_are_checked_when_the_config_is_composed(override, message):
    from qkvqa.config.load import compose

    base = [f"components.reranker={{kind: {SCORER}, tiny: true}}"] if "reranker.options" in override else []
    if override.endswith("min_pixels=4"):  # a Qwen2.5-VL option is one of that kind's, not chat_lm's
        compose(None, [], [*base, "components.generator.kind=qwen2_5_vl", override])
        with pytest.raises(ConfigError, match=r"unknown key\(s\) \['min_pixels'\] for kind chat_lm"):
            compose(None, [], ["components.generator.kind=chat_lm", override])
        return
    if message is None:
        cfg = compose(None, [], [*base, override])
        assert cfg.components.reranker.kind == SCORER
        return
    with pytest.raises(ConfigError, match=message):
        compose(None, [], [*base, override])


def test_a_plugin_builds_scores_and_is_named_on_the_card_with_its_source_hash():
    import hashlib

    from qkvqa.components.registry import build_component
    from qkvqa.pipeline.protocol import component_card
    from tests.helpers import plugin_kinds

    scorer = build_component({"kind": SCORER, "tiny": True, "options": {"weight": 2.0}})
    assert scorer.score([("red fox", "a red fox ran"), ("red fox", "a blue bird")]) == [2.0, 0.0]
    from omegaconf import OmegaConf

    card = component_card(OmegaConf.create({"kind": SCORER, "tiny": True, "dtype": "fp32"}))
    source = Path(plugin_kinds.__file__)
    assert card["plugin"] == {
        "import_path": SCORER,
        "source": str(source),
        "source_sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
    }
    assert "plugin" not in component_card(OmegaConf.create({"kind": "bge_reranker", "tiny": True}))


@pytest.mark.slow
def test_a_plugin_judge_is_built_for_e_vqa_and_judges_what_exact_match_rejects():
    from qkvqa.config.load import compose
    from qkvqa.metrics.evqa import judge_label, score_examples
    from qkvqa.pipeline.build import build_judge

    judge_kind = "tests.helpers.plugin_kinds:SharedWordJudgeKind"
    with pytest.raises(ConfigError, match=r"^components.judge.options.threshold=2 is out of range"):
        compose(None, [], [f"components.judge={{kind: {judge_kind}, tiny: true, options: {{threshold: 2}}}}"])
    cfg = compose(None, [], [f"components.judge={{kind: {judge_kind}, tiny: true}}", "eval.judge=bem"])
    judge = build_judge(cfg, "evqa")
    assert judge_label(judge) == "shared words >= 0.5"
    example = {"question": "Which river?", "question_type": "templated", "reference_list": ["the river Elbe"]}
    scores = score_examples([{**example, "candidate": "Elbe river"}, {**example, "candidate": "the Rhine"}], judge)
    assert scores == [1.0, 0.0]  # EM rejects both; the judge accepts the first (2 of 3 words), not the second
    assert score_examples([{**example, "candidate": "Elbe river"}], None) == [0.0]
