"""Synthetic world: determinism, real formats that read back, answerable evidence, multi-entity images, skips."""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import pytest
import yaml

from qkvqa.data.config import data_config_from_dict, resolve_data_path
from qkvqa.data.images import ImageLoader, QueryImageResolver
from qkvqa.data.kb import KBStore, build_kb_store
from qkvqa.data.questions import (
    read_evqa_csv,
    read_infoseek_csv,
    read_infoseek_jsonl_questions,
    read_infoseek_references,
)
from qkvqa.errors import ConfigError, DataError
from qkvqa.synth.world import DENSE_SECTION_TITLES, generate_world
from tests.fixtures_world import make_world

STOPWORDS = {
    "this",
    "what",
    "which",
    "does",
    "with",
    "that",
    "from",
    "have",
    "been",
    "when",
    "where",
    "many",
    "much",
    "some",
    "into",
    "they",
    "their",
    "there",
    "were",
    "whose",
}


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> dict:
    return make_world(tmp_path_factory.mktemp("synth"))


def _data_files(root: Path) -> dict[str, str]:
    """sha256 of every file except world.json, the yaml configs (absolute root) and the KB store (timestamps)."""
    skip = {"world.json", "data_evqa.yaml", "data_infoseek.yaml", ".qkvqa-synth-world"}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name not in skip and not {"store", "kb_store"} & set(p.relative_to(root).parts[:2])
    }


@pytest.mark.slow  # seconds: `make test` runs it, `make test-fast` does not
def test_the_same_seed_gives_identical_bytes_and_another_seed_does_not(tmp_path, world):
    again = generate_world(tmp_path / "again", entities=len(world["entities"]), seed=0, build_store=False)
    first, second = _data_files(Path(world["dir"])), _data_files(tmp_path / "again")
    assert first == second
    assert {"evqa/test.csv", "kb/encyclopedic_kb_wiki.json", "infoseek/infoseek_val.jsonl"} <= set(first)
    assert again["questions"] == world["questions"]
    other = generate_world(tmp_path / "other", entities=len(world["entities"]), seed=1, build_store=False)
    assert _data_files(tmp_path / "other")["kb/encyclopedic_kb_wiki.json"] != first["kb/encyclopedic_kb_wiki.json"]
    assert other["counts"]["entities"] == world["counts"]["entities"]


@pytest.mark.slow
def test_every_evqa_file_reads_back_with_the_ids_world_json_records(world):
    root = Path(world["dir"])
    for split in ("train", "val", "test"):
        records = world["questions"][f"evqa/{split}.csv"]
        questions = read_evqa_csv(root / f"evqa/{split}.csv", split=split, include_two_hop=True)
        assert [q.data_id for q in questions] == [r["data_id"] for r in records]
        assert [q.gold_urls for q in questions] == [r["gold_urls"] for r in records]
        assert [q.evidence_section_id for q in questions] == [r["evidence_section_id"] for r in records]
    test_types = Counter(q.question_type for q in read_evqa_csv(root / "evqa/test.csv", include_two_hop=True))
    assert set(test_types) == {"templated", "automatic", "multi_answer", "2_hop"}
    two_hop = [q for q in read_evqa_csv(root / "evqa/test.csv", include_two_hop=True) if q.question_type == "2_hop"]
    assert all(len(q.gold_urls) == 2 and q.data_id.startswith("E-VQA_2hop_") for q in two_hop)
    multi = [q for q in read_evqa_csv(root / "evqa/train.csv") if q.question_type == "multi_answer"]
    assert all(len(q.answers[0].split("&&")) == 3 for q in multi)
    assert {q.dataset_name for q in read_evqa_csv(root / "evqa/train.csv")} == {"inaturalist", "landmarks"}


