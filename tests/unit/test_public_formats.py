"""Conformance: qkvqa's readers on the fixtures of tests/fixtures/public/, written from the owners' documentation and
code (tests/fixtures/public/README.md names the file and line each follows). One test per documented field and per
documented quirk of the formats whose readers live in qkvqa.data.questions, qkvqa.data.kb and qkvqa.metrics; the
image CSVs, mined negatives and index files have their readers' tests beside those readers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from qkvqa.data.kb import KBStore, build_kb_store
from qkvqa.data.questions import (
    attach_infoseek_references,
    is_training_question,
    read_evqa_csv,
    read_infoseek_csv,
    read_infoseek_jsonl_questions,
    read_infoseek_references,
    read_webdataset_questions,
)
from qkvqa.data.shards import ShardIndex
from qkvqa.metrics import infoseek

PUBLIC = Path(__file__).resolve().parents[1] / "fixtures/public"
W = "https://en.wikipedia.org/wiki/"


def _kb(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def evqa():
    """Every row of the E-VQA test.csv fixture, 2_hop included, by question text."""
    return {q.question: q for q in read_evqa_csv(PUBLIC / "evqa/test.csv", include_two_hop=True)}


@pytest.fixture(scope="module")
def evqa_store(tmp_path_factory):
    out = tmp_path_factory.mktemp("evqa_store")
    build_kb_store(PUBLIC / "evqa/encyclopedic_kb_wiki.json", out)
    return KBStore.open(out, source=PUBLIC / "evqa/encyclopedic_kb_wiki.json")


# ---- E-VQA question CSV: google-research encyclopedic_vqa/README.md lines 32-75 ------------------------------------


def test_evqa_question_text_is_read_whole_through_csv_quoting(evqa):
    """README line 38 `question`; the CSV quotes a question holding commas and double quotes."""
    assert 'In which year did this "steel arch" bridge open, after six years of work?' in evqa


def test_evqa_answer_alternatives_split_on_bar_and_multi_answer_items_keep_their_ampersands(evqa):
    """README lines 39-42: '|' between annotators' answers, '&&' between the items of a multi_answer answer."""
    assert evqa["How long is this bird, in centimetres?"].answers == ["12 cm", "12", "twelve centimetres"]
    assert evqa["What does this bird eat?"].answers == ["insects&&seeds", "seeds&&insects"]


def test_evqa_up_to_five_image_ids_and_only_the_first_is_used(evqa):
    """README line 43 `dataset_image_ids` (up to 5); EchoSight and OMGM use the first (data-formats.md section 1)."""
    question = evqa["How long is this bird, in centimetres?"]
    assert len(question.image_ids) == 5 and question.image_id == "4f1c2d"


def test_evqa_dataset_name_and_category_id(evqa):
    """README lines 45-47: the image dataset's name and its category id (kept with the row)."""
    assert {q.dataset_name for q in evqa.values()} == {"inaturalist", "landmarks"}
    assert evqa["Who designed this bridge?"].row["dataset_category_id"] == "145332"


def test_evqa_question_types_and_single_hop_ids(evqa):
    """README lines 48-49: four types; single-hop rows are E-VQA_{i} among themselves (EchoSight load_csv_data)."""
    assert {q.question_type for q in evqa.values()} == {"templated", "automatic", "multi_answer", "2_hop"}
    assert [q.data_id for q in evqa.values()] == ["E-VQA_0", "E-VQA_1", "E-VQA_2", "E-VQA_2hop_0", "E-VQA_3"]
    assert [is_training_question(q) for q in evqa.values()] == [True, True, True, False, True]


def test_evqa_wikipedia_url_is_a_kb_key_and_two_hop_rows_hold_two(evqa, evqa_store):
    """README lines 50-53: the URL keys the KB; a two_hop row holds the two consecutive URLs joined by '|'."""
    for question in evqa.values():
        assert all(url in evqa_store for url in question.gold_urls)
    two_hop = next(q for q in evqa.values() if q.question_type == "2_hop")
    assert two_hop.gold_urls == [W + "Grey-crested_warbler", W + "Reed_bed"]


