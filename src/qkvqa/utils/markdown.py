"""Text from data (a question, a title, a config value) written into Markdown: shown as text, never as HTML.

Question text with HTML (`<img src=x onerror=...>`, `<details>`) went raw into `qkvqa compare --format markdown` and
`report.md`, where a Markdown viewer renders it (issue 44). `md_text` escapes `&`, `<` and `>`, a table's `|` and
turns line breaks into spaces (a break ends a table row).
"""

from __future__ import annotations

import html


def md_text(text: object, in_table: bool = True) -> str:
    """`text` safe to put into Markdown as plain text (`in_table`: also `|` escaped and line breaks as spaces)."""
    out = html.escape(str(text), quote=False)
    if in_table:
        out = out.replace("|", "\\|").replace("\r\n", " ").replace("\n", " ").replace("\r", " ")
    return out
