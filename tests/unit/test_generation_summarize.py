"""`qkvqa summarize`: one summary per KB article through the tiny generator, resumable, refusing another KB's file."""

from __future__ import annotations

import json

import pytest

from qkvqa.cli.main import main
from qkvqa.config.schema import GenerationConfig
from qkvqa.data.kb import KBStore, build_kb_store
from qkvqa.errors import DataError, StaleArtifactError
from qkvqa.generation.backends import build_generator
from qkvqa.generation.summarize import read_summaries, summarize_articles

SETTINGS = GenerationConfig(
    batch_size=2, summary_max_new_tokens=4, summary_context_tokens=64, summary_template="{title}: {context}\nSummary:"
)


def write_kb(tmp_path, n=5):
    entries = {}
    for i in range(n):
        url = f"https://en.wikipedia.org/wiki/Heron_{i}"
        entries[url] = {
            "url": url,
            "title": f"Heron {i}",
            "section_titles": ["Abstract", "References"],
            "section_texts": [f"Heron {i} is a wading bird. " * 5, "refs"],
            "image_urls": [],
            "image_reference_descriptions": [],
            "image_section_indices": [],
        }
    (tmp_path / "kb.json").write_text(json.dumps(entries), encoding="utf-8")
    build_kb_store(tmp_path / "kb.json", tmp_path / "store")
    return KBStore.open(tmp_path / "store")


@pytest.fixture(scope="module")
def generator():
    return build_generator({"kind": "llama3", "tiny": True, "device": "cpu"}, SETTINGS)


def rows(path):
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_summaries_are_written_once_and_resumed(tmp_path, generator):
    store = write_kb(tmp_path)
    out = tmp_path / "summaries.jsonl"
    articles = list(store)
    assert summarize_articles(articles[:3], generator, out, SETTINGS) == {"written": 3, "skipped": 0}
    first = rows(out)
    assert [(r["row_id"], r["url"]) for r in first] == [(a.row_id, a.url) for a in articles[:3]]
    assert all(isinstance(r["summary"], str) for r in first)
    # A crash mid-line leaves a torn last line: it is dropped and that article is summarised again.
    out.write_bytes(out.read_bytes() + b'{"row_id": 3, "url": "https://en.wi')
    assert summarize_articles(articles, generator, out, SETTINGS) == {"written": 2, "skipped": 3}
    again = rows(out)
    assert again[:3] == first and [r["row_id"] for r in again] == [0, 1, 2, 3, 4]
    assert summarize_articles(articles, generator, out, SETTINGS) == {"written": 0, "skipped": 5}
    assert rows(out) == again


def test_summaries_of_another_kb_are_refused(tmp_path, generator):
    store = write_kb(tmp_path, 2)
    out = tmp_path / "summaries.jsonl"
    out.write_text(json.dumps({"row_id": 1, "url": "https://en.wikipedia.org/wiki/Other", "summary": "x"}) + "\n")
    with pytest.raises(StaleArtifactError, match="another KB"):
        summarize_articles(list(store), generator, out, SETTINGS)
    out.write_text(json.dumps({"row_id": "1", "url": "u", "summary": "x"}) + "\n")
    with pytest.raises(DataError, match="line 1"):
        read_summaries(out)


def test_summary_context_is_truncated_to_generator_tokens(generator):
    text = "Heron 0 is a wading bird. " * 5
    assert generator.count_tokens(generator.truncate_to_tokens(text, SETTINGS.summary_context_tokens)) == 64


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_summarize_command(tmp_path, capsys):
    write_kb(tmp_path, 3)
    out = tmp_path / "out" / "summaries.jsonl"
    args = [
        "summarize",
        "--out",
        str(out),
        f"data.kb_store={tmp_path / 'store'}",
        "components.generator.kind=llama3",
        "components.generator.tiny=true",
        "components.generator.pretrained=null",
        "components.generator.device=cpu",
        "components.generator.dtype=fp32",
        "generation.summary_max_new_tokens=3",
        "generation.batch_size=2",
    ]
    assert main(args + ["--limit", "2"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["written"] == 2
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == {"out": str(out), "written": 1, "skipped": 2}
    assert [r["row_id"] for r in rows(out)] == [0, 1, 2]
    assert main(["summarize", "components.generator.tiny=true"]) == 2  # no data.kb_store: one-line error
    assert "data.kb_store" in capsys.readouterr().err
