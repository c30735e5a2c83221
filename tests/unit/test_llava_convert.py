"""The LLaVA -> transformers Llava converter: a tiny checkpoint in the original key layout, converted, gives the logits
of a forward written from the original architecture (llava_arch.py), and inputs that are not that layout are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors import safe_open
from safetensors.torch import save_file

from qkvqa.errors import DataError
from qkvqa.generation.llava_convert import (
    CONVERTER_VERSION,
    RECORD,
    card_fields,
    convert_llava,
    image_processor_for,
    map_key,
)
from qkvqa.generation.tiny_llava import write_tiny_clip_tower, write_tiny_llava_source

IMAGE_TOKEN_INDEX = -200  # llava/constants.py


# ---- the original architecture, written from ReflectiVA's llava/ code (not from the converter) ----


def expand2square(image, background):
    """llava/mm_utils.py expand2square."""
    width, height = image.size
    if width == height:
        return image
    side = max(width, height)
    result = Image.new(image.mode, (side, side), background)
    result.paste(image, (0, (width - height) // 2) if width > height else ((height - width) // 2, 0))
    return result


def process_images(images, tower: Path):
    """llava/mm_utils.py process_images with image_aspect_ratio 'pad' and the tower's CLIPImageProcessor."""
    from transformers import CLIPImageProcessor

    processor = CLIPImageProcessor.from_pretrained(str(tower))
    background = tuple(int(x * 255) for x in processor.image_mean)
    return torch.stack(
        [
            torch.as_tensor(
                processor.preprocess(expand2square(image, background), return_tensors="pt")["pixel_values"][0]
            )
            for image in images
        ]
    )


def tokenizer_image_token(prompt, tokenizer):
    """llava/mm_utils.py tokenizer_image_token: chunks split at <image>, each tokenised with its bos, -200 between."""
    chunks = [tokenizer(chunk).input_ids for chunk in prompt.split("<image>")]
    ids, offset = [], 0
    if chunks and chunks[0] and chunks[0][0] == tokenizer.bos_token_id:
        offset = 1
        ids.append(chunks[0][0])
    separated = [x for pair in zip(chunks, [[IMAGE_TOKEN_INDEX] * (offset + 1)] * len(chunks)) for x in pair][:-1]
    for x in separated:
        ids.extend(x[offset:])
    return ids


def reflectiva_conversation(tokenizer, question, passages, short=True):
    """conv llama_3_1's get_prompt (llava/conversation.py) for release_retrieval.py's concat_paragraph messages."""
    system = (
        "You are a helpful language and vision assistant. You are able to understand the visual content that "
        "the user provides, and assist the user with a variety of tasks using natural language."
    )
    turns = [
        ("user", "<image>\n\n" + question),
        ("assistant", "[Retrieval]"),
        (
            "user",
            "Consider this paragraph: <paragraph>"
            + passages
            + "</paragraph>"
            + (". Give a short answer." if short else ""),
        ),
        ("assistant", None),
    ]
    messages = [{"role": "system", "content": system}] + [{"role": r, "content": m} for r, m in turns if m]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)


class OriginalLlava(torch.nn.Module):
    """LlavaLlamaForCausalLM's forward for one image: CLIP hidden_states[select_layer][:, 1:] (feature 'patch') ->
    mm_projector (Linear, GELU, Linear) -> spliced where id -200 stands into LLaMA's inputs_embeds."""

    def __init__(self, source: Path, tower: Path):
        super().__init__()
        from transformers import CLIPVisionModel, LlamaConfig, LlamaForCausalLM

        config = json.loads((source / "config.json").read_text())
        self.select_layer = config["mm_vision_select_layer"]
        text = {
            k: v for k, v in config.items() if k in LlamaConfig().to_dict() and k not in ("model_type", "architectures")
        }
        self.llama = LlamaForCausalLM(LlamaConfig(**text)).eval()
        self.projector = torch.nn.Sequential(
            torch.nn.Linear(config["mm_hidden_size"], config["hidden_size"]),
            torch.nn.GELU(),
            torch.nn.Linear(config["hidden_size"], config["hidden_size"]),
        )
        state = {}
        for name in json.loads((source / "model.safetensors.index.json").read_text())["weight_map"].values():
            with safe_open(str(source / name), framework="pt") as handle:
                state.update({k: handle.get_tensor(k) for k in handle.keys()})
        self.llama.load_state_dict(
            {
                k: v
                for k, v in state.items()
                if not k.startswith("model.mm_projector.") and not k.startswith("model.vision_tower.")
            },
            strict=True,
        )
        self.projector.load_state_dict(
            {k[len("model.mm_projector.") :]: v for k, v in state.items() if k.startswith("model.mm_projector.")},
            strict=True,
        )
        self.vision = CLIPVisionModel.from_pretrained(str(tower)).eval()  # CLIPVisionTower.load_model

    @torch.no_grad()
    def forward(self, ids: list[int], pixel_values: torch.Tensor) -> torch.Tensor:
        hidden = self.vision(pixel_values, output_hidden_states=True).hidden_states[self.select_layer][:, 1:]
        features = self.projector(hidden)[0]
        ids_t = torch.tensor(ids)
        where = int((ids_t == IMAGE_TOKEN_INDEX).nonzero()[0])
        embed = self.llama.get_input_embeddings()
        embeds = torch.cat([embed(ids_t[:where]), features, embed(ids_t[where + 1 :])])
        return self.llama(inputs_embeds=embeds[None]).logits[0]


