"""InfoSeek scorer: every rule, example and table of metrics.md section 1, plus coverage and property tests."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkvqa.metrics import infoseek
from qkvqa.metrics.infoseek import (
    evaluate,
    harmonic_mean,
    normalize_answer,
    numerical_range_match,
    parse_numerical_answer,
    score_item,
)
from tests.helpers.examples import examples

CHINA = ["cn", "People's Republic of China", "China", "PRC", "\U0001f1e8\U0001f1f3"]


# --- normalize_answer (section 1.3) -------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Jean-Luc", "jeanluc"),  # punctuation deleted, not replaced by a space
        ("3.14", "314"),
        ("U.S.A.", "usa"),
        ("A-Team", "ateam"),  # punctuation first, so the `a` survives
        ("a cappella", "cappella"),
        ("The Theater of Anne", "theater of anne"),  # whole words only
        ("Straße", "straße"),  # str.lower, not casefold
        ("İstanbul", "i\u0307stanbul"),  # İ lower-cases to i + combining dot
        ("\u201cquoted\u201d \u2019s", "\u201cquoted\u201d \u2019s"),  # non-ASCII punctuation kept
        ("1990\u20131995", "1990\u20131995"),  # en dash kept
        ("\u00abx\u00bb y\u3002", "\u00abx\u00bb y\u3002"),
        ("new\u00a0york\u3000city", "new york city"),  # NBSP and ideographic space split
        ("new\u200byork", "new\u200byork"),  # zero-width space does not
        ("  the  answer\tis  ", "answer is"),
        ("", ""),
        ("the", ""),
        ("   ", ""),
    ],
)
def test_normalize_answer_examples(text, expected):
    assert normalize_answer(text) == expected


@pytest.mark.parametrize(
    "prediction, alias",
    [
        ("two", "2"),
        ("1st", "first"),
        ("IV", "4"),
        ("Sao Paulo", "São Paulo"),
        ("\uff21\uff22\uff23", "abc"),  # full-width letters: no NFKC
        ("\ufb01sh", "fish"),  # ligature stays
        ("salt and pepper", "salt & pepper"),
        ("the answer is paris", "paris"),
        ("answer: paris", "paris"),
        ("paris france", "paris"),  # no partial or containment credit
    ],
)
def test_normalizer_does_not_equate(prediction, alias):
    assert score_item(prediction, [alias], "String") == 0


@pytest.mark.parametrize(
    "prediction, expected",
    [
        ("China", 1),
        ("china.", 1),
        ("PRC", 1),
        ("\U0001f1e8\U0001f1f3", 1),
        ("the people's republic of china", 1),
        ("Republic of China", 0),
    ],
)
def test_string_is_exact_match_over_aliases(prediction, expected):
    assert score_item(prediction, CHINA, "String") == expected


def test_answer_eval_is_scored_never_answer_or_answer_eng():
    ref = {
        "data_id": "a",
        "answer": ["Paris"],
        "answer_eng": ["Paris"],
        "answer_eval": ["London"],
        "data_split": "val_unseen_question",
    }
    qtypes = [{"data_id": "a", "question_type": "String"}]
    assert evaluate([{"data_id": "a", "prediction": "Paris"}], [ref], qtypes)["unseen_question_score"]["score"] == 0
    del ref["answer_eval"]
    with pytest.raises(ValueError, match="missing field 'answer_eval'"):
        evaluate([{"data_id": "a", "prediction": "Paris"}], [ref], qtypes)


@pytest.mark.parametrize("prediction", ["", "the", "   ", "A!"])
def test_article_only_prediction_matches_article_only_reference(prediction):
    assert score_item(prediction, ["The"], "String") == 1
    assert score_item(prediction, ["Paris"], "String") == 0


# --- routing (section 1.2) and Time (section 1.4) -------------------------------------------------


@pytest.mark.parametrize(
    "question_type, kind",
    [
        ("Time", "time"),
        ("TIME", "time"),
        ("Numerical", "numerical"),
        ("nUmErIcAl", "numerical"),
        ("String", "string"),
        ("Other", "string"),
        ("Numerical ", "string"),
        (" time", "string"),
        ("", "string"),
    ],
)
def test_question_type_routing(question_type, kind):
    assert infoseek.question_kind(question_type) == kind


def test_numerical_with_trailing_space_is_scored_as_a_string():
    assert score_item("5", ["5"], "Numerical ") == 1
    assert score_item("5.0", ["5"], "Numerical ") == 0  # "50" != "5": no numeric parsing


@pytest.mark.parametrize(
    "prediction, answers, expected",
    [
        ("1997", ["1998"], 0),  # no +/- one year, despite the docstring
        ("1998", ["1 March 1998"], 0),  # no year-only credit
        ("1998", ["1998"], 1),
        ("March 1, 1998", ["1 March 1998"], 0),
    ],
)
def test_time_is_plain_exact_match(prediction, answers, expected):
    assert score_item(prediction, answers, "Time") == expected


# --- parse_numerical_answer (section 1.5) ---------------------------------------------------------


@pytest.mark.parametrize(
    "text, parsed",
    [
        # the table
        ("1/2", [1.0, 2.0]),
        ("12:30", [12.0, 30.0]),
        ("1,5", [1.0, 5.0]),
        ("1 000 000", 1.0),
        ("1_000", 1.0),
        ("5 - 3", 5.0),
        ("0x10", [0.0, 10.0]),
        ("1.2.3", [1.2, 3.0]),
        # range hyphens and signs
        ("9-10", [9.0, 10.0]),
        ("-5--3", [-5.0, -3.0]),
        ("-5", -5.0),
        ("a-5", -5.0),
        ("from -3 to 2", [-3.0, 2.0]),
        # digits
        ("\u0663", 3.0),
        ("\uff13", 3.0),
        ("\u00b2", [0.0, 0.0]),
        ("\u00bd", [0.0, 0.0]),
        # commas and dots
        ("1,234,567", 1234567.0),
        (".5", 5.0),
        ("..5..", 5.0),
        ("-.5", -0.5),
        ("5.", 5.0),
        ("+.5", 0.5),
        ("1e3", 1000.0),
        ("2.5E-1", 0.25),
        ("1e400", math.inf),
        # first two numbers only; a descending pair keeps the first; none -> [0, 0]
        ("3 4 5", [3.0, 4.0]),
        ("10 to 5", 10.0),
        ("7 7", [7.0, 7.0]),
        ("3 million", 3.0),
        ("three", [0.0, 0.0]),
        ("", [0.0, 0.0]),
        ("about", [0.0, 0.0]),
        # Unicode minus and en dash: neither sign nor separator
        ("\u22125", 5.0),
        ("5\u20137", [5.0, 7.0]),
        ("\u22127 \u22125", 7.0),
    ],
)
def test_parse_numerical_answer(text, parsed):
    assert parse_numerical_answer(text) == parsed


def test_hyphen_after_superscript_digit_is_isolated_so_no_sign():
    # '²'.isdigit() is True, so '²-5' becomes '² - 5' and the 5 loses its sign.
    assert parse_numerical_answer("\u00b2-5") == 5.0


# --- scoring numerical answers ------------------------------------------------------------------


@pytest.mark.parametrize(
    "prediction, answer_range, expected",
    [
        ("0.9", [0.9, 1.1], 1),
        ("1.1", [0.9, 1.1], 1),
        ("1.11", [0.9, 1.1], 0),  # inclusive, no extra tolerance
        ("1-1.05", [0.9, 1.1], 1),  # both ends inside
        ("0-4", [1, 3], 1),
        ("1-5", [1, 3], 1),  # IoU exactly 0.5 passes
        ("0-5", [1, 3], 0),  # IoU 0.4
        ("2-3.5", [1, 3], 0),  # overlap 1, union 2.5: IoU 0.4
        ("abc", [-1, 1], 1),
        ("", [0, 0], 1),
        ("abc", [1, 2], 0),  # unparseable -> [0, 0]
        ("2", [3, 1], 0),  # reversed range never matches a single number
        ("1-3", [3, 1], 1),  # ... but a range passes through the IoU branch
        ("1e400", [0, 1e308], 0),
    ],
)
def test_numerical_scoring(prediction, answer_range, expected):
    assert score_item(prediction, [{"wikidata": 1.0, "range": answer_range}], "Numerical") == expected


def test_numerical_answer_shapes_and_ignored_fields():
    bare = {"wikidata": 1.0, "range": [0.9, 1.1], "unit": "metre"}
    assert score_item("1", bare, "Numerical") == 1
    assert score_item("1", [bare], "numerical") == 1
    # `wikidata` and later entries are ignored: only the first range counts
    assert score_item("5.5", [{"wikidata": 5.5, "range": [0.9, 1.1]}, {"range": [5, 6]}], "Numerical") == 0
    # range elements go through str() then float()
    assert score_item("1", [{"range": ["0.9", "1.1"]}], "Numerical") == 1
    # only the first two elements of the range are kept
    assert score_item("1", [{"range": [0.9, 1.1, 50]}], "Numerical") == 1


def test_scalar_answer_path_uses_ten_percent_and_inverts_for_negatives():
    assert numerical_range_match(10.5, 10.0)
    assert not numerical_range_match(11.5, 10.0)
    assert not numerical_range_match(-10.0, -10.0)  # [-9, -11] is inverted
    assert numerical_range_match([-10.5, -9.5], -10.0)  # a range still passes by IoU


# --- errors (where the official code raises) ------------------------------------------------------


@pytest.mark.parametrize(
    "prediction, answer_eval, question_type, message",
    [
        ("x", [], "String", "non-empty list"),
        ("x", [], "Time", "non-empty list"),
        ("1", [], "Numerical", "non-empty list of dicts"),
        ("1", ["0.9", "1.1"], "Numerical", "'range'"),
        ("1", [{"range": [1]}], "Numerical", "two bounds"),
        ("1", [{"range": []}], "Numerical", "two bounds"),
        ("1", [{"wikidata": 1}], "Numerical", "'range'"),
        (None, ["x"], "String", "must be a str"),
        (5, ["5"], "String", "must be a str"),
        (1.0, [{"range": [0, 2]}], "Numerical", "must be a str"),
        ("x", ["x"], None, "question_type"),
    ],
)
def test_score_item_raises_value_error(prediction, answer_eval, question_type, message):
    with pytest.raises(ValueError, match=message):
        score_item(prediction, answer_eval, question_type)


# --- aggregation (section 1.6) --------------------------------------------------------------------


def _ref(qid, answers, split="val_unseen_question"):
    return {"data_id": qid, "answer_eval": answers, "data_split": split, "question": "q", "answer": ["unused"]}


def _files(rows_by_split):
    """references, qtypes and predictions for {split: [(qid, qtype, answers, prediction or None)]}."""
    refs, qtypes, preds = [], [], []
    for split, rows in rows_by_split.items():
        for qid, qtype, answers, prediction in rows:
            refs.append(_ref(qid, answers, split))
            qtypes.append({"data_id": qid, "question_type": qtype})
            if prediction is not None:
                preds.append({"data_id": qid, "prediction": prediction})
    return preds, refs, qtypes


def _uniform(split, n, correct, prefix):
    return [(f"{prefix}{i}", "String", ["yes"], "yes" if i < correct else "no") for i in range(n)]


def test_final_is_harmonic_mean_of_rounded_splits():
    preds, refs, qtypes = _files(
        {"val_unseen_question": _uniform("q", 2, 1, "q"), "val_unseen_entity": _uniform("e", 7, 1, "e")}
    )
    result = evaluate(preds, refs, qtypes)
    assert result["unseen_question_score"]["score"] == 50.0
    assert result["unseen_entity_score"]["score"] == 14.29
    assert result["final_score"] == 22.23
    unrounded = 2 / (1 / 50.0 + 1 / (100 / 7))
    assert round(unrounded, 2) == 22.22  # what rounding first changes


def test_splits_weigh_the_same_whatever_their_size():
    preds, refs, qtypes = _files(
        {
            "val_unseen_question": _uniform("q", 1, 1, "q"),
            "val_unseen_entity": _uniform("e", 9, 0, "e") + _uniform("e", 1, 1, "x"),
        }
    )
    result = evaluate(preds, refs, qtypes)
    assert result["unseen_question_score"]["score"] == 100.0
    assert result["unseen_entity_score"]["score"] == 10.0
    assert result["final_score"] == round(2 / (1 / 100 + 1 / 10), 2) == 18.18  # not 2/11 accuracy


def test_zero_or_empty_split_gives_zero_final_and_integer_zero_buckets():
    preds, refs, qtypes = _files({"val_unseen_question": _uniform("q", 3, 3, "q")})
    result = evaluate(preds, refs, qtypes)
    assert result["unseen_question_score"] == {"score": 100.0, "score_time": 0, "score_num": 0, "score_string": 100.0}
    entity = result["unseen_entity_score"]
    assert entity == {"score": 0, "score_time": 0, "score_num": 0, "score_string": 0}
    assert all(type(v) is int for v in entity.values())
    assert type(result["unseen_question_score"]["score_time"]) is int
    assert result["final_score"] == 0.0 and type(result["final_score"]) is float
    preds, refs, qtypes = _files(
        {"val_unseen_question": _uniform("q", 3, 3, "q"), "val_unseen_entity": _uniform("e", 3, 0, "e")}
    )
    assert evaluate(preds, refs, qtypes)["final_score"] == 0.0


def test_split_score_pools_types_and_per_type_scores():
    rows = [
        ("t1", "Time", ["1998"], "1998"),
        ("t2", "Time", ["1998"], "1997"),
        ("n1", "Numerical", [{"range": [1, 2]}], "1.5"),
        ("s1", "String", ["x"], "x"),
        ("s2", "String", ["x"], "y"),
        ("s3", "String", ["x"], "y"),
    ]
    preds, refs, qtypes = _files({"val_unseen_entity": rows, "val_unseen_question": _uniform("q", 1, 1, "q")})
    entity = evaluate(preds, refs, qtypes)["unseen_entity_score"]
    assert entity == {"score": 50.0, "score_time": 50.0, "score_num": 100.0, "score_string": 33.33}


def test_python_round_is_bankers_rounding_on_binary_floats():
    # 1 correct of 800: 100 * 1/800 = 0.125 exactly, which Python rounds to 0.12 (half to even)
    preds, refs, qtypes = _files(
        {"val_unseen_question": _uniform("q", 800, 1, "q"), "val_unseen_entity": _uniform("e", 1, 1, "e")}
    )
    assert evaluate(preds, refs, qtypes)["unseen_question_score"]["score"] == 0.12


@pytest.mark.parametrize(
    "data_split, routed",
    [
        ("val_unseen_question", "unseen_question_score"),
        ("test_unseen_question", "unseen_question_score"),
        ("val_unseen_entity", "unseen_entity_score"),
        ("val_seen", "unseen_entity_score"),
        ("human", "unseen_entity_score"),
        ("train", "unseen_entity_score"),
        ("unseen_question_val", "unseen_entity_score"),
    ],
)
def test_split_routing_by_suffix(data_split, routed):
    preds, refs, qtypes = _files({data_split: [("a", "String", ["x"], "x")]})
    result = evaluate(preds, refs, qtypes)
    assert result[routed]["score"] == 100.0
    other = "unseen_entity_score" if routed == "unseen_question_score" else "unseen_question_score"
    assert result[other]["score"] == 0


def test_missing_unknown_duplicate_and_repeated_reference_rules():
    preds, refs, qtypes = _files(
        {
            "val_unseen_question": [
                ("a", "String", ["x"], "x"),
                ("b", "String", ["x"], "y"),
                ("c", "String", ["x"], None),
            ],
            "val_unseen_entity": [("e", "String", ["x"], "x")],
        }
    )
    preds += [
        {"data_id": "a", "prediction": "x"},  # duplicate: counted twice
        {"data_id": "zzz", "prediction": None},
    ]  # unknown: dropped, never scored
    refs.insert(0, _ref("b", ["y"], "val_unseen_entity"))  # an earlier line for b: the last line wins
    result = evaluate(preds, refs, qtypes)
    # unseen_question: a, b, a -> 2 of 3 (c has no prediction and is not counted)
    assert result["unseen_question_score"]["score"] == 66.67
    assert result["unseen_entity_score"]["score"] == 100.0
    coverage = result["coverage"]
    assert (coverage["n_missing"], coverage["n_unknown"], coverage["n_duplicated_ids"]) == (1, 1, 1)
    assert coverage["missing_ids"] == ["c"] and coverage["unknown_ids"] == ["zzz"]
    assert coverage["duplicated_ids"] == ["a"] and coverage["n_repeated_reference_lines"] == 1
    assert coverage["n_conflicting_reference_ids"] == 1
    assert coverage["n_scored"]["unseen_question"]["string"] == 3


def test_strict_refuses_a_reference_id_repeated_with_another_answer_or_type():
    """Issue 14 item 5: the later line silently won; --strict now names the line, the id and the earlier line."""
    preds, refs, qtypes = _files(
        {"val_unseen_question": [("a", "String", ["x"], "x")], "val_unseen_entity": [("e", "String", ["x"], "x")]}
    )
    same = refs + [_ref("a", ["x"])]  # an identical repeat is harmless
    assert evaluate(preds, same, qtypes, strict=True)["coverage"]["n_conflicting_reference_ids"] == 0
    with pytest.raises(
        ValueError, match=r"references\[2\]: data_id a: repeated with another answer .* references\[0\]"
    ):
        evaluate(preds, refs + [_ref("a", ["y"])], qtypes, strict=True)
    with pytest.raises(ValueError, match=r"data_id a: question_type 'Time', but an earlier line gives 'String'"):
        evaluate(preds, refs, qtypes + [{"data_id": "a", "question_type": "Time"}], strict=True)


def test_strict_raises_listing_ids_and_counts():
    preds, refs, qtypes = _files({"val_unseen_question": [(f"q{i}", "String", ["x"], None) for i in range(8)]})
    preds = [{"data_id": "q0", "prediction": "x"}]
    evaluate(preds, refs, qtypes)  # not strict: scored, with a warning
    with pytest.raises(ValueError, match=r"7 missing id\(s\) \(q1, q2, q3, q4, q5, \.\.\.\)"):
        evaluate(preds, refs, qtypes, strict=True)


def test_strict_passes_on_complete_coverage():
    preds, refs, qtypes = _files(
        {"val_unseen_question": _uniform("q", 2, 1, "q"), "val_unseen_entity": _uniform("e", 2, 2, "e")}
    )
    assert evaluate(preds, refs, qtypes, strict=True)["final_score"] == round(harmonic_mean(50.0, 100.0), 2)


def test_reference_without_question_type_raises():
    preds, refs, qtypes = _files({"val_unseen_question": _uniform("q", 2, 1, "q")})
    with pytest.raises(ValueError, match="no entry in the question-type file.*q1"):
        evaluate(preds, refs, qtypes[:1])


def test_bad_reference_or_prediction_names_the_data_id():
    preds, refs, qtypes = _files({"val_unseen_question": [("n1", "Numerical", [], "1")]})
    with pytest.raises(ValueError, match="data_id n1"):
        evaluate(preds, refs, qtypes)
    preds, refs, qtypes = _files({"val_unseen_question": [("s1", "String", ["x"], "x")]})
    preds[0]["prediction"] = None
    with pytest.raises(ValueError, match="data_id s1.*must be a str"):
        evaluate(preds, refs, qtypes)


def test_one_element_range_raises_only_when_scored():
    preds, refs, qtypes = _files(
        {"val_unseen_question": [("n1", "Numerical", [{"range": [1]}], None), ("s1", "String", ["x"], "x")]}
    )
    assert evaluate(preds, refs, qtypes)["unseen_question_score"]["score"] == 100.0
    preds.append({"data_id": "n1", "prediction": "1"})
    with pytest.raises(ValueError, match="n1.*two bounds"):
        evaluate(preds, refs, qtypes)


def test_evaluate_reads_jsonl_paths(tmp_path):
    preds, refs, qtypes = _files(
        {"val_unseen_question": _uniform("q", 2, 1, "q"), "val_unseen_entity": _uniform("e", 4, 3, "e")}
    )
    paths = {}
    for name, rows in (("pred", preds), ("ref", refs), ("qtype", qtypes)):
        paths[name] = tmp_path / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    from_files = evaluate(str(paths["pred"]), paths["ref"], paths["qtype"])
    assert from_files == evaluate(preds, refs, qtypes)
    assert from_files["final_score"] == round(harmonic_mean(50.0, 75.0), 2) == 60.0
    assert list(from_files)[:3] == ["final_score", "unseen_question_score", "unseen_entity_score"]


def test_malformed_jsonl_names_file_and_line(tmp_path):
    bad = tmp_path / "pred.jsonl"
    bad.write_text('{"data_id": "a", "prediction": "x"}\n{oops\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"pred\.jsonl: line 2"):
        evaluate(bad, [_ref("a", ["x"])], [{"data_id": "a", "question_type": "String"}])
    with pytest.raises(ValueError, match="missing field 'prediction'"):
        evaluate([{"data_id": "a"}], [_ref("a", ["x"])], [{"data_id": "a", "question_type": "String"}])


def test_harmonic_mean_replaces_zero():
    assert harmonic_mean(50.0, 0) == pytest.approx(2e-12)
    assert harmonic_mean(0, 0) == pytest.approx(1e-12)
    assert harmonic_mean(40.0, 60.0) == pytest.approx(48.0)


# --- properties -------------------------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=examples(300), deadline=None)
@given(st.text())
def test_normalize_answer_is_idempotent(text):
    once = normalize_answer(text)
    assert normalize_answer(once) == once


@pytest.mark.parametrize(
    "text, expected", [("-.0.0", [0.0, 0.0]), ("-.5.5 and 3", 3.0), ("+.2.2", [0.0, 0.0]), ("1.2.3", [1.2, 3.0])]
)
def test_signed_two_dot_tokens_are_skipped_where_the_official_code_raises(text, expected):
    assert parse_numerical_answer(text) == expected


@pytest.mark.slow
@settings(max_examples=examples(300), deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8")) | st.from_regex(r"[-+.,eE0-9 \u0660-\u0669]{0,20}"))
def test_parse_numerical_answer_never_crashes(text):
    parsed = parse_numerical_answer(text)
    if isinstance(parsed, list):
        assert len(parsed) == 2 and all(isinstance(x, float) for x in parsed) and parsed[0] <= parsed[1]
    else:
        assert isinstance(parsed, float)


finite = st.floats(allow_nan=False, allow_infinity=False, width=32)
any_prediction = st.text() | st.from_regex(r"-?[0-9]{1,4}(\.[0-9]+)?( ?- ?-?[0-9]{1,4})?")
string_items = st.tuples(
    any_prediction,
    st.lists(st.text(max_size=5), min_size=1, max_size=3),
    st.sampled_from(["String", "Time", "other", "Numerical "]),
)
stored_ranges = st.tuples(finite, finite).map(lambda bounds: [{"wikidata": 0, "range": list(bounds)}])
numerical_items = st.tuples(any_prediction, stored_ranges, st.sampled_from(["Numerical", "numerical", "NUMERICAL"]))


@pytest.mark.slow
@settings(max_examples=examples(400), deadline=None)
@given(string_items | numerical_items)
def test_score_item_is_always_zero_or_one(item):
    prediction, answer_eval, question_type = item
    assert score_item(prediction, answer_eval, question_type) in (0, 1)


def test_details_give_each_accepted_answer_or_range_its_match():
    preds, refs, qtypes = _files(
        {
            "val_unseen_question": [
                ("s", "String", ["Paris", "Lutetia"], "the lutetia"),
                ("n", "Numerical", [{"range": [9, 11]}], "about 10 m"),
            ],
            "val_unseen_entity": [("t", "Time", ["1999"], "2000"), ("k", "String", ["x"], "")],
        }
    )
    preds[-1]["skipped"] = "query image missing"
    _, details = infoseek.evaluate_with_details(preds, refs, qtypes)
    by_id = {d["data_id"]: d for d in details}
    assert (
        by_id["s"]["references"]
        == [{"answer": "Paris", "em": False, "bem": None}, {"answer": "Lutetia", "em": True, "bem": None}]
        and by_id["s"]["correct"] == 1
    )
    assert by_id["n"]["references"] == [{"answer": "[9, 11]", "em": True, "bem": None}] and by_id["n"]["correct"] == 1
    assert by_id["t"]["references"] == [{"answer": "1999", "em": False, "bem": None}] and by_id["t"]["correct"] == 0
    assert by_id["k"]["references"] == [{"answer": "x", "em": None, "bem": None}] and by_id["k"]["correct"] == 0
    for d in details:  # the per-reference matches agree with the per-question scorer
        if d["data_id"] != "k":
            assert d["correct"] == int(any(r["em"] for r in d["references"]))
