"""The vLLM backend (`generation.backend: vllm`): runs `qkvqa.generation.vllm_worker` with the vLLM environment's interpreter."""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional, Sequence

import qkvqa
from qkvqa.components.registry import DTYPES, ComponentSpec
from qkvqa.errors import ConfigError
from qkvqa.generation.vllm_worker import EXIT_NO_VLLM, read_answers, write_requests
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

WORKER_MODULE = "qkvqa.generation.vllm_worker"
STDERR_TAIL_LINES = 40


def source_root() -> Path:
    """The directory that holds the `qkvqa` package (put on the worker's PYTHONPATH)."""
    return Path(qkvqa.__file__).resolve().parent.parent


class VLLMRunner:
    """Sends rendered prompts to a vLLM worker process in another Python environment and reads its answers.

    Rendering (chat template) and token counting stay in this environment; the worker only
    generates. Images are written as PNG files into a temporary directory under `work_dir`.
    """

    def __init__(
        self,
        python: str,
        model: str,
        stop_token_ids: Sequence[int],
        token_ids,
        engine_args: dict,
        work_dir: Optional[str] = None,
        offline: bool = True,
    ):
        if not python:
            raise ConfigError(
                "generation.backend=vllm needs components.generator.options.python: the interpreter "
                "of the vLLM environment (see docs/generation.md)"
            )
        if not (os.path.isfile(python) and os.access(python, os.X_OK)):
            raise ConfigError(f"components.generator.options.python: {python} is not an executable file")
        self.python = python
        self.model = model
        self.stop_token_ids = list(stop_token_ids)
        self.token_ids = token_ids
        self.engine_args = dict(engine_args)
        self.work_dir = work_dir
        self.offline = offline

    @classmethod
    def from_spec(cls, spec: ComponentSpec, model: str, chat) -> "VLLMRunner":
        """A runner for the generator spec: options python, engine_args, work_dir; dtype and pixel limits forwarded."""
        options = spec.options
        engine_args = dict(options.get("engine_args") or {})
        engine_args.setdefault("dtype", DTYPES[spec.dtype])
        pixels = {k: int(options[k]) for k in ("min_pixels", "max_pixels") if k in options}
        if pixels:
            engine_args.setdefault("mm_processor_kwargs", pixels)
        return cls(
            python=options.get("python"),
            model=model,
            stop_token_ids=chat.stop_token_ids,
            token_ids=chat.token_ids,
            engine_args=engine_args,
            work_dir=options.get("work_dir"),
            offline=not spec.allow_download,
        )

    def requests(self, texts: Sequence[str], images: Sequence[Sequence[Any]], image_dir: Path) -> list[dict]:
        """Protocol records for rendered texts; each image is saved as `image_dir/{request}-{k}.png`."""
        image_dir.mkdir(parents=True, exist_ok=True)
        records = []
        for i, (text, per_text) in enumerate(zip(texts, images)):
            paths = []
            for k, image in enumerate(per_text):
                path = image_dir / f"{i}-{k}.png"
                image.convert("RGB").save(path)
                paths.append(str(path))
            records.append({"id": i, "prompt": text, "prompt_token_ids": list(self.token_ids(text)), "images": paths})
        return records

    def run(
        self, texts: Sequence[str], images: Sequence[Sequence[Any]], max_new_tokens: int, batch_size: int
    ) -> list[str]:
        """Answers for rendered chat texts; vLLM schedules its own batches, so `batch_size` is not used."""
        header = {
            "model": self.model,
            "max_new_tokens": max_new_tokens,
            "stop_token_ids": self.stop_token_ids,
            "engine_args": self.engine_args,
        }
        if self.work_dir:
            Path(self.work_dir).mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="qkvqa-vllm-", dir=self.work_dir) as tmp:
            requests_path, answers_path = Path(tmp) / "requests.jsonl", Path(tmp) / "answers.jsonl"
            write_requests(str(requests_path), header, self.requests(texts, images, Path(tmp) / "images"))
            self._run_worker(requests_path, answers_path)
            return read_answers(str(answers_path), len(texts))

    def _run_worker(self, requests_path: Path, answers_path: Path) -> None:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(source_root())] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        if self.offline:
            env.setdefault("HF_HUB_OFFLINE", "1")
        command = [self.python, "-m", WORKER_MODULE, "--in", str(requests_path), "--out", str(answers_path)]
        log.info("vLLM worker: %s", " ".join(command))
        tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        with subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True) as process:
            for line in process.stderr:  # relayed live (vLLM logs progress there), tail kept for errors
                sys.stderr.write(line)
                tail.append(line.rstrip("\n"))
        if process.returncode == EXIT_NO_VLLM:
            raise ConfigError(tail[-1] if tail else f"vllm is not importable by {self.python}")
        if process.returncode != 0:
            raise RuntimeError(f"vLLM worker exited with status {process.returncode}; last output:\n" + "\n".join(tail))
