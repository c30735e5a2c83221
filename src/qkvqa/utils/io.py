"""Atomic writes and JSON helpers used by every stage that must never leave a half-written file."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path
from typing import Any, BinaryIO, Callable, Iterable, Iterator, Optional


def partial_path(path: str | os.PathLike) -> Path:
    """The temporary file an atomic write of `path` goes to: beside it (one filesystem), named by this process."""
    path = Path(path)
    return path.with_name(f".{path.name}.partial-{os.getpid()}")


def real_path_within(real: str, real_root: str) -> bool:
    """Whether the resolved path `real` is the resolved folder `real_root` or below it (both from os.path.realpath)."""
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def path_within(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """Whether `path`, with symlinks and `..` resolved, is `root` (resolved) or below it: the one containment rule of
    every path taken from data (image paths, url-store URLs, a site's file list)."""
    return real_path_within(os.path.realpath(path), os.path.realpath(root))


def pid_alive(pid: str | int) -> bool:
    """Whether a process of this host with that PID runs (a partial file's name ends in its writer's PID)."""
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def remove_dead_partials(directory: str | os.PathLike) -> list[Path]:
    """Remove the `.NAME.partial-PID` files in `directory` whose writer is gone (a SIGKILLed build or save leaves
    one, up to the size of what it was writing); returns them."""
    directory = Path(directory)
    removed = []
    for stale in directory.glob(".*.partial-*") if directory.is_dir() else ():
        pid = stale.name.rsplit("-", 1)[-1]
        if stale.is_file() and not stale.is_symlink() and pid.isdigit() and not pid_alive(pid):
            try:
                stale.unlink()
                removed.append(stale)
            except OSError:
                pass
    return removed


# errno values of a write the user fixes by freeing space or choosing another folder: one line, not a traceback.
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM})


def free_space(path: str | os.PathLike) -> Optional[int]:
    """Bytes free on the filesystem of `path` (or of its nearest existing parent), or None."""
    import shutil

    path = Path(path)
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def human_bytes(n: Optional[float]) -> str:
    """1536 -> '1.5 KiB'."""
    if n is None:
        return "unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def disk_error_message(error: OSError, path: Optional[str | os.PathLike] = None, needed: Optional[int] = None) -> str:
    """One line for a write that failed on a full, read-only or forbidden filesystem: the path, the free space
    there and, when known, how much the write needs."""
    where = Path(path if path is not None else (error.filename or "."))
    reason = error.strerror or str(error)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        need = f", and this needs about {human_bytes(needed)}" if needed else ""
        fix = (
            f"{human_bytes(free_space(where))} free there{need}: free space on that filesystem (or point the "
            "output at another) and rerun; finished work is kept"
        )
    elif error.errno == errno.EROFS:
        fix = "that filesystem is mounted read-only: point the output (paths.*, --out) at a writable folder"
    elif error.errno in (errno.EACCES, errno.EPERM):
        fix = "you may not write there: fix its permissions or point the output (paths.*, --out) at your own folder"
    else:
        fix = "fix that folder (a file or folder in the way, its permissions) or point the output elsewhere"
    return f"{where}: {reason}; {fix}"


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows (/proc), else by setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def shared_mode(directory: bool = False) -> int:
    """The mode `open()` (0o666) or `mkdir` (0o777) gives a new file or directory under the current umask."""
    return (0o777 if directory else 0o666) & ~current_umask()


def make_shareable(path: str | os.PathLike) -> None:
    """Give `path` (and, for a directory, everything under it) the mode a plain `open`/`mkdir` would: libraries that
    write through a private temporary file (safetensors, `tempfile.mkstemp`/`mkdtemp`) leave 0600/0700 behind."""
    path = Path(path)
    file_mode, dir_mode = shared_mode(), shared_mode(directory=True)
    if not path.is_dir():
        os.chmod(path, file_mode)
        return
    os.chmod(path, dir_mode)
    for parent, dirs, files in os.walk(path):  # symlinks are left alone (their targets are not ours)
        for names, mode in ((dirs, dir_mode), (files, file_mode)):
            for name in names:
                if not os.path.islink(os.path.join(parent, name)):
                    os.chmod(os.path.join(parent, name), mode)


