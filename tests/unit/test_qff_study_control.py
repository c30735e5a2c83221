"""The focus study's instruments: the positive control's oracle focus path (tests/helpers/qff_oracle.py) and the BM25
lexical reference (tests/helpers/qff_study.py); properties only."""

from __future__ import annotations

import pytest
import torch

from qkvqa.qff.builder import build_qff_component
from qkvqa.qff.model import QFFModel, QuestionEncoding
from tests.helpers.qff_oracle import (
    AttributeOracle,
    OracleFocusModel,
    OracleQuestionEncoding,
    PresenceOracle,
    attribute_presence,
    attribute_words,
    oracle_token_ids,
)
from tests.helpers.qff_study import BM25, PRESENCE_ORACLE

pytestmark = pytest.mark.usefixtures("single_thread")
QUESTION = "According to recent surveys, what does the diet of this bird consist of mainly?"
SECTIONS = [
    "Diet: Early surveys report that its diet consists mainly of seeds.",
    "Range: Recent surveys report that the species is native to the Andes.",
]


def test_bm25_prefers_the_section_with_the_rare_query_word_and_saturates():
    corpus = [[1, 2, 3], [1, 4, 5], [1, 6], [1, 7, 7]]
    bm25 = BM25(corpus, ignore=[0])
    assert bm25.score([1, 2], [1, 2, 9]) > bm25.score([1, 2], [1, 4, 9]) > 0
    assert bm25.score([2], [2] * 10) < 10 * bm25.score([2], [2])  # term frequency saturates
    assert bm25.score([0, 2], [0, 0, 2]) == bm25.score([2], [2])  # ignored ids count nowhere (nor in length)
    assert bm25.score([3], [1, 2]) == 0.0


def test_attribute_words_name_the_asked_fact_and_nothing_generic():
    words = set(attribute_words())
    assert {"diet", "wingspan", "conservation", "flowering", "recent", "early"} <= words
    assert not words & {"the", "this", "what", "of", "bird", "plant", "landmark"}


_SPEC = {
    "kind": "blip2_qff",
    "tiny": True,
    "device": "cpu",
    "options": {
        "hidden_size": 32,
        "num_layers": 2,
        "num_query_tokens": 2,
        "seed": 0,
        "vocab_texts": [" ".join([*attribute_words(), QUESTION, *SECTIONS])],
    },
}


@pytest.fixture(scope="module")
def component():
    return build_qff_component(_SPEC, {"focus": "per_layer", "blip_text_preprocess": False})


def test_the_positive_control_is_a_focus_plugin_scored_by_the_class_it_was_trained_as(component):
    """The study trains the control with `qff.focus` naming the oracle class, so the trained QFF records this class's
    source and the study's scoring, building from the same config, passes the builder's plugin check (a control
    made by swapping a built per_layer model's class recorded the oracle's source at training and none at scoring,
    and was refused)."""
    import hashlib
    from pathlib import Path

    from qkvqa.qff.model import focus_source
    from tests.helpers import qff_oracle

    built = build_qff_component(_SPEC, {"focus": PRESENCE_ORACLE.split("=", 1)[1], "blip_text_preprocess": False})
    model = built.model
    assert type(model) is PresenceOracle and model.focus_mode == "per_layer"
    # per_layer's weights, none added; one buffer: the sha256 of the oracle's token ids
    assert model.state_dict().keys() == {*component.model.state_dict().keys(), "oracle_ids_sha256"}
    assert not any(name == "oracle_ids_sha256" for name, _ in model.named_parameters())
    sha = hashlib.sha256(Path(qff_oracle.__file__).read_bytes()).hexdigest()
    assert focus_source(type(model)) == {"focus_source_sha256": sha}
    q = built.tokenize_questions([QUESTION])
    image = model.encode_image(built.preprocess_images([_image()]))
    assert isinstance(model.encode_question(q["input_ids"], q["attention_mask"], image), OracleQuestionEncoding)


