"""The paper's rows: each table row an experiment reproduces, with every setting that row's number means, in one place.

An experiment names its row (`paper: table2/evqa_qwen`); the protocol card compares the run's config with the
row's settings and lists each difference as a reason ("cda.K1 = 8 where the row uses 4"). A row's `varies` are
the axes its table sweeps (Figure 5's alpha, Table 6's CDA grid): they are named on the card, not reasons. Its
readings (`READINGS`) are the settings where the paper's text and its owners' code differ, so that
the row's number may have been made either way: named on the card with the run's value, not reasons either.
Settings follow the paper and method.md; where the paper leaves a choice to OMGM's code (the top-1 section mix,
the reranker length, the image geometry), the row holds OMGM's value (docs/protocol.md).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class Model:
    """A component as a row means it: its kind and the released weights (a hub id; None: no weights to compare)."""

    kind: str
    weights: Optional[str] = None

    def __str__(self) -> str:
        return self.kind if self.weights is None else f"{self.kind} {self.weights}"


@dataclass(frozen=True)
class Trained:
    """qff.checkpoint as a row means it: a QFF trained by `qkvqa train` (`trained`), or the stock weights (None)."""

    trained: bool
    focus: Optional[str] = None  # the focus the QFF was trained with, when the row names one
    vit_dtype: str = "bf16"  # the dtype its frozen ViT ran in during training (method.md section 3: bf16)

    def __str__(self) -> str:
        if not self.trained:
            return "the stock BLIP-2 Q-Former (no trained checkpoint)"
        return "a QFF trained by `qkvqa train experiment=evqa_qff" + (
            f" qff.focus={self.focus}`" if self.focus else "`"
        )


# Stage 1's text side as the paper has it: OMGM's index of LLaMA-3 article summaries (imported), or summaries
# written here by `qkvqa summarize`. The lead section (qkvqa's default, free) is another text.
LLAMA3_SUMMARIES = "llama3_summaries"
STAGE1_TEXT = "stage1.text"  # a pseudo-key: what stage 1 embedded, read from the index manifest


@dataclass(frozen=True)
class PaperRow:
    """One row of the paper: its key (the experiment that reproduces it), title, dataset and settings."""

    key: str
    title: str
    dataset: str
    settings: Mapping[str, Any]
    varies: tuple[str, ...] = ()
    experiments: tuple[str, ...] = field(default=())  # experiment files that reproduce the row


EVA_CLIP = Model("evaclip_hf", "BAAI/EVA-CLIP-8B")
QWEN = Model("qwen2_5_vl", "Qwen/Qwen2.5-VL-7B-Instruct")
LLAMA3 = Model("llama3", "meta-llama/Meta-Llama-3-8B-Instruct")
REFLECTIVA = Model("reflectiva", "aimagelab/ReflectiVA")
CHUNK_TOKENS = {"evqa": 60, "infoseek": 90}  # L, method.md section 4

STAGE1 = {
    "retrieval.mode": "image_to_summary",
    "retrieval.top_k": 20,
    STAGE1_TEXT: LLAMA3_SUMMARIES,
    "components.image_encoder": EVA_CLIP,
    "components.text_encoder": EVA_CLIP,
}
QFF = {
    "eval.filter": "qff",
    "qff.checkpoint": Trained(True, "per_layer"),
    "qff.allow_untrained": False,
    "qff.focus": "per_layer",
    "qff.alpha": 0.9,
    "qff.score_direction": "question_to_section",
    "qff.question_max_tokens": 64,
    "qff.max_text_tokens": 512,
    "qff.image_transform": "targetpad",
    "qff.blip_text_preprocess": True,
    "components.qformer": Model("blip2_qff", "Salesforce/blip2-itm-vit-g"),
    "components.qformer.dtype": "fp16",
}
RERANKER = {"components.reranker": Model("bge_reranker", "BAAI/bge-reranker-v2-m3"), "cda.reranker_normalize": True}
CHUNKS = {"components.splitter": Model("spacy_sentencizer"), "cda.reranker_max_length": 512}
ARTICLES = {"cda.U": 2, "cda.theta": 0.01, "cda.K2": 2}
GENERATION = {
    "eval.stop_after": "generation",
    "generation.prompt": "auto",
    "generation.max_new_tokens": 128,
    "generation.reader": "generator",
}
# Table 5 before CDA: the top-1 section of the top-1 article by QFF and BGE-Reranker-v2-m3, mixed as OMGM's
# step 3 mixes them (test/step3_secaugmented_gen.py: beta * section similarity + (1 - beta) * sigmoid(BGE), beta
# 0.2 in scripts/step3_secaugmented_gen.sh; BGE reads the pair up to 6000 tokens, model/answer_generator.py).
TOP1_SECTION = {
    "eval.context": "cda",
    "cda.mode": "top1_section",
    "cda.top1_section_by": "fused",
    "cda.top1_section_beta": 0.2,
    "cda.top1_section_max_length": 6000,
    **RERANKER,
}


def _full(dataset: str, generator: Model, mode: str = "full") -> dict:
    """Stage 1 + QFF + CDA in `mode` + generation with `generator`, the paper's method on `dataset`."""
    cda = {"eval.context": "cda", "cda.mode": mode, "cda.chunk_tokens": CHUNK_TOKENS[dataset], **RERANKER, **CHUNKS}
    if mode == "full":
        cda.update(ARTICLES, **{"cda.K1": 4})
    elif mode == "top1_article_chunks":
        cda["cda.K1"] = 4
    return {**STAGE1, **QFF, **cda, **GENERATION, "components.generator": generator}


