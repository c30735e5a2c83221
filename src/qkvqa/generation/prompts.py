"""Generator prompts: the paper's appendix prompts (section 6.1-6.5) verbatim, ReflectiVA's answering conversation, custom templates, and the summary prompt."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping, Optional, Sequence, Union

from qkvqa.data.sections import candidate_sections
from qkvqa.errors import ConfigError

if TYPE_CHECKING:
    from PIL.Image import Image

    from qkvqa.cda.chunker import ArticleLike
    from qkvqa.config.schema import GenerationConfig

DATASETS = ("evqa", "infoseek")
GENERATOR_TYPES = ("llm", "vlm")
PROMPT_MODES = ("auto", "template")

# Appendix section 6, copied verbatim from the paper text. The paper prints each prompt on one line,
# so no line breaks can be recovered; `{context}` stands for "{ Chunks }", `{question}` for
# "{ Textual question }", `{image}` for "{ Query Image }" and `{candidate_image}` for "{ Candidate Image }".
DOLOMITES_EXAMPLE = (
    "There is an example: - Context: # Wiki Article: Dolomites ##Section Title: Dolomites The Dolomites, also "
    "known as the Dolomite Mountains, Dolomite Alps or Dolomitic Alps, are a mountain range located in "
    "northeastern Italy. The Dolomites are located in the regions of Veneto, Trentino-Alto Adige/Südtirol and "
    "Friuli Venezia Giulia, covering an area shared between the provinces of Belluno, Vicenza, Verona, Trentino, "
    "South Tyrol, Udine and Pordenone. - Question: Which city or region does this mountain locate in? Just "
    "answer the questions, no explanations needed. Short answer is: Province of Belluno"
)

EVQA_LLM_SYSTEM = (
    "Answer the encyclopedic question about the given image. Don’t mention the visual content of image in your "
    "output. Directly output the answer of the question according to the context. You are a helpful assistant "
    "for answering encyclopedic questions. If the context does not contain the information required to answer "
    "the question, you should answer the question using internal model knowledge."
)
EVQA_LLM_USER = "- Context: {context} - Question: {question} The answer is:"

EVQA_VLM_SYSTEM = (
    "Answer the encyclopedic question about the given image. Don’t mention the visual content of image in your "
    "output. Directly output the answer of the question according to the context. If the context does not "
    "contain the information required to answer the question, you should answer the question using internal "
    "model knowledge."
)
EVQA_VLM_USER = "- Context: {context} - Question: {question} {image} The answer is:"

INFOSEEK_LLM_SYSTEM = (
    "Answer the encyclopedic question about the given image. Don’t mention the visual content of image in your "
    "output. Directly output the answer of the question according to the context. You are a helpful assistant "
    "for answering encyclopedic questions. Do not answer anything else. If you need to answer questions about "
    "numbers or time, please output the corresponding numerical format directly. If the context does not "
    "contain the information required to answer the question, you should answer the question using internal "
    "model knowledge. " + DOLOMITES_EXAMPLE
)
INFOSEEK_LLM_USER = (
    "- Context: {context} - Question: {question} Just answer the questions, no explanations needed. Short answer is:"
)

INFOSEEK_VLM_SYSTEM = (
    "Answer the encyclopedic question about the given image. Don’t mention the visual content of image in your "
    "output. Directly output the answer of the question according to the context. If you need to answer "
    "questions about numbers or time, please output the corresponding numerical format directly. If the context "
    "does not contain the information required to answer the question, you should answer the question using "
    "internal model knowledge. " + DOLOMITES_EXAMPLE
)
INFOSEEK_VLM_USER = (
    "- Context: {context} - Question: {question} {image} Just answer the questions, no "
    "explanations needed. Short answer is:"
)

# Appendix 6.5: the MLLM-filtering baseline (paper Table 2), one request per top-ranked article.
FILTER_SYSTEM = (
    "You are an encyclopedia expert. Given the question, image and candidate article, filter out the information "
    "in the article that is relevant to answering the question. Do not directly answer the question."
)
FILTER_USER = "{image} - Question: {question} {candidate_image} - Context: {context}"

# (dataset, generator type) -> (system prompt, user template).
PAPER_PROMPTS = {
    ("evqa", "llm"): (EVQA_LLM_SYSTEM, EVQA_LLM_USER),
    ("evqa", "vlm"): (EVQA_VLM_SYSTEM, EVQA_VLM_USER),
    ("infoseek", "llm"): (INFOSEEK_LLM_SYSTEM, INFOSEEK_LLM_USER),
    ("infoseek", "vlm"): (INFOSEEK_VLM_SYSTEM, INFOSEEK_VLM_USER),
}

# Ours (not in the paper): per-article summaries for the image_to_summary index, whose text
# encoder (EVA-CLIP) reads at most 77 tokens, hence "short".
DEFAULT_SUMMARY_TEMPLATE = (
    'Summarize the following Wikipedia article about "{title}" in one or two short sentences. Say what it is '
    "and name its most distinctive features, including how it looks if the article says so.\n\n{context}\n\n"
    "Summary:"
)

FILTER_MERGE_JOINER = "\n"

# ReflectiVA's answering conversation (aimagelab/ReflectiVA rag_evaluation/{encyclopedic,infoseek}/release_retrieval.py
# `concat_paragraph`, conv mode llama_3_1 of llava/conversation.py): the system prompt of conv_llava_llama_3_1, the
# user's image and question (IMAGE_TOKEN = "<image>\n\n"), the assistant's "[Retrieval]", then the user's passages,
# with ". Give a short answer." under --short_prompt, which both release scripts (scripts/ReflectiVA_*.sh) pass.
REFLECTIVA_SYSTEM = (
    "You are a helpful language and vision assistant. You are able to understand the visual content "
    "that the user provides, and assist the user with a variety of tasks using natural language."
)
REFLECTIVA_IMAGE_SEPARATOR = "\n\n"
REFLECTIVA_RETRIEVAL = "[Retrieval]"
REFLECTIVA_PARAGRAPH = "Consider this paragraph: <paragraph>{context}</paragraph>"
REFLECTIVA_SHORT = ". Give a short answer."

Part = Union[str, "Image"]


@dataclass(frozen=True)
class Prompt:
    """A chat prompt: an optional system message and a user message made of text parts and images, in order."""

    system: Optional[str]
    parts: tuple[Part, ...]
    # earlier turns, before the final user message: (role, parts) with role user | assistant (ReflectiVA's prompt)
    history: tuple[tuple[str, tuple[Part, ...]], ...] = ()

    @property
    def images(self) -> list["Image"]:
        """The images of the earlier turns, then of the user message, in order."""
        return [part for _, parts in self.history for part in parts if not isinstance(part, str)] + [
            part for part in self.parts if not isinstance(part, str)
        ]

    def user_text(self) -> str:
        """The user message without its images (what a text-only LLM reads)."""
        return "".join(part for part in self.parts if isinstance(part, str))


@dataclass
class GenerationRequest:
    """One question to answer: the question, the CDA context, the query image (or None) and the dataset."""

    question: str
    context: str
    image: Optional["Image"] = None
    dataset: str = "evqa"  # evqa | infoseek: picks the appendix prompt


def fill_template(
    template: str, text: Mapping[str, str], images: Optional[Mapping[str, Optional["Image"]]] = None
) -> tuple[Part, ...]:
    """Substitute `{name}` placeholders in one pass: text values verbatim, images as separate parts.

    An image placeholder whose image is None is removed with the spaces before it (or, at the very
    start, after it), so that no double or leading space remains. Values are never searched for
    placeholders.
    """
    images = images or {}
    names = [*text, *images]
    parts: list[Part] = []
    buffer, position, strip_next = "", 0, False
    for match in re.finditer(r"\{(" + "|".join(re.escape(n) for n in names) + r")\}", template) if names else ():
        literal = template[position : match.start()]
        buffer += literal.lstrip(" ") if strip_next else literal
        position, strip_next = match.end(), False
        name = match.group(1)
        if name in text:
            buffer += str(text[name])
        elif images[name] is None:
            buffer = buffer.rstrip(" ")
            strip_next = not buffer and not parts
        else:
            if buffer:
                parts.append(buffer)
            parts.append(images[name])
            buffer = ""
    tail = template[position:]
    buffer += tail.lstrip(" ") if strip_next else tail
    if buffer:
        parts.append(buffer)
    return tuple(parts)


def check_generator_type(generator_type: str) -> None:
    """Raise ConfigError unless `generator_type` is llm or vlm."""
    if generator_type not in GENERATOR_TYPES:
        raise ConfigError(f"generator type {generator_type!r} is not one of {', '.join(GENERATOR_TYPES)}")


def answer_prompt(request: GenerationRequest, generator_type: str, settings: "GenerationConfig") -> Prompt:
    """The answer prompt of a request: the appendix prompt for (dataset, generator type), or the configured template.

    With `generation.prompt: template`, `generation.template` must contain `{question}` and
    `{context}`; a VLM's image goes where `{image}` is, else before the text. LLMs never see images.
    """
    check_generator_type(generator_type)
    if request.dataset not in DATASETS:
        raise ConfigError(f"request dataset {request.dataset!r} is not one of {', '.join(DATASETS)}")
    image = request.image if generator_type == "vlm" else None
    values = {"question": request.question, "context": request.context}
    if settings.prompt == "auto":
        system, template = PAPER_PROMPTS[(request.dataset, generator_type)]
    elif settings.prompt == "template":
        template = settings.template
        if not template or "{question}" not in template or "{context}" not in template:
            raise ConfigError(
                "generation.prompt=template needs generation.template with {question} and {context}; "
                f"got {template!r}"
            )
        system = settings.template_system
        if "{image}" not in template and image is not None:
            return Prompt(system, (image, *fill_template(template, values)))
    else:
        raise ConfigError(f"generation.prompt: {settings.prompt!r} is not one of {', '.join(PROMPT_MODES)}")
    return Prompt(system, fill_template(template, values, {"image": image}))


def reflectiva_prompt(request: GenerationRequest, short: bool = True) -> Prompt:
    """ReflectiVA's answering conversation for a request: user image + question, assistant "[Retrieval]", user
    passages (the CDA context), ending where the assistant answers. Without an image the question stands alone."""
    if request.dataset not in DATASETS:
        raise ConfigError(f"request dataset {request.dataset!r} is not one of {', '.join(DATASETS)}")
    first: tuple[Part, ...] = (
        (request.image, REFLECTIVA_IMAGE_SEPARATOR + request.question)
        if request.image is not None
        else (request.question,)
    )
    passages = REFLECTIVA_PARAGRAPH.replace("{context}", request.context) + (REFLECTIVA_SHORT if short else "")
    return Prompt(REFLECTIVA_SYSTEM, (passages,), history=(("user", first), ("assistant", (REFLECTIVA_RETRIEVAL,))))


def article_sections_text(article: "ArticleLike") -> str:
    """The article's candidate section strings (no references / external links), joined by newlines."""
    return "\n".join(
        section.text for section in candidate_sections(article.title, article.section_titles, article.section_texts)
    )


