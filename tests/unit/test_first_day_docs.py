"""Issue 34 item 5: docs that stay tied to the code: experiments/README.md's preset table lists every preset file
(and no other), and docs/index.md links every page of docs/."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_preset_table_lists_every_preset_file_and_no_other():
    text = (REPO / "experiments" / "README.md").read_text(encoding="utf-8")
    table = text.split("## Presets", 1)[1].split("\n## ", 1)[0]
    listed = {
        name
        for line in table.splitlines()
        if line.startswith("| `")
        for name in re.findall(r"`([a-z0-9_]+)`", line.split("|")[1])
    }
    files = {p.stem for p in (REPO / "experiments" / "presets").glob("*.yaml")}
    assert listed == files, f"missing from the table: {sorted(files - listed)}; no such file: {sorted(listed - files)}"


def test_the_docs_index_links_every_page():
    index = (REPO / "docs" / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([A-Za-z0-9_.-]+\.md)\)", index))
    pages = {p.name for p in (REPO / "docs").glob("*.md")} - {"index.md"}
    assert pages <= linked, f"not in docs/index.md: {sorted(pages - linked)}"
    assert all((REPO / "docs" / name).is_file() for name in linked), sorted(
        n for n in linked if not (REPO / "docs" / n).is_file()
    )
