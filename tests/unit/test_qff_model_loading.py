"""The `blip2_qff` component: checkpoints, the LAVIS name mapping, tokenisation and batched per-article scoring."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors import safe_open

from qkvqa.components import build_component
from qkvqa.config.schema import QFFConfig
from qkvqa.errors import ConfigError, MissingWeightsError, StaleArtifactError
from qkvqa.qff.builder import build_qff_component
from qkvqa.qff.scoring import late_interaction, per_section_loop

ARTICLES = [
    [
        "# Wiki Article: Grey heron\n## Section Title: Description\nThe grey heron is a large bird.",
        "# Wiki Article: Grey heron\n## Section Title: Diet\nIt eats fish, frogs and small mammals near the river.",
        "# Wiki Article: Grey heron\n## Section Title: Range\nFound in Europe and Asia.",
    ],
    [
        "# Wiki Article: Eiffel Tower\n## Section Title: History\nBuilt in 1889.",
        "# Wiki Article: Eiffel Tower\n## Section Title: Height\nThe tower is 330 metres tall.",
    ],
    ["# Wiki Article: Rose\n## Section Title: Colour\nRed, white or pink flowers."],
    [],
]
QUESTION = "what does this bird eat?"


pytestmark = pytest.mark.usefixtures("single_thread")


def picture(seed: int) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 255, (40, 52, 3), dtype=np.uint8))


def tiny(**options):
    """A tiny QFF component: construction `options` on the spec, the rest as `qff:` settings."""
    torch.manual_seed(0)
    settings = {k: options.pop(k) for k in list(options) if k in QFFConfig.__dataclass_fields__}
    options = {"num_layers": 4, "cross_attention_frequency": 2, **options}
    return build_qff_component({"kind": "blip2_qff", "tiny": True, "device": "cpu", "options": options}, settings)


def perturb_new_blocks(model) -> None:
    """Move the new parameters away from their initial values, so that a reload cannot re-derive them."""
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.startswith("base."):
                param.add_(0.3 * torch.randn(param.shape, generator=g))


@pytest.mark.slow
@pytest.mark.parametrize("focus", ["per_layer", "input"])
def test_safetensors_round_trip_gives_identical_scores(tmp_path, focus):
    comp = tiny(focus=focus)
    perturb_new_blocks(comp.model)
    images = [picture(1), picture(2), None, picture(3)]
    before = comp.score_sections(QUESTION, picture(0), images, ARTICLES)
    out = comp.save_pretrained(tmp_path / "qff")
    meta = json.loads((out / "qff_config.json").read_text())
    assert meta["focus"] == focus and meta["base_config"]["num_query_tokens"] == 4
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    new = {"per_layer": ("q_xattn.", "q_gate"), "input": ("input_xattn.", "input_gate")}[focus]
    assert keys == set(comp.model.state_dict())
    assert all(k.startswith(("base.",) + new) for k in keys) and any(k.startswith(new[0]) for k in keys)
    again = build_qff_component({"kind": "blip2_qff", "pretrained": str(out), "device": "cpu"}, {"focus": focus})
    assert again.model.focus == focus
    assert again.score_sections(QUESTION, picture(0), images, ARTICLES) == before
    for (name, a), (_, b) in zip(comp.model.state_dict().items(), again.model.state_dict().items()):
        assert torch.equal(a, b), name


@pytest.mark.slow
def test_checkpoint_focus_conflict_is_refused(tmp_path):
    out = tiny().save_pretrained(tmp_path / "qff")
    with pytest.raises(ConfigError, match="built with focus='per_layer'"):
        build_qff_component({"kind": "blip2_qff", "pretrained": str(out), "device": "cpu"}, {"focus": "input"})
    generic = build_qff_component({"kind": "blip2_qff", "pretrained": str(out), "device": "cpu"}, {"focus": "none"})
    assert generic.model.focus == "per_layer" and generic.focus == "none"


def test_per_article_vit_runs_once_and_matches_a_per_section_loop():
    comp = tiny(section_batch_size=2, vit_lru_size=0)  # the LRU pads ViT forwards to fixed chunks
    comp.model.q_gate.data.fill_(0.5)
    images_seen = []
    hook = comp.model.base.vision_model.register_forward_pre_hook(
        lambda m, args, kwargs: images_seen.append(kwargs["pixel_values"].shape[0]), with_kwargs=True
    )
    article_images = [picture(1), None, picture(3), picture(4)]  # article 1 has no image, article 3 no sections
    scores = comp.score_sections(QUESTION, picture(0), article_images, ARTICLES)
    assert sum(images_seen) == 1 + 2, "the question image and the two scored article images, once each"
    assert [len(s) for s in scores] == [3, 0, 1, 0]
    hook.remove()
    with torch.no_grad():
        question = comp.encode_question(QUESTION, picture(0))
        for i in (0, 2):
            for j, text in enumerate(ARTICLES[i]):
                tokens = comp.tokenize_sections([text])
                image = comp.model.encode_image(comp.preprocess_images([article_images[i]]))
                states = comp.model.encode_sections(tokens["input_ids"], tokens["attention_mask"], image, question)
                assert scores[i][j] == pytest.approx(late_interaction(question.tokens, states).item(), abs=1e-6)


def test_the_per_section_loop_baseline_scores_as_the_batched_path():
    """`per_section_loop` (OMGM's way, which bench/qff.py and bench/pipeline_real.py time) gives the batched scores."""
    comp = tiny(section_batch_size=2)
    comp.model.q_gate.data.fill_(0.5)
    images = [picture(1), picture(2), picture(3), picture(4)]
    with torch.inference_mode():
        looped = per_section_loop(comp, QUESTION, picture(0), images, (texts for texts in ARTICLES))
    batched = comp.score_sections(QUESTION, picture(0), images, ARTICLES)
    assert [len(row) for row in looped] == [3, 2, 1, 0]
    assert [x for row in looped for x in row] == pytest.approx([x for row in batched for x in row], abs=1e-6)


@pytest.mark.slow
def test_tokenisation_truncates_pads_to_longest_and_cleans_text():
    comp = tiny(max_text_tokens=16, question_max_tokens=8)
    long_text = " ".join(["heron"] * 40)
    assert comp.tokenize_sections([long_text, "a bird"])["input_ids"].shape == (2, 16)
    short = comp.tokenize_sections(["a bird", "a large grey bird"])
    assert short["input_ids"].shape == (2, 6) and short["attention_mask"][0].tolist() == [1, 1, 1, 1, 0, 0]
    assert comp.tokenize_questions([long_text])["input_ids"].shape == (1, 8)
    cleaned = tiny()  # OMGM's blip_caption cleaning is the default
    header = cleaned.tokenize_sections(["# Wiki Article: Heron\n## Section Title: Diet\nFish."])["input_ids"]
    plain = cleaned.tokenize_sections(["wiki article heron section title diet fish"])["input_ids"]
    assert torch.equal(header, plain)
    raw = tiny(blip_text_preprocess=False)
    assert not torch.equal(
        raw.tokenize_sections(["# Wiki Article: Heron"])["input_ids"],
        raw.tokenize_sections(["wiki article heron"])["input_ids"],
    )


def test_image_processor_uses_clip_statistics_and_the_model_size():
    comp = tiny(image_size=42)
    pixels = comp.preprocess_images([picture(0), picture(1).convert("L")])
    assert pixels.shape == (2, 3, 42, 42) and pixels.dtype == comp.model.vision_dtype
    assert comp.image_processor.image_mean == pytest.approx([0.48145466, 0.4578275, 0.40821073])
    assert comp.image_processor.resample == 3 and comp.model.encode_image(pixels).shape[1] == (42 // 14) ** 2 + 1
    assert comp.image_processor.transform == "targetpad"  # OMGM's default


def hf_to_lavis(hf: dict) -> tuple[dict, dict]:
    """HF names -> LAVIS names, written independently of qkvqa.qff.lavis; returns (blip2 state, EVA ViT state)."""
    blip2, eva = {}, {}
    simple = {
        "query_tokens": "query_tokens",
        "embeddings.word_embeddings.weight": "Qformer.bert.embeddings.word_embeddings.weight",
        "embeddings.position_embeddings.weight": "Qformer.bert.embeddings.position_embeddings.weight",
        "qformer.layernorm.weight": "Qformer.bert.embeddings.LayerNorm.weight",
        "qformer.layernorm.bias": "Qformer.bert.embeddings.LayerNorm.bias",
        "vision_model.post_layernorm.weight": "ln_vision.weight",
        "vision_model.post_layernorm.bias": "ln_vision.bias",
    }
    vit = {
        "vision_model.embeddings.class_embedding": "cls_token",
        "vision_model.embeddings.position_embedding": "pos_embed",
        "vision_model.embeddings.patch_embedding.weight": "patch_embed.proj.weight",
        "vision_model.embeddings.patch_embedding.bias": "patch_embed.proj.bias",
    }
    block_parts = {
        "layer_norm1": "norm1",
        "layer_norm2": "norm2",
        "self_attn.projection": "attn.proj",
        "self_attn.qkv": "attn.qkv",
        "mlp.fc1": "mlp.fc1",
        "mlp.fc2": "mlp.fc2",
    }
    for key, value in hf.items():
        if key in simple:
            blip2[simple[key]] = value
        elif key in vit:
            eva[vit[key]] = value
        elif key.startswith("vision_model.encoder.layers."):
            i, rest = key.split(".")[3], ".".join(key.split(".")[4:])
            if rest == "self_attn.qkv.bias":
                d = value.shape[0] // 3
                eva[f"blocks.{i}.attn.q_bias"], eva[f"blocks.{i}.attn.v_bias"] = value[:d], value[2 * d :]
                continue
            module, param = rest.rsplit(".", 1)
            eva[f"blocks.{i}.{block_parts[module]}.{param}"] = value
        elif key.startswith("qformer.encoder.layer."):
            lavis = key.replace("qformer.encoder.", "Qformer.bert.encoder.")
            blip2[lavis.replace("attention.attention.", "attention.self.")] = value
        else:
            head, rest = key.split(".", 1)
            blip2[
                {"vision_projection": "vision_proj", "text_projection": "text_proj", "itm_head": "itm_head"}[head]
                + "."
                + rest
            ] = value
    return blip2, eva


@pytest.mark.slow
def test_lavis_checkpoint_loads_through_the_name_mapping(tmp_path):
    comp = tiny()
    base = comp.model.base
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():  # distinct q/v biases (k part 0, as EVA has no k bias) so the merge is checked
        for layer in base.vision_model.encoder.layers:
            d = layer.self_attn.embed_dim
            bias = torch.randn(3 * d, generator=g)
            bias[d : 2 * d] = 0
            layer.self_attn.qkv.bias.copy_(bias)
    hf = {k: v.clone() for k, v in base.state_dict().items()}
    blip2, eva = hf_to_lavis(hf)
    blip2.update(
        {
            "temp": torch.tensor(0.07),
            "Qformer.cls.predictions.bias": torch.zeros(3),
            "Qformer.bert.embeddings.position_ids": torch.arange(8)[None],
        }
    )
    eva.update(
        {f"blocks.{len(base.vision_model.encoder.layers)}.norm1.weight": torch.ones(32)}
    )  # EVA's unused last block
    torch.save({"model": blip2}, tmp_path / "blip2_pretrained.pth")
    torch.save(eva, tmp_path / "eva_vit_g.pth")
    comp.tokenizer.save_pretrained(str(tmp_path / "tok"))
    options = {"base_config": base.config.to_dict(), "tokenizer": str(tmp_path / "tok")}
    spec = {"kind": "blip2_qff", "pretrained": str(tmp_path / "blip2_pretrained.pth"), "device": "cpu"}
    with pytest.raises(MissingWeightsError, match="vision_checkpoint"):
        build_component({**spec, "options": options})
    loaded = build_component({**spec, "options": {**options, "vision_checkpoint": str(tmp_path / "eva_vit_g.pth")}})
    state = loaded.model.base.state_dict()
    assert state.keys() == hf.keys()
    for key, value in hf.items():
        assert torch.equal(state[key], value), key
    assert torch.equal(loaded.model.q_gate, torch.zeros(4))
    assert loaded.score_sections(QUESTION, picture(0), [picture(1)], ARTICLES[:1]) == comp.score_sections(
        QUESTION, picture(0), [picture(1)], ARTICLES[:1]
    )


@pytest.mark.slow
def test_qff_config_section_feeds_the_component(tmp_path):
    spec = {"kind": "blip2_qff", "tiny": True, "device": "cpu", "options": {"num_layers": 2}}
    comp = build_qff_component(
        spec,
        QFFConfig(
            focus="input",
            max_text_tokens=20,
            question_max_tokens=10,
            score_direction="section_to_question",
            section_batch_size=8,
            gradient_checkpointing=True,
        ),
    )
    assert comp.model.focus == "input" and comp.model.gradient_checkpointing
    assert (comp.max_text_tokens, comp.question_max_tokens, comp.section_batch_size) == (20, 10, 8)
    assert comp.score_direction == "section_to_question"
    saved = comp.save_pretrained(tmp_path / "trained")
    same = dict(max_text_tokens=20, question_max_tokens=10, score_direction="section_to_question")
    reloaded = build_qff_component(spec, QFFConfig(focus="input", checkpoint=str(saved), **same))
    assert reloaded.model.num_layers == 2 and reloaded.model.focus == "input"
    # what changes a score travels with the weights: another value is refused, naming the key and both values
    for key, value in (("max_text_tokens", 16), ("score_direction", "question_to_section"), ("gate", "none")):
        wanted = {"score_direction": "scorer_options.score_direction"}.get(key, key)
        with pytest.raises(StaleArtifactError, match=rf"qff.{wanted}: trained with .* this config has '?{value}"):
            build_qff_component(spec, QFFConfig(focus="input", checkpoint=str(saved), **{**same, key: value}))
    # a runtime-only setting may differ: the question norm (inference's), attention, batch and cache sizes
    runtime = dict(question_norm="across_tokens", attention="eager", section_batch_size=3, vit_lru_size=0)
    again = build_qff_component(spec, QFFConfig(focus="input", checkpoint=str(saved), **same, **runtime))
    assert again.runtime_settings() == {"qff.attention": "eager", "qff.section_batch_size": 3, "qff.vit_lru_size": 0}
    recorded = json.loads((saved / "qff_config.json").read_text())["scoring"]
    assert recorded["scorer"] == "late_interaction" and recorded["runtime_options"] == ["question_norm"]


@pytest.mark.slow
def test_bad_options_and_missing_weights_fail_clearly(tmp_path):
    with pytest.raises(ConfigError, match="unknown option.*num_layer"):
        build_component({"kind": "blip2_qff", "tiny": True, "options": {"num_layer": 3}})
    with pytest.raises(MissingWeightsError, match="huggingface-cli download"):
        build_component({"kind": "blip2_qff", "pretrained": str(tmp_path / "nowhere")})
    with pytest.raises(MissingWeightsError, match="no LAVIS checkpoint"):
        build_component({"kind": "blip2_qff", "pretrained": str(tmp_path / "missing.pth")})


def test_a_run_directory_as_qff_checkpoint_names_the_qff_folder_inside_it(tmp_path):
    from qkvqa.config.load import compose
    from qkvqa.errors import MissingWeightsError
    from qkvqa.qff.rerank import load_qff_component

    (tmp_path / "status.json").write_text("{}")
    with pytest.raises(MissingWeightsError, match=f"{tmp_path / 'qff'}"):
        load_qff_component(compose(None, [], [f"qff.checkpoint={tmp_path}"]))


@pytest.mark.slow
def test_a_trained_qff_is_refused_when_its_weights_changed_or_its_preprocessing_differs(tmp_path):
    """Issue 14 item 6: a flipped model.safetensors changed R@10 in silence; a QFF trained with one image transform
    was used with another."""
    import json

    from qkvqa.errors import DataError, StaleArtifactError

    out = tiny(image_transform="squash").save_pretrained(tmp_path / "qff")
    meta = json.loads((out / "qff_config.json").read_text())
    assert meta["preprocessing"] == {
        "image_transform": "squash",
        "image_geometry": "hf_squash",
        "blip_text_preprocess": True,
    }
    assert meta["vit_dtype"] == "fp32"  # issue 32 item 6: the dtype its ViT ran in, recorded with it
    spec = {"kind": "blip2_qff", "pretrained": str(out), "device": "cpu"}
    with pytest.raises(
        StaleArtifactError,
        match=r"qff.image_transform: trained with 'squash', this config has "
        r"'targetpad'.*qff.image_transform='squash'",
    ):
        build_qff_component(spec, {"image_transform": "targetpad"})
    build_qff_component(spec, {"image_transform": "squash"})
    weights = out / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-7] ^= 0x10
    weights.write_bytes(bytes(data))
    with pytest.raises(DataError, match=r"model\.safetensors: corrupt QFF weights \(sha256"):
        build_qff_component(spec, {"image_transform": "squash"})
    del meta["weights_sha256"]
    (out / "qff_config.json").write_text(json.dumps(meta))
    weights.write_bytes(bytes(data[:200]))
    with pytest.raises(DataError, match=r"model\.safetensors: unreadable safetensors"):
        build_qff_component(spec, {"image_transform": "squash"})


@pytest.mark.slow
def test_the_vit_dtype_of_training_is_recorded_checked_on_load_and_on_the_card(tmp_path, caplog):
    """Issue 32 item 6: training runs the ViT in bf16, inference in fp16; the checkpoint says which it was trained in,
    an unknown value is refused, a difference is said in one line, and the card shows both."""
    import json
    import logging

    from qkvqa.config.load import compose
    from qkvqa.errors import DataError
    from qkvqa.pipeline.protocol import protocol_card

    out = tiny().save_pretrained(tmp_path / "qff", vit_dtype="bf16")
    meta_path = out / "qff_config.json"
    assert json.loads(meta_path.read_text())["vit_dtype"] == "bf16"
    spec = {"kind": "blip2_qff", "pretrained": str(out), "device": "cpu"}
    with caplog.at_level(logging.INFO, logger="qkvqa.qff.builder"):
        build_component(spec)
    assert "was trained with its ViT in bf16; this run's ViT runs in fp32" in caplog.text

    class KB:
        store_dir, url_checksum = tmp_path / "kb", "sha256:0"

        def __len__(self):
            return 3

    cfg = compose("demo/evaluate", [], [f"qff.checkpoint={out}"])
    scores = {"dataset": "evqa", "n_questions": 3, "n_skipped": 0, "question_set": {}, "benchmark": {}}
    card = protocol_card(cfg, scores, KB())
    assert card["models"]["qformer"]["vit_dtype"] == "fp32 here, bf16 in training"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "vit_dtype": "int3"}))
    with pytest.raises(DataError, match=r"qff_config\.json: vit_dtype 'int3' is not one of"):
        build_component(spec)
