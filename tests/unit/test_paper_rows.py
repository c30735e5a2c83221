"""Issue 32 item 2: each paper row declares the settings its number means, and the protocol card says "no, because
KEY = VALUE where the row uses WANTED" for every one of them that a run changes (every row, every setting)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from qkvqa.config.load import compose
from qkvqa.config.paper_rows import PAPER_ROWS, STAGE1_TEXT, Model, Trained, paper_row
from qkvqa.config.schema import CHOICES
from qkvqa.errors import ConfigError
from qkvqa.pipeline.protocol import not_comparable_because, render_card, used_components

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"
OMGM_STAGE1 = {"text": "llama3_summaries", "index": "index/omgm", "detail": "imported OMGM summary index"}
QUESTIONS = {"evqa": 5750, "infoseek": 71335}


def scores_of(row, **overrides) -> dict:
    """Scores of a run over the row's whole question set, stage 1 on OMGM's imported summary index."""
    sample = 1000 if row.key == "table6/infoseek_1k" else None
    scores = {
        "dataset": row.dataset,
        "n_questions": sample or QUESTIONS[row.dataset],
        "n_skipped": 3,
        "exclude_skipped": False,
        "two_hop_rows": row.dataset == "evqa",
        "question_set": {"max_questions": None, "sample_questions": sample},
        "benchmark": {"label": "BEM (PyTorch reproduction)"} if row.dataset == "evqa" else {},
        "stage1_text": OMGM_STAGE1,
    }
    return {**scores, **overrides}


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A directory as `qkvqa convert-llava` leaves it, as far as the card reads it: its record names the source."""
    from qkvqa.generation.llava_convert import CONVERTER_VERSION, RECORD

    out = tmp_path_factory.mktemp("reflectiva-hf")
    (out / RECORD).write_text(
        json.dumps(
            {"source": {"hub_id": "aimagelab/ReflectiVA", "path": "/src"}, "converter_version": CONVERTER_VERSION}
        )
    )
    return out


def row_config(row, converted=None):
    """The row's experiment as shipped, with a trained QFF where the row reads one (its run directory) and, for the
    Gen. FT rows, ReflectiVA's generator converted by `qkvqa convert-llava` (`converted`)."""
    cfg = compose(row.experiments[0] if row.experiments else "eval/evqa_qwen", [], [f"paper={row.key}"])
    if row.key == "figure5/alpha":
        OmegaConf.update(cfg, "eval.stop_after", "filter")
    if any(isinstance(v, Trained) and v.trained for v in row.settings.values()):
        OmegaConf.update(cfg, "qff.checkpoint", "checkpoints/evqa_qff/qff")
    generator = row.settings.get("components.generator")
    if converted is not None and generator is not None and generator.weights == "aimagelab/ReflectiVA":
        OmegaConf.update(cfg, "components.generator.pretrained", str(converted))
    return cfg


def verdict(cfg, scores):
    return not_comparable_because(cfg, scores, used_components(cfg))


def other_value(key, value):
    """A valid value other than `value` for `key`."""
    if key in CHOICES:
        return next(v for v in CHOICES[key] if v != value)
    if key == "generation.prompt":
        return "template"
    if key.endswith(".dtype"):
        return "bf16" if value != "bf16" else "fp16"
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return round(value / 2, 6)
    raise AssertionError(f"no other value for {key}={value!r}")


ROWS = sorted(PAPER_ROWS)


@pytest.mark.slow  # every row x setting (every trial, every experiment): make test, not the fast loop
def test_every_experiment_names_a_row_that_names_it_back():
    for path in EXPERIMENTS.rglob("*.yaml"):
        text = OmegaConf.load(path)
        if not isinstance(text, dict) and "paper" not in text or text.get("paper") is None:
            continue
        name = str(path.relative_to(EXPERIMENTS))[: -len(".yaml")]
        row = paper_row(text["paper"])
        assert name in row.experiments, (name, row.key)
    for row in PAPER_ROWS.values():
        for experiment in row.experiments:
            assert compose(experiment, [], []).paper == row.key


@pytest.mark.slow
def test_an_unknown_row_is_refused_with_the_list():
    with pytest.raises(ConfigError, match=r"paper='table9/x' is not a paper row; use one of eval/evqa_qwen"):
        compose("eval/evqa_qwen", [], ["paper=table9/x"])
    # a run recorded before the keys (its title as `paper`) still names its row
    assert paper_row(PAPER_ROWS["eval/evqa_qwen"].title).key == "eval/evqa_qwen"


@pytest.mark.slow
@pytest.mark.parametrize("key", ROWS)
def test_each_row_with_its_own_settings_is_comparable(key, converted):
    row = PAPER_ROWS[key]
    cfg = row_config(row, converted)
    assert verdict(cfg, scores_of(row)) == []