def fsync_dir(directory: str | os.PathLike) -> None:
    """Make a rename durable (the directory entry), where the platform allows it."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None], durable: bool = True) -> None:
    """Call `write(f)` on a partial file beside `path`, fsync it (`durable`), and rename it over `path`: a kill or a
    full disk leaves the previous file whole, never a torn one; the partial file is removed on any failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = partial_path(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    except BaseException as e:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        if isinstance(e, OSError) and not e.filename and e.errno in DISK_ERRNOS:
            # a write through a file object (np.save, json.dump) names no file: the one-line message then named the
            # working directory ("`.`: 65.0 GiB free") instead of the full disk (issue 44)
            raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(path)) from e
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write text to a temporary file beside `path`, then rename it into place."""
    atomic_write(path, lambda f: f.write(text.encode("utf-8")), durable=False)


def atomic_write_json(path: str | os.PathLike, obj: Any, indent: int = 2) -> None:
    """Serialise `obj` as JSON and write it atomically."""
    atomic_write_text(path, json.dumps(obj, indent=indent, ensure_ascii=False, default=str) + "\n")


def sidecar_path(path: str | os.PathLike) -> Path:
    """The sidecar that describes a results file: `reranked_test.json` -> `reranked_test.meta.json`."""
    path = Path(path)
    return path.with_name(f"{path.stem}.meta.json")


def write_described(path: str | os.PathLike, text: str, description: Optional[dict]) -> None:
    """Write `text` to `path` atomically, with `description` (what produced it) and the text's sha256 in its sidecar
    (`sidecar_path`); none: any old sidecar is removed. The sidecar goes first: a kill between the two writes leaves
    one that does not describe the old file, which `read_description` refuses (never a wrong description)."""
    if description is not None:
        atomic_write_json(
            sidecar_path(path), {"sha256": hashlib.sha256(text.encode("utf-8")).hexdigest(), **description}
        )
    else:
        sidecar_path(path).unlink(missing_ok=True)
    atomic_write_text(path, text)


def read_description(path: str | os.PathLike, data: Optional[bytes] = None, *, fix: str) -> Optional[dict]:
    """The sidecar of `path` (without its sha256), None when it has none (a file qkvqa did not write). DataError,
    ending in `fix`, when the sidecar describes another version of the file (`data`: the file's bytes, if read)."""
    import hashlib

    from qkvqa.errors import DataError

    meta_path = sidecar_path(path)
    if not meta_path.is_file():
        return None
    try:
        meta = read_json(meta_path)
    except ValueError as e:
        raise DataError(f"{meta_path}: {e}") from None
    data = Path(path).read_bytes() if data is None else data
    if not isinstance(meta, dict) or meta.get("sha256") != hashlib.sha256(data).hexdigest():
        raise DataError(f"{meta_path} does not describe {path} (another version of it was written since); {fix}")
    return {k: v for k, v in meta.items() if k != "sha256"}


def read_json(path: str | os.PathLike) -> Any:
    """Read a JSON file, naming the file in the error when it is malformed."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: line {e.lineno}: malformed JSON ({e.msg})") from e
    except UnicodeDecodeError as e:
        raise ValueError(not_utf8(path, e)) from None


def not_utf8(path: str | os.PathLike, error: UnicodeDecodeError, line: int | None = None) -> str:
    """The one-line message for a text file that is not UTF-8, naming the line of the first bad byte (found by
    re-reading the file when `line` is not known: a text reader decodes blocks, not lines)."""
    if line is None:
        with open(path, "rb") as f:
            data = f.read()
        try:
            data.decode("utf-8-sig")
        except UnicodeDecodeError as whole:
            error, line = whole, data.count(b"\n", 0, whole.start) + 1
    where = f"line {line}: " if line is not None else ""
    return (
        f"{path}: {where}not UTF-8 text (byte {error.object[error.start : error.start + 1]!r}); re-save it as "
        f"UTF-8 (e.g. `iconv -f latin1 -t utf-8`)"
    )


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """Yield (line number, object) for each non-empty line; a bad line raises naming file and line."""
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(not_utf8(path, e, lineno)) from None
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: line {lineno}: malformed JSON ({e.msg})") from e


def append_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> None:
    """Append rows to a JSONL file and flush them to disk (used for resumable outputs)."""
    from qkvqa.utils.own_files import fopen_no_follow

    try:
        with fopen_no_follow(path, "a", encoding="utf-8") as f:  # a planted link is refused, never appended through
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as e:
        if not e.filename and e.errno in DISK_ERRNOS:  # name the file on the full disk, not the working directory
            raise OSError(e.errno, e.strerror or os.strerror(e.errno), str(path)) from e
        raise


def sha256_file(path: str | os.PathLike, block: int = 8 << 20) -> str:
    """sha256 (hex) of a whole file, read `block` bytes at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            digest.update(chunk)
    return digest.hexdigest()


def verify_sha256_once(path: str | os.PathLike, wanted: str, what: str, fix: str, force: bool = False) -> None:
    """Check `path` against the sha256 its manifest records, once: a stamp beside it (`.NAME.verified`, holding the
    hash, size and mtime) spares the re-hash until the file changes (`force`: hash anyway). DataError naming the file
    and `fix` otherwise."""
    from qkvqa.errors import DataError

    path = Path(path)
    if not force:
        key = _stamp_key(path, wanted)
        for stamp in _stamp_files(path):
            try:
                if stamp.read_text() == key:
                    return
            except OSError:
                pass
    found = sha256_file(path)
    if found != wanted:
        raise DataError(f"{path}: corrupt {what} (sha256 {found[:12]}, its manifest records {wanted[:12]}); {fix}")
    mark_verified(path, wanted)


def _stamp_key(path: Path, sha256: str) -> str:
    stat = path.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}"