def _rows(*rows: PaperRow) -> dict[str, PaperRow]:
    return {row.key: row for row in rows}


PAPER_ROWS = _rows(
    PaperRow(
        "eval/evqa_qwen",
        "Table 2, QKVQA with Qwen2.5-VL-7B (no generator fine-tuning): E-VQA 48.0 (BEM, all)",
        "evqa",
        _full("evqa", QWEN),
        experiments=("eval/evqa_qwen",),
    ),
    PaperRow(
        "eval/infoseek_qwen",
        "Table 2, QKVQA with Qwen2.5-VL-7B (no generator fine-tuning): InfoSeek 36.3 (overall)",
        "infoseek",
        _full("infoseek", QWEN),
        experiments=("eval/infoseek_qwen",),
    ),
    PaperRow(
        "eval/evqa_llama3",
        "Table 2, QKVQA with LLaMA-3-8B: E-VQA 48.5 (BEM, all)",
        "evqa",
        _full("evqa", LLAMA3),
        experiments=("eval/evqa_llama3",),
    ),
    PaperRow(
        "eval/infoseek_llama3",
        "Table 2, QKVQA with LLaMA-3-8B: InfoSeek 34.5 (overall)",
        "infoseek",
        _full("infoseek", LLAMA3),
        experiments=("eval/infoseek_llama3",),
    ),
    PaperRow(
        "eval/evqa_llama31_ft",
        "Table 2, QKVQA with the fine-tuned LLaMA-3.1-8B (Gen. FT, ReflectiVA's generator): E-VQA 45.3 (BEM, all)",
        "evqa",
        _full("evqa", REFLECTIVA),
        experiments=("eval/evqa_llama31_ft",),
    ),
    PaperRow(
        "eval/infoseek_llama31_ft",
        "Table 2, QKVQA with the fine-tuned LLaMA-3.1-8B (Gen. FT, ReflectiVA's generator): InfoSeek 42.4 (overall)",
        "infoseek",
        _full("infoseek", REFLECTIVA),
        experiments=("eval/infoseek_llama31_ft",),
    ),
    PaperRow(
        "table2/evqa_qkvqa",
        "Table 2, QKVQA row (Qwen2.5-VL-7B): E-VQA 48.0, with context length and time per stage",
        "evqa",
        _full("evqa", QWEN),
        experiments=("table2/evqa_qkvqa",),
    ),
    PaperRow(
        "table2/evqa_mllm_filter",
        "Table 2, MLLM-based filtering: E-VQA 37.7, 9.77 s filtering per question",
        "evqa",
        {
            **STAGE1,
            "eval.filter": "retrieval",
            "eval.context": "mllm_filter",
            "generation.filter_top_n": 5,
            **GENERATION,
            "components.generator": QWEN,
        },
        experiments=("table2/evqa_mllm_filter",),
    ),
    PaperRow(
        "table4/evqa_recall",
        "Table 4, E-VQA Recall@K before and after the QFF (single-hop rows)",
        "evqa",
        {**STAGE1, **QFF, "retrieval.two_hop_policy": "exclude"},
        experiments=("table4/evqa_recall",),
    ),
    PaperRow(
        "table4/infoseek_recall",
        "Table 4, InfoSeek Recall@K before and after the QFF",
        "infoseek",
        {**STAGE1, **QFF},
        experiments=("table4/infoseek_recall",),
    ),
    PaperRow(
        "table5/evqa_no_finetuning",
        "Table 5, row 1 (QFF without basic fine-tuning): E-VQA 34.16",
        "evqa",
        {
            **STAGE1,
            **QFF,
            "qff.checkpoint": Trained(False),
            "qff.allow_untrained": True,
            "qff.focus": "none",
            **TOP1_SECTION,
            **GENERATION,
            "components.generator": QWEN,
        },
        experiments=("table5/evqa_no_finetuning",),
    ),
    PaperRow(
        "table5/evqa_basic_finetuning",
        "Table 5, row 2 (basic fine-tuning): E-VQA 44.19",
        "evqa",
        {
            **STAGE1,
            **QFF,
            "qff.checkpoint": Trained(True, "none"),
            "qff.focus": "none",
            **TOP1_SECTION,
            **GENERATION,
            "components.generator": QWEN,
        },
        experiments=("table5/evqa_basic_finetuning",),
    ),
    PaperRow(
        "table5/evqa_question_focus",
        "Table 5, row 3 (+ question focus): E-VQA 46.77, 281 context tokens",
        "evqa",
        {**STAGE1, **QFF, **TOP1_SECTION, **GENERATION, "components.generator": QWEN},
        experiments=("table5/evqa_question_focus",),
    ),
    PaperRow(
        "table5/evqa_first_chunk",
        "Table 5, row 4 (first chunk only): 55 context tokens",
        "evqa",
        _full("evqa", QWEN, "first_chunk"),
        experiments=("table5/evqa_first_chunk",),
    ),
    PaperRow(
        "table5/evqa_top1_article_chunks",
        "Table 5, row 5 (K1 chunks of the top-1 article): E-VQA 47.15, 213 tokens",
        "evqa",
        _full("evqa", QWEN, "top1_article_chunks"),
        experiments=("table5/evqa_top1_article_chunks",),
    ),
    PaperRow(
        "table5/evqa_full_cda",
        "Table 5, row 6 (full CDA): E-VQA 48.02, 246 context tokens",
        "evqa",
        _full("evqa", QWEN),
        experiments=("table5/evqa_full_cda",),
    ),
    PaperRow(
        "table6/infoseek_1k",
        "Table 6, CDA hyper-parameters on a 1K InfoSeek subset",
        "infoseek",
        _full("infoseek", QWEN),
        varies=("cda.U", "cda.theta", "cda.chunk_tokens", "cda.K1", "cda.K2"),
        experiments=("table6/infoseek_1k",),
    ),
    PaperRow(
        "figure5/alpha",
        "Figure 5, E-VQA single-hop article R@1 after the filter as alpha varies",
        "evqa",
        {**STAGE1, **QFF, "retrieval.two_hop_policy": "exclude"},
        varies=("qff.alpha",),
    ),
)
TITLES = {row.title: row for row in PAPER_ROWS.values()}


