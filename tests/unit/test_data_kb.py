"""KB store: streaming build from a JSON dict or JSONL, random access, manifest, report and error paths."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from qkvqa.data.kb import KBStore, build_kb_store, iter_kb_source, url_list_checksum
from qkvqa.errors import DataError, StaleArtifactError
from tests.data_fixtures import kb_entry, write_kb_json, write_kb_jsonl

W = "https://en.wikipedia.org/wiki/"


def _entries() -> dict[str, dict]:
    entries = {
        W + "Kestrel": kb_entry(W + "Kestrel", "Kestrel"),
        W + "Zürich_Tower": kb_entry(
            W + "Zürich_Tower", "Zürich Tower", [("Zürich Tower", "Ein Turm."), ("Gallery", ""), ("References", "R.")]
        ),
        W + "Bare": kb_entry(W + "Bare", "Bare", image_urls=[]),
        W + "Ørsted_moth": kb_entry(W + "Ørsted_moth", "Ørsted moth"),
    }
    return entries


@pytest.fixture
def store(tmp_path) -> KBStore:
    build_kb_store(write_kb_json(tmp_path / "kb.json", _entries()), tmp_path / "store")
    return KBStore.open(tmp_path / "store")


def test_rows_follow_kb_order_and_urls_resolve_both_ways(store):
    urls = list(_entries())
    assert len(store) == 4
    assert list(store.urls()) == urls
    assert [store.row_of(u) for u in urls] == [0, 1, 2, 3]
    article = store.get(1)
    assert (article.row_id, article.url, article.title) == (1, W + "Zürich_Tower", "Zürich Tower")
    assert store.get_by_url(W + "Ørsted_moth").row_id == 3
    assert [a.row_id for a in store.get_many([3, 0, 3])] == [3, 0, 3]
    assert [a.url for a in store] == urls


def test_article_fields_round_trip_including_unicode_and_empty_sections(store):
    article = store.get_by_url(W + "Zürich_Tower")
    assert article.section_titles == ["Zürich Tower", "Gallery", "References"]
    assert article.section_texts == ["Ein Turm.", "", "R."]
    assert article.image_urls == ["https://upload.example.org/Zürich Tower.jpg"]
    assert article.image_reference_descriptions == ["image 0"]
    assert article.image_section_indices == [0]
    assert [c.index for c in article.candidate_sections()] == [0]  # an empty section is never one
    assert [c.index for c in article.candidate_sections(evidence_section_id=2)] == [0, 2]
    assert article.section_string(1) == "# Wiki Article: Zürich Tower\n## Section Title: Gallery\n"


def test_unknown_keys_and_rows_raise(store):
    assert W + "Nope" not in store and W + "Kestrel" in store
    with pytest.raises(KeyError):
        store.get_by_url(W + "Nope")
    with pytest.raises(KeyError):
        store.row_of(W + "Nope")
    with pytest.raises(IndexError):
        store.get(4)
    with pytest.raises(IndexError):
        store.get(-1)


def test_json_dict_and_jsonl_build_identical_stores(tmp_path):
    entries = _entries()
    a = build_kb_store(write_kb_json(tmp_path / "kb.json", entries), tmp_path / "a")
    b = build_kb_store(write_kb_jsonl(tmp_path / "kb.jsonl", entries), tmp_path / "b")
    assert (a["source"]["format"], b["source"]["format"]) == ("json_dict", "jsonl")
    assert a["url_checksum"] == b["url_checksum"] == url_list_checksum(entries)
    assert a["issues"] == b["issues"]
    store_a, store_b = KBStore.open(tmp_path / "a"), KBStore.open(tmp_path / "b")
    assert list(store_a) == list(store_b)


def test_manifest_describes_the_source_and_report_lists_issues_by_key(tmp_path):
    entries = _entries()
    entries[W + "Broken"] = {
        "url": W + "Elsewhere",
        "title": "Broken",
        "section_titles": ["Broken", "Extra"],
        "section_texts": ["only one"],
        "image_urls": "not a list",
    }
    source = write_kb_json(tmp_path / "kb.json", entries)
    manifest = build_kb_store(source, tmp_path / "store")
    assert manifest["source"]["size"] == source.stat().st_size
    assert manifest["source"]["mtime"] == source.stat().st_mtime
    assert manifest["articles"] == 5
    assert json.loads((tmp_path / "store" / "manifest.json").read_text()) == manifest
    report = KBStore.open(tmp_path / "store").report()
    assert {r["key"] for r in report["no_image"]} == {W + "Bare", W + "Broken"}
    excluded = {(r["key"], r["section_index"], r["section_title"]) for r in report["excluded_section"]}
    assert (W + "Zürich_Tower", 2, "References") in excluded
    assert (W + "Kestrel", 3, "External links") in excluded
    problems = [r["detail"] for r in report["malformed"] if r["key"] == W + "Broken"]
    assert any("differs from its key" in p for p in problems)
    assert any("image_urls is missing or not a list" in p for p in problems)
    assert any("2 section_titles but 1 section_texts" in p for p in problems)
    assert report["counts"]["articles_with_malformed_fields"] == 1
    broken = KBStore.open(tmp_path / "store").get(4)
    assert (broken.url, broken.image_urls) == (W + "Broken", [])


def test_a_duplicated_key_keeps_its_first_position_and_last_value_like_json_load(tmp_path):
    text = '{"u1": {"title": "first"}, "u2": {"title": "two"}, "u1": {"title": "last"}}'
    (tmp_path / "kb.json").write_text(text)
    manifest = build_kb_store(tmp_path / "kb.json", tmp_path / "store")
    store = KBStore.open(tmp_path / "store")
    loaded = json.loads(text)
    assert list(store.urls()) == list(loaded) == ["u1", "u2"]
    assert store.get(0).title == loaded["u1"]["title"] == "last"
    assert manifest["issues"]["duplicate_key"] == 1


def test_a_truncated_kb_json_fails_naming_the_file_and_the_last_good_key(tmp_path):
    source = write_kb_json(tmp_path / "kb.json", _entries())
    data = source.read_bytes()
    cut = data.index(b'"https://en.wikipedia.org/wiki/Bare"') + 60
    source.write_bytes(data[:cut])
    with pytest.raises(DataError) as error:
        build_kb_store(source, tmp_path / "store")
    assert str(source) in str(error.value)
    assert "Zürich_Tower" in str(error.value) and "after entry 2" in str(error.value)
    assert not (tmp_path / "store" / "kb.sqlite").exists()
    assert [p.name for p in (tmp_path / "store").iterdir()] == []


def test_a_failed_rebuild_leaves_the_old_store_usable(tmp_path):
    source = write_kb_json(tmp_path / "kb.json", _entries())
    build_kb_store(source, tmp_path / "store")
    bad = tmp_path / "bad.json"
    bad.write_text('{"u1": {"title": "x"}, "u2": ')
    with pytest.raises(DataError):
        build_kb_store(bad, tmp_path / "store")
    assert len(KBStore.open(tmp_path / "store")) == 4


def test_a_malformed_jsonl_line_fails_naming_the_line(tmp_path):
    source = write_kb_jsonl(tmp_path / "kb.jsonl", _entries())
    with open(source, "a", encoding="utf-8") as f:
        f.write('{"https://x": {"title": "cut')
    with pytest.raises(DataError, match=r"kb\.jsonl: line 5: truncated or malformed"):
        build_kb_store(source, tmp_path / "store")


@pytest.mark.parametrize("text, message", [("", "is empty"), ("[1, 2]", "starts with '\\['")])
def test_a_kb_json_that_is_not_a_dict_is_refused(tmp_path, text, message):
    (tmp_path / "kb.json").write_text(text)
    with pytest.raises(DataError, match=message):
        list(iter_kb_source(tmp_path / "kb.json"))


def test_an_unknown_suffix_needs_an_explicit_format(tmp_path):
    source = write_kb_jsonl(tmp_path / "kb.txt", _entries())
    with pytest.raises(DataError, match="format"):
        build_kb_store(source, tmp_path / "store")
    assert build_kb_store(source, tmp_path / "store", kb_format="jsonl")["articles"] == 4


def test_open_checks_the_source_by_content_not_by_mtime(tmp_path):
    """Issue 14 item 2: a touched or copied KB file keeps the store usable; another file of the same size does not."""
    import shutil

    source = write_kb_json(tmp_path / "kb.json", _entries())
    build_kb_store(source, tmp_path / "store")
    os.utime(source, (1, 1))  # `touch`, `rsync` without -t
    KBStore.open(tmp_path / "store", source=source)
    copy = tmp_path / "copy" / "kb.json"
    copy.parent.mkdir()
    shutil.copy(source, copy)  # `cp` without -p: a new mtime
    KBStore.open(tmp_path / "store", source=copy)
    data = bytearray(source.read_bytes())
    at = data.index(b"Kestrel is a thing")
    data[at : at + 7] = b"Falcon!"  # same size, other content
    source.write_bytes(bytes(data))
    with pytest.raises(StaleArtifactError, match="sampled fingerprint differs.*qkvqa kb build --source"):
        KBStore.open(tmp_path / "store", source=source)
    source.write_bytes(bytes(data) + b" ")
    with pytest.raises(StaleArtifactError, match="another KB file"):
        KBStore.open(tmp_path / "store", source=source)


def test_a_same_size_edit_outside_the_sampled_blocks_is_caught_by_the_full_check(tmp_path, monkeypatch):
    """The documented false accept of the sampled fingerprint, and `check_source(full=True)` ruling it out."""
    import qkvqa.data.kb as kb

    monkeypatch.setattr(kb, "SAMPLE_BLOCK", 16)
    monkeypatch.setattr(kb, "SAMPLE_BLOCKS", 2)  # only the first and the last 16 bytes
    source = write_kb_json(tmp_path / "kb.json", _entries())
    build_kb_store(source, tmp_path / "store")
    data = bytearray(source.read_bytes())
    at = data.index(b"Kestrel is a thing")
    data[at : at + 7] = b"Falcon!"
    source.write_bytes(bytes(data))
    store = KBStore.open(tmp_path / "store", source=source)  # the false accept
    with pytest.raises(StaleArtifactError, match="sha256 differs"):
        store.check_source(source, full=True)


def test_open_refuses_a_manifest_that_does_not_match_and_a_damaged_store(tmp_path):
    source = write_kb_json(tmp_path / "kb.json", _entries())
    build_kb_store(source, tmp_path / "store")
    db = tmp_path / "store" / "kb.sqlite"
    data = bytearray(db.read_bytes())
    data[len(data) // 2] ^= 0xFF
    db.write_bytes(bytes(data))  # one flipped byte: caught by the full check
    with pytest.raises(DataError, match=r"kb\.sqlite: corrupt KB store \(sha256"):
        KBStore.open(tmp_path / "store")  # the first open of a changed file re-hashes it
    db.write_bytes(bytes(data[:4096]))  # truncated: refused on open
    with pytest.raises(DataError, match=r"kb\.sqlite: 4096 bytes, the build wrote"):
        KBStore.open(tmp_path / "store")
    manifest_path = tmp_path / "store" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    del manifest["store_size"], manifest["store_sha256"]  # a store of an older qkvqa: SQLite's own check
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(DataError, match=r"kb\.sqlite: not a readable KB store"):
        KBStore.open(tmp_path / "store")
    build_kb_store(source, tmp_path / "store")
    manifest = json.loads(manifest_path.read_text())
    manifest["url_checksum"] = "sha256:0"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(StaleArtifactError):
        KBStore.open(tmp_path / "store")
    manifest_path.write_text("{")
    with pytest.raises(DataError, match=r"manifest\.json: unreadable manifest"):
        KBStore.open(tmp_path / "store")


def test_the_manifest_records_the_sha256_of_the_source_while_streaming(tmp_path):
    import hashlib

    for name, writer in (("kb.json", write_kb_json), ("kb.jsonl", write_kb_jsonl)):
        source = writer(tmp_path / name, _entries())
        manifest = build_kb_store(source, tmp_path / f"store_{name}")
        assert manifest["source"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()
        assert (
            manifest["store_sha256"]
            == hashlib.sha256((tmp_path / f"store_{name}" / "kb.sqlite").read_bytes()).hexdigest()
        )


def test_a_reflectiva_wiki100k_kb_becomes_articles_with_paragraph_sections(tmp_path):
    """ReflectiVA's KB layout {url: {"wikipedia_content": text}}: title from the URL, paragraphs as sections (the
    blank-line switch; the default, ReflectiVA's own passages, is tests/unit/test_reflectiva_passages.py)."""
    entries = {
        W + "Blue_jay": {"wikipedia_content": "The blue jay is a bird.\n\nIt lives in North America.\n\n"},
        W + "Caf%C3%A9_racer": {"wikipedia_content": "A café racer is a motorcycle.", "wikipedia_title": "Café racer"},
        W + "Empty": {"wikipedia_content": ""},
    }
    source = tmp_path / "Wiki100k_ver_1_0-all.json"
    source.write_text(json.dumps(entries), encoding="utf-8")
    manifest = build_kb_store(source, tmp_path / "store", reflectiva_passages="blank_lines")
    assert manifest["source"]["entry_layouts"] == {"evqa": 0, "reflectiva": 3}
    store = KBStore.open(tmp_path / "store", source=source)
    jay = store.get_by_url(W + "Blue_jay")
    assert (jay.title, jay.section_texts) == ("Blue jay", ["The blue jay is a bird.", "It lives in North America."])
    assert [s.text for s in jay.candidate_sections()][1] == (
        "# Wiki Article: Blue jay\n## Section Title: \nIt lives in North America."
    )
    assert store.get(1).title == "Café racer" and store.get(1).image_urls == []
    assert list(store.get(2).candidate_sections()) == []
    counts = manifest["issues"]
    assert counts["no_image"] == 3 and counts["empty_section"] == 1 and counts["malformed"] == 0