def _stamp_files(path: Path) -> list[Path]:
    """Where the stamp of `path` may live: beside it, else (a read-only directory, a shared KB) in the user's cache,
    `$QKVQA_STAMP_DIR` or `~/.cache/qkvqa/verified`, named by a hash of the file's absolute path."""
    fallback = Path(os.environ.get("QKVQA_STAMP_DIR") or Path.home() / ".cache" / "qkvqa" / "verified")
    name = hashlib.sha1(str(path.resolve()).encode()).hexdigest()
    return [path.with_name(f".{path.name}.verified"), fallback / name]


def mark_verified(path: str | os.PathLike, sha256: str) -> None:
    """Record that `path` (just written or just hashed) has `sha256`, so `verify_sha256_once` need not re-hash it."""
    path = Path(path)
    key = _stamp_key(path, sha256)
    for stamp in _stamp_files(path):
        try:
            atomic_write_text(stamp, key)
            return
        except OSError:
            continue  # a read-only directory: the user's cache, else verified again next time


def cut_torn_tail(path: Path, block: int = 1 << 16) -> int:
    """Truncate an append-only line file (JSONL, CSV) after its last newline, cutting a row a kill tore mid-write, so
    that the next append does not glue onto it; returns the bytes cut."""
    if not path.is_file():
        return 0
    from qkvqa.utils.own_files import fopen_no_follow

    with fopen_no_follow(path, "r+b") as f:
        size = f.seek(0, 2)
        end = size
        while end > 0:
            start = max(0, end - block)
            f.seek(start)
            chunk = f.read(end - start)
            at = chunk.rfind(b"\n")
            if at >= 0:
                keep = start + at + 1
                break
            end = start
        else:
            keep = 0
        if keep < size:
            f.truncate(keep)
            f.flush()
    return size - keep


_HASHED: dict = {}  # (absolute path, size, mtime_ns, inode) -> sha256, for this process


def sha256_file_cached(path: str | os.PathLike) -> str:
    """sha256 of a file, hashed once per file version: the hash is kept, with the file's size, mtime and inode, in
    the user's stamp folder (`$QKVQA_STAMP_DIR` or `~/.cache/qkvqa/verified`, `sha256-` + a hash of the absolute
    path), so a content fingerprint of many GB of weights costs a stat per file after the first time."""
    path = Path(path)
    info = path.stat()
    absolute = str(path.resolve())
    key = (absolute, info.st_size, info.st_mtime_ns, info.st_ino)
    if key in _HASHED:
        return _HASHED[key]
    folder = Path(os.environ.get("QKVQA_STAMP_DIR") or Path.home() / ".cache" / "qkvqa" / "verified")
    stamp = folder / f"sha256-{hashlib.sha1(absolute.encode()).hexdigest()}"
    version = f"{info.st_size} {info.st_mtime_ns} {info.st_ino} "
    try:
        text = stamp.read_text()
        if text.startswith(version) and len(text) == len(version) + 64:
            _HASHED[key] = text[len(version) :]
            return _HASHED[key]
    except OSError:
        pass
    found = sha256_file(path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_text(stamp, version + found)
    except OSError:
        pass  # a read-only home: hashed again next time
    _HASHED[key] = found
    return found


def tree_fingerprint(directory: str | os.PathLike) -> str:
    """sha256 (16 hex) of every regular, non-hidden file under `directory` (relative path and content sha256): the
    identity of a folder of weights by what it holds, not by its name."""
    root = Path(directory)
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if any(part.startswith(".") for part in relative.parts) or not path.is_file():
            continue
        digest.update(str(relative).encode() + b"\0" + sha256_file_cached(path).encode() + b"\0")
    return digest.hexdigest()[:16]