@dataclass(frozen=True)
class Reading:
    """A setting where the paper's text and its owners' code read differently, so that a row's number may have been
    made either way: named on the protocol card with the run's value, never a reason (docs/protocol.md "Readings").
    `key` is the config key of a switch, or the name of a behaviour qkvqa keeps one way (`switch` False)."""

    key: str
    text: str  # the reading of the paper's text: qkvqa's default
    others: tuple[str, ...]  # the other readings (the owners' code)
    evidence: str  # where the other reading comes from
    switch: bool = True


READINGS = {
    r.key: r
    for r in (
        Reading(
            "qff.question_norm",
            "per_token",
            ("across_tokens",),
            "OMGM's released step 2b normalises the question's query tokens with F.normalize's default dim=1, each "
            "channel across the 32 tokens (lavis/models/blip2_models/qformer_IT2IT_reranker.py, multimodal_query), "
            "about 4.9 times a cosine, so alpha 0.9 weighs the QFF about 5 times more",
        ),
        Reading(
            "cda.theta_on",
            "fused",
            ("qff", "softmax"),
            "the paper lists tau = 0.07 among its inference settings and selects articles 'based on QFF scores'",
        ),
        Reading(
            "cda.chunk_length_counts",
            "body",
            ("with_header",),
            "Table 5's first-chunk context lengths (55 tokens on E-VQA, 86 on InfoSeek) are below L (60, 90)",
        ),
        Reading(
            "candidate sections",
            "with text only",
            ("also empty ones, scored as header-only strings",),
            "OMGM scores a section without text as its '# Wiki Article / ## Section Title' string",
            switch=False,
        ),
        Reading(
            "decoding",
            "greedy",
            ("sampling at temperature 0.2, one question at a time",),
            "ReflectiVA's release scripts (--temperature 0.2, do_sample when above 0)",
            switch=False,
        ),
    )
}


