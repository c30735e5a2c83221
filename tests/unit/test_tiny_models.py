"""Tiny models are written once per content key under qkvqa-tiny, reused, replaced when damaged, and cleaned up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from qkvqa.components import ComponentSpec, build_component
from qkvqa.components.registry import TINY_IN_USE_S, TINY_KEEP, TINY_MAX_AGE_S, _clean_tiny_root, tiny_model, tiny_root

REPO = Path(__file__).resolve().parents[2]
BERT = {"kind": "bert_text_encoder", "tiny": True, "device": "cpu"}


def model_dirs() -> list[str]:
    return sorted(p.name for p in tiny_root().iterdir() if not p.name.startswith("."))


def test_the_same_tiny_model_built_twice_is_one_directory_and_the_same_model():
    texts = ["a heron", "a red flower"]
    torch.manual_seed(7)
    first = build_component(BERT).encode(texts)
    after_first = torch.random.get_rng_state()
    (name,) = model_dirs()
    written = (tiny_root() / name / "model.safetensors").stat().st_mtime_ns
    torch.manual_seed(7)
    again = build_component(BERT).encode(texts)
    assert model_dirs() == [name]  # reused, not written again
    assert (tiny_root() / name / "model.safetensors").stat().st_mtime_ns == written
    assert torch.equal(first, again)
    # the writer seeds torch's RNG; a reuse leaves it in the same state, so what is drawn next does not change
    assert torch.equal(torch.random.get_rng_state(), after_first)
    build_component({**BERT, "options": {"seed": 1}})  # another seed is another model
    assert len(model_dirs()) == 2 and not [p for p in tiny_root().iterdir() if ".partial-" in p.name]


def test_a_damaged_tiny_model_is_written_again():
    spec = ComponentSpec(**BERT)
    build_component(spec)
    (name,) = model_dirs()
    (tiny_root() / name / "model.safetensors").write_bytes(b"cut")
    enc = build_component(spec)  # a reuse would fail to load the weights
    assert model_dirs() == [name] and enc.encode(["x"]).shape[0] == 1


def _fake(root: Path, name: str, age_s: float, now: float) -> None:
    (root / name).mkdir()
    os.utime(root / name, (now - age_s, now - age_s))


def test_cleaning_keeps_recent_directories_and_removes_stale_and_surplus_ones():
    root, now = tiny_root(), time.time()
    _fake(root, "bem-stale", TINY_MAX_AGE_S + 60, now)  # unused for a week
    for i in range(TINY_KEEP):
        _fake(root, f"bem-recent{i:02d}", i, now)  # the TINY_KEEP most recently used
    _fake(root, "bem-surplus-old", TINY_IN_USE_S + 60, now)  # beyond the count, unused for an hour
    _fake(root, "bem-surplus-in-use", TINY_KEEP + 1, now)  # beyond the count, but used a moment ago
    _fake(root, ".bem-x.partial-1-ab", TINY_IN_USE_S + 60, now)  # a builder that died
    _fake(root, ".bem-y.partial-2-cd", 5, now)  # a builder still writing
    removed = _clean_tiny_root(root, now=now)
    assert sorted(removed) == [".bem-x.partial-1-ab", "bem-stale", "bem-surplus-old"]
    left = sorted(p.name for p in root.iterdir() if p.is_dir())
    assert left == sorted(
        [".bem-y.partial-2-cd", "bem-surplus-in-use", *(f"bem-recent{i:02d}" for i in range(TINY_KEEP))]
    )


CONCURRENT = """
import os, sys, time
from pathlib import Path
from qkvqa.components import ComponentSpec
from qkvqa.components.registry import tiny_model

meeting = Path(sys.argv[1])

def write(out_dir, text):
    with open(meeting / "writers.log", "a") as log:
        log.write(f"{os.getpid()}\\n")
    time.sleep(1.0)                                       # both builders are writing at the same time
    (Path(out_dir) / "weights.txt").write_text(text)

(meeting / f"ready-{os.getpid()}").touch()
while len(list(meeting.glob("ready-*"))) < 2:            # start together, once both have imported torch
    time.sleep(0.01)
print(tiny_model(ComponentSpec(kind="toy"), write, "same"))
"""


@pytest.mark.slow
def test_concurrent_builders_of_one_model_share_one_directory(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CONCURRENT, str(tmp_path)],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err for _, err in outs]
    assert len((tmp_path / "writers.log").read_text().split()) == 2  # both wrote a copy: a real race
    paths = {out.strip() for out, _ in outs}
    assert len(paths) == 1 and Path(paths.pop()).joinpath("weights.txt").read_text() == "same"
    dirs = model_dirs()
    assert len(dirs) == 1 and dirs[0].startswith("toy-")
    assert not [p for p in tiny_root().iterdir() if ".partial-" in p.name or ".trash-" in p.name]


def test_a_writer_is_called_on_a_fresh_directory_and_its_files_are_kept(tmp_path):
    calls = []

    def write(out_dir, text):
        calls.append(sorted(os.listdir(out_dir)))
        (Path(out_dir) / "a.txt").write_text(text)

    spec = ComponentSpec(kind="toy")
    first, second = tiny_model(spec, write, "x"), tiny_model(spec, write, "x")
    assert first == second and calls == [[]] and (first / "a.txt").read_text() == "x"
    assert tiny_model(spec, write, "y") != first and len(calls) == 2