# ---- fixtures ----


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("llava")
    source = write_tiny_llava_source(root / "source", seed=3, saved_tower=True)
    tower = write_tiny_clip_tower(root / "clip", seed=4)
    record = convert_llava(
        source, root / "converted", vision_tower=tower, source_id="tiny/llava", progress=lambda m: None
    )
    return source, tower, root / "converted", record


def _converted(path):
    from transformers import AutoTokenizer, LlavaForConditionalGeneration, LlavaImageProcessor, LlavaProcessor

    model = LlavaForConditionalGeneration.from_pretrained(str(path)).eval()
    processor = LlavaProcessor.from_pretrained(str(path))
    processor.image_processor = LlavaImageProcessor.from_pretrained(str(path))
    processor.tokenizer = AutoTokenizer.from_pretrained(str(path))
    return model, processor


IMAGES = [Image.new("RGB", (70, 42), (200, 30, 40)), Image.new("RGB", (30, 50), (10, 180, 90))]
for _i, _img in enumerate(IMAGES):  # some structure, so that different crops give other pixels
    for _x in range(0, _img.size[0], 7):
        _img.putpixel((_x, _x % _img.size[1]), (255, 255, 255))


def test_key_map_of_the_original_layout():
    assert map_key("model.embed_tokens.weight") == "model.language_model.embed_tokens.weight"
    assert map_key("model.layers.3.self_attn.q_proj.weight") == "model.language_model.layers.3.self_attn.q_proj.weight"
    assert map_key("model.norm.weight") == "model.language_model.norm.weight"
    assert map_key("lm_head.weight") == "lm_head.weight"
    assert map_key("model.mm_projector.0.bias") == "model.multi_modal_projector.linear_1.bias"
    assert map_key("model.mm_projector.2.weight") == "model.multi_modal_projector.linear_2.weight"
    assert (
        map_key("model.vision_tower.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight")
        == "model.vision_tower.vision_model.encoder.layers.0.mlp.fc1.weight"
    )
    assert map_key("model.layers.0.self_attn.rotary_emb.inv_freq") is None
    with pytest.raises(KeyError):
        map_key("model.image_newline")


def test_pixels_match_expand2square_and_clip_preprocessing(checkpoint):
    _, tower, converted, _ = checkpoint
    _, processor = _converted(converted)
    ours = torch.as_tensor(processor.image_processor(IMAGES, return_tensors="pt")["pixel_values"])
    reference = process_images(IMAGES, tower)
    assert ours.shape == reference.shape
    assert torch.allclose(ours, reference, atol=1e-6, rtol=0)
    # the pad colour matters: without do_pad the 70x42 image is resized and cropped, other pixels
    plain = torch.as_tensor(processor.image_processor(IMAGES[:1], do_pad=False, return_tensors="pt")["pixel_values"])
    assert not torch.allclose(plain, reference[:1], atol=1e-3)


@pytest.mark.slow
def test_converted_logits_match_the_original_forward(checkpoint):
    from transformers import AutoTokenizer

    source, tower, converted, record = checkpoint
    source_tokenizer = AutoTokenizer.from_pretrained(str(source))
    original = OriginalLlava(source, tower)
    model, processor = _converted(converted)
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    prompt = reflectiva_conversation(
        source_tokenizer, "What is the wingspan of this bird?", "# Wiki Article: Grey heron\nThe grey heron is tall."
    )
    prompt += "<|start_header_id|>assistant<|end_header_id|>\n\n"
    reference_ids = tokenizer_image_token(prompt, source_tokenizer)[1:]  # release_retrieval.py drops one bos
    worst = 0.0
    for image in IMAGES:
        pixels = process_images([image], tower)
        expected = original(reference_ids, pixels)
        inputs = processor(
            text=[prompt], images=[image], add_special_tokens=False, return_token_type_ids=False, return_tensors="pt"
        )
        n = expected.shape[0] - (len(reference_ids) - 1)  # image features spliced in
        expanded = [
            t for i in reference_ids for t in ([model.config.image_token_index] * n if i == IMAGE_TOKEN_INDEX else [i])
        ]
        assert inputs["input_ids"][0].tolist() == expanded  # the same tokens around the image
        with torch.no_grad():
            logits = model(**inputs).logits[0]
        assert logits.shape[0] == expected.shape[0]
        assert torch.allclose(logits[:, :vocab], expected, atol=1e-4, rtol=1e-4)
        worst = max(worst, float((logits[:, :vocab] - expected).abs().max()))
    # the image is read: the two images give other logits, by far more than the tolerance
    with torch.no_grad():
        a = original(reference_ids, process_images(IMAGES[:1], tower))
        b = original(reference_ids, process_images(IMAGES[1:], tower))
    assert float((a - b).abs().max()) > 100 * max(worst, 1e-6)
    assert record["converter_version"] == CONVERTER_VERSION