def test_evqa_wikipedia_title_is_not_the_key_and_a_two_hop_row_may_give_one(evqa):
    """README lines 54-56: the title is no stable identifier; for two_hop rows the README documents no second title
    (silent: qkvqa reads one title as the first hop's and a second as the second hop's)."""
    two_hop = next(q for q in evqa.values() if q.question_type == "2_hop")
    assert [h["title"] for h in two_hop.hops] == ["Grey-crested warbler", None]


def test_evqa_evidence_is_only_given_for_templated_rows(evqa):
    """README lines 57-58."""
    assert all(bool(q.row["evidence"]) == (q.question_type == "templated") for q in evqa.values())


def test_evqa_evidence_section_id_and_title_index_the_unfiltered_kb_sections_per_hop(evqa, evqa_store):
    """README lines 59-64: an integer section index (two for two_hop rows) and its title, which "corresponds": the
    KB entry's section_titles[id] is the title, hop by hop (line 63 says "the two IDs" for the titles: read as two
    titles)."""
    for question in evqa.values():
        assert question.hops and all(h["section_index"] is not None for h in question.hops)
        for hop in question.hops:
            assert evqa_store.get_by_url(hop["url"]).section_titles[hop["section_index"]] == hop["section_title"]
    two_hop = next(q for q in evqa.values() if q.question_type == "2_hop")
    assert [(h["section_index"], h["section_title"]) for h in two_hop.hops] == [(2, "Habitat"), (1, "Wildlife")]


def test_evqa_split_and_original_question(evqa):
    """README lines 65-70: encyclopedic_vqa_split and question_original (kept with the row)."""
    assert {q.split for q in evqa.values()} == {"test"}
    assert evqa["Who designed this bridge?"].row["question_original"] == "Who designed the Velmora Harbour Bridge?"


def test_evqa_wikipedia_url_used_in_train_is_a_boolean(evqa):
    """README lines 71-74: Boolean, 'False' for a subject unseen in training."""
    assert evqa["Who designed this bridge?"].url_used_in_train is False
    assert evqa["What does this bird eat?"].url_used_in_train is True


# ---- E-VQA KB JSON: README lines 102-117 ---------------------------------------------------------------------------


def test_kb_maps_urls_to_entries_in_file_order_and_url_repeats_the_key(evqa_store):
    """README lines 102-104 and 117; file order is the row id every index uses (data-formats.md section 2.1)."""
    kb = _kb(PUBLIC / "evqa/encyclopedic_kb_wiki.json")
    assert list(evqa_store.urls()) == list(kb) and all(entry["url"] == url for url, entry in kb.items())
    assert evqa_store.manifest["issues"]["malformed"] == 0


def test_kb_first_section_title_is_the_title(evqa_store):
    """README lines 109-110: section_titles[0] is identical to title (the lead section)."""
    assert all(a.section_titles[0] == a.title for a in evqa_store)


def test_kb_section_texts_are_parallel_to_section_titles(evqa_store):
    """README line 111."""
    assert all(len(a.section_texts) == len(a.section_titles) for a in evqa_store)


def test_kb_images_their_captions_and_section_indices_are_parallel(evqa_store):
    """README lines 112-116: image_urls, image_reference_descriptions and image_section_indices (an index into the
    section lists) run in parallel."""
    warbler = evqa_store.get_by_url(W + "Grey-crested_warbler")
    assert warbler.image_reference_descriptions == ["An adult in spring", "A nest in a reed bed"]
    assert [warbler.section_titles[i] for i in warbler.image_section_indices] == ["Grey-crested warbler", "Habitat"]
    assert evqa_store.manifest["issues"]["no_image"] == 1  # the bridge has none: counted, not an error


def test_kb_store_records_the_sha256_the_release_is_checked_by(evqa_store):
    """README lines 94-100 give the release's sha256; the store records the same digest of its source."""
    source = PUBLIC / "evqa/encyclopedic_kb_wiki.json"
    assert evqa_store.manifest["source"]["sha256"] == hashlib.sha256(source.read_bytes()).hexdigest()


