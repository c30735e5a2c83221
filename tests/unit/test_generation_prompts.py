"""Prompts: the appendix prompts verbatim per dataset x generator type, custom templates, MLLM filtering, summaries."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from PIL import Image

from qkvqa.config.schema import GenerationConfig
from qkvqa.errors import ConfigError
from qkvqa.generation import prompts as P
from qkvqa.generation.prompts import (
    GenerationRequest,
    Prompt,
    answer_prompt,
    fill_template,
    filter_prompts,
    merge_filter_outputs,
    summary_prompt,
)

PAPER = Path(__file__).resolve().parents[3] / "shared" / "paper" / "qkvqa-paper.txt"

# The paper's lines (appendix section 6), copied from the paper text.
PAPER_LINES = {
    ("evqa", "llm"): (
        "System Prompt Answer the encyclopedic question about the given image. Don’t mention the visual content of "
        "image in your output. Directly output the answer of the question according to the context. You are a "
        "helpful assistant for answering encyclopedic questions. If the context does not contain the information "
        "required to answer the question, you should answer the question using internal model knowledge.",
        "User Prompt - Context: { Chunks } - Question: { Textual question } The answer is:",
    ),
    ("evqa", "vlm"): (
        "System Prompt Answer the encyclopedic question about the given image. Don’t mention the visual content of "
        "image in your output. Directly output the answer of the question according to the context. If the context "
        "does not contain the information required to answer the question, you should answer the question using "
        "internal model knowledge.",
        "User Prompt - Context: { Chunks } - Question: { Textual question } { Query Image } The answer is:",
    ),
    ("infoseek", "llm"): (
        "System Prompt Answer the encyclopedic question about the given image. Don’t mention the visual content of "
        "image in your output. Directly output the answer of the question according to the context. You are a "
        "helpful assistant for answering encyclopedic questions. Do not answer anything else. If you need to "
        "answer questions about numbers or time, please output the corresponding numerical format directly. If "
        "the context does not contain the information required to answer the question, you should answer the "
        "question using internal model knowledge. There is an example: - Context: # Wiki Article: Dolomites "
        "##Section Title: Dolomites The Dolomites, also known as the Dolomite Mountains, Dolomite Alps or Dolomitic "
        "Alps, are a mountain range located in northeastern Italy. The Dolomites are located in the regions of "
        "Veneto, Trentino-Alto Adige/Südtirol and Friuli Venezia Giulia, covering an area shared between the "
        "provinces of Belluno, Vicenza, Verona, Trentino, South Tyrol, Udine and Pordenone. - Question: Which city "
        "or region does this mountain locate in? Just answer the questions, no explanations needed. Short answer "
        "is: Province of Belluno",
        "User Prompt - Context: { Chunks } - Question: { Textual question } Just answer the questions, no "
        "explanations needed. Short answer is:",
    ),
    ("infoseek", "vlm"): (
        "System Prompt Answer the encyclopedic question about the given image. Don’t mention the visual content of "
        "image in your output. Directly output the answer of the question according to the context. If you need "
        "to answer questions about numbers or time, please output the corresponding numerical format directly. If "
        "the context does not contain the information required to answer the question, you should answer the "
        "question using internal model knowledge. There is an example: - Context: # Wiki Article: Dolomites "
        "##Section Title: Dolomites The Dolomites, also known as the Dolomite Mountains, Dolomite Alps or Dolomitic "
        "Alps, are a mountain range located in northeastern Italy. The Dolomites are located in the regions of "
        "Veneto, Trentino-Alto Adige/Südtirol and Friuli Venezia Giulia, covering an area shared between the "
        "provinces of Belluno, Vicenza, Verona, Trentino, South Tyrol, Udine and Pordenone. - Question: Which city "
        "or region does this mountain locate in? Just answer the questions, no explanations needed. Short answer "
        "is: Province of Belluno",
        "User Prompt - Context: { Chunks } - Question: { Textual question } { Query Image } Just answer the "
        "questions, no explanations needed. Short answer is:",
    ),
    "filter": (
        "System Prompt You are an encyclopedia expert. Given the question, image and candidate article, filter out "
        "the information in the article that is relevant to answering the question. Do not directly answer the "
        "question.",
        "User Prompt {Query Image } - Question: { Textual question } { Candidate Image } - Context: { Sections }",
    ),
}


def as_paper_line(prompt: Prompt, image_names=("{ Query Image }",)) -> str:
    """The user message written the paper's way: images shown by their placeholder names, in order."""
    names = iter(image_names)
    return "User Prompt " + "".join(p if isinstance(p, str) else next(names) for p in prompt.parts)


@pytest.mark.parametrize("dataset,generator_type", sorted(P.PAPER_PROMPTS))
def test_appendix_prompts_verbatim_by_dataset_and_generator_type(dataset, generator_type):
    image = Image.new("RGB", (8, 8)) if generator_type == "vlm" else None
    request = GenerationRequest("{ Textual question }", "{ Chunks }", image or Image.new("RGB", (8, 8)), dataset)
    prompt = answer_prompt(request, generator_type, GenerationConfig())
    system_line, user_line = PAPER_LINES[(dataset, generator_type)]
    assert "System Prompt " + prompt.system == system_line
    assert as_paper_line(prompt) == user_line
    assert len(prompt.images) == (1 if generator_type == "vlm" else 0)  # an LLM never gets the image
    assert ("Dolomites" in prompt.system) == (dataset == "infoseek")


