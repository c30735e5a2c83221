"""E-VQA scorer: every rule, example and table of metrics.md section 2 (EM path, aggregation, coverage)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from qkvqa.metrics import evqa
from qkvqa.metrics.evqa import evaluate, evaluate_example, exact_match, preprocess_answer
from tests.helpers.examples import examples

# --- preprocess_answer (section 2.2) -------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        # the table
        ("1.5", "15"),
        ("-5", "5"),
        ("Jean-Luc", "jeanluc"),
        ("São Paulo", "são paulo"),
        ("The answer is: Paris.", "paris"),
        # step 1: lower, newline and tab to spaces, strip
        ("  New\nYork\tCity ", "new york city"),
        # step 2: `<extra_id_0> ` at the start deletes every occurrence; elsewhere it is just punctuation
        ("<extra_id_0> Paris <extra_id_0> France", "paris france"),
        ("Paris <extra_id_0> France", "paris extraid0 france"),
        ("<extra_id_0>Paris", "extraid0paris"),
        # step 3: ASCII punctuation and ‘ ’ ´ ` _ deleted; curly double quotes and dashes kept
        ("\u2018rock\u2019 n\u00b4roll `x` snake_case", "rock nroll x snakecase"),
        ("\u201cquoted\u201d 1990\u20131995 x\u2014y", "\u201cquoted\u201d 1990\u20131995 x\u2014y"),
        ("a\u2014b", "\u2014b"),  # a kept dash is still a word boundary for the articles
        # step 4: whole-word `the answer is`, `a`, `an`, `the`
        ("an apple a day", "apple day"),
        ("theater anne", "theater anne"),
        ("The answer isn't", "answer isn't"),
        ("the answer is the answer is x", "x"),
        # step 5: number words and yes/no words, then contractions (the apostrophe comes back)
        ("None", "0"),
        ("zero", "0"),
        ("one two three four five", "1 2 3 4 5"),
        ("six seven eight nine ten", "6 7 8 9 10"),
        ("eleven", "eleven"),
        ("True", "yes"),
        ("entailment", "yes"),
        ("false", "no"),
        ("contradiction", "no"),
        ("dont", "don't"),
        ("don't", "don't"),
        ("Isn't", "isn't"),
        ("hes", "he's"),
        ("oclock", "o'clock"),
        ("Im", "im"),
        ("Ive", "ive"),
        ("let's", "lets"),
        ("somebody'd", "somebodyd"),
        # step 6: whitespace collapsed
        ("a   b", "b"),
        ("", ""),
    ],
)
def test_preprocess_answer(text, expected):
    assert preprocess_answer(text) == expected


@pytest.mark.parametrize(
    "reference, candidate, equal",
    [
        ("2", "two", True),
        ("yes", "true", True),
        ("1.5", "15", True),
        ("-5", "5", True),
        ("Sao Paulo", "São Paulo", False),
        ("don't", "dont", True),
    ],
)
def test_single_answer_exact_match(reference, candidate, equal):
    assert exact_match(reference, candidate, "templated") is equal


def test_single_answer_rules():
    assert exact_match("a&&b", "ab", "automatic")  # && is just punctuation outside multi_answer
    assert not exact_match("Paris", "", "2_hop")  # an empty candidate scores 0
    assert exact_match("Paris|London", "parislondon", "templated")  # without the caller's split, '|' is deleted
    assert exact_match("x y", "X  Y", "anything-else")  # exact_match itself accepts any type


@pytest.mark.parametrize("reference", ["The", "a", "!!!", "the answer is", " an "])
def test_reference_empty_after_preprocessing_raises(reference):
    with pytest.raises(ValueError, match="empty after preprocessing"):
        exact_match(reference, "x", "templated")


# --- multi_answer EM (section 2.3) ---------------------------------------------------------------


@pytest.mark.parametrize(
    "reference, candidate, passes",
    [
        ("red&&blue", "red", True),  # 1/2
        ("red&&blue&&green", "red", False),  # 1/3
        ("red&&blue&&green", "red, blue and yellow", True),  # 2/4
        ("red&&blue", "Red and Blue", True),
        ("red&&blue", "red & blue", True),
        ("red&&blue", "red AND blue", False),  # upper-case AND does not split
        ("red&&blue", "red\nand blue", False),  # "\nand " does not split
        ("red&&blue", "red;blue", False),
        ("red&&blue", "red/blue", False),
        ("red&&blue", "red&blue", False),
        ("salt&&pepper", "salt and pepper", True),  # two items
        ("salt and pepper", "salt and pepper", False),  # one reference item vs two candidate items: 0/3
        ("red&&red&&blue", "blue", True),  # set: {red, blue}
        ("the red&&a blue", "red, blue", True),
        ("red&&blue", "", False),
    ],
)
def test_multi_answer_iou(reference, candidate, passes):
    assert exact_match(reference, candidate, "multi_answer") is passes


@pytest.mark.parametrize("reference", ["&&", "the&&a", "!!!&&"])
def test_multi_answer_empty_reference_set_raises(reference):
    with pytest.raises(ValueError, match="no item left"):
        exact_match(reference, "x", "multi_answer")


# --- evaluate_example (section 2.4), EM only -----------------------------------------------------


@pytest.mark.parametrize(
    "references, candidate, question_type, score",
    [
        (["Paris", "Lutetia"], "lutetia", "templated", 1.0),
        (["Paris"], "London", "automatic", 0.0),
        (["red&&blue", "green"], "green", "multi_answer", 1.0),
        (["Mont Blanc"], "mont blanc", "2_hop", 1.0),
    ],
)
def test_evaluate_example_em_only(references, candidate, question_type, score):
    assert evaluate_example("q?", references, candidate, question_type) == score


@pytest.mark.parametrize(
    "references, question_type, message",
    [
        (["Paris", ""], "templated", "empty or non-str reference"),  # "Paris|" raises although Paris matches
        ([""], "templated", "empty or non-str reference"),
        (["Paris"], "multi-answer", "unknown question_type"),
        (["Paris"], "list", "unknown question_type"),
        (["Paris", "The"], "templated", "empty after preprocessing"),
        ([], "templated", "empty reference list"),
    ],
)
def test_evaluate_example_raises(references, question_type, message):
    with pytest.raises(ValueError, match=message):
        evaluate_example("q?", references, "Paris", question_type)


@pytest.mark.parametrize(
    "question_type, reference, expected",
    [
        ("multi_answer", "a&&b", "a,b"),
        ("list", "a&&b", "a,b"),
        ("multianswer", "a&&b", "a,b"),
        ("templated", "a&&b", "a&&b"),
        ("2_hop", "The Answer!", "The Answer!"),
    ],
)
def test_bem_reference_is_raw_with_multi_answer_separator_replaced(question_type, reference, expected):
    assert evqa.bem_reference(reference, question_type) == expected


# --- evaluate over many questions ---------------------------------------------------------------

QUESTIONS = [
    {"data_id": "E-VQA_0", "question": "q0", "answer": "Paris|Lutetia", "question_type": "templated"},
    {"data_id": "E-VQA_1", "question": "q1", "answer": "red&&blue", "question_type": "multi_answer"},
    {"data_id": "E-VQA_2", "question": "q2", "answer": "1.5", "question_type": "automatic"},
    {"data_id": "E-VQA_2hop_0", "question": "q3", "answer": "Mont Blanc", "question_type": "2_hop"},
]


def _predictions(*pairs):
    return [{"data_id": qid, "prediction": prediction} for qid, prediction in pairs]


def test_evaluate_groups_and_label():
    predictions = _predictions(
        ("E-VQA_0", "lutetia"), ("E-VQA_1", "blue"), ("E-VQA_2", "2"), ("E-VQA_2hop_0", "Mont Blanc")
    )
    result = evaluate(predictions, QUESTIONS)
    assert result["label"] == "EM only"
    assert result["single_hop"] == {"n": 3, "correct": 2.0, "accuracy": pytest.approx(200 / 3)}
    assert result["two_hop"] == {"n": 1, "correct": 1.0, "accuracy": 100.0}
    assert result["all"]["accuracy"] == 75.0
    assert result["per_question_type"]["automatic"]["accuracy"] == 0.0
    assert set(result["per_question_type"]) == {"templated", "multi_answer", "automatic", "2_hop"}


def test_evaluate_coverage_last_prediction_wins_and_strict():
    predictions = _predictions(("E-VQA_0", "London"), ("E-VQA_0", "Paris"), ("E-VQA_9", "x"), ("E-VQA_1", "green"))
    result, details = evqa.evaluate_with_details(predictions, QUESTIONS)
    assert result["all"] == {"n": 2, "correct": 1.0, "accuracy": 50.0}  # missing ids are not counted
    assert result["two_hop"] == {"n": 0, "correct": 0.0, "accuracy": None}
    coverage = result["coverage"]
    assert (coverage["n_missing"], coverage["n_unknown"], coverage["n_duplicated_ids"]) == (2, 1, 1)
    assert details == [
        {
            "data_id": "E-VQA_0",
            "question_type": "templated",
            "score": 1.0,
            "references": [
                {"answer": "Paris", "em": True, "bem": None},
                {"answer": "Lutetia", "em": False, "bem": None},
            ],
        },
        {
            "data_id": "E-VQA_1",
            "question_type": "multi_answer",
            "score": 0.0,
            "references": [{"answer": "red&&blue", "em": False, "bem": None}],
        },
    ]
    with pytest.raises(ValueError, match=r"2 missing id\(s\).*1 unknown id\(s\) \(E-VQA_9\).*1 duplicated"):
        evaluate(predictions, QUESTIONS, strict=True)


class TableJudge:
    """A judge whose P(equivalent) is a fixed table over (reference, candidate): the per-reference bookkeeping."""

    label = "table"

    def __init__(self, table):
        self.table = table

    def score_batch(self, triples):
        return [self.table.get((reference, candidate), 0.0) for _, reference, candidate in triples]


def test_per_reference_details_give_each_reference_its_em_and_the_judge_only_where_em_failed():
    questions = QUESTIONS + [
        {"data_id": "E-VQA_3", "question": "q", "answer": "Rome|Roma", "question_type": "templated"}
    ]
    judge = TableJudge({("Roma", "Città eterna"): 0.75, ("Rome", "Città eterna"): 0.25, ("red,blue", "green"): 0.5})
    predictions = _predictions(("E-VQA_0", "lutetia"), ("E-VQA_1", "green"), ("E-VQA_3", "Città eterna"))
    predictions.append({"data_id": "E-VQA_2", "prediction": "", "skipped": "query image missing"})
    _, details = evqa.evaluate_with_details(predictions, questions, bem=judge)
    by_id = {d["data_id"]: d for d in details}
    assert by_id["E-VQA_0"]["references"] == [
        {"answer": "Paris", "em": False, "bem": None},
        {"answer": "Lutetia", "em": True, "bem": None},
    ]
    assert by_id["E-VQA_3"]["score"] == 1.0 and by_id["E-VQA_3"]["references"] == [
        {"answer": "Rome", "em": False, "bem": 0.25},
        {"answer": "Roma", "em": False, "bem": 0.75},
    ]
    assert by_id["E-VQA_1"]["score"] == 1.0 and by_id["E-VQA_1"]["references"] == [
        {"answer": "red&&blue", "em": False, "bem": 0.5}
    ]  # BEM sees the && list as "red,blue"
    assert by_id["E-VQA_2"] == {
        "data_id": "E-VQA_2",
        "question_type": "automatic",
        "score": 0.0,
        "references": [{"answer": "1.5", "em": None, "bem": None}],
    }
    # the per-reference form scores exactly as the official per-question scorer
    for d in details:
        if d["data_id"] != "E-VQA_2":
            q = next(q for q in questions if q["data_id"] == d["data_id"])
            candidate = next(p["prediction"] for p in predictions if p["data_id"] == d["data_id"])
            assert (
                d["score"]
                == evqa.score_examples(
                    [
                        {
                            "question": q["question"],
                            "candidate": candidate,
                            "reference_list": q["answer"].split("|"),
                            "question_type": q["question_type"],
                        }
                    ],
                    judge,
                )[0]
            )


def test_evaluate_names_the_data_id_of_a_bad_question():
    questions = QUESTIONS + [{"data_id": "E-VQA_7", "question": "q", "answer": "Paris|", "question_type": "templated"}]
    with pytest.raises(ValueError, match="data_id E-VQA_7: empty or non-str reference"):
        evaluate(_predictions(("E-VQA_7", "Paris")), questions)
    with pytest.raises(ValueError, match="data_id E-VQA_0: an answer must be a str"):
        evaluate(_predictions(("E-VQA_0", None)), QUESTIONS)


def test_repeated_question_id_is_an_error():
    with pytest.raises(ValueError, match="appears twice"):
        evaluate([], QUESTIONS + QUESTIONS[:1])


# --- properties ---------------------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=examples(300), deadline=None)
@given(st.text())
def test_preprocess_answer_is_idempotent(text):
    once = preprocess_answer(text)
    assert preprocess_answer(once) == once


@pytest.mark.slow
@settings(max_examples=examples(200), deadline=None)
@given(st.text(), st.text(min_size=1), st.sampled_from(evqa.QUESTION_TYPES))
def test_em_only_score_is_zero_or_one_or_a_value_error(candidate, reference, question_type):
    try:
        score = evaluate_example("q", [reference], candidate, question_type)
    except ValueError as e:
        assert "empty" in str(e) or "no item left" in str(e)
    else:
        assert score in (0.0, 1.0)
