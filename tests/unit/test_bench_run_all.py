"""bench/run_all.py: RESULTS.md's header and per-benchmark times come from the run that measured them, so that
`--render-only` and `--only` runs do not restamp earlier figures with the time of rendering."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def run_all(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_run_all", REPO / "bench" / "run_all.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "OUT", tmp_path / "out")
    monkeypatch.setattr(module, "BENCH", tmp_path)
    (tmp_path / "out").mkdir()
    for name in module.BENCHMARKS:
        (tmp_path / "out" / f"{name}.md").write_text(f"table of {name}")
    yield module
    sys.modules.pop(spec.name, None)


def test_render_only_keeps_the_run_header_and_times(run_all, tmp_path, monkeypatch):
    names = list(run_all.BENCHMARKS)
    run_all.record_run({name: {"rc": 0, "seconds": 10.0 + i} for i, name in enumerate(names)})
    record = json.loads((tmp_path / "out" / "run_all.json").read_text())
    record["date"], record["node"] = "2026-01-02 03:04", "bench-host"  # as if it ran elsewhere, earlier
    (tmp_path / "out" / "run_all.json").write_text(json.dumps(record))
    assert run_all.main(["--render-only"]) == 0
    text = (tmp_path / "RESULTS.md").read_text()
    assert "One `make bench` run on bench-host" in text and "2026-01-02 03:04" in text
    assert f"## {names[1]}\n\ntable of {names[1]}\n\nRaw figures: `bench/out/{names[1]}.json`.\n\nRan in 11 s." in text


def test_an_only_run_says_so_and_keeps_the_others_times(run_all, tmp_path):
    names = list(run_all.BENCHMARKS)
    run_all.record_run({name: {"rc": 0, "seconds": 10.0} for name in names})
    run_all.record_run({names[0]: {"rc": 3, "seconds": 99.0}})  # an --only run, or a run stopped after one
    run_all.write_results({})
    text = (tmp_path / "RESULTS.md").read_text()
    assert f"A `bench/run_all.py` run of {names[0]} (the other benchmarks' figures are from earlier runs)" in text
    assert f"FAILED (exit 3); see bench/out/{names[0]}.log" in text and "Ran in 99 s." in text
    assert text.count("Ran in 10 s.") == len(names) - 1


def test_without_a_record_the_header_says_so(run_all, tmp_path):
    run_all.write_results({})
    assert "no record of the run that produced it" in (tmp_path / "RESULTS.md").read_text()
