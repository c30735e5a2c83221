"""The vLLM backend's JSONL protocol (requests, answers, errors) and the worker's behaviour without vLLM."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from PIL import Image

from qkvqa.config.schema import GenerationConfig
from qkvqa.errors import ConfigError
from qkvqa.generation.backends import build_generator
from qkvqa.generation.prompts import GenerationRequest, answer_prompt
from qkvqa.generation.vllm_client import VLLMRunner, source_root
from qkvqa.generation.vllm_worker import (
    EXIT_BAD_INPUT,
    EXIT_NO_VLLM,
    ProtocolError,
    read_answers,
    read_requests,
    write_answers,
    write_requests,
)


def generator_prompt(generator, question, image):
    return answer_prompt(
        GenerationRequest(question, "ctx", image, "evqa"), generator.generator_type, generator.settings
    )


HEADER = {"model": "/models/qwen", "max_new_tokens": 16, "stop_token_ids": [2, 7], "engine_args": {"dtype": "bfloat16"}}


def test_requests_round_trip(tmp_path):
    requests = [
        {"id": 0, "prompt": "<|im_start|>user\nSüdtirol?", "prompt_token_ids": [1, 2, 3], "images": []},
        {"id": 1, "prompt": "p", "prompt_token_ids": [4], "images": ["/tmp/a.png"]},
    ]
    path = tmp_path / "requests.jsonl"
    write_requests(str(path), HEADER, requests)
    header, back = read_requests(str(path))
    assert header == {"qkvqa_vllm": 1, **HEADER} and back == requests
    assert "Südtirol" in path.read_text(encoding="utf-8")


def test_protocol_errors(tmp_path):
    path = str(tmp_path / "r.jsonl")
    with pytest.raises(ProtocolError, match="header lacks"):
        write_requests(path, {"model": "m"}, [])
    with pytest.raises(ProtocolError, match="must have id 0"):
        write_requests(path, HEADER, [{"id": 1, "prompt": "p", "prompt_token_ids": [], "images": []}])
    (tmp_path / "bad.jsonl").write_text('{"model": "m"}\n')
    with pytest.raises(ProtocolError, match="line 1: expected a header"):
        read_requests(str(tmp_path / "bad.jsonl"))
    lines = [
        json.dumps({"qkvqa_vllm": 1, **HEADER}),
        json.dumps({"id": 0, "prompt": "p", "prompt_token_ids": [], "images": []}),
        json.dumps({"id": 5}),
    ]
    (tmp_path / "gap.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ProtocolError, match="line 3: a request needs"):
        read_requests(str(tmp_path / "gap.jsonl"))
    answers = tmp_path / "answers.jsonl"
    write_answers(str(answers), ["Belluno", "1,889 m"])
    assert read_answers(str(answers), 2) == ["Belluno", "1,889 m"]
    with pytest.raises(ProtocolError, match="2 answers for 3 requests"):
        read_answers(str(answers), 3)
    answers.write_text('{"id": 1, "text": "x"}\n')
    with pytest.raises(ProtocolError, match="line 1"):
        read_answers(str(answers), 1)


def run_worker(tmp_path, requests_text: str):
    (tmp_path / "in.jsonl").write_text(requests_text, encoding="utf-8")
    env = {"PYTHONPATH": str(source_root()), "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "qkvqa.generation.vllm_worker",
            "--in",
            str(tmp_path / "in.jsonl"),
            "--out",
            str(tmp_path / "out.jsonl"),
        ],
        capture_output=True,
        text=True,
        env=env,
    )


def test_worker_without_vllm_says_which_environment_to_use(tmp_path):
    write_requests(str(tmp_path / "r.jsonl"), HEADER, [])
    done = run_worker(tmp_path, (tmp_path / "r.jsonl").read_text())
    assert done.returncode == EXIT_NO_VLLM
    assert "vllm cannot be imported" in done.stderr and "docs/generation.md" in done.stderr
    assert not (tmp_path / "out.jsonl").exists()
    bad = run_worker(tmp_path, "not json\n")
    assert bad.returncode == EXIT_BAD_INPUT and "line 1: malformed JSON" in bad.stderr


def test_vllm_backend_renders_requests_and_reports_a_missing_vllm(tmp_path):
    spec = {
        "kind": "qwen2_5_vl",
        "tiny": True,
        "dtype": "bf16",
        "options": {
            "python": sys.executable,
            "work_dir": str(tmp_path / "work"),
            "max_pixels": 3136,
            "engine_args": {"max_model_len": 4096},
        },
    }
    generator = build_generator(spec, GenerationConfig(backend="vllm", max_new_tokens=7))
    runner = generator.runner
    assert isinstance(runner, VLLMRunner)
    assert runner.engine_args == {
        "max_model_len": 4096,
        "dtype": "bfloat16",
        "mm_processor_kwargs": {"max_pixels": 3136},
    }
    image = Image.new("RGB", (30, 20), "red")
    texts = [
        generator.chat.render(p)
        for p in [generator_prompt(generator, "What is it?", image), generator_prompt(generator, "Where?", None)]
    ]
    records = runner.requests(texts, [[image], []], tmp_path / "images")
    assert [r["id"] for r in records] == [0, 1] and records[1]["images"] == []
    assert records[0]["prompt"] == texts[0] and records[0]["prompt_token_ids"] == generator.chat.token_ids(texts[0])
    assert Image.open(records[0]["images"][0]).size == (30, 20)
    with pytest.raises(ConfigError, match="vllm cannot be imported"):
        generator.generate([GenerationRequest("What is it?", "ctx", image, "infoseek")])
    assert list((tmp_path / "work").iterdir()) == []  # the request files are cleaned up


def test_vllm_backend_needs_the_other_interpreter(tmp_path):
    with pytest.raises(ConfigError, match="options.python"):
        build_generator({"kind": "llama3", "tiny": True}, GenerationConfig(backend="vllm"))
    with pytest.raises(ConfigError, match="not an executable"):
        build_generator(
            {"kind": "llama3", "tiny": True, "options": {"python": str(tmp_path / "nope")}},
            GenerationConfig(backend="vllm"),
        )
