"""Question readers: E-VQA CSVs, EchoSight-style InfoSeek CSVs, the official InfoSeek JSONL files and ReflectiVA's
webdataset query shards."""

from __future__ import annotations

import csv
import difflib
import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional

from qkvqa.errors import DataError
from qkvqa.utils.io import iter_jsonl, not_utf8
from qkvqa.utils.logging import get_logger

log = get_logger(__name__)

SINGLE_HOP_TYPES = ("templated", "automatic", "multi_answer")
TWO_HOP_TYPE = "2_hop"
INFOSEEK_CSV_TYPE = "infoseek"
EVQA_QUESTION_TYPES = SINGLE_HOP_TYPES + (TWO_HOP_TYPE,)
# Rows EchoSight and OMGM train on (data-formats.md section 1).
TRAINING_QUESTION_TYPES = frozenset(SINGLE_HOP_TYPES + (INFOSEEK_CSV_TYPE,))
INFOSEEK_ANSWER_TYPES = ("string", "numerical", "time")

# Columns a question CSV must have; the other E-VQA columns are kept in `Question.row` when present.
EVQA_REQUIRED_COLUMNS = (
    "question",
    "answer",
    "dataset_image_ids",
    "dataset_name",
    "question_type",
    "wikipedia_url",
    "wikipedia_title",
    "evidence_section_id",
    "evidence_section_title",
)
INFOSEEK_CSV_REQUIRED_COLUMNS = EVQA_REQUIRED_COLUMNS + ("data_id",)
INFOSEEK_REFERENCE_FIELDS = ("data_id", "answer_eval", "data_split")


@dataclass(frozen=True)
class InfoSeekReference:
    """One line of the official `infoseek_val.jsonl`, joined with its `infoseek_val_qtype.jsonl` type."""

    data_id: str
    answer_eval: Any  # list of strings, or list of / one {"wikidata", "range"} dict
    data_split: str  # val_unseen_question | val_unseen_entity | ...
    question_type: Optional[str]  # String | Numerical | Time (None without a qtype file)
    question: str
    image_id: str
    answer: list[str]
    source: str  # "file:line"


@dataclass
class Question:
    """One question with its gold article, evidence section and images; `row` keeps every source column."""

    data_id: str
    question: str
    answers: list[str]  # raw answer split on '|' (annotator alternatives)
    raw_answer: str
    question_type: str
    image_id: str  # the FIRST of image_ids (the only one used)
    image_ids: list[str]
    dataset_name: str  # inaturalist | landmarks | infoseek
    gold_urls: list[str]  # one URL; two for 2_hop (hop 1: the entity in the image)
    gold_title: str  # the `wikipedia_title` field as written (per hop: gold_titles)
    evidence_section_id: Optional[int]  # index into the (first) gold entry's unfiltered section lists
    evidence_section_title: str  # the field as written (2_hop: `a|b`; per hop: evidence_section_titles)
    split: str
    source: str  # "file:line" of the row
    row: dict[str, Any] = field(default_factory=dict)
    reference: Optional[InfoSeekReference] = None  # InfoSeek scoring data, when joined
    # Per hop, parallel to gold_urls (one hop; two for 2_hop, whose fields hold `a|b`, google-research
    # encyclopedic_vqa/README.md): the article title (None where the file gives one title for two URLs), the
    # evidence section's index into that article's unfiltered section lists and its title.
    gold_titles: list[Optional[str]] = field(default_factory=list)
    evidence_section_ids: list[Optional[int]] = field(default_factory=list)
    evidence_section_titles: list[Optional[str]] = field(default_factory=list)
    # `wikipedia_url_used_in_train` (E-VQA): whether the gold URL is also a training question's; None when the file
    # has no such column or the row leaves it empty (EchoSight's InfoSeek CSVs).
    url_used_in_train: Optional[bool] = None

    @property
    def gold_url(self) -> str:
        """The gold article URL (the first one for 2_hop)."""
        return self.gold_urls[0]

    @property
    def hops(self) -> list[dict[str, Any]]:
        """`{url, title, section_index, section_title}` per gold URL, in the file's order (two for 2_hop)."""

        def at(values: list, i: int) -> Any:
            return values[i] if i < len(values) else None

        return [
            {
                "url": url,
                "title": at(self.gold_titles, i),
                "section_index": at(self.evidence_section_ids, i),
                "section_title": at(self.evidence_section_titles, i),
            }
            for i, url in enumerate(self.gold_urls)
        ]