def test_the_builder_binds_the_oracle_s_token_ids_and_a_control_trained_with_other_ids_is_refused(tmp_path):
    """A focus plugin that needs token ids gets the tokenizer from the builder (QFFModel.bind_tokenizer), on the fresh
    and the checkpoint path alike; the ids' sha256 travels with the weights, so weights trained with other ids (an
    edited word list, another tokenizer) are refused rather than scored with ids they never saw."""
    from qkvqa.errors import StaleArtifactError

    focus = {"focus": PRESENCE_ORACLE.split("=", 1)[1], "blip_text_preprocess": False}
    built = build_qff_component(_SPEC, focus)
    model, tokenizer = built.model, built.tokenizer
    assert model.oracle_ids.tolist() == oracle_token_ids(tokenizer)
    assert model.oracle_ids_sha256.any()  # recorded at the first bind
    unbound = PresenceOracle(model.base, focus=focus["focus"])
    q = built.tokenize_questions([QUESTION])
    image = model.encode_image(built.preprocess_images([_image()]))
    with pytest.raises(RuntimeError, match="no tokenizer bound"):
        unbound.encode_question(q["input_ids"], q["attention_mask"], image)
    saved = model.save_pretrained(tmp_path / "qff")
    tokenizer.save_pretrained(saved)  # as qkvqa train exports a QFF
    reloaded = build_qff_component({**_SPEC, "tiny": False, "pretrained": str(saved)}, focus).model
    assert torch.equal(reloaded.oracle_ids, model.oracle_ids)
    assert torch.equal(reloaded.oracle_ids_sha256, model.oracle_ids_sha256)
    reloaded.encode_question(q["input_ids"], q["attention_mask"], image)  # the same ids: it runs
    other = {**model.state_dict()}
    other["oracle_ids_sha256"] = other["oracle_ids_sha256"].clone()
    other["oracle_ids_sha256"][0] ^= 1  # as if trained with another word list
    with pytest.raises(StaleArtifactError, match="retrain the control"):
        reloaded.load_state_dict(other)  # into a bound model (Lightning's resume): refused as it loads
    reloaded.load_state_dict(model.state_dict())  # its own ids load
    model.oracle_ids_sha256[0] ^= 1
    stale = model.save_pretrained(tmp_path / "stale")
    tokenizer.save_pretrained(stale)
    with pytest.raises(StaleArtifactError, match="retrain the control"):  # the checkpoint path: refused at the bind
        build_qff_component({**_SPEC, "tiny": False, "pretrained": str(stale)}, focus)


def test_the_oracle_focus_path_reads_only_the_attribute_words(component):
    plain = component.model
    oracle = _oracle(AttributeOracle, plain, component.tokenizer)
    assert isinstance(oracle, OracleFocusModel)
    with torch.no_grad():
        oracle.q_gate.fill_(1.0)
        plain.q_gate.fill_(1.0)
        q = component.tokenize_questions([QUESTION])
        image = oracle.encode_image(component.preprocess_images([_image()]))
        encoding = oracle.encode_question(q["input_ids"], q["attention_mask"], image)
        assert isinstance(encoding, OracleQuestionEncoding)
        # the whole question for late interaction, as the plain model encodes it
        whole = plain.encode_question(q["input_ids"], q["attention_mask"], image)
        assert torch.allclose(encoding.tokens, whole.tokens)
        # the focus states: the question pass over [CLS], the attribute words and [SEP] only
        keep = torch.isin(q["input_ids"], torch.tensor(oracle_token_ids(component.tokenizer)))
        kept = component.tokenizer.convert_ids_to_tokens(q["input_ids"][keep].tolist())
        assert set(kept) == {"[CLS]", "[SEP]", "recent", "diet", "mainly"}
        masked = plain.encode_question(q["input_ids"], q["attention_mask"] * keep, image)
        assert torch.allclose(encoding.focus_states[-1], masked.tokens)
        assert not torch.allclose(encoding.focus_states[-1], encoding.tokens, atol=1e-3)
        s = component.tokenize_sections(SECTIONS)
        focused = oracle.encode_sections(s["input_ids"], s["attention_mask"], image, encoding)
        # the focus blocks saw the oracle, not the whole question (at random weights the two differ little)
        assert (focused - plain.encode_sections(s["input_ids"], s["attention_mask"], image, whole)).abs().max() > 1e-6
        assert torch.allclose(focused, plain.encode_sections(s["input_ids"], s["attention_mask"], image, masked))
        off = oracle.encode_sections(s["input_ids"], s["attention_mask"], image, encoding, focus="none")
        assert torch.allclose(
            off, plain.encode_sections(s["input_ids"], s["attention_mask"], image, None, focus="none")
        )