def test_every_infoseek_file_reads_back(world):
    root = Path(world["dir"])
    references = read_infoseek_references(
        root / "infoseek/infoseek_val.jsonl", root / "infoseek/infoseek_val_qtype.jsonl"
    )
    test = read_infoseek_csv(root / "infoseek/infoseek_test_filtered.csv")
    train = read_infoseek_csv(root / "infoseek/infoseek_train_filtered.csv")
    assert [q.data_id for q in test] == list(references)
    assert len(train) == world["counts"]["questions:infoseek/infoseek_train_filtered.csv"] > 0
    assert {r.question_type for r in references.values()} == {"String", "Numerical", "Time"}
    assert {r.data_split for r in references.values()} == {"val_unseen_question", "val_unseen_entity"}
    numerical = [r.answer_eval for r in references.values() if r.question_type == "Numerical"]
    assert any(isinstance(a, dict) for a in numerical) and any(isinstance(a, list) for a in numerical)
    assert len(
        read_infoseek_jsonl_questions(root / "infoseek/infoseek_val.jsonl", root / "infoseek/infoseek_val_qtype.jsonl")
    ) == len(test)
    suffixes = {p.suffix for p in (root / "infoseek/images").rglob("*") if p.is_file()}
    assert suffixes == {".jpg", ".JPEG"}


def test_the_kb_json_and_jsonl_are_the_same_kb(world, tmp_path):
    root = Path(world["dir"])
    manifest = build_kb_store(root / "kb/encyclopedic_kb_wiki.jsonl", tmp_path / "store")
    assert manifest["url_checksum"] == KBStore.open(root / "kb/store").url_checksum
    assert manifest["articles"] == world["counts"]["articles"]


def test_each_answer_is_stated_in_the_evidence_section_only(world):
    store = KBStore.open(Path(world["dir"]) / "kb/store")
    root = Path(world["dir"])
    checked = 0
    for split in ("train", "val", "test"):
        for q in read_evqa_csv(root / f"evqa/{split}.csv"):
            article = store.get_by_url(q.gold_url)
            evidence = article.section_texts[q.evidence_section_id]
            assert article.section_titles[q.evidence_section_id] == q.evidence_section_title
            assert q.row["evidence"] in evidence
            items = q.answers[0].split("&&")
            assert all(item in evidence for item in items)
            if q.question_type != "multi_answer":
                others = [t for i, t in enumerate(article.section_texts) if i != q.evidence_section_id]
                assert not any(re.search(rf"\b{re.escape(q.answers[0])}\b", t) for t in others), q.question
            checked += 1
    assert checked == sum(len(r) for n, r in world["questions"].items() if n.startswith("evqa/")) - sum(
        r["question_type"] == "2_hop" for n, rs in world["questions"].items() if n.startswith("evqa/") for r in rs
    )


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]+", text.lower()) if len(w) > 3 and w not in STOPWORDS}


def test_questions_share_a_content_word_with_their_evidence_sentence(world):
    for name, records in world["questions"].items():
        if not name.startswith("evqa/"):
            continue
        questions = read_evqa_csv(Path(world["dir"]) / name, include_two_hop=True)
        for q in questions:
            assert _words(q.question) & _words(q.row["evidence"]), (q.question, q.row["evidence"])


def test_entities_have_questions_about_different_sections(world):
    sections = {}
    for name, records in world["questions"].items():
        for r in records:
            if name.startswith("evqa/") and r["question_type"] != "2_hop":
                sections.setdefault(r["entity"], set()).add(r["evidence_section_id"])
    assert min(len(s) for s in sections.values()) >= 5


def test_multi_entity_images_show_entities_of_different_categories(world):
    category = {e["entity_id"]: e["category"] for e in world["entities"]}
    records = [r for name, rs in world["questions"].items() if name.startswith("evqa/") for r in rs]
    multi = [r for r in records if len(r["image_entities"]) > 1]
    assert len(multi) / len(records) > 0.25
    for r in records:
        assert r["entity"] in r["image_entities"]
    for image in world["images"].values():
        if image["kind"] == "multi":
            assert 2 <= len(image["entities"]) <= 3
            assert len({category[e] for e in image["entities"]}) == len(image["entities"])


@pytest.fixture(scope="module")
def variant(tmp_path_factory) -> dict:
    """The named focus world (`qkvqa synth --world focus`): dense sections (3 facts each), same-category images."""
    import json

    from qkvqa.cli.main import main

    out = tmp_path_factory.mktemp("variant") / "world"
    assert main(["synth", "--out", str(out), "--entities", "36", "--world", "focus"]) == 0
    manifest = json.loads((out / "world.json").read_text())
    return dict(manifest, dir=str(out))


