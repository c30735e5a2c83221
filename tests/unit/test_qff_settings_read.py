"""Issue 45 item 2: one settings object end to end. The component, the trainer (and its checkpoint), rerank, evaluate
and the card read the `qff:` section as one `QFFConfig` (`qkvqa.config.schema.qff_settings`), whole: no copy of its
fields, no allow-list that drops a key. Every field of `QFFConfig` is read by some code (`qff.<key>`,
`cfg.qff.<key>`, `self.qff.<key>`, a `"qff.<key>"` string, or a scorer's `QFF_KEYS`); a field added to the schema and
read nowhere fails here, naming it; and a setting added to the object reaches every command."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from qkvqa.config.load import compose
from qkvqa.config.schema import QFFConfig, qff_settings
from qkvqa.errors import ConfigError
from qkvqa.qff.scorers import SCORERS

pytestmark = pytest.mark.usefixtures("single_thread")

REPO = Path(__file__).resolve().parents[2]


def keys_read_in_code() -> set[str]:
    """Every `<...>.qff.NAME` / `qff.NAME` attribute (or through a name bound to `<...>.qff`), `qff["NAME"]` subscript
    and `"qff.NAME..."` string in the code."""
    read: set[str] = set()
    for path in [*(REPO / "src" / "qkvqa").rglob("*.py"), *(REPO / "data_modules").rglob("*.py")]:
        if "data_modules" in path.parts[len(REPO.parts) + 1 :] and path.is_symlink():
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        aliases = {"qff"}  # and every name bound to `<...>.qff` (`q = cfg.qff`)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) and node.value.attr == "qff":
                aliases |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        for node in ast.walk(tree):
            inner = node.value if isinstance(node, (ast.Attribute, ast.Subscript)) else None
            names_qff = (isinstance(inner, ast.Name) and inner.id in aliases) or (
                isinstance(inner, ast.Attribute) and inner.attr == "qff"
            )
            if isinstance(node, ast.Attribute) and names_qff:
                read.add(node.attr)
            elif isinstance(node, ast.Subscript) and names_qff and isinstance(node.slice, ast.Constant):
                read.add(str(node.slice.value))
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("qff."):
                read.add(node.value.split(".")[1])
    return read


@pytest.mark.slow
def test_every_key_of_the_qff_section_has_a_reader():
    routes = {key for cls in SCORERS.values() for key in cls.QFF_KEYS.values()}
    unread = sorted({f.name for f in dataclasses.fields(QFFConfig)} - keys_read_in_code() - routes)
    assert unread == [], f"qff keys in the schema that no code reads (silently dropped): {unread}"


@pytest.mark.slow
def test_the_scan_would_catch_a_dropped_key():
    """The check above is not vacuous: a name no code uses is reported."""
    assert "no_such_qff_key" not in keys_read_in_code()
    assert {"alpha", "scorer", "lr", "negatives", "gate_init", "vit_lru_size"} <= keys_read_in_code()


@dataclasses.dataclass
class WithProbe(QFFConfig):
    """The schema with one field more, as a researcher would add one to `QFFConfig`."""

    probe: str = "unset"


@pytest.mark.slow
def test_a_setting_added_to_the_one_object_reaches_training_rerank_evaluate_and_the_card(tmp_path):
    """A field added to the settings object, and a scorer option (`qff.scorer_options`), reach the trainer (and its
    checkpoint), the component that rerank and evaluate score with (`QFFReranker.from_config`, the QFF filter) and the
    card, with no list of keys to extend anywhere."""
    from qkvqa.models.qff_module import QFFTrainer
    from qkvqa.pipeline.filters import filter_kind
    from qkvqa.qff.builder import build_qff_component
    from qkvqa.qff.rerank import load_qff_component

    overrides = ["qff.scorer=examples.mean_cosine_scorer:MeanCosine", "qff.scorer_options.scale=3", "qff.alpha=0.7"]
    cfg = compose("demo/qff_per_layer", overrides=overrides)
    qff = WithProbe(**{f.name: getattr(qff_settings(cfg.qff), f.name) for f in dataclasses.fields(QFFConfig)})
    qff.probe = "reached"
    assert qff_settings(qff) is qff  # the object travels as it is: nothing picks keys out of it

    component = build_qff_component(cfg.components.qformer, qff)  # what `qkvqa rerank` and `evaluate` build
    assert component.qff is qff and component.qff.probe == "reached"
    assert component.scorer.options == {"scale": 3.0} and component.scoring()["scorer_options"] == {"scale": 3.0}

    spec = OmegaConf.to_container(cfg.components.qformer, resolve=True)
    trainer = QFFTrainer(component.model, qff, model_spec={"qformer": spec})
    assert trainer.qff is qff and trainer.qff.probe == "reached" and trainer.scorer.options == {"scale": 3.0}
    assert trainer.hparams["settings"]["probe"] == "reached"  # saved with the checkpoint, plain
    torch.save(dict(trainer.hparams), tmp_path / "hparams.pt")
    saved = torch.load(tmp_path / "hparams.pt", weights_only=True)["settings"]
    assert saved["probe"] == "reached" and saved["scorer_options"] == {"scale": 3}
    with pytest.raises(ConfigError, match=r"qff.probe: Key 'probe' not in 'QFFConfig'"):
        qff_settings(saved)  # a key today's schema lacks is refused, naming it, never dropped

    # rerank and evaluate: the config's section, through the same one object
    reranked = load_qff_component(cfg)
    assert reranked.qff == qff_settings(cfg.qff) and reranked.scorer.options == {"scale": 3.0}
    card = filter_kind("qff").card(cfg)
    assert card["scorer"] == "examples.mean_cosine_scorer:MeanCosine" and card["scorer_options"] == {"scale": 3}
    assert card["alpha"] == 0.7


def test_the_section_is_read_whole_and_a_key_the_schema_lacks_is_refused():
    """`build_qff_component` hands the whole section over (no allow-list): a key outside the schema is refused by name
    instead of dropped, and a construction option that is a qff setting is refused on `components.qformer.options`."""
    from qkvqa.qff.builder import build_qff_component

    spec = {"kind": "blip2_qff", "tiny": True, "device": "cpu", "options": {"num_layers": 2}}
    with pytest.raises(ConfigError, match=r"qff.scorer_optionz: Key 'scorer_optionz' not in 'QFFConfig'"):
        build_qff_component(spec, {"scorer_optionz": {}})
    with pytest.raises(ConfigError, match=r"options.gate_init: gate_init is a setting of the qff: section, .* set qff"):
        build_qff_component({**spec, "options": {"num_layers": 2, "gate_init": 0.5}})
    component = build_qff_component(spec, {"gate_init": 0.5, "max_text_tokens": 16, "vit_lru_size": 0})
    assert float(component.model.q_gate.detach().flatten()[0]) == 0.5
    assert (component.max_text_tokens, component.vit_lru_size) == (16, 0)