def test_kb_references_and_external_links_are_never_candidates_but_keep_their_indexes(evqa_store):
    """OMGM dataset/dataset_utils.py reconstruct_wiki_sections_dict lines 77-81 (and EchoSight's): titles holding
    "external links" / "references" are left out; the others keep their original index."""
    warbler = evqa_store.get_by_url(W + "Grey-crested_warbler")
    assert [s.index for s in warbler.candidate_sections()] == [0, 1, 2, 3]
    assert [s.index for s in warbler.candidate_sections(evidence_section_id=4)] == [0, 1, 2, 3, 4]


# ---- EchoSight's InfoSeek files: Go2Heart/EchoSight README ("VQA Questions", "Knowledge Base") ------------------------


def test_echosight_infoseek_csvs_are_evqa_columns_plus_data_id(tmp_path):
    """README: InfoSeek "transformed to E-VQA format"; test/test_reranker.py lines 102-103 key infoseek rows by their
    data_id; utils/test_utils.py line 34 keeps question_type "infoseek"."""
    test = read_infoseek_csv(PUBLIC / "echosight/infoseek_test_filtered.csv")
    train = read_infoseek_csv(PUBLIC / "echosight/infoseek_train_filtered.csv")
    assert [q.data_id for q in test] == ["infoseek_val_00000001", "infoseek_val_00000002", "infoseek_val_00000003"]
    assert all(
        q.question_type == "infoseek" and q.dataset_name == "infoseek" and is_training_question(q) for q in test + train
    )
    assert test[0].answers == ["Kenya", "Republic of Kenya", "KE"] and test[0].url_used_in_train is None


def test_echosight_test_csv_holds_infoseek_val_ids(tmp_path):
    """EchoSight's "test" file is InfoSeek val: its data_ids join the official references (data-formats.md 3.1)."""
    questions = read_infoseek_csv(PUBLIC / "echosight/infoseek_test_filtered.csv")
    references = read_infoseek_references(
        PUBLIC / "infoseek/infoseek_val.jsonl", PUBLIC / "infoseek/infoseek_val_qtype.jsonl"
    )
    overlap = attach_infoseek_references(questions, references)
    assert overlap["questions_without_reference"] == 0 and overlap["references_without_question"] == 1


def test_echosight_100k_kb_is_the_evqa_kb_format(tmp_path):
    """README "Knowledge Base": "the same format as the Encyclopedic-VQA dataset"."""
    manifest = build_kb_store(PUBLIC / "echosight/wiki_100_dict_v4.json", tmp_path / "store")
    assert manifest["articles"] == 2 and manifest["source"]["entry_layouts"] == {"evqa": 2, "reflectiva": 0}
    assert manifest["issues"]["malformed"] == 0


# ---- InfoSeek: open-vision-language/infoseek README ("InfoSeek Annotation"), edchengg/infoseek_eval ---------------


def test_infoseek_jsonl_fields():
    """infoseek README example: data_id, image_id, question, answer (a list), answer_eval, data_split."""
    (first, *_) = read_infoseek_jsonl_questions(
        PUBLIC / "infoseek/infoseek_val.jsonl", PUBLIC / "infoseek/infoseek_val_qtype.jsonl"
    )
    assert (first.data_id, first.image_id, first.question) == (
        "infoseek_val_00000001",
        "oven_00000011",
        "Which country is this bridge in?",
    )
    assert first.answers == ["Kenya"] and first.reference.answer_eval[-1] == "\U0001f1f0\U0001f1ea"
    assert first.reference.data_split == "val_unseen_question" and first.gold_urls == []