@pytest.mark.slow
def test_dense_sections_hold_several_facts_under_titles_that_do_not_name_them(variant):
    store = KBStore.open(Path(variant["dir"]) / "kb/store")
    for entity in variant["entities"]:
        by_section = Counter(fact["section_id"] for fact in entity["facts"].values())
        content = {s: n for s, n in by_section.items() if s != 0}
        assert sorted(content.values()) == [3, 3], entity["title"]
        article = store.get_by_url(entity["url"])
        for key, fact in entity["facts"].items():
            assert fact["sentence"] in article.section_texts[fact["section_id"]]
            if fact["section_id"]:
                assert article.section_titles[fact["section_id"]] in DENSE_SECTION_TITLES
    layouts = {tuple(sorted(f["section_id"] for f in e["facts"].values())) for e in variant["entities"]}
    assert len(layouts) > 1  # which section holds a fact varies by article
    assert variant["facts_per_section"] == 3


@pytest.mark.slow
def test_same_category_groups_need_the_kind_word_to_tell_the_entities_apart(variant):
    entities = {e["entity_id"]: e for e in variant["entities"]}
    kind = {i: e["title"].rsplit(" ", 1)[-1].lower() for i, e in entities.items()}
    multi = [image for image in variant["images"].values() if image["kind"] == "multi"]
    assert multi
    for image in multi:
        members = image["entities"]
        assert len({entities[e]["category"] for e in members}) == 1
        assert len({kind[e] for e in members}) == len(members)
    records = [r for name, rs in variant["questions"].items() if name.startswith("evqa/") for r in rs]
    root = Path(variant["dir"])
    for split in ("train", "val", "test"):
        for q, r in zip(
            read_evqa_csv(root / f"evqa/{split}.csv", include_two_hop=True), variant["questions"][f"evqa/{split}.csv"]
        ):
            if r["question_type"] != "2_hop":
                assert f"this {kind[r['entity']]}" in q.question, q.question
    assert sum(len(r["image_entities"]) > 1 for r in records) / len(records) > 0.25


@pytest.fixture(scope="module")
def bound(tmp_path_factory) -> dict:
    """The named bound-facts world (`qkvqa synth --world bound`): each non-lead fact stated by two surveys."""
    from qkvqa.cli.main import main

    out = tmp_path_factory.mktemp("bound") / "world"
    assert main(["synth", "--out", str(out), "--entities", "24", "--world", "bound", "--no-store"]) == 0
    return dict(json.loads((out / "world.json").read_text()), dir=str(out))


@pytest.mark.slow
def test_bound_facts_are_stated_by_both_surveys_with_other_values_in_other_sections(bound):
    assert bound["bound_facts"] and bound["facts_per_section"] == 3
    for entity in bound["entities"]:
        facts = entity["facts"]
        surveyed = {key.rsplit("_", 1)[0] for key in facts if key.endswith(("_early", "_recent"))}
        assert len(surveyed) == 6 and len(facts) == 13, entity["title"]  # the lead fact is stated once
        for key in surveyed:
            early, recent = facts[f"{key}_early"], facts[f"{key}_recent"]
            assert early["section_id"] != recent["section_id"]
            assert sorted(early["answer"].split("&&")) != sorted(recent["answer"].split("&&"))
            assert early["sentence"].startswith("Early surveys report that ")
            assert recent["sentence"].startswith("Recent surveys report that ")


