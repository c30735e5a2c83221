"""Hard-negative mining: OMGM's rule exactly, drop reasons, the step1_HardNeg layout and reading it back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkvqa.data.config import ImagesConfig
from qkvqa.data.images import ArticleImage, ArticleImageIndex, QueryImageResolver
from qkvqa.data.kb import KBStore, build_kb_store
from qkvqa.data.questions import Question
from qkvqa.errors import StaleArtifactError
from qkvqa.qff.mining import (
    ArticleFactsSource,
    Candidate,
    ImagePaths,
    PoolFile,
    SamplePool,
    articles_path,
    image_key,
    mine_pools,
    sample_pool,
    write_pools,
)
from qkvqa.retrieval.results import Retrieved

WIKI = "https://en.wikipedia.org/wiki/"
# (title, section titles, has image): "References" sits in the middle of some articles, so candidate
# positions and original section indices differ.
ARTICLES = [
    ("Gold heron", ["Gold heron", "Diet", "References", "Range", "Breeding", "Conservation", "External links"], True),
    ("Blue finch", ["Blue finch", "References", "Diet", "Range", "External links"], True),
    ("Red tower", ["Red tower", "History", "Architecture", "Location", "Tourism", "References"], True),
    ("Grey moth", ["Grey moth", "Description", "Host plants"], False),  # no image: never a negative
    ("Pink orchid", ["Pink orchid", "Description", "Uses", "Flowering", "Cultivation"], True),
    ("Black perch", ["Black perch", "Habitat", "Diet", "Fisheries", "External links", "Distribution"], True),
    ("Lone sedge", ["Lone sedge", "Description", "External links"], True),
    ("Bare wrasse", ["Bare wrasse", "Diet", "Habitat"], False),  # no image, and a gold below
]


def url(title: str) -> str:
    return WIKI + title.replace(" ", "_")


@pytest.fixture(scope="module")
def kb(tmp_path_factory):
    """(KB store, article image index, ImagePaths, image root) of the handmade KB above."""
    root = tmp_path_factory.mktemp("mining")
    entries = {
        url(t): {
            "url": url(t),
            "title": t,
            "section_titles": s,
            "section_texts": [f"{t}: text of {x}." for x in s],
            "image_urls": [f"https://img/{t.replace(' ', '_')}.jpg"] if image else [],
            "image_reference_descriptions": ["d"] if image else [],
            "image_section_indices": [0] if image else [],
        }
        for t, s, image in ARTICLES
    }
    (root / "kb.json").write_text(json.dumps(entries))
    build_kb_store(root / "kb.json", root / "store")
    image_root = root / "kb_images" / "full"
    images = ArticleImageIndex(
        {
            t: [ArticleImage(image_root / "part_1" / f"{t.replace(' ', '_')}.jpg", "c", "u")]
            for t, _, image in ARTICLES
            if image
        }
    )
    paths = ImagePaths(image_root, root)
    return KBStore.open(root / "store"), images, paths, image_root


def facts_of(kb) -> ArticleFactsSource:
    store, images, paths, _ = kb
    return ArticleFactsSource(store, images, paths)


def question(data_id: str, gold: str, evidence: int, image_id: str = "img1", qtype: str = "templated") -> Question:
    return Question(
        data_id=data_id,
        question="what does this bird eat?",
        answers=["fish"],
        raw_answer="fish",
        question_type=qtype,
        image_id=image_id,
        image_ids=[image_id],
        dataset_name="landmarks",
        gold_urls=[url(gold)],
        gold_title=gold,
        evidence_section_id=evidence,
        evidence_section_title="",
        split="train",
        source="test",
    )


def image_of(title: str) -> str:
    return f"part_1/{title.replace(' ', '_')}.jpg"


def candidates(title: str, indices) -> list[Candidate]:
    return [Candidate(url(title), i, image_of(title)) for i in indices]


def test_the_pool_follows_omgm_rule_exactly_with_original_section_indices(kb):
    top = [url(t) for t in ("Blue finch", "Gold heron", "Grey moth", "Red tower", "Blue finch", "Pink orchid")]
    pool = sample_pool(url("Gold heron"), 3, top, facts_of(kb), num_negatives=5)
    assert pool.positive == Candidate(url("Gold heron"), 3, image_of("Gold heron"))
    expected = (
        candidates("Gold heron", [0, 1, 4])  # first 3 other candidates: References (2) skipped
        + candidates("Blue finch", [0, 2, 3])  # References (1) and External links (4) never
        + candidates("Red tower", [0, 1, 2, 3, 4])  # Grey moth has no image: skipped
        + candidates("Pink orchid", [0, 1, 2, 3, 4])
    )  # the repeated Blue finch counts once
    assert list(pool.negatives) == expected
    titles = {c.url: dict(enumerate(s)) for c in expected for t, s, _ in ARTICLES if url(t) == c.url}
    assert all(titles[c.url][c.section_index] not in ("References", "External links") for c in pool.negatives)


def test_an_evidence_section_that_is_excluded_as_a_candidate_is_still_the_positive(kb):
    pool = sample_pool(url("Gold heron"), 2, [url("Red tower"), url("Pink orchid")], facts_of(kb), num_negatives=5)
    assert pool.positive.section_index == 2  # "References" of the gold article
    assert [c.section_index for c in pool.negatives[:3]] == [0, 1, 3]


@pytest.mark.parametrize(
    "gold, evidence, top, reason",
    [
        ("Bare wrasse", 1, ["Red tower", "Pink orchid"], "no_gold_image"),
        ("Nowhere", 1, ["Red tower", "Pink orchid"], "gold_not_in_kb"),
        ("Gold heron", 7, ["Red tower", "Pink orchid"], "bad_evidence_section"),
        ("Gold heron", 1, [], "no_retrieval_results"),
        ("Gold heron", 1, ["Red tower", "Grey moth"], "too_few_candidates"),  # 3 + 5 < 15, the moth has no image
    ],
)
def test_samples_are_dropped_with_their_reason(kb, gold, evidence, top, reason):
    assert sample_pool(url(gold), evidence, [url(t) for t in top], facts_of(kb)) == reason


def test_gold_sections_and_num_negatives_are_switches(kb):
    top = [url("Red tower"), url("Pink orchid"), url("Black perch")]
    pool = sample_pool(url("Gold heron"), 3, top, facts_of(kb), gold_sections=1, num_negatives=15)
    assert [c.url for c in pool.negatives].count(url("Gold heron")) == 1
    assert len(pool.negatives) == 1 + 5 + 5 + 5
    assert (
        sample_pool(url("Gold heron"), 3, top, facts_of(kb), gold_sections=1, num_negatives=17) == "too_few_candidates"
    )


def test_mining_writes_omgm_layout_counts_drops_and_reads_back(kb, tmp_path):
    _, _, paths, image_root = kb
    questions = [
        question("q0", "Gold heron", 1, "imgA"),
        question("q1", "Bare wrasse", 1, "imgB"),
        question("q2", "Red tower", 3, "imgA"),  # same image as q0, another gold article
        question("q3", "Gold heron", 4, "imgC"),  # no stage-1 results
        question("q4", "Gold heron", 0, "imgD", qtype="2_hop"),
    ]
    top = [url(t) for t in ("Red tower", "Pink orchid", "Black perch", "Gold heron", "Blue finch")]
    ranking = Retrieved(top, [None] * 5, [0.9, 0.8, 0.7, 0.6, 0.5])
    results = {"q0": ranking, "q1": ranking, "q2": ranking}
    mined = mine_pools(questions, results, facts_of(kb), lambda q: q.image_id, top_k=4, split="train")
    report = mined.report
    assert (report["mined"], report["kept"], report["not_training_type"]) == (4, 2, 1)
    assert (
        report["dropped_by_reason"]["no_gold_image"] == 1 and report["dropped_by_reason"]["no_retrieval_results"] == 1
    )
    assert {d["data_id"]: d["reason"] for d in report["dropped_samples"]} == {
        "q1": "no_gold_image",
        "q3": "no_retrieval_results",
    }
    assert report["image_keys_with_several_gold_articles"] == 1

    pools_path, side = write_pools(tmp_path / "hardneg_train.json", mined)
    assert side == articles_path(pools_path) == tmp_path / "hardneg_train.articles.json"
    raw = json.loads(pools_path.read_text())
    assert set(raw) == {"imgA", "imgB", "imgC"}
    assert raw["imgA"]["gt_entity_pos_img"] == image_of("Gold heron")  # relative to kb_image_root
    assert (image_root / raw["imgA"]["gt_entity_pos_img"]) == paths.resolve(raw["imgA"]["gt_entity_pos_img"])
    assert [e["entry"] for e in raw["imgA"]["top_20"]] == top[:4]
    assert raw["imgA"]["top_20"][0] == {"entry": url("Red tower"), "title": None, "similarity": 0.9}
    assert raw["imgC"]["top_20"] == [] and raw["imgB"]["gt_entity_pos_img"] is None

    read = PoolFile(pools_path)
    for q in (questions[0], questions[2]):
        assert read.pool(q, "imgA") == sample_pool(q.gold_url, q.evidence_section_id, top[:4], facts_of(kb))
    # q0 and q2 share the image but each positive carries its own gold article's image
    assert read.pool(questions[0], "imgA").positive.image == image_of("Gold heron")
    assert read.pool(questions[2], "imgA").positive.image == image_of("Red tower")
    assert read.ranking("imgA") == (tuple(top[:4]), (0.9, 0.8, 0.7, 0.6))
    # Issue 14 item 1: the facts sidecar names the KB it was mined over; pools of another KB are refused
    store = kb[0]
    assert json.loads(side.read_text())["kb"] == {
        "url_checksum": store.url_checksum,
        "articles": len(store),
        "content": store.manifest["source"]["sha256"],  # the KB's text too (issue 44)
    }
    PoolFile(pools_path, kb_checksum=store.url_checksum)
    with pytest.raises(StaleArtifactError, match=r"hardneg_train\.articles\.json: mined over another KB.*qkvqa mine"):
        PoolFile(pools_path, kb_checksum="sha256:another")


def test_an_omgm_file_without_the_articles_sidecar_reads_facts_from_the_kb(kb, tmp_path):
    q = question("q0", "Gold heron", 1, "imgA")
    top = [url(t) for t in ("Red tower", "Pink orchid", "Black perch")]
    mined = mine_pools([q], {"q0": Retrieved(top, [None] * 3, [0.3, 0.2, 0.1])}, facts_of(kb), lambda x: x.image_id)
    pools_path, side = write_pools(tmp_path / "omgm.json", mined)
    side.unlink()
    with pytest.raises(Exception, match="no omgm.articles.json"):
        PoolFile(pools_path).pool(q, "imgA")
    omgm = PoolFile(pools_path, fallback=lambda: facts_of(kb))
    assert omgm.pool(q, "imgA") == PoolFile(write_pools(tmp_path / "with.json", mined)[0]).pool(q, "imgA")
    raw = json.loads(pools_path.read_text())
    raw["imgA"]["gt_entity_pos_img"] = "elsewhere/heron.jpg"  # OMGM's own gold image wins without the sidecar
    pools_path.write_text(json.dumps(raw))
    pool = PoolFile(pools_path, fallback=lambda: facts_of(kb)).pool(q, "imgA")
    assert isinstance(pool, SamplePool) and pool.positive.image == "elsewhere/heron.jpg"
    assert {c.image for c in pool.negatives if c.url == q.gold_url} == {"elsewhere/heron.jpg"}


def test_the_pool_key_is_the_query_image_basename_without_extension(tmp_path):
    (tmp_path / "inat").mkdir()
    (tmp_path / "id2name.json").write_text(json.dumps({"123": "train/00001_bird/abcdef.jpg"}))
    resolver = QueryImageResolver(
        ImagesConfig(
            inaturalist_root="inat", inaturalist_id2name="id2name.json", landmarks_root="gld", infoseek_root="is"
        ),
        tmp_path,
    )
    assert image_key(resolver, "inaturalist", "123") == "abcdef"
    assert image_key(resolver, "landmarks", "4f2a9c") == "4f2a9c"
    assert image_key(resolver, "infoseek", "oven_0001") == "oven_0001"
    assert image_key(resolver, "inaturalist", "not-in-map") == "not-in-map"


def test_image_paths_are_stored_relative_to_the_kb_image_root_else_the_data_root_else_absolute(tmp_path):
    paths = ImagePaths(tmp_path / "kb_images", tmp_path)
    (tmp_path / "kb_images" / "a").mkdir(parents=True)
    (tmp_path / "kb_images" / "a" / "x.jpg").write_bytes(b"x")
    (tmp_path / "url_store").mkdir()
    (tmp_path / "url_store" / "y.jpg").write_bytes(b"y")
    assert paths.relative(tmp_path / "kb_images" / "a" / "x.jpg") == "a/x.jpg"
    assert paths.relative(tmp_path / "url_store" / "y.jpg") == "url_store/y.jpg"
    assert paths.relative(Path("/elsewhere/z.jpg")) == "/elsewhere/z.jpg"
    assert paths.resolve("a/x.jpg") == (tmp_path / "kb_images" / "a" / "x.jpg").resolve()
    assert paths.resolve("url_store/y.jpg") == (tmp_path / "url_store" / "y.jpg").resolve()
    assert paths.resolve("/elsewhere/z.jpg") == Path("/elsewhere/z.jpg")