def filter_prompts(
    question: str,
    image: Optional["Image"],
    articles: Sequence["ArticleLike"],
    candidate_images: Optional[Sequence[Optional["Image"]]] = None,
    top_n: int = 5,
) -> list[Prompt]:
    """Appendix 6.5 prompts of the MLLM-filtering baseline: one per article among the first `top_n` (ranked order).

    `candidate_images[i]` is the image of `articles[i]` (None when it has none); `{ Sections }` is the
    article's candidate section strings joined by newlines.
    """
    chosen = list(articles)[:top_n]
    if candidate_images is not None and len(candidate_images) < len(chosen):
        raise ValueError(f"{len(candidate_images)} candidate images for {len(chosen)} articles")
    prompts = []
    for i, article in enumerate(chosen):
        candidate = candidate_images[i] if candidate_images is not None else None
        prompts.append(
            Prompt(
                FILTER_SYSTEM,
                fill_template(
                    FILTER_USER,
                    {"question": question, "context": article_sections_text(article)},
                    {"image": image, "candidate_image": candidate},
                ),
            )
        )
    return prompts


def merge_filter_outputs(outputs: Sequence[str]) -> str:
    """The context the generator answers from after MLLM filtering: the non-empty filtered outputs, one per line."""
    return FILTER_MERGE_JOINER.join(text.strip() for text in outputs if text.strip())


def summary_prompt(title: str, context: str, template: Optional[str] = None) -> Prompt:
    """The prompt asking for a short summary of one article (`{title}` and `{context}` in the template)."""
    template = template or DEFAULT_SUMMARY_TEMPLATE
    if "{context}" not in template:
        raise ConfigError(f"generation.summary_template must contain {{context}}; got {template!r}")
    return Prompt(None, fill_template(template, {"title": title, "context": context}))