@pytest.mark.slow
def test_in_the_bound_world_the_question_words_stand_in_the_evidence_and_in_a_sibling_section(bound):
    """What makes the world need the question: the other survey's statement of the same fact holds every fact word
    the question shares with its evidence sentence, in another section of the same article."""
    root = Path(bound["dir"])
    kb = json.loads((root / "kb/encyclopedic_kb_wiki.json").read_text(encoding="utf-8"))
    entities = {e["entity_id"]: e for e in bound["entities"]}
    checked = 0
    for split in ("train", "val", "test"):
        for q, r in zip(
            read_evqa_csv(root / f"evqa/{split}.csv"),
            [r for r in bound["questions"][f"evqa/{split}.csv"] if r["question_type"] != "2_hop"],
        ):
            if not r["fact"].endswith(("_early", "_recent")):
                continue
            key, survey = r["fact"].rsplit("_", 1)
            assert q.question.startswith(f"According to {survey} surveys, "), q.question
            other = entities[r["entity"]]["facts"][f"{key}_{'recent' if survey == 'early' else 'early'}"]
            sibling = kb[q.gold_url]["section_texts"][other["section_id"]]
            shared = _words(q.question) & _words(q.row["evidence"]) - {"early", "recent", "surveys", "report"}
            assert shared and shared <= _words(sibling), (q.question, sibling)
            assert other["answer"] != entities[r["entity"]]["facts"][r["fact"]]["answer"]
            checked += 1
    assert checked > 100


def test_the_focus_study_pairs_each_bound_question_with_its_rival_and_scores_the_pair(bound):
    from tests.helpers.qff_study import figures, survey_rivals

    rivals = survey_rivals(bound)
    kb = json.loads((Path(bound["dir"]) / "kb/encyclopedic_kb_wiki.json").read_text(encoding="utf-8"))
    entities = {e["entity_id"]: e for e in bound["entities"]}
    records = {
        f"{split}/{r['data_id']}": r for split in ("val", "test") for r in bound["questions"][f"evqa/{split}.csv"]
    }
    assert len(rivals) > 20
    for key, (url, section) in rivals.items():
        record = records[key]
        other = "Early" if record["fact"].endswith("_recent") else "Recent"
        assert url == entities[record["entity"]]["url"] and section != record["evidence_section_id"]
        assert f"{other} surveys report that" in kb[url]["section_texts"][section]
    # hits: (section hit, article hit, focus-off hit, focus change, {candidate: score}), the positive first
    first, second = list(rivals.items())[:2]
    hits = {
        first[0]: (1.0, 1.0, None, None, {(first[1][0], 99): 0.9, first[1]: 0.2}),
        second[0]: (0.0, 0.0, None, None, {(second[1][0], 99): 0.1, second[1]: 0.7, ("other", 0): 0.8}),
        "val/unpaired": (1.0, 0.0, None, None, {("gold", 3): 0.5}),
    }
    out = figures(hits, {second[0]}, rivals)
    assert out["all"]["pair_accuracy"] == 50.0 and out["all"]["pair_n"] == 2
    assert out["all"]["section_r1"] == 200 / 3 and out["multi"]["section_r1"] == 0.0
    # the top candidate is in the gold article in the first and third sample (the second's is another article's);
    # the evidence tops its siblings in the first only (the third has none in its sample, the second loses to its rival)
    assert out["all"]["top_in_gold_article"] == 200 / 3 and out["all"]["within_article_r1"] == 50.0
    assert out["all"]["within_article_n"] == 2
    # no sample with a sibling: no within-article figure (not a 0 %)
    alone = figures({"val/unpaired": hits["val/unpaired"]}, set())
    assert alone["all"]["within_article_n"] == 0 and alone["all"]["within_article_r1"] is None


def test_the_cli_offers_every_named_world():
    from qkvqa.cli.main import build_parser
    from qkvqa.synth.world import WORLDS

    synth = build_parser()._subparsers._group_actions[0].choices["synth"]
    assert next(a for a in synth._actions if a.dest == "world").choices == list(WORLDS)


def test_bound_facts_need_generic_sections(tmp_path):
    with pytest.raises(DataError, match="bound_facts needs 2-4 facts per section"):
        generate_world(tmp_path / "bad", entities=12, facts_per_section=1, bound_facts=True, build_store=False)


def test_a_section_must_hold_at_least_one_fact(tmp_path):
    with pytest.raises(DataError, match="facts_per_section"):
        generate_world(tmp_path / "bad", entities=12, facts_per_section=0, build_store=False)
    assert not (tmp_path / "bad").exists()


