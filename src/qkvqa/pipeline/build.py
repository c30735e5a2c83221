"""What an evaluation builds before it predicts: the preflight checks, the article filter, the pipeline
(filter, CDA selector, generator) and the judge, from a composed config and its benchmark."""

from __future__ import annotations

from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from qkvqa.config.schema import STOP_AFTER  # declared with the config
from qkvqa.errors import ConfigError
from qkvqa.pipeline.filters import filter_kind


def preflight(cfg: DictConfig, benchmark: Any) -> Optional[dict]:
    """Before stage 1: the KB opens and every model the run will load has its weights (qff.checkpoint included),
    so a missing judge or generator stops the run in seconds, not after hours of generation; precomputed reranked
    results were made with this run's qff.alpha and qff.question_norm, over its KB, for its questions; cda.theta_on
    has the scores it compares. Returns what produced them (for
    the report's filter card; None for other filters and for a file of unknown origin)."""
    import os

    from qkvqa.components.registry import resolve_pretrained, spec_from_mapping
    from qkvqa.errors import MissingWeightsError
    from qkvqa.pipeline.protocol import used_components

    check_theta_on(cfg)
    benchmark.kb_store()
    for name in used_components(cfg):
        spec = spec_from_mapping(OmegaConf.to_container(cfg.components[name], resolve=True))
        if not spec.tiny and not os.path.isfile(os.path.expanduser(str(spec.pretrained))):  # a .pth loads too
            try:
                path = resolve_pretrained(spec)
            except MissingWeightsError as e:
                raise MissingWeightsError(f"components.{name}: {e}") from None
            static_checks(name, spec, path)
        else:
            static_checks(name, spec, None)
    return filter_kind(cfg.eval.filter).preflight(cfg, benchmark)  # the filter's own inputs (checkpoint, file)


def check_theta_on(cfg: DictConfig) -> None:
    """Refuse `cda.theta_on=qff` with a filter that computes no QFF scores (theta would have nothing to compare)."""
    if (
        cfg.eval.stop_after != "filter"
        and cfg.eval.context == "cda"
        and cfg.cda.mode == "full"
        and cfg.cda.theta is not None
        and cfg.cda.theta_on == "qff"
        and not filter_kind(cfg.eval.filter).qff_scores
    ):
        raise ConfigError(
            f"cda.theta_on=qff compares the articles' QFF scores, which eval.filter={cfg.eval.filter} does not "
            "compute; set cda.theta_on=fused or softmax, or eval.filter=qff"
        )


def static_checks(role: str, spec: Any, path: Optional[str]) -> None:
    """The checks a component's builder makes before it loads, made here before stage 1 without loading anything
    (issue 44: they were tracebacks or one-liners after stage 1 and the filter had run); each kind's own `preflight`
    (the encoders' options, the reranker's head and tokenizer files, a Qwen2.5-VL folder's chat template). `path`:
    its local folder, if known."""
    from pathlib import Path

    from qkvqa.components.registry import component_kind

    folder = Path(path) if path and Path(path).is_dir() else None
    component_kind(spec.kind).preflight(role, spec, folder)


def build_filter(cfg: DictConfig, benchmark: Any):
    """The article filter named by `eval.filter` (its kind builds it: `qkvqa.pipeline.filters.FILTER_KINDS`)."""
    return filter_kind(cfg.eval.filter).build(cfg, benchmark)


def build_pipeline(cfg: DictConfig, benchmark: Any, retrieval_seconds: float):
    """Filter, CDA selector and generator from the config's components."""
    from qkvqa.cda.select import ContextSelector, needs_reranker, needs_section_scores
    from qkvqa.components import build_component
    from qkvqa.generation.backends import build_generator
    from qkvqa.pipeline.pipeline import KBVQAPipeline

    if cfg.eval.stop_after not in STOP_AFTER:
        raise ConfigError(f"eval.stop_after must be one of {STOP_AFTER}, got {cfg.eval.stop_after!r}")
    if cfg.eval.stop_after == "filter":  # filter-only study: no CDA, no generator loaded
        return KBVQAPipeline(cfg.eval.filter, build_filter(cfg, benchmark), None, None, retrieval_seconds)
    generator = build_generator(cfg.components.generator, OmegaConf.to_object(cfg.generation))
    if cfg.generation.reader == "extractive":  # the demo's: answers from the context, no language model
        from qkvqa.generation.tiny import ExtractiveReader

        generator = ExtractiveReader(generator)
    if cfg.eval.context == "mllm_filter":
        from qkvqa.pipeline.mllm_filter import MLLMFilterSelector

        selector = MLLMFilterSelector(generator, cfg.generation.filter_top_n, benchmark.article_images())
    elif cfg.eval.context == "cda":
        if needs_section_scores(cfg.cda) and not filter_kind(cfg.eval.filter).section_scores:
            raise ConfigError(
                f"cda.top1_section_by={cfg.cda.top1_section_by} picks the section with QFF scores, "
                f"which eval.filter={cfg.eval.filter} does not compute; set cda.top1_section_by=bge or "
                "eval.filter=qff"
            )
        check_theta_on(cfg)
        splitter = build_component(cfg.components.splitter)
        reranker = build_component(cfg.components.reranker) if needs_reranker(cfg.cda) else None
        selector = ContextSelector(
            OmegaConf.to_object(cfg.cda), splitter, generator.count_tokens, reranker, float(cfg.qff.temperature)
        )
    else:
        raise ConfigError(f"eval.context must be cda or mllm_filter, got {cfg.eval.context!r}")
    return KBVQAPipeline(cfg.eval.filter, build_filter(cfg, benchmark), selector, generator, retrieval_seconds)


def build_judge(cfg: DictConfig, dataset: str):
    """BEM for E-VQA unless `eval.judge=em_only`; InfoSeek has no judge."""
    if dataset != "evqa" or cfg.eval.judge == "em_only":
        return None
    if cfg.eval.judge != "bem":
        raise ConfigError(f"eval.judge must be bem or em_only, got {cfg.eval.judge!r}")
    from qkvqa.components import build_component

    return build_component(cfg.components.judge)