def test_infoseek_numerical_answer_eval_is_a_list_of_one_range_dict_or_a_bare_dict():
    """infoseek_eval.py prepare_qid2example lines 400-408: `[{"wikidata", "range"}]` or the dict alone."""
    references = read_infoseek_references(
        PUBLIC / "infoseek/infoseek_val.jsonl", PUBLIC / "infoseek/infoseek_val_qtype.jsonl"
    )
    assert isinstance(references["infoseek_val_00000002"].answer_eval, list)
    assert isinstance(references["infoseek_val_00000004"].answer_eval, dict)
    predictions = [
        {"data_id": "infoseek_val_00000002", "prediction": "about 500 metres"},
        {"data_id": "infoseek_val_00000004", "prediction": "12.5"},
    ]
    result = infoseek.evaluate(
        predictions, str(PUBLIC / "infoseek/infoseek_val.jsonl"), str(PUBLIC / "infoseek/infoseek_val_qtype.jsonl")
    )
    assert result["unseen_entity_score"]["score_num"] == 100.0  # 500 in [452.7, 553.3]
    assert result["unseen_question_score"]["score_num"] == 0.0  # 12.5 outside [9.9, 12.1]


def test_infoseek_qtypes_are_capitalised_and_compared_lower_case():
    """infoseek_eval.py lines 264 and 399: the type is lower-cased before use (String / Numerical / Time)."""
    references = read_infoseek_references(
        PUBLIC / "infoseek/infoseek_val.jsonl", PUBLIC / "infoseek/infoseek_val_qtype.jsonl"
    )
    assert [r.question_type for r in references.values()] == ["String", "Numerical", "Time", "Numerical"]


def test_infoseek_split_is_unseen_question_by_suffix_else_unseen_entity():
    """infoseek_eval.py line 377: a data_split ending in `unseen_question` is that split, every other one the
    unseen-entity split."""
    predictions = [
        {"data_id": "infoseek_val_00000001", "prediction": "Kenya"},
        {"data_id": "infoseek_val_00000003", "prediction": "1931"},
    ]
    result = infoseek.evaluate(
        predictions, str(PUBLIC / "infoseek/infoseek_val.jsonl"), str(PUBLIC / "infoseek/infoseek_val_qtype.jsonl")
    )
    assert result["unseen_question_score"]["score_string"] == 100.0
    assert result["unseen_entity_score"]["score_time"] == 0.0  # the time rule is exact match, as the scorer


# ---- ReflectiVA: aimagelab/ReflectiVA rag_evaluation/infoseek/release_retrieval.py ---------------------------------


def test_reflectiva_kb_entries_hold_only_wikipedia_content(tmp_path):
    """Line 152 reads `wikipedia[entity_url]['wikipedia_content']` and nothing else: the title comes from the URL,
    there are no images (counted), the key is the URL knn.json names (lines 44-45)."""
    manifest = build_kb_store(PUBLIC / "reflectiva/Wiki100k_ver_1_0-all.json", tmp_path / "store")
    store = KBStore.open(tmp_path / "store")
    assert manifest["source"]["entry_layouts"] == {"evqa": 0, "reflectiva": 4}
    assert store.get_by_url(W + "Harbour_Bridge_(Velmora)").title == "Harbour Bridge (Velmora)"
    assert manifest["issues"]["no_image"] == 4
    knn = json.loads((PUBLIC / "reflectiva/knn.json").read_text(encoding="utf-8"))
    assert all(row[0] in store for row in knn)


def test_reflectiva_query_shards_are_keyed_by_data_id_with_question_and_image_members():
    """Lines 133-148 (`sample.pop('question').decode('utf-8')`, `sample['img.jpg']`) and 292 (`data_id` =
    `__key__`)."""
    references = read_infoseek_references(
        PUBLIC / "infoseek/infoseek_val.jsonl", PUBLIC / "infoseek/infoseek_val_qtype.jsonl"
    )
    shards = ShardIndex.from_pattern(str(PUBLIC / "reflectiva/val-{0000..0000}.tar"))
    questions = read_webdataset_questions(shards, references)
    assert [q.data_id for q in questions] == list(references)
    assert [q.question for q in questions] == [r.question for r in references.values()]
    assert all(q.reference is references[q.data_id] for q in questions)
    assert shards.member(questions[0].data_id, "img.jpg") is not None