def is_training_question(question: Question) -> bool:
    """True for the rows EchoSight and OMGM train on (templated, automatic, multi_answer, infoseek)."""
    return question.question_type in TRAINING_QUESTION_TYPES


def _open_csv(path: Path, required: Iterable[str]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line, row) of a CSV after checking its header; a short or long row raises DataError."""
    if not path.is_file():
        raise DataError(f"{path}: question file not found")
    with open(path, newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        try:
            header = reader.fieldnames or []
        except UnicodeDecodeError as e:
            raise DataError(not_utf8(path, e)) from None
        missing = [name for name in required if name not in header]
        if missing:
            hints = []
            for name in missing:
                close = difflib.get_close_matches(name, header, n=1)
                hints.append(f"'{name}'" + (f" (found '{close[0]}')" if close else ""))
            raise DataError(
                f"{path}: line 1: missing column(s) {', '.join(hints)}; the header has: "
                f"{', '.join(header) or '(nothing)'}"
            )
        try:
            for row in reader:
                line = reader.line_num
                if None in row:
                    raise DataError(
                        f"{path}: line {line}: {len(header) + len(row[None])} fields but the header has {len(header)}"
                    )
                short = [name for name, value in row.items() if value is None]
                if short:
                    raise DataError(
                        f"{path}: line {line}: field '{short[0]}': missing ({len(header) - len(short)} "
                        f"fields but the header has {len(header)})"
                    )
                yield line, row
        except csv.Error as e:
            raise DataError(f"{path}: line {reader.line_num}: malformed CSV ({e})") from e
        except UnicodeDecodeError as e:
            raise DataError(not_utf8(path, e)) from None


def _parse_section_id(path: Path, line: int, value: str, question_type: str = "") -> Optional[int]:
    value = value.strip()
    if not value:
        return None
    try:
        number = float(value)
    except ValueError:
        number = float("nan")
    if number != number or number != int(number) or number < 0:
        hint = " (only 2_hop rows hold two ids joined by '|')" if "|" in value and question_type != TWO_HOP_TYPE else ""
        raise DataError(f"{path}: line {line}: field 'evidence_section_id': {value!r} is not a section index{hint}")
    return int(number)


# `wikipedia_url_used_in_train` as the E-VQA release writes it ("Boolean", pandas' True / False); empty: not known.
USED_IN_TRAIN_COLUMN = "wikipedia_url_used_in_train"
_BOOLEANS = {"true": True, "false": False}


def _parse_used_in_train(path: Path, line: int, row: dict[str, str]) -> Optional[bool]:
    value = (row.get(USED_IN_TRAIN_COLUMN) or "").strip()
    if not value:
        return None
    if value.lower() not in _BOOLEANS:
        raise DataError(
            f"{path}: line {line}: field '{USED_IN_TRAIN_COLUMN}': {value!r} is neither True nor False "
            f"(the E-VQA release writes True or False; leave it empty when unknown)"
        )
    return _BOOLEANS[value.lower()]


def _hop_values(path: Path, line: int, name: str, value: str, hops: int, allow_one: bool = False) -> list[str]:
    """The `|`-joined values of a 2_hop field, one per hop: exactly `hops` of them (or one with `allow_one`), none
    empty; an empty field gives []."""
    if not value.strip():
        return []
    parts = [p.strip() for p in value.split("|")]
    if len(parts) != hops and not (allow_one and len(parts) == 1) or not all(parts):
        raise DataError(
            f"{path}: line {line}: field '{name}': {value!r} holds {len(parts)} value(s)"
            f"{' with an empty one' if len(parts) == hops else ''}; a 2_hop row holds {hops} joined by '|' "
            f"(one per URL of wikipedia_url, google-research encyclopedic_vqa/README.md)"
        )
    return parts


def _question_from_row(path: Path, line: int, row: dict[str, str], data_id: str, split: str) -> Question:
    """Build a Question from one E-VQA-layout row, checking the fields it uses."""

    def fail(name: str, problem: str) -> DataError:
        return DataError(f"{path}: line {line}: field '{name}': {problem}")

    question_type = row["question_type"].strip()
    for name in ("question", "answer", "dataset_name", "wikipedia_url"):
        if not row[name].strip():
            raise fail(name, "empty")
    image_ids = [i.strip() for i in row["dataset_image_ids"].split("|") if i.strip()]
    if not image_ids:
        raise fail("dataset_image_ids", "no image id")
    gold_urls = [u.strip() for u in row["wikipedia_url"].split("|")]
    if question_type == TWO_HOP_TYPE:
        if len(gold_urls) != 2 or not all(gold_urls):
            raise fail(
                "wikipedia_url",
                f"{row['wikipedia_url']!r}: a 2_hop row holds two URLs joined by '|' "
                f"(google-research encyclopedic_vqa/README.md), found {len(gold_urls)} "
                f"value(s){' with an empty one' if len(gold_urls) == 2 else ''}",
            )
        ids = [
            _parse_section_id(path, line, v, question_type)
            for v in _hop_values(path, line, "evidence_section_id", row["evidence_section_id"], 2)
        ]
        section_titles: list[Optional[str]] = list(
            _hop_values(path, line, "evidence_section_title", row["evidence_section_title"], 2)
        )
        titles: list[Optional[str]] = list(
            _hop_values(path, line, "wikipedia_title", row["wikipedia_title"], 2, allow_one=True)
        )
        if len(titles) == 1:  # the README documents two values only for the three other fields
            titles.append(None)
    else:
        gold_urls = [u for u in gold_urls if u]
        if len(gold_urls) != 1:
            raise fail("wikipedia_url", f"{len(gold_urls)} URLs for a {question_type} question (expected 1)")
        section_id = _parse_section_id(path, line, row["evidence_section_id"], question_type)
        ids = [section_id] if section_id is not None else []
        section_titles = [row["evidence_section_title"]] if row["evidence_section_title"].strip() else []
        titles = [row["wikipedia_title"]]
    return Question(
        data_id=data_id,
        question=row["question"],
        answers=row["answer"].split("|"),
        raw_answer=row["answer"],
        question_type=question_type,
        image_id=image_ids[0],
        image_ids=image_ids,
        dataset_name=row["dataset_name"].strip(),
        gold_urls=gold_urls,
        gold_title=row["wikipedia_title"],
        evidence_section_id=ids[0] if ids else None,
        evidence_section_title=row["evidence_section_title"],
        split=row.get("encyclopedic_vqa_split") or split,
        source=f"{path}:{line}",
        row=dict(row),
        gold_titles=titles,
        evidence_section_ids=ids,
        evidence_section_titles=section_titles,
        url_used_in_train=_parse_used_in_train(path, line, row),
    )


def read_evqa_csv(path: str | os.PathLike, split: str = "", include_two_hop: bool = False) -> list[Question]:
    """Read an E-VQA question CSV in file order.

    `data_id` is `E-VQA_{i}`, with i the 0-based position among the single-hop rows (templated,
    automatic, multi_answer), exactly as EchoSight and OMGM number them. With `include_two_hop`, the
    2_hop rows are kept too, as `E-VQA_2hop_{j}` (j among the 2_hop rows), so single-hop ids never shift.
    """
    path = Path(path)
    questions: list[Question] = []
    counts: Counter[str] = Counter()
    for line, row in _open_csv(path, EVQA_REQUIRED_COLUMNS):
        question_type = row["question_type"].strip()
        if question_type not in EVQA_QUESTION_TYPES:
            raise DataError(
                f"{path}: line {line}: field 'question_type': unknown type {question_type!r}; "
                f"expected one of {', '.join(EVQA_QUESTION_TYPES)}"
            )
        if question_type == TWO_HOP_TYPE:
            data_id = f"E-VQA_2hop_{counts[TWO_HOP_TYPE]}"
        else:
            data_id = f"E-VQA_{sum(counts[t] for t in SINGLE_HOP_TYPES)}"
        counts[question_type] += 1
        if question_type == TWO_HOP_TYPE and not include_two_hop:
            continue
        questions.append(_question_from_row(path, line, row, data_id, split))
    single = sum(counts[t] for t in SINGLE_HOP_TYPES)
    log.info(
        "E-VQA %s: %d single-hop questions (%s), %d 2_hop (%s)",
        path,
        single,
        ", ".join(f"{t} {counts[t]}" for t in SINGLE_HOP_TYPES),
        counts[TWO_HOP_TYPE],
        "kept" if include_two_hop else "excluded",
    )
    return questions


def read_infoseek_csv(path: str | os.PathLike, split: str = "") -> list[Question]:
    """Read an EchoSight-style InfoSeek CSV (E-VQA columns plus `data_id`); a repeated data_id is an error."""
    path = Path(path)
    questions: list[Question] = []
    first_line: dict[str, int] = {}
    for line, row in _open_csv(path, INFOSEEK_CSV_REQUIRED_COLUMNS):
        data_id = row["data_id"].strip()
        if not data_id:
            raise DataError(f"{path}: line {line}: field 'data_id': empty")
        if data_id in first_line:
            raise DataError(f"{path}: line {line}: field 'data_id': {data_id!r} already on line {first_line[data_id]}")
        first_line[data_id] = line
        questions.append(_question_from_row(path, line, row, data_id, split))
    log.info("InfoSeek %s: %d questions", path, len(questions))
    return questions


def _check_answer_eval(path: Path, line: int, value: Any) -> None:
    """answer_eval is a list of strings, or a list of / one {"wikidata", "range": [lo, hi]} dict."""
    first = value[0] if isinstance(value, list) and value else value
    if isinstance(value, list) and all(isinstance(v, str) for v in value) and value:
        return
    if isinstance(first, dict):
        bounds = first.get("range")
        if isinstance(bounds, list) and len(bounds) == 2 and all(isinstance(b, (int, float)) for b in bounds):
            return
    raise DataError(
        f"{path}: line {line}: field 'answer_eval': expected a non-empty list of strings or "
        f'[{{"wikidata": x, "range": [lo, hi]}}], found {json.dumps(value)[:80]}'
    )


def _iter_json_lines(path: Path) -> Iterator[tuple[int, dict]]:
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    try:
        for line, obj in iter_jsonl(path):
            if not isinstance(obj, dict):
                raise DataError(f"{path}: line {line}: expected a JSON object, found {type(obj).__name__}")
            yield line, obj
    except DataError:
        raise
    except ValueError as e:  # malformed JSON or not UTF-8, already naming the file and the line
        raise DataError(str(e)) from None


def read_infoseek_qtypes(path: str | os.PathLike) -> dict[str, str]:
    """`infoseek_val_qtype.jsonl`: data_id -> String | Numerical | Time (checked case-insensitively)."""
    path = Path(path)
    qtypes: dict[str, str] = {}
    for line, obj in _iter_json_lines(path):
        for name in ("data_id", "question_type"):
            if not isinstance(obj.get(name), str):
                raise DataError(f"{path}: line {line}: field '{name}': missing or not a string")
        if obj["question_type"].lower() not in INFOSEEK_ANSWER_TYPES:
            raise DataError(
                f"{path}: line {line}: field 'question_type': {obj['question_type']!r} is not one of "
                f"String, Numerical, Time"
            )
        qtypes[obj["data_id"]] = obj["question_type"]
    return qtypes


def read_infoseek_references(
    path: str | os.PathLike, qtype_path: Optional[str | os.PathLike] = None
) -> dict[str, InfoSeekReference]:
    """The official reference file, keyed by data_id (a repeated id: the last line wins, as in the scorer).

    With `qtype_path`, every reference id must have a question type (the official scorer raises
    KeyError otherwise; here it is a DataError naming the id).
    """
    path = Path(path)
    qtypes = read_infoseek_qtypes(qtype_path) if qtype_path is not None else None
    references: dict[str, InfoSeekReference] = {}
    repeated = 0
    for line, obj in _iter_json_lines(path):
        for name in INFOSEEK_REFERENCE_FIELDS:
            if name not in obj:
                raise DataError(f"{path}: line {line}: field '{name}': missing")
        data_id = obj["data_id"]
        _check_answer_eval(path, line, obj["answer_eval"])
        if qtypes is not None and data_id not in qtypes:
            raise DataError(
                f"{qtype_path}: field 'data_id': {data_id!r} (from {path}: line {line}) has no question type"
            )
        answer = obj.get("answer", [])
        repeated += data_id in references
        references[data_id] = InfoSeekReference(
            data_id=data_id,
            answer_eval=obj["answer_eval"],
            data_split=obj["data_split"],
            question_type=qtypes[data_id] if qtypes is not None else None,
            question=obj.get("question", ""),
            image_id=obj.get("image_id", ""),
            answer=[str(a) for a in answer] if isinstance(answer, list) else [str(answer)],
            source=f"{path}:{line}",
        )
    if repeated:
        log.warning("InfoSeek %s: %d repeated data_ids (the last line wins, as in the official scorer)", path, repeated)
    splits = Counter(r.data_split for r in references.values())
    log.info(
        "InfoSeek references %s: %d questions (%s)",
        path,
        len(references),
        ", ".join(f"{s} {n}" for s, n in sorted(splits.items())),
    )
    return references


def read_infoseek_jsonl_questions(path: str | os.PathLike, qtype_path: str | os.PathLike) -> list[Question]:
    """Questions straight from the official files (no gold URL there: use the CSV for retrieval metrics)."""
    questions = []
    for ref in read_infoseek_references(path, qtype_path).values():
        if not ref.image_id or not ref.question:
            raise DataError(f"{ref.source}: field '{'image_id' if not ref.image_id else 'question'}': missing")
        questions.append(
            Question(
                data_id=ref.data_id,
                question=ref.question,
                answers=list(ref.answer),
                raw_answer="|".join(ref.answer),
                question_type=ref.question_type,
                image_id=ref.image_id,
                image_ids=[ref.image_id],
                dataset_name="infoseek",
                gold_urls=[],
                gold_title="",
                evidence_section_id=None,
                evidence_section_title="",
                split=ref.data_split,
                source=ref.source,
                reference=ref,
            )
        )
    return questions


def attach_infoseek_references(
    questions: list[Question], references: dict[str, InfoSeekReference], name: str = ""
) -> dict[str, int]:
    """Join references to questions by data_id; log and return the overlap (data-formats.md section 3.1)."""
    ids = {q.data_id for q in questions}
    for q in questions:
        q.reference = references.get(q.data_id)
    overlap = {
        "questions": len(ids),
        "references": len(references),
        "matched": len(ids & references.keys()),
        "questions_without_reference": len(ids - references.keys()),
        "references_without_question": len(references.keys() - ids),
    }
    level = log.warning if overlap["questions_without_reference"] else log.info
    level(
        "InfoSeek %s: %d of %d questions have a reference; %d references have no question",
        name,
        overlap["matched"],
        overlap["questions"],
        overlap["references_without_question"],
    )
    return overlap


QUESTION_MEMBER = "question"


def read_webdataset_questions(shards, references: dict[str, InfoSeekReference], name: str = "") -> list[Question]:
    """Questions of ReflectiVA's InfoSeek query shards (`__key__` = data_id, a `question` member, an `img.jpg` member),
    in shard order, each joined with its official reference by data_id (None when it has none: the evaluation
    refuses such a set before any model runs). A sample without a question member is a DataError naming it."""
    questions = []
    for key in shards.keys():
        member = shards.member(key, QUESTION_MEMBER)
        if member is None:
            where = next(iter(shards.samples[key].values())).shard
            raise DataError(
                f"{where}: sample {key!r} has no '{QUESTION_MEMBER}' member (found: "
                f"{', '.join(sorted(shards.samples[key]))}); these are not ReflectiVA query shards"
            )
        try:
            text = shards.read(member).decode("utf-8").strip()
        except UnicodeDecodeError as e:
            raise DataError(f"{member.shard}: sample {key!r}: field 'question': not UTF-8 ({e})") from None
        ref = references.get(key)
        answers = list(ref.answer) if ref is not None else []
        questions.append(
            Question(
                data_id=key,
                question=text,
                answers=answers,
                raw_answer="|".join(answers),
                question_type=ref.question_type if ref is not None else None,
                image_id=key,
                image_ids=[key],
                dataset_name="infoseek",
                gold_urls=[],
                gold_title="",
                evidence_section_id=None,
                evidence_section_title="",
                split=ref.data_split if ref is not None else "",
                source=f"{member.shard}#{key}",
                reference=ref,
            )
        )
    log.info(
        "InfoSeek shards %s: %d questions in %d shards, %d with a reference",
        name,
        len(questions),
        len(shards.shards),
        sum(q.reference is not None for q in questions),
    )
    return questions