def test_record_names_the_source_and_the_choices(checkpoint):
    source, tower, converted, record = checkpoint
    on_disk = json.loads((converted / RECORD).read_text())
    assert on_disk == record
    assert record["source"]["hub_id"] == "tiny/llava"
    files = record["source"]["fingerprint"]["files"]
    assert {"config.json", "model-00001-of-00002.safetensors", "tokenizer.json"} <= set(files)
    assert len(record["source"]["fingerprint"]["sha256"]) == 64
    assert record["vision_tower"]["weights_from"] == "vision_tower_dir"
    assert record["ignored_keys"] > 0  # the saved tower, which LLaVA does not load either
    assert record["image_token"]["rows_added"] == 1
    assert record["llava"]["conv_mode"] == "llama_3_1" and record["llava"]["image_aspect_ratio"] == "pad"
    config = json.loads((converted / "config.json").read_text())
    assert config["vision_feature_layer"] == -2 and config["vision_feature_select_strategy"] == "default"
    assert config["image_token_index"] == record["image_token"]["id"]


def test_same_source_same_fingerprint_other_weights_other_fingerprint(checkpoint, tmp_path):
    source, tower, _, record = checkpoint
    again = convert_llava(source, tmp_path / "again", vision_tower=tower, progress=lambda m: None)
    assert again["source"]["fingerprint"]["sha256"] == record["source"]["fingerprint"]["sha256"]
    other = write_tiny_llava_source(tmp_path / "other", seed=9)
    third = convert_llava(other, tmp_path / "third", vision_tower=tower, progress=lambda m: None)
    assert third["source"]["fingerprint"]["sha256"] != record["source"]["fingerprint"]["sha256"]


def _copy_source(source: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(source, to)
    return to


def _edit_config(path: Path, **fields):
    config = json.loads((path / "config.json").read_text())
    config.update(fields)
    (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    "field, value",
    [
        ("model_type", "llava"),
        ("model_type", "llama"),
        ("mm_projector_type", "linear"),
        ("image_aspect_ratio", "anyres"),
        ("mm_patch_merge_type", "spatial_unpad"),
        ("mm_use_im_start_end", True),
    ],
)
def test_a_config_outside_the_layout_is_refused_naming_file_and_field(checkpoint, tmp_path, field, value):
    source, tower, _, _ = checkpoint
    copy = _copy_source(source, tmp_path / "src")
    _edit_config(copy, **{field: value})
    with pytest.raises(DataError) as err:
        convert_llava(copy, tmp_path / "out", vision_tower=tower)
    message = str(err.value)
    assert str(copy / "config.json") in message and field in message
    assert "\n" not in message
    assert not (tmp_path / "out").exists()


def test_an_unknown_weight_key_is_refused_naming_file_and_key(checkpoint, tmp_path):
    source, tower, _, _ = checkpoint
    copy = _copy_source(source, tmp_path / "src")
    shard = copy / "model-00002-of-00002.safetensors"
    with safe_open(str(shard), framework="pt") as handle:
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    tensors["model.image_newline"] = torch.zeros(4)
    save_file(tensors, str(shard), metadata={"format": "pt"})
    with pytest.raises(DataError, match=r"model-00002-of-00002\.safetensors: model\.image_newline"):
        convert_llava(copy, tmp_path / "out", vision_tower=tower)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))


def test_missing_vision_tower_and_non_empty_output_are_refused(checkpoint, tmp_path):
    source, tower, _, _ = checkpoint
    with pytest.raises(DataError, match="--vision-tower"):
        convert_llava(source, tmp_path / "out")
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(DataError, match="not empty"):
        convert_llava(source, tmp_path / "full", vision_tower=tower)