@pytest.mark.parametrize("key", ROWS)
@pytest.mark.slow  # every row x setting (every trial, every experiment): make test, not the fast loop
def test_each_setting_of_each_row_is_a_reason_when_changed(key, converted):
    row = PAPER_ROWS[key]
    base = row_config(row, converted)
    checked = 0
    for setting, wanted in row.settings.items():
        cfg, scores = copy.deepcopy(base), scores_of(row)
        if setting == STAGE1_TEXT:
            scores["stage1_text"] = {"text": "lead_section", "index": "i", "detail": "lead sections"}
            expected = "stage 1 embeds lead_section where the row uses OMGM's LLaMA-3 article summaries"
        elif isinstance(wanted, Model):
            if wanted.weights:
                OmegaConf.update(cfg, f"{setting}.pretrained", "someone/other-model")
                expected = f"{setting}.pretrained = someone/other-model where the row uses {wanted.weights}"
            else:
                OmegaConf.update(cfg, f"{setting}.kind", "other_kind")
                expected = f"{setting}.kind = other_kind where the row uses {wanted.kind}"
        elif isinstance(wanted, Trained):
            OmegaConf.update(cfg, "qff.checkpoint", None if wanted.trained else "checkpoints/x/qff")
            expected = "qff.checkpoint = "
        else:
            value = other_value(setting, wanted)
            OmegaConf.update(cfg, setting, value)
            expected = f"{setting} = "
        reasons = verdict(cfg, scores)
        if setting in row.varies:
            assert not any(setting in r for r in reasons), (setting, reasons)
        else:
            assert any(r.startswith(expected) or expected in r for r in reasons), (row.key, setting, reasons)
            checked += 1
    assert checked >= len(row.settings) - len(row.varies)


def test_a_swept_axis_is_named_on_the_card_not_a_reason():
    row = PAPER_ROWS["figure5/alpha"]
    cfg = row_config(row)
    OmegaConf.update(cfg, "qff.alpha", 0.3)
    assert verdict(cfg, scores_of(row)) == []
    from qkvqa.pipeline.protocol import comparability_line

    card = {"paper": row.title, "paper_varies": {"qff.alpha": 0.3}, "comparable": True, "not_comparable_because": []}
    assert comparability_line(card) == f"comparable to paper {row.title} at qff.alpha=0.3: yes"


def test_an_alpha_sweep_trial_on_the_table_2_row_is_not_comparable():
    """The issue's case: every alpha trial used to say "comparable to Table 2 ... 48.0: yes"."""
    row = PAPER_ROWS["eval/evqa_qwen"]
    cfg = row_config(row)
    OmegaConf.update(cfg, "qff.alpha", 0.3)
    OmegaConf.update(cfg, "cda.K1", 8)
    reasons = verdict(cfg, scores_of(row))
    assert "qff.alpha = 0.3 where the row uses 0.9" in reasons and "cda.K1 = 8 where the row uses 4" in reasons


@pytest.mark.slow
def test_a_local_copy_of_the_weights_matches_its_hub_id():
    row = PAPER_ROWS["eval/evqa_qwen"]
    cfg = row_config(row)
    OmegaConf.update(cfg, "components.generator.pretrained", "/data/weights/Qwen2.5-VL-7B-Instruct")
    assert verdict(cfg, scores_of(row)) == []
    OmegaConf.update(cfg, "components.generator.pretrained", "/data/weights/Qwen2.5-VL-3B-Instruct")
    assert any(
        "components.generator.pretrained = /data/weights/Qwen2.5-VL-3B-Instruct" in r
        for r in verdict(cfg, scores_of(row))
    )


@pytest.mark.slow
def test_the_card_says_how_the_weights_were_matched_to_the_release(tmp_path):
    """A folder named like the release passes the row check, but the card says it was matched by its name only (a
    fine-tune saved under that name looks the same); a path ending in the hub id says so."""
    from qkvqa.config.paper_rows import weights_matched_by
    from qkvqa.pipeline.protocol import protocol_card

    hub = "Qwen/Qwen2.5-VL-7B-Instruct"
    assert weights_matched_by(hub, hub) == "the hub id"
    assert weights_matched_by("/data/Qwen/Qwen2.5-VL-7B-Instruct/", hub) == "the path"
    assert weights_matched_by("/data/weights/Qwen2.5-VL-7B-Instruct", hub) == "the name only"
    assert weights_matched_by("/data/weights/other", hub, converted_from=hub) == "the converter's record"
    assert weights_matched_by("/data/weights/Qwen2.5-VL-3B-Instruct", hub) is None

    class KB:
        store_dir, url_checksum = tmp_path / "kb", "sha256:0"

        def __len__(self):
            return 3

    row = PAPER_ROWS["eval/evqa_qwen"]
    cfg = row_config(row)
    OmegaConf.update(cfg, "components.generator.pretrained", "/data/weights/Qwen2.5-VL-7B-Instruct")
    card = protocol_card(cfg, scores_of(row), KB())
    assert card["models"]["generator"]["row_weights"] == {"wanted": hub, "matched_by": "the name only"}
    assert "the name only" in render_card(card)