def test_opening_a_directory_without_a_store_says_how_to_build_one(tmp_path):
    with pytest.raises(DataError, match="qkvqa kb build"):
        KBStore.open(tmp_path)


def test_a_store_survives_pickling_for_dataloader_workers(store):
    clone = pickle.loads(pickle.dumps(store))
    assert clone.get(2).title == "Bare"
    assert clone.url_checksum == store.url_checksum


def test_get_many_queries_in_chunks_and_keeps_order_and_repeats(store, monkeypatch):
    import qkvqa.data.kb as kb

    monkeypatch.setattr(kb, "QUERY_CHUNK", 2)  # the real cap is far above this 4-article store
    assert [a.row_id for a in store.get_many([3, 1, 0, 2, 3, 0])] == [3, 1, 0, 2, 3, 0]
    assert store.get_many([]) == []


@pytest.mark.slow
def test_a_forgotten_world_dir_says_so_instead_of_asking_for_a_kb_build(tmp_path, monkeypatch):
    from qkvqa.config.load import compose
    from qkvqa.data_modules import build_data_module
    from qkvqa.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    cfg = compose("demo/evaluate", [], [])  # paths.world_dir left unset
    with pytest.raises(ConfigError, match="paths.world_dir"):
        build_data_module(cfg.data).kb_store()
