"""`qkvqa synth` and `qkvqa kb build / show` through the real command line entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkvqa.cli.main import main


@pytest.mark.slow
def test_synth_then_kb_build_and_show(tmp_path, capsys):
    world = tmp_path / "world"
    assert main(["synth", "--out", str(world), "--entities", "12", "--seed", "3", "--no-store"]) == 0
    manifest = json.loads((world / "world.json").read_text())
    assert manifest["seed"] == 3 and manifest["counts"]["entities"] == 12
    assert not (world / "kb/store").exists()
    capsys.readouterr()

    assert (
        main(
            ["kb", "build", "--source", str(world / "kb/encyclopedic_kb_wiki.jsonl"), "--out", str(tmp_path / "store")]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["articles"] == 12

    first = manifest["entities"][0]
    assert main(["kb", "show", "--store", str(tmp_path / "store"), "0"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["url"], shown["row_id"]) == (first["url"], 0)

    assert main(["kb", "show", "--store", str(tmp_path / "store"), first["url"], "--sections"]) == 0
    out = capsys.readouterr().out
    assert f"# Wiki Article: {first['title']}" in out and "References" not in out

    assert main(["kb", "show", "--store", str(tmp_path / "store"), "https://nowhere"]) == 1
    assert "'https://nowhere' is not in the KB store" in capsys.readouterr().err


def test_a_truncated_kb_is_one_clear_error_line(tmp_path, capsys):
    source = tmp_path / "kb.json"
    source.write_text('{"https://a": {"title": "A"}, "https://b": {"title": ')
    assert main(["kb", "build", "--source", str(source), "--out", str(tmp_path / "store")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("qkvqa kb: error:") and str(source) in err[-1] and "https://a" in err[-1]


@pytest.mark.slow
def test_kb_build_takes_the_reflectiva_passage_rule(tmp_path, capsys):
    """`qkvqa kb build --reflectiva-passages` reaches the store's manifest (ReflectiVA's spaCy 300-token passages by
    default; blank lines on request)."""
    source = Path(__file__).resolve().parents[1] / "fixtures" / "public" / "reflectiva" / "Wiki100k_ver_1_0-all.json"
    for rule in ("spacy_300", "blank_lines"):
        argv = ["kb", "build", "--source", str(source), "--out", str(tmp_path / rule)]
        assert main(argv + ([] if rule == "spacy_300" else ["--reflectiva-passages", rule])) == 0
        capsys.readouterr()
        assert json.loads((tmp_path / rule / "manifest.json").read_text())["source"]["reflectiva_passages"] == rule