def test_visual_signatures_are_unique_within_a_category_but_share_colours(world):
    by_category: dict[str, list] = {}
    for e in world["entities"]:
        s = e["signature"]
        by_category.setdefault(e["category"], []).append((s["colour"], s["second_colour"], s["pattern"]))
    for signatures in by_category.values():
        assert len(set(signatures)) == len(signatures)
    colours = Counter(s[0] for e in by_category.values() for s in e)
    assert max(colours.values()) > 1


def test_the_deliberate_skips_are_counted_by_the_image_loader(world):
    config = data_config_from_dict(yaml.safe_load((Path(world["dir"]) / "data_evqa.yaml").read_text()))
    config.images.infoseek_root = "infoseek/images/val"
    loader = ImageLoader(QueryImageResolver(config.images, config.root))
    for skip in world["deliberate_skips"]:
        assert loader.load(skip["dataset_name"], skip["image_id"]) is None
        assert loader.skipped[(skip["dataset_name"], skip["image_id"])].reason == skip["reason"]
    assert {reason: n for reason, n in loader.counts().items() if n} == {"missing": 2, "corrupt": 1}


def test_the_data_yamls_are_data_configs_whose_paths_exist(world):
    for name in ("evqa", "infoseek"):
        config = data_config_from_dict(yaml.safe_load((Path(world["dir"]) / f"data_{name}.yaml").read_text()))
        assert config.dataset == name
        for field in ("kb_source", "kb_store", "train_questions", "test_questions", "infoseek_references"):
            path = resolve_data_path(config, getattr(config, field))
            assert path is None or path.exists(), (name, field)


def test_the_kb_has_unicode_titles_articles_without_images_and_excluded_sections(world):
    store = KBStore.open(Path(world["dir"]) / "kb/store")
    report = store.report()
    assert any(not t.isascii() for t in (a.title for a in store))
    assert report["counts"]["no_image"] == world["counts"]["articles_without_images"] > 0
    assert {r["section_title"] for r in report["excluded_section"]} == {"References", "External links"}
    empty = report["empty_section"]  # the Gallery sections: counted, never candidates
    assert (
        empty and {r["section_title"] for r in empty} == {"Gallery"} and report["counts"]["empty_section"] == len(empty)
    )
    for row in empty:
        assert row["section_index"] not in [c.index for c in store.get(row["row_id"]).candidate_sections()]
    # one stands before content sections, so filtered positions and original KB indexes differ after it
    assert any(max(c.index for c in store.get(r["row_id"]).candidate_sections()) > r["section_index"] for r in empty)
    assert all(a.section_titles[0] == a.title for a in store)


def test_a_non_world_directory_is_never_overwritten(tmp_path):
    (tmp_path / "keep.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds files that qkvqa synth --out did not write"):
        generate_world(tmp_path, entities=12)
    assert (tmp_path / "keep.txt").read_text() == "mine"


def _colour_histogram(path: Path, size: int):
    import numpy as np
    from PIL import Image

    pixels = np.asarray(Image.open(path).convert("RGB").resize((size, size), Image.BICUBIC), dtype=np.float32) / 255
    bins = np.clip(pixels * 4, 0, 3.99).astype(int)
    histogram = np.zeros(64)
    np.add.at(histogram, bins[..., 0] * 16 + bins[..., 1] * 4 + bins[..., 2], 1)
    return histogram / np.linalg.norm(histogram)


@pytest.mark.slow
@pytest.mark.parametrize("size", [28, 224])
def test_signatures_survive_downscaling_and_retrieval_by_them_is_informative_but_imperfect(world, size):
    import numpy as np

    root = Path(world["dir"])
    articles, queries = {}, []
    for image in world["images"].values():
        if image["status"] == "ok" and image["kind"] == "article":
            articles.setdefault(image["entities"][0], root / image["path"])
        elif image["status"] == "ok" and image["kind"] == "single":
            queries.append((image["entities"][0], root / image["path"]))
    ids = sorted(articles)
    matrix = np.stack([_colour_histogram(articles[i], size) for i in ids])
    queries = [(entity, path) for entity, path in queries if entity in articles]
    top1 = sum(ids[int(np.argmax(matrix @ _colour_histogram(path, size)))] == entity for entity, path in queries)
    accuracy = top1 / len(queries)
    assert 5 / len(ids) < accuracy < 0.9
