"""`qkvqa ... | head`: a reader that closes stdout early ends the command quietly with 141, never a traceback."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from qkvqa.cli.main import EXIT_STDOUT_CLOSED
from tests.data_fixtures import kb_entry, write_kb_json

REPO = Path(__file__).resolve().parents[2]


def run_into_closed_pipe(args: list[str], read: int = 0) -> tuple[int, bytes, str]:
    """Run `python -m qkvqa.cli ARGS` into a 4 KiB pipe whose reader takes the first `read` bytes (like `head -c`)
    and closes it, or closes it at once (`read=0`); return the exit status, what was read, and stderr."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(read_end, fcntl.F_SETPIPE_SZ, 4096)  # the command's output must outgrow the pipe
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # stdout buffered, as in a shell
    proc = subprocess.Popen(
        [sys.executable, "-m", "qkvqa.cli", *args],
        cwd=REPO,
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    os.close(write_end)
    first = os.read(read_end, read) if read else b""
    os.close(read_end)
    stderr = proc.communicate(timeout=120)[1]
    return proc.returncode, first, stderr


def assert_quiet(stderr: str) -> None:
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr and "Exception ignored" not in stderr, stderr


@pytest.fixture(scope="module")
def big_store(tmp_path_factory) -> tuple[Path, str]:
    from qkvqa.data.kb import build_kb_store

    tmp = tmp_path_factory.mktemp("kb")
    url = "https://en.wikipedia.org/wiki/Long"
    sections = [("Long", "A long article."), *[(f"Part {i}", "word " * 400) for i in range(100)]]
    build_kb_store(write_kb_json(tmp / "kb.json", {url: kb_entry(url, "Long", sections)}), tmp / "store")
    return tmp / "store", url


@pytest.mark.slow
def test_head_on_kb_show_ends_it_quietly(big_store):
    store, url = big_store
    rc, first, stderr = run_into_closed_pipe(["kb", "show", "--store", str(store), url, "--sections"], read=64)
    assert first.startswith(b"--- section 0")  # the command did write before the reader left
    assert_quiet(stderr)
    assert rc == EXIT_STDOUT_CLOSED


@pytest.mark.parametrize("command", ["kb show", "config show", "sweep --help", "--help"])
def test_every_command_into_a_pipe_closed_before_its_output_ends_quietly(big_store, command):
    store, url = big_store
    args = {
        "kb show": ["kb", "show", "--store", str(store), url],
        "--help": ["--help"],
        "config show": ["config", "show", "experiment=demo/qff_per_layer"],
        "sweep --help": ["sweep", "--help"],
    }[command]
    rc, _, stderr = run_into_closed_pipe(args)
    assert_quiet(stderr)
    assert rc == EXIT_STDOUT_CLOSED


def test_the_same_command_into_an_open_pipe_succeeds(big_store):
    store, url = big_store
    done = subprocess.run(
        [sys.executable, "-m", "qkvqa.cli", "kb", "show", "--store", str(store), url, "--sections"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.count("word ") == 100 * 400
