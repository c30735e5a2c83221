"""Builders of small, real data files (KB entries, question CSVs, images) for the data-layer tests."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Optional

from PIL import Image

from qkvqa.synth.world import EVQA_COLUMNS


def kb_entry(
    url: str, title: str, sections: Optional[list[tuple[str, str]]] = None, image_urls: Optional[list[str]] = None
) -> dict:
    """A KB entry in the E-VQA schema; the lead section is titled with the article title."""
    sections = (
        sections
        if sections is not None
        else [
            (title, f"{title} is a thing."),
            ("History", "Old."),
            ("References", "A book."),
            ("External links", "A site."),
        ]
    )
    image_urls = image_urls if image_urls is not None else [f"https://upload.example.org/{title}.jpg"]
    return {
        "url": url,
        "title": title,
        "section_titles": [s[0] for s in sections],
        "section_texts": [s[1] for s in sections],
        "image_urls": image_urls,
        "image_reference_descriptions": [f"image {i}" for i in range(len(image_urls))],
        "image_section_indices": [0] * len(image_urls),
    }


def write_kb_json(path: Path, entries: dict[str, dict]) -> Path:
    """A KB JSON dict {url: entry}."""
    path.write_text(json.dumps(entries, ensure_ascii=False, indent=1), encoding="utf-8")
    return path


def write_kb_jsonl(path: Path, entries: dict[str, dict]) -> Path:
    """The same KB as JSONL, one {url: entry} object per line."""
    path.write_text(
        "".join(json.dumps({u: e}, ensure_ascii=False) + "\n" for u, e in entries.items()), encoding="utf-8"
    )
    return path


def evqa_row(question_type: str = "templated", **overrides: str) -> dict[str, str]:
    """One E-VQA CSV row with every column set."""
    row = {
        "question": "What is the wingspan of this bird?",
        "answer": "30 cm|thirty centimetres",
        "dataset_image_ids": "111|222",
        "dataset_category_id": "7",
        "dataset_name": "inaturalist",
        "question_type": question_type,
        "wikipedia_url": "https://en.wikipedia.org/wiki/A",
        "wikipedia_title": "A",
        "evidence": "The wingspan is 30 cm.",
        "evidence_section_id": "1",
        "evidence_section_title": "Description",
        "encyclopedic_vqa_split": "test",
        "question_original": "What is the wingspan of this bird?",
        "wikipedia_url_used_in_train": "True",
    }
    if question_type == "2_hop":  # the three per-hop fields hold `a|b` (google-research encyclopedic_vqa/README.md)
        row.update(
            wikipedia_url="https://en.wikipedia.org/wiki/A|https://en.wikipedia.org/wiki/B",
            evidence_section_id="0|1",
            evidence_section_title="A|Description",
        )
    row.update(overrides)
    return row


def write_csv(path: Path, rows: list[dict[str, str]], columns: Optional[list[str]] = None) -> Path:
    """A question CSV with `columns` (default: the E-VQA columns, plus data_id when the rows have it)."""
    if columns is None:
        columns = (["data_id"] if rows and "data_id" in rows[0] else []) + list(EVQA_COLUMNS)
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return path


def write_image(path: Path, colour: tuple[int, int, int] = (200, 30, 30), image_format: str = "JPEG") -> Path:
    """A small real image file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (16, 16), colour).save(path, format=image_format)
    return path