def test_filter_prompt_verbatim():
    article = SimpleNamespace(title="T", section_titles=["S"], section_texts=["x"])
    (prompt,) = filter_prompts("{ Textual question }", Image.new("RGB", (8, 8)), [article], [Image.new("RGB", (8, 8))])
    system_line, user_line = PAPER_LINES["filter"]
    assert "System Prompt " + prompt.system == system_line
    text = as_paper_line(prompt, ("{Query Image }", "{ Candidate Image }"))
    assert text == user_line.replace("{ Sections }", "# Wiki Article: T\n## Section Title: S\nx")


@pytest.mark.skipif(not PAPER.exists(), reason="the paper text is not beside this checkout")
def test_the_copied_lines_are_the_papers():
    lines = PAPER.read_text(encoding="utf-8").splitlines()
    for system_line, user_line in PAPER_LINES.values():
        assert system_line in lines and user_line in lines


def test_vlm_prompt_without_image_and_values_with_braces():
    request = GenerationRequest("what is {context}?", "ctx {question}", None, "evqa")
    prompt = answer_prompt(request, "vlm", GenerationConfig())
    assert prompt.parts == ("- Context: ctx {question} - Question: what is {context}? The answer is:",)
    assert fill_template("{image} - Q: {question}", {"question": "q"}, {"image": None}) == ("- Q: q",)


def test_custom_template():
    settings = GenerationConfig(
        prompt="template", template="Q: {question}\nC: {context}\nA:", template_system="Be brief."
    )
    image = Image.new("RGB", (8, 8))
    vlm = answer_prompt(GenerationRequest("q", "c", image, "infoseek"), "vlm", settings)
    assert vlm == Prompt("Be brief.", (image, "Q: q\nC: c\nA:"))  # no {image}: image first
    llm = answer_prompt(GenerationRequest("q", "c", image, "infoseek"), "llm", settings)
    assert llm == Prompt("Be brief.", ("Q: q\nC: c\nA:",))
    placed = GenerationConfig(prompt="template", template="{context} {image} {question}")
    assert answer_prompt(GenerationRequest("q", "c", image), "vlm", placed).parts == ("c ", image, " q")
    with pytest.raises(ConfigError, match="generation.template"):
        answer_prompt(GenerationRequest("q", "c"), "llm", GenerationConfig(prompt="template", template="{question}"))
    with pytest.raises(ConfigError, match="generation.prompt"):
        answer_prompt(GenerationRequest("q", "c"), "llm", GenerationConfig(prompt="fancy"))
    with pytest.raises(ConfigError, match="dataset"):
        answer_prompt(GenerationRequest("q", "c", None, "okvqa"), "llm", GenerationConfig())
    with pytest.raises(ConfigError, match="generator type"):
        answer_prompt(GenerationRequest("q", "c"), "audio", GenerationConfig())


def test_filter_prompts_over_the_top_articles():
    articles = [
        SimpleNamespace(
            title=f"A{i}",
            section_titles=["Intro", "References", "Habitat"],
            section_texts=[f"intro {i}", "refs", f"habitat {i}"],
        )
        for i in range(7)
    ]
    query = Image.new("RGB", (8, 8), "red")
    candidates = [Image.new("RGB", (8, 8), "blue") if i % 2 == 0 else None for i in range(7)]
    prompts = filter_prompts("where does it live?", query, articles, candidates, top_n=5)
    assert len(prompts) == 5
    assert prompts[0].parts == (
        query,
        " - Question: where does it live? ",
        candidates[0],
        " - Context: # Wiki Article: A0\n## Section Title: Intro\nintro 0\n"
        "# Wiki Article: A0\n## Section Title: Habitat\nhabitat 0",
    )
    assert prompts[1].parts[:2] == (
        query,
        " - Question: where does it live? - Context: # Wiki Article: A1\n"
        "## Section Title: Intro\nintro 1\n# Wiki Article: A1\n"
        "## Section Title: Habitat\nhabitat 1",
    )
    assert all("refs" not in p.user_text() for p in prompts)
    assert len(filter_prompts("q", None, articles[:2])) == 2
    with pytest.raises(ValueError, match="candidate images"):
        filter_prompts("q", query, articles, candidates[:2])
    assert (
        merge_filter_outputs([" It lives in rivers. ", "", "  ", "It nests in trees."])
        == "It lives in rivers.\nIt nests in trees."
    )


def test_summary_prompt():
    prompt = summary_prompt("Grey heron", "The grey heron is a bird.")
    assert prompt.system is None and prompt.images == []
    assert '"Grey heron"' in prompt.user_text() and prompt.user_text().endswith("The grey heron is a bird.\n\nSummary:")
    assert summary_prompt("T", "C", "{title}: {context}").parts == ("T: C",)
    with pytest.raises(ConfigError, match="summary_template"):
        summary_prompt("T", "C", "{title} only")
