"""Issue 44 class 2: inputs that were tracebacks, some after stage 1 and the QFF had run, are one line naming the key
and the fix, before the expensive work; a 1 MB KB section is split in pieces instead of stopping spaCy (E088)."""

from __future__ import annotations

import json

import pytest

from qkvqa.components import build_component
from qkvqa.errors import ConfigError, MissingWeightsError


def test_a_qwen2_5_vl_folder_without_a_chat_template_is_refused_naming_the_key(tmp_path):
    from transformers import AutoProcessor

    from qkvqa.generation.backends import QwenVLFormat
    from qkvqa.generation.tiny import write_tiny_qwen2_5_vl

    folder = write_tiny_qwen2_5_vl(tmp_path / "qwen")
    for name in ("chat_template.jinja", "chat_template.json"):
        (folder / name).unlink(missing_ok=True)
    processor = AutoProcessor.from_pretrained(str(folder), local_files_only=True, use_fast=True)
    processor.chat_template = None
    processor.tokenizer.chat_template = None
    with pytest.raises(ConfigError, match=r"^components.generator: kind qwen2_5_vl, but .* has no chat template"):
        QwenVLFormat(processor)


def test_a_reranker_folder_without_tokenizer_files_is_refused_before_loading(tmp_path):
    from qkvqa.cda.reranker import write_tiny_xlmr_reranker
    from qkvqa.components.hub import TOKENIZER_FILES

    folder = write_tiny_xlmr_reranker(tmp_path / "rr")
    for name in (*TOKENIZER_FILES, "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    with pytest.raises(MissingWeightsError, match=r"^components.reranker.pretrained: .* has no tokenizer files"):
        build_component({"kind": "bge_reranker", "pretrained": str(folder), "device": "cpu", "dtype": "fp32"})


def test_a_qff_folder_without_model_safetensors_is_refused_naming_qff_checkpoint(tmp_path):
    from qkvqa.qff.model import CHECKPOINT_CONFIG, QFFModel

    folder = tmp_path / "qff"
    folder.mkdir()
    (folder / CHECKPOINT_CONFIG).write_text("{}")
    with pytest.raises(MissingWeightsError, match=r"^qff.checkpoint .*qff: no model.safetensors there"):
        QFFModel.from_checkpoint(folder)


@pytest.mark.slow
def test_a_one_megabyte_section_is_split_in_pieces_as_spacy_would_split_it_whole():
    from qkvqa.cda.splitter import PIECE_CHARS, SentenceSplitter, _pieces

    splitter = SentenceSplitter()
    paragraph = "The kestrel hovers over fields. It eats voles.\n"
    text = paragraph * (1_100_000 // len(paragraph))  # over spaCy's max_length (1,000,000): E088 before
    sentences = splitter.split(text)
    assert len(sentences) == 2 * (1_100_000 // len(paragraph))
    assert sentences[:2] == ["The kestrel hovers over fields.", "It eats voles."]
    assert "".join(_pieces(text, PIECE_CHARS)) == text
    short = paragraph * 50
    assert splitter.split_many([short, text[:500]]) == [splitter.split(short), splitter.split(text[:500])]


@pytest.mark.slow
def test_the_preflight_checks_each_component_before_stage_1(tmp_path):
    """Build-time checks made before stage 1, without loading a model: a reranker folder without tokenizer files, an
    encoder option typo, a Qwen2.5-VL folder without a chat template."""
    from types import SimpleNamespace

    from qkvqa.cda.reranker import write_tiny_xlmr_reranker
    from qkvqa.components.hub import TOKENIZER_FILES
    from qkvqa.config.load import compose
    from qkvqa.generation.tiny import write_tiny_qwen2_5_vl
    from qkvqa.pipeline.build import preflight

    base = [f"components.{role}={{kind: {kind}, tiny: true, device: cpu}}" for role, kind in (
        ("image_encoder", "evaclip_hf"), ("text_encoder", "evaclip_hf"), ("qformer", "blip2_qff"),
        ("reranker", "bge_reranker"), ("generator", "llama3"), ("judge", "bem"))]  # fmt: skip
    benchmark = SimpleNamespace(kb_store=lambda: None, article_images=lambda: None)
    cfg = compose(None, [], [*base, "eval.filter=retrieval", "eval.judge=em_only"])
    assert preflight(cfg, benchmark) is None  # every component fine: nothing said

    folder = write_tiny_xlmr_reranker(tmp_path / "rr")
    for name in (*TOKENIZER_FILES, "tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).unlink(missing_ok=True)
    cfg = compose(
        None,
        [],
        [
            *base,
            "eval.filter=retrieval",
            f"components.reranker={{kind: bge_reranker, tiny: false, pretrained: {folder}}}",
        ],
    )
    with pytest.raises(MissingWeightsError, match=r"^components.reranker.pretrained: .* has no tokenizer files"):
        preflight(cfg, benchmark)

    cfg = compose(None, [], [*base, "eval.filter=retrieval", "components.image_encoder.options.preproces=targetpad"])
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \{'preproces'"):
        preflight(cfg, benchmark)

    qwen = write_tiny_qwen2_5_vl(tmp_path / "qwen")
    for name in ("chat_template.jinja", "chat_template.json"):
        (qwen / name).unlink(missing_ok=True)
    for name in ("tokenizer_config.json", "processor_config.json"):
        if (qwen / name).is_file():
            data = json.loads((qwen / name).read_text())
            data.pop("chat_template", None)
            (qwen / name).write_text(json.dumps(data))
    cfg = compose(
        None,
        [],
        [*base, "eval.filter=retrieval", f"components.generator={{kind: qwen2_5_vl, tiny: false, pretrained: {qwen}}}"],
    )
    with pytest.raises(ConfigError, match=r"^components.generator: kind qwen2_5_vl, but .* has no chat template"):
        preflight(cfg, benchmark)
