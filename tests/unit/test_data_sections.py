"""Section strings, the candidate-section filter (original indexes, evidence always allowed) and LAVIS preprocessing."""

from __future__ import annotations

import pytest

from qkvqa.data.sections import blip_caption, candidate_sections, is_excluded_section, section_string
from qkvqa.errors import DataError

TITLES = ["Kestrel", "Description", "References", "Diet", "External Links", "Further references"]
TEXTS = ["Lead.", "Brown.", "Smith 1999.", "Mice.", "Site.", "More."]


def test_section_string_has_the_echosight_header():
    assert section_string("Kestrel", "Diet", "Mice.") == "# Wiki Article: Kestrel\n## Section Title: Diet\nMice."


@pytest.mark.parametrize(
    "title, excluded",
    [("References", True), ("EXTERNAL LINKS", True), ("Notes and references", True), ("Diet", False), ("Links", False)],
)
def test_excluded_titles_are_matched_case_insensitively_as_substrings(title, excluded):
    assert is_excluded_section(title) is excluded


def test_candidates_skip_excluded_sections_and_keep_original_indexes():
    candidates = list(candidate_sections("Kestrel", TITLES, TEXTS))
    assert [c.index for c in candidates] == [0, 1, 3]
    assert candidates[2].section_title == "Diet"
    assert candidates[2].text == section_string("Kestrel", "Diet", "Mice.")


def test_the_evidence_section_is_a_candidate_even_when_its_title_is_excluded():
    indexes = [c.index for c in candidate_sections("Kestrel", TITLES, TEXTS, evidence_section_id=4)]
    assert indexes == [0, 1, 3, 4]


def test_an_evidence_index_outside_the_article_is_a_data_error():
    with pytest.raises(DataError, match="evidence_section_id 6"):
        list(candidate_sections("Kestrel", TITLES, TEXTS, evidence_section_id=6))


def test_sections_without_text_are_never_candidates_and_indexes_stay_original():
    titles, texts = ["A", "See also", "History", "Gallery", "Diet"], ["x", "", "Built in 1900.", " \n", "Mice."]
    assert [c.index for c in candidate_sections("A", titles, texts)] == [0, 2, 4]
    assert [c.index for c in candidate_sections("A", titles, texts, evidence_section_id=1)] == [0, 1, 2, 4]


def test_blip_caption_lowercases_strips_punctuation_and_the_header_marks():
    text = blip_caption(section_string("Kestrel", "Diet", 'It eats "mice" (mostly); rarely: birds!'))
    # "\n## " is a run of whitespace once "#" is gone, so it squeezes to one space; the single "\n" stays.
    assert text == "wiki article kestrel section title diet\nit eats mice mostly rarely birds"


def test_blip_caption_truncates_to_max_words():
    assert blip_caption(" ".join(f"w{i}" for i in range(600))).split(" ")[-1] == "w511"
    assert blip_caption("a b c", max_words=2) == "a b"
