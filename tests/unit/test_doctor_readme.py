"""The README's real-data quickstart and downloads: each quickstart command parses and composes its config, the weights
commands are the ones qkvqa.components.hub derives from what the builders load, every model an experiment names is
listed, and the packaging installs faiss-gpu without faiss-cpu."""

from __future__ import annotations

import configparser
import re
import shlex
from pathlib import Path

import pytest
import yaml

from qkvqa.cli.main import build_parser
from qkvqa.components.hub import HUB_FILES, download_command, is_hub_id
from qkvqa.config.cli import config_from_args

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def quickstart_commands() -> list[str]:
    block = README.split("<!-- quickstart -->", 1)[1].split("<!-- /quickstart -->", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip().startswith(("qkvqa ", "pip "))]


@pytest.mark.slow
def test_every_quickstart_command_parses_and_composes():
    commands = quickstart_commands()
    qkvqa = [c for c in commands if c.startswith("qkvqa ")]
    assert [c.split()[1] for c in qkvqa] == [
        "kb",
        "doctor",
        "doctor",
        "embed",
        "index",
        "retrieve",
        "train",
        "evaluate",
    ]
    parser = build_parser()
    for command in qkvqa:
        args = parser.parse_args(shlex.split(command)[1:])
        assert callable(args.func), command
        if hasattr(args, "overrides"):
            cfg = config_from_args(args)  # the whole config composes and validates
            assert "local_weights" in cfg.presets, command
            assert cfg.components.image_encoder.pretrained == "weights/BAAI/EVA-CLIP-8B", command
            if cfg.task == "evaluate":
                assert cfg.components.generator.pretrained == "weights/Qwen/Qwen2.5-VL-7B-Instruct"
                assert cfg.data.protocol == "evqa_2m"


def test_the_pip_line_names_an_extra_that_exists():
    extras = configparser.ConfigParser()
    extras.read(REPO / "setup.cfg")
    defined = set(extras["options.extras_require"])
    for command in quickstart_commands():
        if command.startswith("pip "):
            assert set(re.findall(r"\.\[(\w+)\]", command)) <= defined, command


def test_the_gpu_extra_installs_faiss_gpu_without_faiss_cpu():
    config = configparser.ConfigParser()
    config.read(REPO / "setup.cfg")
    requires = config["options"]["install_requires"]
    extras = config["options.extras_require"]

    def names(text):
        return {
            re.split(r"[<>=!~ ]", line.strip())[0]
            for line in text.splitlines()
            if line.strip() and not line.strip().startswith("#")
        }

    assert not any(n.startswith("faiss") for n in names(requires))  # the base set installs no faiss at all
    assert {n for n in names(extras["gpu"]) if n.startswith("faiss")} == {"faiss-gpu"}
    assert {n for n in names(extras["cpu"]) if n.startswith("faiss")} == {"faiss-cpu"}
    assert "faiss-cpu" in names(extras["dev"])  # CI keeps its faiss


def test_the_readme_downloads_are_the_hub_tables():
    for hub_id in HUB_FILES:
        assert download_command(hub_id) in " ".join(README.split()), hub_id
    assert "EVA_CLIP_8B_psz14_s9B.pt" in README  # named as what is left out


def _named_models() -> set[str]:
    named = set()
    for path in (REPO / "experiments").rglob("*.yaml"):
        doc = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        for spec in (doc.get("components") or {}).values() if isinstance(doc, dict) else ():
            if isinstance(spec, dict):
                for value in (spec.get("pretrained"), (spec.get("options") or {}).get("tokenizer")):
                    if value and not str(value).startswith("${"):
                        named.add(str(value))
    return named


def test_every_model_an_experiment_names_is_in_the_readme():
    named = _named_models()
    assert "Qwen/Qwen2.5-VL-7B-Instruct" in named and "BAAI/EVA-CLIP-8B" in named
    for model in named:
        if is_hub_id(model):
            assert model in README, model
        else:  # a local folder: the README says what goes there
            assert "ReflectiVA" in README and "blip2_pretrained.pth" in README and "eva_vit_g.pth" in README, model


def test_the_readme_gives_the_data_sources_the_gpu_driver_and_the_wandb_switch():
    for needle in (
        "encyclopedic_vqa",
        "inat_comp",
        "google-landmark",
        "Go2Heart/EchoSight",
        "ChaoLinAViy/OMGM",
        "open-vision-language/infoseek",
        "id2name",
        "580.65.06",
        "logger.wandb.enabled",
        "gated",
        "qkvqa doctor",
    ):
        assert needle in README, needle