def paper_row(name: Optional[str]) -> Optional[PaperRow]:
    """The row an experiment's `paper` names, by key (or by its title, as runs before the keys recorded it); None
    for no row. An unknown name is a ConfigError listing the keys."""
    if not name:
        return None
    row = PAPER_ROWS.get(name) or TITLES.get(name)
    if row is None:
        from qkvqa.errors import ConfigError

        raise ConfigError(
            f"paper={name!r} is not a paper row; use one of {', '.join(PAPER_ROWS)} "
            "(qkvqa.config.paper_rows), or leave `paper` unset"
        )
    return row


def show(value: Any) -> str:
    """A setting as the card writes it: null, true/false, numbers without float noise, text as it is."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _same(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, bool) or isinstance(value, bool):
        return value is wanted or value == wanted and type(value) is type(wanted)
    if isinstance(wanted, (int, float)) and isinstance(value, (int, float)):
        return math.isclose(float(value), float(wanted), rel_tol=1e-9, abs_tol=1e-12)
    return value == wanted


def weights_matched_by(pretrained: Optional[str], hub_id: str, converted_from: Optional[str] = None) -> Optional[str]:
    """How `pretrained` was found to name the row's released weights, or None when it does not: "the hub id", "the
    converter's record" (a directory `qkvqa convert-llava` made from that hub id), "the path" (a local copy whose
    path ends in the hub id) or "the name only" (a folder named like the release, `weights/Qwen2.5-VL-7B-Instruct`
    as the README's downloads leave them: a fine-tune saved under that name looks the same, which the card says)."""
    if converted_from is not None and converted_from.lower() == hub_id.lower():
        return "the converter's record"
    if not pretrained:
        return None
    ref = os.path.normpath(os.path.expanduser(str(pretrained))).replace(os.sep, "/").lower().rstrip("/")
    wanted = hub_id.lower()
    if ref == wanted:
        return "the hub id"
    if ref.endswith("/" + wanted):
        return "the path"
    if ref.rsplit("/", 1)[-1] == wanted.rsplit("/", 1)[-1]:
        return "the name only"
    return None


def weights_match(pretrained: Optional[str], hub_id: str, converted_from: Optional[str] = None) -> bool:
    """Whether `pretrained` names the row's released weights (`weights_matched_by`)."""
    return weights_matched_by(pretrained, hub_id, converted_from) is not None


def row_weights(row: PaperRow, component: str) -> Optional[str]:
    """The hub id of the weights `row` means for `components.<component>`, if it names any."""
    wanted = row.settings.get(f"components.{component}")
    return wanted.weights if isinstance(wanted, Model) else None


def _model_difference(key: str, spec: Any, wanted: Model, converted_from: Optional[str]) -> list[str]:
    out = []
    if spec.kind != wanted.kind:
        out.append(f"{key}.kind = {spec.kind} where the row uses {wanted.kind}")
    elif wanted.weights and not spec.tiny and not weights_match(spec.pretrained, wanted.weights, converted_from):
        out.append(f"{key}.pretrained = {spec.pretrained} where the row uses {wanted.weights}")
    return out


def _checkpoint_difference(cfg: Any, wanted: Trained, trained: Mapping[str, Any]) -> list[str]:
    checkpoint = cfg.qff.checkpoint
    if wanted.trained and not checkpoint:
        return [f"qff.checkpoint = null where the row uses {wanted}"]
    if not wanted.trained and checkpoint:
        return [f"qff.checkpoint = {checkpoint} where the row uses {wanted}"]
    out = []
    if wanted.trained and wanted.focus and trained.get("focus") and trained["focus"] != wanted.focus:
        out.append(
            f"qff.checkpoint {checkpoint} was trained with qff.focus={trained['focus']} where the row uses a "
            f"QFF trained with qff.focus={wanted.focus}"
        )
    if wanted.trained and trained.get("vit_dtype") and trained["vit_dtype"] != wanted.vit_dtype:
        out.append(
            f"qff.checkpoint {checkpoint} was trained with its ViT in {trained['vit_dtype']} where the row "
            f"trains it in {wanted.vit_dtype}"
        )
    return out


def row_differences(
    cfg: Any,
    row: PaperRow,
    *,
    stage1_text: Optional[str] = None,
    converted_from: Optional[Mapping[str, str]] = None,
    trained: Optional[Mapping[str, Any]] = None,
) -> list[str]:
    """Every setting of `cfg` that differs from what `row` means, as "KEY = VALUE where the row uses WANTED".

    `stage1_text`: what stage 1 embedded (`stage1.text`); `converted_from`: per component, the hub id its weights
    were converted from; `trained`: what qff.checkpoint records of its training (focus, vit_dtype), when known.
    """
    from omegaconf import OmegaConf

    reasons = []
    for key, wanted in row.settings.items():
        if key in row.varies:
            continue
        if key == STAGE1_TEXT:
            if stage1_text != wanted:
                reasons.append(
                    f"stage 1 embeds {stage1_text or 'an unknown text'} where the row uses OMGM's LLaMA-3 "
                    "article summaries (import OMGM's summary index, or `qkvqa summarize`; docs/retrieval.md)"
                )
            continue
        if isinstance(wanted, Model):
            spec = OmegaConf.select(cfg, key)
            reasons += _model_difference(key, spec, wanted, (converted_from or {}).get(key.split(".")[-1]))
            continue
        if isinstance(wanted, Trained):
            reasons += _checkpoint_difference(cfg, wanted, trained or {})
            continue
        value = OmegaConf.select(cfg, key)
        if not _same(value, wanted):
            reasons.append(f"{key} = {show(value)} where the row uses {show(wanted)}")
    return reasons


def varied_values(cfg: Any, row: PaperRow) -> dict[str, Any]:
    """The values of the row's swept axes in `cfg` (the cell of the table this run is)."""
    from omegaconf import OmegaConf

    return {key: OmegaConf.select(cfg, key) for key in row.varies}