def _oracle(cls, plain: QFFModel, tokenizer) -> OracleFocusModel:
    """An oracle of class `cls` around `plain`'s BLIP-2 with `plain`'s focus blocks, bound to `tokenizer`."""
    from qkvqa.qff.model import focus_name

    oracle = cls(plain.base, focus=focus_name(cls))
    missing = oracle.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert missing == ["oracle_ids_sha256"]  # the one key a plain QFF lacks: the bind records it
    oracle.bind_tokenizer(tokenizer)
    return oracle


def _image():
    from PIL import Image

    return Image.new("RGB", (40, 30), (120, 30, 200))


def test_the_presence_oracle_hands_the_focus_path_whether_the_section_states_the_asked_attribute(component):
    plain = component.model
    oracle = _oracle(PresenceOracle, plain, component.tokenizer)
    with torch.no_grad():
        oracle.q_gate.fill_(1.0)
        plain.q_gate.fill_(1.0)
        q = component.tokenize_questions([QUESTION])
        image = oracle.encode_image(component.preprocess_images([_image()]))
        encoding = oracle.encode_question(q["input_ids"], q["attention_mask"], image)
        s = component.tokenize_sections(SECTIONS)
        # the Diet section holds "diet" and "mainly" but not "recent"; the Range section holds "recent" only
        share = attribute_presence(s["input_ids"] * s["attention_mask"], encoding.attribute_ids.expand(2, -1))
        assert share.tolist() == pytest.approx([2 / 3, 1 / 3])
        focused = oracle.encode_sections(s["input_ids"], s["attention_mask"], image, encoding)
        scaled = [tuple(f * value for f in encoding.focus_states) for value in share.tolist()]
        for row, states in enumerate(scaled):
            expected = plain.encode_sections(
                s["input_ids"][row : row + 1], s["attention_mask"][row : row + 1], image, QuestionEncoding(states)
            )
            assert torch.allclose(focused[row : row + 1], expected, atol=1e-5)


@pytest.mark.slow
def test_a_failing_model_stops_the_study_s_scoring_naming_it(tmp_path):
    """evaluate_many raises at the first model that fails, naming it (the jobs not started are cancelled rather than
    scored and then thrown away with the error)."""
    from tests.helpers.qff_study import evaluate_many

    jobs = {("none", 0): ("none", tmp_path / "no-such-qff", 0), ("none", 1): ("none", tmp_path / "no-such-qff", 1)}
    with pytest.raises(RuntimeError, match=r"scoring \('none', [01]\) failed"):
        evaluate_many(jobs, [], tmp_path, set(), parallel=1)


def test_the_study_finds_its_positive_control_by_the_class_its_variant_builds():
    """bench/qff_focus.py reports as the positive control the variant whose `qff.focus` resolves to the presence
    oracle's class (or a subclass), not one whose overrides merely spell the same text."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "qff_focus.py"
    spec = importlib.util.spec_from_file_location("bench_qff_focus", path)
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench
    try:
        spec.loader.exec_module(bench)
        assert bench.focus_class("positive_control") is PresenceOracle
        assert bench.focus_class("oracle_attribute") is AttributeOracle
        assert bench.focus_class("per_layer_lr10") is QFFModel and bench.focus_class("none") is QFFModel
    finally:
        sys.modules.pop(spec.name, None)
