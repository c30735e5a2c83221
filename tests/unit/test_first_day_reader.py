"""Issue 34 item 4: the demo's generator answers from its context (a tiny extractive reader, stated as such)."""

from __future__ import annotations

import pytest

from qkvqa.config.load import compose
from qkvqa.generation.prompts import GenerationRequest
from qkvqa.generation.tiny import ExtractiveReader, extract_answer

CONTEXT = (
    "The species is native to the Andes. According to 3 surveys, the wingspan of the Azure warbler measures "
    "45 cm. Its diet consists mainly of small fish. The Azure warbler was first described by Ada Lind in 1887."
)


@pytest.mark.parametrize(
    "question, answer",
    [
        ("What is the wingspan of this bird?", "45 cm"),
        ("What does the diet of this bird consist of mainly?", "small fish"),
        ("In which year was this bird first described?", "1887"),
        ("Which region is this bird native to?", "the Andes"),
    ],
)
def test_the_reader_answers_with_the_span_of_the_sentence_the_question_asks_about(question, answer):
    assert extract_answer(question, CONTEXT) == answer


def test_the_reader_answers_from_the_context_it_is_given():
    question = "What is the wingspan of this bird?"
    assert extract_answer(question, "") == ""
    headed = "# Wiki Article: Azure warbler\n## Section Title: Description\nThe wingspan of the Azure warbler measures 45 cm."
    assert extract_answer(question, headed) == "45 cm"  # CDA's heading lines are not sentences
    assert extract_answer(question, "The wingspan of the Grey heron measures 90 cm.") == "90 cm"


@pytest.mark.slow
def test_the_demo_evaluates_with_the_reader_and_a_wrapped_generator_keeps_the_rest():
    from qkvqa.components import build_component

    cfg = compose("demo/evaluate", [], ["paths.world_dir=/nowhere"])
    assert cfg.generation.reader == "extractive"
    generator = build_component(cfg.components.generator)
    reader = ExtractiveReader(generator)
    assert reader.count_tokens("a few words") == generator.count_tokens("a few words")
    answers = reader.generate(
        [
            GenerationRequest("What is the wingspan of this bird?", CONTEXT),
            GenerationRequest("What is the wingspan of this bird?", ""),
        ]
    )
    assert answers == ["45 cm", ""]
