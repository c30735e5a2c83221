"""Per-article summaries for the image_to_summary index (`qkvqa summarize`): a resumable JSONL written through the generator."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Optional, Protocol, Sequence

from qkvqa.errors import DataError, StaleArtifactError
from qkvqa.generation.prompts import article_sections_text, summary_prompt
from qkvqa.utils.io import append_jsonl, iter_jsonl
from qkvqa.utils.logging import get_logger
from qkvqa.utils.progress import progress

if TYPE_CHECKING:
    from qkvqa.config.schema import GenerationConfig
    from qkvqa.generation.backends import Generator

log = get_logger(__name__)


class KBArticle(Protocol):
    """What summarising reads from an article (qkvqa.data.kb.Article satisfies it)."""

    row_id: int
    url: str
    title: str
    section_titles: Sequence[str]
    section_texts: Sequence[str]


def read_summaries(path: str | os.PathLike) -> dict[int, str]:
    """row_id -> url of the summaries already in `path` ({} when absent).

    A last line cut short by a crash (no final newline) is removed from the file, so that the
    article is summarised again; any other malformed line is a DataError.
    """
    path = Path(path)
    if not path.exists():
        return {}
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        keep = data.rfind(b"\n") + 1
        log.warning(
            "%s: dropping an incomplete last line (%d bytes) left by an interrupted run", path, len(data) - keep
        )
        with open(path, "r+b") as f:
            f.truncate(keep)
    done: dict[int, str] = {}
    for lineno, row in iter_jsonl(path):
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("row_id"), int)
            or not isinstance(row.get("url"), str)
            or not isinstance(row.get("summary"), str)
        ):
            raise DataError(f'{path}: line {lineno}: expected {{"row_id": int, "url": str, "summary": str}}')
        done[row["row_id"]] = row["url"]
    return done


def summarize_articles(
    articles: Iterable[KBArticle],
    generator: "Generator",
    out_path: str | os.PathLike,
    settings: "GenerationConfig",
    total: Optional[int] = None,
) -> dict:
    """Append one `{row_id, url, summary}` line per article not yet in `out_path`; returns counts.

    Articles are summarised `settings.batch_size` at a time from their candidate section strings,
    truncated to `settings.summary_context_tokens` generator tokens; each batch is flushed to disk
    before the next starts, so an interrupted run resumes where it stopped. A row already written
    for the same row id but another URL means the file belongs to another KB: StaleArtifactError.
    """
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    done = read_summaries(out_path)
    counts = {"written": 0, "skipped": 0}
    batch: list[KBArticle] = []

    def flush() -> None:
        prompts = [
            summary_prompt(
                a.title,
                generator.truncate_to_tokens(article_sections_text(a), settings.summary_context_tokens),
                settings.summary_template,
            )
            for a in batch
        ]
        summaries = generator.generate_prompts(prompts, max_new_tokens=settings.summary_max_new_tokens)
        append_jsonl(out_path, [{"row_id": a.row_id, "url": a.url, "summary": s} for a, s in zip(batch, summaries)])
        counts["written"] += len(batch)
        batch.clear()

    for article in progress(articles, desc="summaries", total=total, unit="article"):
        if article.row_id in done:
            if done[article.row_id] != article.url:
                raise StaleArtifactError(
                    f"{out_path}: row {article.row_id} holds the summary of "
                    f"{done[article.row_id]!r}, but that row of the KB is {article.url!r}; "
                    "the file was written for another KB (move it away and rerun)"
                )
            counts["skipped"] += 1
            continue
        batch.append(article)
        if len(batch) >= settings.batch_size:
            flush()
    if batch:
        flush()
    return counts