def test_a_tower_saved_in_the_checkpoint_is_used_when_llava_would(checkpoint, tmp_path):
    """unfreeze_mm_vision_tower: true makes LLaVA build (and so load) the tower from the checkpoint's own keys."""
    source, tower, converted, _ = checkpoint
    copy = _copy_source(source, tmp_path / "src")
    _edit_config(copy, unfreeze_mm_vision_tower=True)
    record = convert_llava(copy, tmp_path / "out", vision_tower=tower, progress=lambda m: None)
    assert record["vision_tower"]["weights_from"] == "checkpoint"
    with safe_open(str(source / "model-00002-of-00002.safetensors"), framework="pt") as handle:
        saved = handle.get_tensor("model.vision_tower.vision_tower.vision_model.embeddings.patch_embedding.weight")
    model, _ = _converted(tmp_path / "out")
    assert torch.equal(model.model.vision_tower.vision_model.embeddings.patch_embedding.weight, saved)
    default, _ = _converted(converted)
    assert not torch.equal(default.model.vision_tower.vision_model.embeddings.patch_embedding.weight, saved)


def test_cli_converts_and_refuses_in_one_line(checkpoint, tmp_path, capsys):
    from qkvqa.cli.main import main

    source, tower, _, record = checkpoint
    assert (
        main(
            [
                "convert-llava",
                str(source),
                "--vision-tower",
                str(tower),
                "--out",
                str(tmp_path / "cli"),
                "--source-id",
                "tiny/llava",
            ]
        )
        == 0
    )
    written = json.loads((tmp_path / "cli" / RECORD).read_text())
    assert written["source"]["fingerprint"] == record["source"]["fingerprint"]
    capsys.readouterr()
    assert main(["convert-llava", str(source), "--vision-tower", str(tower), "--out", str(tmp_path / "anon")]) == 0
    assert "--source-id" in capsys.readouterr().err  # no hub id known: the card could not match the row
    status = main(["convert-llava", str(tower), "--vision-tower", str(tower), "--out", str(tmp_path / "bad")])
    err = capsys.readouterr().err.strip().splitlines()
    assert status != 0 and len(err) == 1 and "config.json" in err[0] and "model_type" in err[0]


def test_pytorch_bin_shards_convert_to_the_same_weights(checkpoint, tmp_path):
    """Older LLaVA saves write pytorch_model-*.bin with an index; the conversion reads them the same way."""
    source, tower, converted, _ = checkpoint
    copy = _copy_source(source, tmp_path / "src")
    index = json.loads((copy / "model.safetensors.index.json").read_text())
    weight_map = {}
    for name in sorted(set(index["weight_map"].values())):
        with safe_open(str(copy / name), framework="pt") as handle:
            tensors = {k: handle.get_tensor(k) for k in handle.keys()}
        binary = name.replace("model-", "pytorch_model-").replace(".safetensors", ".bin")
        torch.save(tensors, copy / binary)
        weight_map.update({k: binary for k in tensors})
        (copy / name).unlink()
    (copy / "model.safetensors.index.json").unlink()
    (copy / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    convert_llava(copy, tmp_path / "out", vision_tower=tower, progress=lambda m: None)
    a, _ = _converted(converted)
    b, _ = _converted(tmp_path / "out")
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


def test_a_source_in_the_hf_cache_records_its_hub_id_and_revision(checkpoint, tmp_path):
    source, tower, _, _ = checkpoint
    revision = "0123456789abcdef0123456789abcdef01234567"
    snapshot = _copy_source(source, tmp_path / "models--aimagelab--ReflectiVA" / "snapshots" / revision)
    convert_llava(snapshot, tmp_path / "out", vision_tower=tower, progress=lambda m: None)
    fields = card_fields(tmp_path / "out")
    assert fields["converted_from"] == "aimagelab/ReflectiVA" and fields["revision"] == revision
    assert fields["converter_version"] == CONVERTER_VERSION and fields["converter_current"]
    assert fields["vision_tower_weights"] == "vision_tower_dir" and len(fields["source_sha256"]) == 64
    assert card_fields(tmp_path) is None


def test_the_openai_336_preprocessing_as_released_pads_like_expand2square(tmp_path):
    """openai/clip-vit-large-patch14-336's preprocessor_config.json (integer size and crop_size, bicubic): the
    converted processor gives process_images' pixels for a 5:3 and a 3:5 photo-like image at 336 x 336."""
    import numpy as np

    config = {
        "crop_size": 336,
        "do_center_crop": True,
        "do_normalize": True,
        "do_resize": True,
        "feature_extractor_type": "CLIPFeatureExtractor",
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "resample": 3,
        "size": 336,
    }
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(config))
    ours = image_processor_for(tmp_path, "pad")
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8)) for shape in ((300, 500, 3), (500, 300, 3))]
    got = torch.as_tensor(ours(images, return_tensors="pt")["pixel_values"])
    expected = process_images(images, tmp_path)
    assert got.shape == (2, 3, 336, 336)
    assert torch.allclose(got, expected, atol=1e-6, rtol=0)
