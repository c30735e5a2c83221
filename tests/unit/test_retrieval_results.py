"""Retrieval results files: the OMGM layout round-trips, EchoSight's layout reads, malformed files name the data_id."""

from __future__ import annotations

import json

import pytest

from qkvqa.errors import DataError
from qkvqa.retrieval.results import Retrieved, read_results, read_results_stage1, write_results


def test_omgm_layout_round_trips(tmp_path):
    results = {
        "E-VQA_0": Retrieved(
            ["https://en.wikipedia.org/wiki/Ærø", "https://en.wikipedia.org/wiki/B"], ["Ærø", "B"], [0.91, 0.5]
        ),
        "E-VQA_1": Retrieved(),
    }
    path = write_results(tmp_path / "r.json", results)
    raw = json.loads(path.read_text(encoding="utf-8"))
    assert raw["E-VQA_0"] == {
        "retrieved_entities": [
            {"url": "https://en.wikipedia.org/wiki/Ærø", "title": "Ærø"},
            {"url": "https://en.wikipedia.org/wiki/B", "title": "B"},
        ],
        "retrieval_similarities": [0.91, 0.5],
    }
    assert read_results(path) == results


def test_what_stage_1_embedded_is_kept_beside_the_file_and_a_stale_sidecar_is_refused(tmp_path):
    text = {"text": "lead_section", "index": "idx", "detail": "each article's lead section"}
    path = write_results(tmp_path / "r.json", {"q": Retrieved(["u"], ["t"], [0.5])}, stage1_text=text)
    assert (tmp_path / "r.meta.json").is_file() and read_results_stage1(path) == text
    path.write_text(path.read_text().replace("0.5", "0.25"))  # another version of the file
    with pytest.raises(DataError, match="does not describe"):
        read_results_stage1(path)
    write_results(path, {"q": Retrieved()})  # written without: no sidecar left
    assert not (tmp_path / "r.meta.json").exists() and read_results_stage1(path) is None


def test_echosight_layout_is_read_with_unknown_titles(tmp_path):
    (tmp_path / "e.json").write_text(
        json.dumps(
            {
                "7": {
                    "retrieved_entries": ["u1", "u2"],
                    "retrieval_similarities": [0.8, 0.7],
                    "reranked_entries": ["u2", "u1"],
                    "reranked_sections": ["s"],
                }
            }
        )
    )
    assert read_results(tmp_path / "e.json") == {"7": Retrieved(["u1", "u2"], [None, None], [0.8, 0.7])}


@pytest.mark.parametrize(
    "value,problem",
    [
        ({"retrieved": []}, "neither 'retrieved_entities'"),
        ({"retrieved_entities": [{"title": "x"}], "retrieval_similarities": [1.0]}, "must be a URL"),
        ({"retrieved_entities": ["u1", "u2"], "retrieval_similarities": [1.0]}, "as long as the 2"),
        ({"retrieved_entries": ["u1"], "retrieval_similarities": ["high"]}, "not a number"),
        ([], "expected an object"),
    ],
)
def test_malformed_entries_name_the_file_and_data_id(tmp_path, value, problem):
    (tmp_path / "bad.json").write_text(json.dumps({"q9": value}))
    with pytest.raises(DataError, match=f"bad.json: data_id 'q9': .*{problem}"):
        read_results(tmp_path / "bad.json")


def test_unreadable_files(tmp_path):
    with pytest.raises(DataError, match="not found"):
        read_results(tmp_path / "none.json")
    (tmp_path / "cut.json").write_text('{"q": {"retrieved_entries": [')
    with pytest.raises(DataError, match="line 1: malformed JSON"):
        read_results(tmp_path / "cut.json")


def test_a_results_file_covering_too_few_questions_is_refused_with_its_counts(tmp_path):
    from types import SimpleNamespace

    from qkvqa.errors import DataError
    from qkvqa.retrieval.results import check_coverage_of

    questions = [SimpleNamespace(data_id=f"E-VQA_{i}") for i in range(20)]
    check_coverage_of("r.json", {f"E-VQA_{i}" for i in range(19)}, questions, 0.95, "retrieval.min_results_coverage")
    with pytest.raises(DataError) as error:  # another split's file: 0 of 20
        check_coverage_of("r.json", {"infoseek_val_1"}, questions, 0.95, "retrieval.min_results_coverage")
    assert "results for 0 of the split's 20 questions" in str(error.value) and "E-VQA_0" in str(error.value)
