"""KB store: streams a KB JSON dict or JSONL into SQLite for random access by row id (KB order) or URL.

Two entry layouts are read: the E-VQA / InfoSeek one (title, section_titles, section_texts, image
fields) and ReflectiVA's Wiki100k one (`wikipedia_content`, one text per article), whose passages become
untitled sections: by default as ReflectiVA builds them (`spacy_300`: spaCy sentences packed into passages of at
most 300 tokens, `qkvqa.data.sections.reflectiva_passages`), or split at blank lines (`blank_lines`); the store's
manifest records which (`reflectiva_passages`). The manifest records the source's size, sha256 and
a sampled fingerprint, so a copied or touched KB file is still recognised (`check_source`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import ijson

from qkvqa.data.sections import (
    CandidateSection,
    candidate_sections,
    is_empty_section,
    is_excluded_section,
    reflectiva_passages,
    section_string,
)
from qkvqa.errors import DataError, StaleArtifactError
from qkvqa.utils.io import atomic_write_json, make_shareable, mark_verified, remove_dead_partials, sha256_file
from qkvqa.utils.logging import get_logger
from qkvqa.utils.progress import progress

log = get_logger(__name__)

STORE_FILE = "kb.sqlite"
MANIFEST_FILE = "manifest.json"
REPORT_FILE = "report.json"
SCHEMA_VERSION = 2
KB_FORMATS = ("json_dict", "jsonl")
# How a ReflectiVA entry's `wikipedia_content` becomes sections (data-formats.md section 2.3): `spacy_300`, ReflectiVA's
# own passages (the default), or `blank_lines`, one section per paragraph (the reading of stores built before the
# manifest recorded it).
REFLECTIVA_PASSAGES = ("spacy_300", "blank_lines")
DEFAULT_REFLECTIVA_PASSAGES = "spacy_300"
# The sampled fingerprint of a KB source: its size and SAMPLE_BLOCKS blocks of SAMPLE_BLOCK bytes at evenly
# spaced offsets (the first and the last included): 4 MiB read, whatever the file's size.
SAMPLE_BLOCKS = 64
SAMPLE_BLOCK = 64 << 10
QUERY_CHUNK = 10000  # row ids per SELECT ... IN (...): SQLite builds cap the number of bound parameters

# The list fields of a KB entry (data-formats.md section 2.2), in storage order.
LIST_FIELDS = ("section_titles", "section_texts", "image_urls", "image_reference_descriptions", "image_section_indices")
ISSUE_KINDS = ("no_image", "excluded_section", "empty_section", "malformed", "duplicate_key")

_SCHEMA = """
CREATE TABLE articles (row_id INTEGER PRIMARY KEY, url TEXT NOT NULL UNIQUE, title TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE issues (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, row_id INTEGER NOT NULL, key TEXT NOT NULL,
                     detail TEXT NOT NULL);
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass(frozen=True)
class Article:
    """One KB entry; `row_id` is its position in the KB file (the id every index uses)."""

    row_id: int
    url: str
    title: str
    section_titles: list[str]
    section_texts: list[str]
    image_urls: list[str]
    image_reference_descriptions: list[str]
    image_section_indices: list[int]

    def section_string(self, index: int) -> str:
        """The section string of section `index` (original, unfiltered index)."""
        return section_string(self.title, self.section_titles[index], self.section_texts[index])

    def candidate_sections(self, evidence_section_id: Optional[int] = None) -> Iterator[CandidateSection]:
        """Candidate sections (no references / external links, except the evidence section), original indexes."""
        return candidate_sections(self.title, self.section_titles, self.section_texts, evidence_section_id)


def url_list_checksum(urls: Iterable[str]) -> str:
    """sha256 of the URLs in KB order, one per line: what indexes built on a KB store compare against."""
    digest = hashlib.sha256()
    for url in urls:
        digest.update(url.encode("utf-8"))
        digest.update(b"\n")
    return "sha256:" + digest.hexdigest()


def detect_kb_format(path: str | os.PathLike) -> str:
    """`jsonl` for a `.jsonl` file, `json_dict` for `.json`; other suffixes must be named explicitly."""
    suffix = Path(path).suffix.lower()
    if suffix == ".jsonl":
        return "jsonl"
    if suffix == ".json":
        return "json_dict"
    raise DataError(
        f"{path}: cannot tell the KB layout from the suffix {suffix!r}; "
        f"pass the format explicitly (one of {', '.join(KB_FORMATS)})"
    )


def iter_kb_source(
    path: str | os.PathLike,
    kb_format: str = "auto",
    on_bytes: Optional[Callable[[int], None]] = None,
    digest: Any = None,
) -> Iterator[tuple[str, Any, str]]:
    """Stream (key, entry, position) from a KB JSON dict or JSONL file without loading it whole.

    `position` names where the entry is ("entry 12" or "line 12"). A truncated or malformed file
    raises DataError naming the file and the last good key or the bad line. `on_bytes(offset)` is
    called now and then with the byte offset read so far (for progress bars); `digest` (a hashlib
    object) is fed every byte of the file, in order, while it streams.
    """
    kb_format = detect_kb_format(path) if kb_format == "auto" else kb_format
    if kb_format == "json_dict":
        yield from _iter_json_dict(Path(path), on_bytes, digest)
    elif kb_format == "jsonl":
        yield from _iter_jsonl(Path(path), on_bytes, digest)
    else:
        raise DataError(f"{path}: unknown KB format {kb_format!r}; expected one of {', '.join(KB_FORMATS)}")


class _HashingReader:
    """A binary file's `read` that feeds what it returns to a digest (ijson only calls `read`)."""

    def __init__(self, f, digest):
        self.f, self.digest = f, digest

    def read(self, size: int = -1) -> bytes:
        data = self.f.read(size)
        self.digest.update(data)
        return data


def _iter_json_dict(path: Path, on_bytes, digest=None) -> Iterator[tuple[str, Any, str]]:
    with open(path, "rb") as f:
        first = f.read(4096).lstrip()[:1]
        if first != b"{":
            what = "is empty" if not first else f"starts with {first.decode('latin-1')!r}"
            raise DataError(f"{path}: line 1: a KB JSON dict must start with '{{' but the file {what}")
        f.seek(0)
        reader = f if digest is None else _HashingReader(f, digest)
        count, last_key = 0, None
        try:
            for key, value in ijson.kvitems(reader, "", use_float=True):
                count += 1
                last_key = key
                if on_bytes is not None and count % 256 == 0:
                    on_bytes(f.tell())
                yield key, value, f"entry {count}"
        except ijson.JSONError as e:
            where = f"after entry {count} (key {last_key!r})" if count else "before the first entry"
            reason = " ".join(str(e).split())  # the parser's message spans several lines
            raise DataError(f"{path}: truncated or malformed KB JSON {where}, near byte {f.tell()}: {reason}") from e
        if digest is not None:
            _HashingReader(f, digest).read()  # whatever follows the closing brace
        if on_bytes is not None:
            on_bytes(f.tell())


def _iter_jsonl(path: Path, on_bytes, digest=None) -> Iterator[tuple[str, Any, str]]:
    with open(path, "rb") as f:
        offset = 0
        for lineno, line in enumerate(f, 1):
            offset += len(line)
            if digest is not None:
                digest.update(line)
            if on_bytes is not None and lineno % 256 == 0:
                on_bytes(offset)
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise DataError(f"{path}: line {lineno}: truncated or malformed KB JSONL line ({e})") from e
            if not isinstance(obj, dict) or not obj:
                raise DataError(
                    f"{path}: line {lineno}: expected one {{url: entry}} object, found {type(obj).__name__}"
                )
            for key, value in obj.items():
                yield key, value, f"line {lineno}"
        if on_bytes is not None:
            on_bytes(offset)


def title_from_url(url: str) -> str:
    """A Wikipedia URL's article title (`.../wiki/Blue_jay` -> `Blue jay`), or the URL itself."""
    from urllib.parse import unquote

    tail = url.rstrip("/").rsplit("/", 1)[-1]
    return unquote(tail).replace("_", " ") or url


def is_reflectiva_entry(value: Any) -> bool:
    """ReflectiVA's Wiki100k layout: `wikipedia_content` (one text) instead of section lists."""
    return isinstance(value, dict) and "wikipedia_content" in value and "section_texts" not in value


def from_reflectiva_entry(key: str, value: dict, passages: str = DEFAULT_REFLECTIVA_PASSAGES) -> tuple[dict, list[str]]:
    """The E-VQA-layout entry of a ReflectiVA one, and its problems: title from `wikipedia_title` or the URL, the
    content's passages as untitled sections (`passages`: `spacy_300`, ReflectiVA's spaCy sentence packs of at most 300
    tokens, or `blank_lines`, its paragraphs split at blank lines), no images."""
    problems = []
    content = value["wikipedia_content"]
    if not isinstance(content, str):
        problems.append("wikipedia_content is not a string")
        content = ""
    title = value.get("wikipedia_title", value.get("title"))
    if not isinstance(title, str) or not title.strip():
        title = title_from_url(key)
    if passages == "spacy_300":
        paragraphs = reflectiva_passages(content) or [""]
    elif passages == "blank_lines":
        paragraphs = [p.strip() for p in content.split("\n\n") if p.strip()] or [""]
    else:
        raise DataError(
            f"unknown ReflectiVA passage rule {passages!r}; expected one of {', '.join(REFLECTIVA_PASSAGES)}"
        )
    return {
        "url": value.get("url", key),
        "title": title,
        "section_titles": [""] * len(paragraphs),
        "section_texts": paragraphs,
        "image_urls": [],
        "image_reference_descriptions": [],
        "image_section_indices": [],
    }, problems


def normalise_entry(
    key: str, value: Any, reflectiva_passages: str = DEFAULT_REFLECTIVA_PASSAGES
) -> tuple[str, dict[str, list], list[str]]:
    """(title, list fields, problems) of one raw entry; anything malformed becomes an empty value plus a problem."""
    problems: list[str] = []
    if not isinstance(value, dict):
        problems.append(f"entry is a {type(value).__name__}, not an object")
        value = {}
    if is_reflectiva_entry(value):
        value, problems = from_reflectiva_entry(key, value, reflectiva_passages)
    url = value.get("url", key)
    if url != key:
        problems.append(f"url field {url!r} differs from its key")
    title = value.get("title")
    if not isinstance(title, str):
        problems.append("title is missing or not a string")
        title = "" if title is None else str(title)
    fields: dict[str, list] = {}
    for name in LIST_FIELDS:
        items = value.get(name)
        item_type = int if name == "image_section_indices" else str
        if not isinstance(items, list):
            problems.append(f"{name} is missing or not a list")
            items = []
        elif not all(isinstance(item, item_type) and not isinstance(item, bool) for item in items):
            problems.append(f"{name} holds items that are not {item_type.__name__}s")
            items = [item if isinstance(item, item_type) else item_type() for item in items]
        fields[name] = items
    if len(fields["section_titles"]) != len(fields["section_texts"]):
        problems.append(
            f"{len(fields['section_titles'])} section_titles but {len(fields['section_texts'])} section_texts"
        )
    for name in ("image_reference_descriptions", "image_section_indices"):
        if len(fields[name]) != len(fields["image_urls"]):
            problems.append(f"{len(fields['image_urls'])} image_urls but {len(fields[name])} {name}")
    return title, fields, problems


def _entry_issues(key: str, title: str, fields: dict[str, list], problems: list[str]) -> list[tuple[str, str]]:
    """(kind, detail) rows of the build report for one entry."""
    issues = [("malformed", problem) for problem in problems]
    if not fields["image_urls"]:
        issues.append(("no_image", ""))
    for index, (section_title, text) in enumerate(zip(fields["section_titles"], fields["section_texts"])):
        if is_excluded_section(section_title):
            issues.append(("excluded_section", json.dumps([index, section_title], ensure_ascii=False)))
        elif is_empty_section(text):
            issues.append(("empty_section", json.dumps([index, section_title], ensure_ascii=False)))
    return issues


def build_kb_store(
    source: str | os.PathLike,
    out_dir: str | os.PathLike,
    kb_format: str = "auto",
    reflectiva_passages: str = DEFAULT_REFLECTIVA_PASSAGES,
) -> dict:
    """Stream `source` into `out_dir/kb.sqlite` (built in a temp file, then renamed) and write manifest and report.

    `reflectiva_passages` is how ReflectiVA entries' `wikipedia_content` becomes sections (REFLECTIVA_PASSAGES),
    recorded in the manifest.

    Every key becomes one row, in file order, so row ids equal the entry indexes of json.load (a
    duplicated key keeps its first position and its last value, as json.load does). Malformed entries
    are stored as far as they parse and listed in the report. Returns the manifest.
    """
    source = Path(source).resolve()
    out_dir = Path(out_dir)
    if not source.is_file():
        raise DataError(f"{source}: KB source file not found (or not a regular file)")
    kb_format = detect_kb_format(source) if kb_format == "auto" else kb_format
    if reflectiva_passages not in REFLECTIVA_PASSAGES:
        raise DataError(
            f"unknown ReflectiVA passage rule {reflectiva_passages!r}; expected one of {', '.join(REFLECTIVA_PASSAGES)}"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    stat = source.stat()
    started = time.time()
    tmp_path = out_dir / f".{STORE_FILE}.partial-{os.getpid()}"
    remove_dead_partials(out_dir)  # a SIGKILLed build's store, up to the full store's size
    if tmp_path.exists():
        tmp_path.unlink()
    conn = sqlite3.connect(tmp_path)
    try:
        conn.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF;" + _SCHEMA)
        content = hashlib.sha256()
        count, checksum, layouts = _fill_store(conn, source, kb_format, stat.st_size, content, reflectiva_passages)
        counts = _issue_counts(conn)
        manifest = {
            "schema_version": SCHEMA_VERSION,
            "source": {
                "path": str(source),
                "format": kb_format,
                "size": stat.st_size,
                "mtime": stat.st_mtime,
                "sha256": content.hexdigest(),
                "sample_sha256": sampled_fingerprint(source),
                "entry_layouts": layouts,
                "reflectiva_passages": reflectiva_passages,
            },
            "articles": count,
            "url_checksum": checksum,
            "built_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "build_seconds": round(time.time() - started, 3),
            "store_file": STORE_FILE,
            "report_file": REPORT_FILE,
            "issues": counts,
        }
        conn.execute("INSERT INTO meta VALUES ('manifest', ?)", (json.dumps(manifest),))
        conn.commit()
        _write_report(conn, out_dir / REPORT_FILE, manifest)
        conn.close()
        make_shareable(tmp_path)  # SQLite creates 0644 whatever the umask allows
        manifest["store_sha256"] = sha256_file(tmp_path)
        manifest["store_size"] = tmp_path.stat().st_size
        os.replace(tmp_path, out_dir / STORE_FILE)
        mark_verified(out_dir / STORE_FILE, manifest["store_sha256"])
    except BaseException:
        conn.close()
        tmp_path.unlink(missing_ok=True)
        raise
    atomic_write_json(out_dir / MANIFEST_FILE, manifest)
    log.info(
        "KB store %s: %d articles from %s in %.1fs; %d without images, %d excluded sections, "
        "%d sections without text (never candidates), %d malformed entries, %d duplicate keys (details in %s)",
        out_dir,
        count,
        source,
        manifest["build_seconds"],
        counts["no_image"],
        counts["excluded_section"],
        counts["empty_section"],
        counts["malformed"],
        counts["duplicate_key"],
        out_dir / REPORT_FILE,
    )
    return manifest


def sampled_fingerprint(path: str | os.PathLike) -> str:
    """sha256 of a file's size and SAMPLE_BLOCKS blocks of SAMPLE_BLOCK bytes at evenly spaced offsets (first and last
    included): 4 MiB read whatever the size. Another KB version differs in size or in a sampled block; a
    same-size edit confined to the unsampled bytes is the false accept `qkvqa kb check --full` rules out."""
    size = os.path.getsize(path)
    digest = hashlib.sha256(f"{size}\0".encode())
    last = max(0, size - SAMPLE_BLOCK)
    offsets = sorted({round(i * last / (SAMPLE_BLOCKS - 1)) for i in range(SAMPLE_BLOCKS)})
    with open(path, "rb") as f:
        for offset in offsets:
            f.seek(offset)
            digest.update(f.read(SAMPLE_BLOCK))
    return digest.hexdigest()


def _fill_store(
    conn: sqlite3.Connection,
    source: Path,
    kb_format: str,
    size: int,
    content: Any,
    reflectiva_passages: str = DEFAULT_REFLECTIVA_PASSAGES,
) -> tuple[int, str, dict[str, int]]:
    """Insert every entry in file order, feeding the file's bytes to `content`; returns (article count, URL
    checksum, entries per layout)."""
    digest = hashlib.sha256()
    layouts = {"evqa": 0, "reflectiva": 0}
    next_row = 0
    bar = progress(total=size, desc=f"kb build {source.name}", unit="B", unit_scale=True)
    done = [0]

    def on_bytes(offset: int) -> None:
        bar.update(offset - done[0])
        done[0] = offset

    with bar:
        for key, value, position in iter_kb_source(source, kb_format, on_bytes, digest=content):
            if not isinstance(key, str) or not key:
                raise DataError(f"{source}: {position}: empty KB key")
            layouts["reflectiva" if is_reflectiva_entry(value) else "evqa"] += 1
            title, fields, problems = normalise_entry(key, value, reflectiva_passages)
            body = json.dumps([fields[name] for name in LIST_FIELDS], ensure_ascii=False)
            issues = _entry_issues(key, title, fields, problems)
            try:
                conn.execute("INSERT INTO articles VALUES (?, ?, ?, ?)", (next_row, key, title, body))
                row_id = next_row
                next_row += 1
                digest.update(key.encode("utf-8") + b"\n")
            except sqlite3.IntegrityError:
                (row_id,) = conn.execute("SELECT row_id FROM articles WHERE url = ?", (key,)).fetchone()
                conn.execute("UPDATE articles SET title = ?, body = ? WHERE row_id = ?", (title, body, row_id))
                conn.execute("DELETE FROM issues WHERE row_id = ? AND kind != 'duplicate_key'", (row_id,))
                issues.append(("duplicate_key", f"{position}: the last value wins at row {row_id}"))
            conn.executemany(
                "INSERT INTO issues (kind, row_id, key, detail) VALUES (?, ?, ?, ?)",
                [(kind, row_id, key, detail) for kind, detail in issues],
            )
    return next_row, "sha256:" + digest.hexdigest(), layouts


def _issue_counts(conn: sqlite3.Connection) -> dict[str, int]:
    counts = dict.fromkeys(ISSUE_KINDS, 0)
    counts.update(conn.execute("SELECT kind, COUNT(*) FROM issues GROUP BY kind").fetchall())
    counts["articles_with_malformed_fields"] = conn.execute(
        "SELECT COUNT(DISTINCT row_id) FROM issues WHERE kind = 'malformed'"
    ).fetchone()[0]
    return counts


def _write_report(conn: sqlite3.Connection, path: Path, manifest: dict) -> None:
    """Stream the build report (counts, then every issue with its key) to a temp file and rename it."""
    tmp = path.with_name(f".{path.name}.partial-{os.getpid()}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write("{\n" + f'"source": {json.dumps(manifest["source"], ensure_ascii=False)},\n')
            f.write(f'"articles": {manifest["articles"]},\n"counts": {json.dumps(manifest["issues"])}')
            for kind in ISSUE_KINDS:
                f.write(f',\n"{kind}": [')
                rows = conn.execute("SELECT row_id, key, detail FROM issues WHERE kind = ? ORDER BY id", (kind,))
                for i, (row_id, key, detail) in enumerate(rows):
                    item: dict[str, Any] = {"row_id": row_id, "key": key}
                    if kind in ("excluded_section", "empty_section"):
                        item["section_index"], item["section_title"] = json.loads(detail)
                    elif detail:
                        item["detail"] = detail
                    f.write(("\n  " if i == 0 else ",\n  ") + json.dumps(item, ensure_ascii=False))
                f.write("]")
            f.write("\n}\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


class KBStore:
    """Read-only random access to a store built by `build_kb_store`; memory use does not grow with the KB.

    The SQLite connection is opened lazily per process, so a store can be passed to DataLoader
    workers (forked or spawned) and pickled.
    """

    def __init__(self, store_dir: Path, manifest: dict):
        self.store_dir = store_dir
        self.manifest = manifest
        self._conn: Optional[sqlite3.Connection] = None
        self._conn_pid: Optional[int] = None

    @classmethod
    def open(
        cls,
        store_dir: str | os.PathLike,
        source: Optional[str | os.PathLike] = None,
        reflectiva_passages: Optional[str] = None,
    ) -> "KBStore":
        """Open a store; with `source`, refuse it when that KB file is not the one it was built from (`check_source`).
        A kb.sqlite of another size than the build wrote, or one SQLite cannot read, is refused naming the file. With
        `reflectiva_passages`, a store of ReflectiVA entries whose sections were cut by another rule is refused."""
        store_dir = Path(store_dir)
        manifest_path, db_path = store_dir / MANIFEST_FILE, store_dir / STORE_FILE
        rebuild = f"rebuild the store with `qkvqa kb build --source KB.json --out {store_dir}`"
        for path in (manifest_path, db_path):
            if not path.is_file():
                raise DataError(
                    f"{path}: not found; build the store with `qkvqa kb build --source KB.json --out {store_dir}`"
                )
        try:
            with open(manifest_path, encoding="utf-8") as f:
                manifest = json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise DataError(f"{manifest_path}: unreadable manifest ({e}); {rebuild}") from None
        if manifest.get("store_size") is not None and db_path.stat().st_size != manifest["store_size"]:
            raise DataError(
                f"{db_path}: {db_path.stat().st_size} bytes, the build wrote {manifest['store_size']} "
                f"(truncated or replaced); {rebuild}"
            )
        if manifest.get("store_sha256"):
            # SQLite has no page checksums: a flipped byte inside an article's text reads back without an error, so
            # the first open of each file version re-hashes it (a stamp beside it spares later opens).
            from qkvqa.utils.io import verify_sha256_once

            verify_sha256_once(db_path, manifest["store_sha256"], "KB store", rebuild)
        store = cls(store_dir, manifest)
        try:
            (stored,) = store._connection().execute("SELECT value FROM meta WHERE key = 'manifest'").fetchone()
        except (sqlite3.DatabaseError, TypeError) as e:
            raise DataError(f"{db_path}: not a readable KB store ({e}); {rebuild}") from None
        stored = json.loads(stored)
        if (stored["articles"], stored["url_checksum"]) != (manifest["articles"], manifest["url_checksum"]):
            raise StaleArtifactError(
                f"{manifest_path} does not describe {db_path} (an interrupted rebuild?); "
                f"rebuild the store with `qkvqa kb build`"
            )
        if source is not None:
            store.check_source(source)
        if reflectiva_passages is not None:
            store.check_passages(reflectiva_passages)
        return store

    @property
    def reflectiva_passages(self) -> Optional[str]:
        """How the ReflectiVA entries' `wikipedia_content` became sections (REFLECTIVA_PASSAGES); None when the store
        holds none. A store built before the manifest recorded it split them at blank lines."""
        source = self.manifest["source"]
        if not (source.get("entry_layouts") or {}).get("reflectiva"):
            return None
        return source.get("reflectiva_passages", "blank_lines")

    def check_passages(self, wanted: str) -> None:
        """StaleArtifactError when the store's ReflectiVA sections were cut by another rule than `wanted`."""
        if wanted not in REFLECTIVA_PASSAGES:
            raise DataError(
                f"unknown ReflectiVA passage rule {wanted!r}; expected one of {', '.join(REFLECTIVA_PASSAGES)}"
            )
        built = self.reflectiva_passages
        if built is not None and built != wanted:
            raise StaleArtifactError(
                f"KB store {self.store_dir}: its ReflectiVA articles were cut into sections by rule {built!r}, the run "
                f"asks for {wanted!r}; rebuild it with `qkvqa kb build --source {self.manifest['source']['path']} --out "
                f"{self.store_dir} --reflectiva-passages {wanted}`"
            )

    def check_source(self, source: str | os.PathLike, full: bool = False) -> None:
        """Raise StaleArtifactError when `source` is not the KB file this store was built from.

        The content decides, not the mtime (a `cp -r` or `touch` keeps the store usable): the size and the
        sampled fingerprint (4 MiB read), or with `full` the sha256 of every byte. A store built before
        content hashes were recorded falls back to size and mtime.
        """
        path = Path(source)
        size = path.stat().st_size
        built = self.manifest["source"]
        rebuild = f"rebuild it with `qkvqa kb build --source {source} --out {self.store_dir}`"
        if size != built["size"]:
            raise StaleArtifactError(
                f"KB store {self.store_dir} was built from {built['path']} ({built['size']} bytes) "
                f"but {source} has {size} bytes: another KB file; {rebuild}"
            )
        if "sample_sha256" not in built:
            if path.stat().st_mtime != built["mtime"]:
                raise StaleArtifactError(
                    f"KB store {self.store_dir} predates content hashes and {source} has another mtime than at the "
                    f"build ({built['mtime']}); {rebuild} (the new store checks content, not mtime)"
                )
            return
        if full:
            found, wanted, what = sha256_file(path), built["sha256"], "sha256"
        else:
            found, wanted, what = sampled_fingerprint(path), built["sample_sha256"], "sampled fingerprint"
        if found != wanted:
            raise StaleArtifactError(
                f"KB store {self.store_dir} was built from another {source}: same size, but the "
                f"{what} differs ({found[:12]} here, {wanted[:12]} at the build); {rebuild}"
            )

    def check_store(self) -> None:
        """Raise DataError when kb.sqlite is not, byte for byte, the file the build wrote (re-hashed every call)."""
        from qkvqa.utils.io import verify_sha256_once

        if self.manifest.get("store_sha256"):
            verify_sha256_once(
                self.store_dir / STORE_FILE,
                self.manifest["store_sha256"],
                "KB store",
                f"rebuild the store with `qkvqa kb build --source {self.manifest['source']['path']} "
                f"--out {self.store_dir}`",
                force=True,
            )

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None or self._conn_pid != os.getpid():
            uri = (self.store_dir / STORE_FILE).resolve().as_uri() + "?mode=ro&immutable=1"
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
            self._conn_pid = os.getpid()
        return self._conn

    def __getstate__(self) -> dict:
        return {"store_dir": self.store_dir, "manifest": self.manifest}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["store_dir"], state["manifest"])

    def close(self) -> None:
        """Close this process's connection (reopened on the next access)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __len__(self) -> int:
        return int(self.manifest["articles"])

    @property
    def url_checksum(self) -> str:
        """Checksum of the URL list in KB order (compare it with an index manifest's)."""
        return self.manifest["url_checksum"]

    def __contains__(self, url: object) -> bool:
        return isinstance(url, str) and self._row_by_url(url) is not None

    def get(self, row_id: int) -> Article:
        """The article at `row_id` (0-based KB order); IndexError outside the store."""
        if not 0 <= row_id < len(self):
            raise IndexError(f"row {row_id} is outside the KB store {self.store_dir} ({len(self)} articles)")
        row = (
            self._connection()
            .execute("SELECT row_id, url, title, body FROM articles WHERE row_id = ?", (int(row_id),))
            .fetchone()
        )
        return _article(row)

    def get_many(self, row_ids: Sequence[int]) -> list[Article]:
        """The articles at `row_ids`, in the order given (one query per QUERY_CHUNK distinct rows)."""
        unique = sorted(set(int(r) for r in row_ids))
        for row_id in unique:
            if not 0 <= row_id < len(self):
                raise IndexError(f"row {row_id} is outside the KB store {self.store_dir} ({len(self)} articles)")
        by_row = {}
        for start in range(0, len(unique), QUERY_CHUNK):
            chunk = unique[start : start + QUERY_CHUNK]
            rows = self._connection().execute(
                f"SELECT row_id, url, title, body FROM articles WHERE row_id IN ({','.join('?' * len(chunk))})", chunk
            )
            by_row.update((row[0], _article(row)) for row in rows)
        return [by_row[int(r)] for r in row_ids]

    def get_by_url(self, url: str) -> Article:
        """The article whose KB key is `url`; KeyError when absent."""
        row = self._row_by_url(url)
        if row is None:
            raise KeyError(f"{url!r} is not in the KB store {self.store_dir}")
        return _article(row)

    def row_of(self, url: str) -> int:
        """The row id (KB entry index) of `url`; KeyError when absent."""
        row = self._connection().execute("SELECT row_id FROM articles WHERE url = ?", (url,)).fetchone()
        if row is None:
            raise KeyError(f"{url!r} is not in the KB store {self.store_dir}")
        return row[0]

    def _row_by_url(self, url: str) -> Optional[tuple]:
        return (
            self._connection().execute("SELECT row_id, url, title, body FROM articles WHERE url = ?", (url,)).fetchone()
        )

    def urls(self) -> Iterator[str]:
        """Every URL in KB order."""
        cursor = self._connection().execute("SELECT url FROM articles ORDER BY row_id")
        for (url,) in cursor:
            yield url

    def __iter__(self) -> Iterator[Article]:
        """Every article in KB order (streamed)."""
        cursor = self._connection().execute("SELECT row_id, url, title, body FROM articles ORDER BY row_id")
        for row in cursor:
            yield _article(row)

    def report(self) -> dict:
        """The build report (articles without images, excluded sections, malformed entries, duplicate keys)."""
        with open(self.store_dir / REPORT_FILE, encoding="utf-8") as f:
            return json.load(f)


def _article(row: tuple) -> Article:
    row_id, url, title, body = row
    return Article(row_id, url, title, *json.loads(body))


def article_to_dict(article: Article) -> dict:
    """The article as a plain dict (for printing and JSON files)."""
    return asdict(article)


def kb_content(store) -> Optional[str]:
    """The KB's content fingerprint: its source file's sha256 (the store's manifest, computed at build), else the store
    file's; the URL checksum alone kept vectors of edited text under the same URLs (issue 44)."""
    manifest = getattr(store, "manifest", None) or {}
    return (manifest.get("source") or {}).get("sha256") or manifest.get("store_sha256")
