"""vLLM worker, run in the separate vLLM environment: rendered prompts in (JSONL), greedy answers out (JSONL).

Usage: `python -m qkvqa.generation.vllm_worker --in requests.jsonl --out answers.jsonl`. This module
imports only the standard library at load time (vLLM and PIL inside `generate`), because the vLLM
environment need not have qkvqa's dependencies; qkvqa's own `src/` is put on PYTHONPATH by the client.

Requests file: a header line `{"qkvqa_vllm": 1, "model", "max_new_tokens", "stop_token_ids",
"engine_args"}`, then one line per request `{"id", "prompt", "prompt_token_ids", "images"}` (image
file paths). A request without images is sent to vLLM as its token ids (the rendered chat text
already holds the bos token), one with images as text plus `multi_modal_data`. Answers file: one
`{"id", "text"}` per request, in id order, written atomically once everything is generated.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any, Iterable, Optional, Sequence

PROTOCOL = 1
HEADER_KEYS = ("model", "max_new_tokens", "stop_token_ids", "engine_args")
REQUEST_KEYS = ("id", "prompt", "prompt_token_ids", "images")
EXIT_NO_VLLM = 3
EXIT_BAD_INPUT = 4


class ProtocolError(ValueError):
    """A requests or answers file does not follow the protocol; the message names the file and line."""


def _atomic_write_lines(path: str, rows: Iterable[dict]) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # mkstemp's 0600, as a plain open() would create it
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _read_lines(path: str) -> list[tuple[int, Any]]:
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rows.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                raise ProtocolError(f"{path}: line {lineno}: malformed JSON ({e.msg})") from e
    return rows


def write_requests(path: str, header: dict, requests: Sequence[dict]) -> None:
    """Write the header and the requests (ids 0..n-1 in order) to `path`, atomically."""
    missing = [k for k in HEADER_KEYS if k not in header]
    if missing:
        raise ProtocolError(f"request header lacks {missing}")
    for i, request in enumerate(requests):
        if request.get("id") != i or any(k not in request for k in REQUEST_KEYS):
            raise ProtocolError(
                f"request {i} must have id {i} and the keys {list(REQUEST_KEYS)}; got {sorted(request)}"
            )
    _atomic_write_lines(path, [{"qkvqa_vllm": PROTOCOL, **{k: header[k] for k in HEADER_KEYS}}, *requests])


def read_requests(path: str) -> tuple[dict, list[dict]]:
    """The header and the requests of a requests file, checked against the protocol."""
    rows = _read_lines(path)
    if not rows or not isinstance(rows[0][1], dict) or rows[0][1].get("qkvqa_vllm") != PROTOCOL:
        raise ProtocolError(f'{path}: line 1: expected a header with "qkvqa_vllm": {PROTOCOL}')
    header = rows[0][1]
    missing = [k for k in HEADER_KEYS if k not in header]
    if missing:
        raise ProtocolError(f"{path}: line {rows[0][0]}: header lacks {missing}")
    requests = []
    for expected, (lineno, row) in enumerate(rows[1:]):
        if not isinstance(row, dict) or any(k not in row for k in REQUEST_KEYS):
            raise ProtocolError(f"{path}: line {lineno}: a request needs the keys {list(REQUEST_KEYS)}")
        if row["id"] != expected:
            raise ProtocolError(f"{path}: line {lineno}: request id {row['id']!r}, expected {expected}")
        requests.append(row)
    return header, requests


def write_answers(path: str, texts: Sequence[str]) -> None:
    """Write one `{"id", "text"}` line per answer, atomically."""
    _atomic_write_lines(path, [{"id": i, "text": text} for i, text in enumerate(texts)])


def read_answers(path: str, expected: int) -> list[str]:
    """The answer texts of an answers file, which must hold ids 0..expected-1 exactly once, in order."""
    rows = _read_lines(path)
    if len(rows) != expected:
        raise ProtocolError(f"{path}: {len(rows)} answers for {expected} requests")
    texts = []
    for i, (lineno, row) in enumerate(rows):
        if not isinstance(row, dict) or row.get("id") != i or not isinstance(row.get("text"), str):
            raise ProtocolError(f'{path}: line {lineno}: expected {{"id": {i}, "text": str}}')
        texts.append(row["text"])
    return texts


def generate(header: dict, requests: Sequence[dict]) -> list[str]:
    """Greedy answers from vLLM for the requests (imports vLLM and PIL here)."""
    from PIL import Image
    from vllm import LLM, SamplingParams

    llm = LLM(model=header["model"], **header["engine_args"])
    params = SamplingParams(
        temperature=0.0, max_tokens=int(header["max_new_tokens"]), stop_token_ids=list(header["stop_token_ids"])
    )
    inputs = []
    for request in requests:
        if request["images"]:
            images = [Image.open(p).convert("RGB") for p in request["images"]]
            inputs.append(
                {"prompt": request["prompt"], "multi_modal_data": {"image": images[0] if len(images) == 1 else images}}
            )
        else:
            inputs.append({"prompt_token_ids": request["prompt_token_ids"]})
    outputs = llm.generate(inputs, params)
    return [output.outputs[0].text.strip() for output in outputs]


def vllm_missing_message(error: BaseException) -> str:
    """What to tell the user when vLLM cannot be imported by this interpreter."""
    return (
        f"vllm cannot be imported by {sys.executable} ({type(error).__name__}: {error}); point "
        "components.generator.options.python at the interpreter of the vLLM environment described in "
        "docs/generation.md"
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Read requests, generate with vLLM, write answers; exit 3 without vLLM, 4 on a malformed requests file."""
    parser = argparse.ArgumentParser(
        prog="python -m qkvqa.generation.vllm_worker",
        description="Generate greedy answers for a qkvqa requests JSONL with vLLM.",
    )
    parser.add_argument("--in", dest="inp", required=True, help="requests JSONL written by qkvqa")
    parser.add_argument("--out", required=True, help="answers JSONL to write")
    args = parser.parse_args(argv)
    try:
        header, requests = read_requests(args.inp)
    except (OSError, ProtocolError) as e:
        print(f"qkvqa vllm worker: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        import vllm  # noqa: F401  (fail early, before any file is written)
    except ImportError as e:
        print(f"qkvqa vllm worker: {vllm_missing_message(e)}", file=sys.stderr)
        return EXIT_NO_VLLM
    write_answers(args.out, generate(header, requests))
    return 0


if __name__ == "__main__":
    sys.exit(main())