def test_a_results_file_is_judged_by_the_stage_1_it_records_and_an_unrecorded_one_is_called_an_assumption(tmp_path):
    from qkvqa.pipeline.protocol import protocol_card

    class KB:
        store_dir, url_checksum = tmp_path / "kb", "sha256:0"

        def __len__(self):
            return 3

    row = PAPER_ROWS["eval/evqa_qwen"]
    cfg = row_config(row)
    OmegaConf.update(cfg, "retrieval.results", str(tmp_path / "retrieval_test.json"))
    lead = {"text": "lead_section", "index": "idx", "detail": "each article's lead section"}
    assert any(r.startswith("stage 1 embeds lead_section") for r in verdict(cfg, scores_of(row, stage1_text=lead)))
    unrecorded = scores_of(row, stage1_text=None)
    assert verdict(cfg, unrecorded) == []  # OMGM's step-1 file: taken to be its summaries...
    card = protocol_card(cfg, unrecorded, KB())
    assert card["stage1"]["text"].startswith("not recorded with the file: taken to be llama3_summaries")  # ...said


def test_the_card_says_counted_as_wrong_only_when_they_are():
    row = PAPER_ROWS["eval/evqa_qwen"]
    base = {
        "dataset": "evqa",
        "protocol": None,
        "split": "test",
        "n_questions": 10,
        "n_unanswerable": 2,
        "per_question_type": {},
        "kb": {},
        "stage1": {},
        "filter": {},
        "models": {},
        "paper": row.title,
        "comparable": False,
        "not_comparable_because": ["x"],
    }
    assert "2 unanswerable, counted as wrong" in render_card({**base, "unanswerable": "counted as wrong"})
    left_out = render_card({**base, "unanswerable": "left out (eval.exclude_skipped)"})
    assert "counted as wrong" not in left_out and "2 unanswerable, left out" in left_out
    # no raw Python values: null, not None
    assert "| dataset / protocol / split | evqa / - / test |" in left_out


@pytest.mark.slow  # every row x setting (every trial, every experiment): make test, not the fast loop
def test_every_alpha_sweep_trial_compares_with_figure_5_at_its_alpha():
    from qkvqa.sweep.spec import load_sweep

    spec = load_sweep(EXPERIMENTS / "sweeps" / "alpha_sweep.yaml")
    row = PAPER_ROWS["figure5/alpha"]
    for params in spec.trial_params(None, 0):
        cfg = compose(
            "eval/evqa_qwen", [], [f"{k}={v}" for k, v in params.items()] + ["qff.checkpoint=checkpoints/evqa_qff/qff"]
        )
        assert cfg.paper == "figure5/alpha" and verdict(cfg, scores_of(row)) == []
    # the CDA grid's trials are Table 6 cells: the swept keys are the cell, not reasons
    grid = load_sweep(EXPERIMENTS / "sweeps" / "cda_grid.yaml")
    table6 = PAPER_ROWS["table6/infoseek_1k"]
    for params in grid.trial_params(None, 0)[:12]:
        cfg = compose(
            "table6/infoseek_1k",
            [],
            [f"{k}={'null' if v is None else v}" for k, v in params.items()]
            + ["qff.checkpoint=checkpoints/evqa_qff/qff"],
        )
        assert verdict(cfg, scores_of(table6)) == []


def test_docs_protocol_lists_every_row():
    text = (EXPERIMENTS.parent / "docs" / "protocol.md").read_text(encoding="utf-8")
    for row in PAPER_ROWS.values():
        assert f"| `{row.key}` | {row.title} |" in text, row.key


def test_weights_of_an_older_converter_are_a_reason_and_the_card_names_the_source(converted, tmp_path):
    from qkvqa.generation.llava_convert import CONVERTER_VERSION, RECORD
    from qkvqa.pipeline.protocol import component_card

    row = PAPER_ROWS["eval/evqa_llama31_ft"]
    cfg = row_config(row, converted)
    card = component_card(cfg.components.generator)
    assert card["converted_from"] == "aimagelab/ReflectiVA" and card["converter_version"] == CONVERTER_VERSION
    old = tmp_path / "old-conversion"
    old.mkdir()
    (old / RECORD).write_text(
        json.dumps({"source": {"hub_id": "aimagelab/ReflectiVA"}, "converter_version": CONVERTER_VERSION - 1})
    )
    OmegaConf.update(cfg, "components.generator.pretrained", str(old))
    assert any(
        f"was converted by qkvqa convert-llava version {CONVERTER_VERSION - 1}" in r
        for r in verdict(cfg, scores_of(row))
    )


def test_the_sentence_scorer_and_the_chat_lm_are_reasons_the_row_is_not_the_papers(converted):
    row = PAPER_ROWS["eval/evqa_llama3"]
    cfg = row_config(row, converted)
    for key, value in {
        "components.reranker.kind": "sentence_transformer",
        "components.reranker.pretrained": MINILM,
        "components.generator.kind": "chat_lm",
        "components.generator.pretrained": SMOLLM2,
    }.items():
        OmegaConf.update(cfg, key, value)
    reasons = verdict(cfg, scores_of(row))
    assert "components.reranker.kind = sentence_transformer where the row uses bge_reranker" in reasons
    assert "components.generator.kind = chat_lm where the row uses llama3" in reasons


MINILM, SMOLLM2 = "sentence-transformers/all-MiniLM-L6-v2", "HuggingFaceTB/SmolLM2-135M-Instruct"
