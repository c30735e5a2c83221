"""`qkvqa kb`: build a KB store from a KB JSON dict / JSONL, check it against its source, show one of its articles."""

from __future__ import annotations

import argparse
import json
import sys


def register(subparsers) -> None:
    """Add `kb build`, `kb check` and `kb show`."""
    parser = subparsers.add_parser(
        "kb",
        help="build and inspect the SQLite KB store",
        description="Build a random-access KB store (SQLite) from an E-VQA / InfoSeek KB, streamed, and "
        "inspect it. The store keeps KB order: row id = entry index of the KB file.",
    )
    commands = parser.add_subparsers(dest="kb_command", metavar="<kb command>", required=True)

    build = commands.add_parser(
        "build",
        help="stream a KB JSON dict or JSONL into a store directory",
        description="Stream a KB (JSON dict {url: entry} such as encyclopedic_kb_wiki.json, or JSONL with one "
        "{url: entry} object per line) into DIR/kb.sqlite, and write DIR/manifest.json (source size, "
        "sha256 and sampled fingerprint, article count, URL checksum, the store's sha256) and "
        "DIR/report.json (articles without images, excluded sections, malformed entries, duplicate "
        'keys). Entries in ReflectiVA\'s Wiki100k layout ({url: {"wikipedia_content": text}}) are '
        "read too: their paragraphs become untitled sections.",
    )
    build.add_argument("--source", required=True, help="KB file: .json (dict) or .jsonl")
    build.add_argument("--out", required=True, help="store directory (created; an old store is replaced at the end)")
    build.add_argument(
        "--format",
        default="auto",
        choices=["auto", "json_dict", "jsonl"],
        help="KB layout (default: from the suffix, .json or .jsonl)",
    )
    build.add_argument(
        "--reflectiva-passages",
        default="spacy_300",
        choices=["spacy_300", "blank_lines"],
        help="how a ReflectiVA entry's wikipedia_content becomes sections: spacy_300 (default, as "
        "ReflectiVA builds its passages: spaCy sentences packed into passages of at most 300 "
        "tokens) or blank_lines (one section per paragraph); docs/data-formats.md section 2.3",
    )
    build.set_defaults(func=_build)

    check = commands.add_parser(
        "check",
        help="check a store against its KB file and its own checksum",
        description="Check that a store's KB file is the one it was built from (size and a sampled 4 MiB "
        "fingerprint; --full: the sha256 of every byte of the KB file and of kb.sqlite). A copied or "
        "touched KB file passes; another file or a flipped byte in the store fails naming the file.",
    )
    check.add_argument("--store", required=True, help="store directory written by `qkvqa kb build`")
    check.add_argument("--source", help="the KB file (default: the path recorded at build time, when it exists)")
    check.add_argument("--full", action="store_true", help="hash every byte of the KB file and of kb.sqlite")
    check.set_defaults(func=_check)

    show = commands.add_parser(
        "show",
        help="print one article of a store as JSON",
        description="Print one article (by URL or by row id) of a KB store as JSON.",
    )
    show.add_argument("--store", required=True, help="store directory written by `qkvqa kb build`")
    show.add_argument("key", help="article URL, or a row id (KB entry index)")
    show.add_argument(
        "--sections",
        action="store_true",
        help="print the candidate section strings (original indexes) instead of the raw fields",
    )
    show.set_defaults(func=_show)


def _build(args: argparse.Namespace) -> int:
    import os
    import sqlite3

    from qkvqa.data.kb import build_kb_store
    from qkvqa.errors import DataError
    from qkvqa.utils.io import disk_error_message

    try:
        manifest = build_kb_store(
            args.source, args.out, kb_format=args.format, reflectiva_passages=args.reflectiva_passages
        )
    except sqlite3.OperationalError as e:  # SQLite names no file: say which, and what the store needs
        import errno

        needed = os.path.getsize(args.source) if os.path.isfile(args.source) else None
        code = errno.ENOSPC if "full" in str(e) else errno.EROFS if "readonly" in str(e) else errno.EACCES
        raise DataError(
            f"kb build: the store could not be written (SQLite: {e}): "
            f"{disk_error_message(OSError(code, os.strerror(code)), args.out, needed)}"
        ) from None
    print(json.dumps({"store": args.out, "articles": manifest["articles"], "issues": manifest["issues"]}))
    return 0


def _check(args: argparse.Namespace) -> int:
    import time
    from pathlib import Path

    from qkvqa.data.kb import KBStore

    started = time.time()
    store = KBStore.open(args.store)
    source = args.source or store.manifest["source"]["path"]
    checked = {"store": args.store, "articles": len(store)}
    if args.full:
        store.check_store()
        checked["store_sha256"] = "ok"
    if Path(source).is_file():
        store.check_source(source, full=args.full)
        checked["source"] = {"path": str(source), "check": "sha256" if args.full else "size + sampled fingerprint"}
    else:
        checked["source"] = {"path": str(source), "check": "skipped: file not found"}
    checked["seconds"] = round(time.time() - started, 3)
    print(json.dumps(checked))
    return 0


def _show(args: argparse.Namespace) -> int:
    from qkvqa.data.kb import KBStore, article_to_dict

    store = KBStore.open(args.store)
    try:
        article = store.get(int(args.key)) if args.key.isdigit() else store.get_by_url(args.key)
    except (KeyError, IndexError) as e:
        print(f"qkvqa kb show: {e.args[0]}", file=sys.stderr)
        return 1
    if args.sections:
        for section in article.candidate_sections():
            print(f"--- section {section.index}\n{section.text}")
    else:
        print(json.dumps(article_to_dict(article), ensure_ascii=False, indent=2))
    return 0
