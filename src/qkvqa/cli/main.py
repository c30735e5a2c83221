"""Entry point of the `qkvqa` command: discovers the command modules and dispatches to them.

Every module in `qkvqa.cli` other than `main` and names starting with `_` is a command module. It
defines `register(subparsers)`, which adds one argparse sub-parser and sets `func=handler` on it
with `set_defaults` (plus `opens_run=True` when it runs a qkvqa run, which then holds SLURM's SIGUSR1 from the
first line: `qkvqa.utils.stop_signals`). Command modules import heavy libraries (torch, transformers, faiss)
inside their handlers, so that `qkvqa --help` stays fast.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from typing import Optional, Sequence

import qkvqa
import qkvqa.cli as cli_pkg

EPILOG = """\
Config-driven commands take `experiment=NAME [preset=a,b] [key=value ...] [~key]` after their
name: experiments/base/*.yaml, then the presets, then experiments/NAME.yaml, then the overrides.
`qkvqa config show experiment=NAME` prints the resolved config. Docs: README.md.
"""


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one sub-parser per discovered command module."""
    parser = argparse.ArgumentParser(
        prog="qkvqa",
        description="QKVQA: question-focused filtering for knowledge-based VQA "
        "(retrieve, filter with the QFF, select chunks with CDA, generate, score).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"qkvqa {qkvqa.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for info in sorted(pkgutil.iter_modules(cli_pkg.__path__), key=lambda m: m.name):
        if info.name == "main" or info.name.startswith("_"):
            continue
        module = importlib.import_module(f"qkvqa.cli.{info.name}")
        register = getattr(module, "register", None)
        if register is None:
            raise RuntimeError(f"qkvqa.cli.{info.name} has no register(subparsers) function")
        register(sub)
    return parser


# Exit status of a command whose reader closed stdout early (`qkvqa kb show ... | head`): 128 + SIGPIPE, as a
# program killed by SIGPIPE, which a shell pipeline expects.
EXIT_STDOUT_CLOSED = 141


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse argv and run the chosen command; returns the process exit code (141, quietly, when the reader of
    stdout went away: `qkvqa ... | head`)."""
    try:
        try:
            return _main(argv)
        finally:
            sys.stdout.flush()  # output still buffered breaks the pipe here, not in the interpreter's exit
    except BrokenPipeError:
        if not _stdout_closed():
            raise  # another pipe (a subprocess, a socket): a real error
        # The Python docs' recipe: point stdout at devnull so the flush at exit cannot raise again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EXIT_STDOUT_CLOSED


def _stdout_closed() -> bool:
    """Whether stdout is a pipe (or socket) whose reading end is closed."""
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False  # not a real file (a test's capture)
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    return any(events & select.POLLERR for _, events in poller.poll(0))


def _main(argv: Optional[Sequence[str]]) -> int:
    from qkvqa.utils.stop_signals import hold_stop_signal, release_stop_signal

    hold_stop_signal()  # a SIGUSR1 during start-up stops the run cleanly later, not the process now
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "opens_run", False):
        release_stop_signal()  # no run to stop cleanly (set_defaults(opens_run=True) marks those that do)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2 if args.command is None else 0
    from qkvqa.utils.command_line import remember

    # Every call records its own command line (a handler may refine it: `evaluate --strict`): the commands it
    # suggests must never carry the overrides of an earlier call in this process (a notebook, a test session).
    remember(_command_name(args), getattr(args, "overrides", None) or [])
    try:
        rc = func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except _user_errors() as e:
        from qkvqa.errors import RunInterrupted

        if isinstance(e, RunInterrupted):
            print(f"qkvqa {args.command}: interrupted: {e}", file=sys.stderr)
            return e.exit_code
        print(f"qkvqa {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        line = _disk_error_line(e)
        if line is None:
            raise
        print(f"qkvqa {args.command}: error: {line}", file=sys.stderr)
        return 2
    except Exception as e:  # sqlite3.OperationalError without importing sqlite3 for every command
        line = _sqlite_disk_line(e)
        if line is None:
            raise
        print(f"qkvqa {args.command}: error: {line}", file=sys.stderr)
        return 2
    return 0 if rc is None else int(rc)


def _command_name(args) -> str:
    """`index build`, `kb build`, `score run`, ...: the command and, where it has them, its subcommand."""
    sub = getattr(args, f"{args.command}_command", None)
    return f"{args.command} {sub}" if sub else args.command


def _disk_error_line(e: OSError) -> Optional[str]:
    """One line for a full, read-only or forbidden filesystem (the path, the free space there), else None."""
    from qkvqa.utils.io import DISK_ERRNOS, disk_error_message

    return disk_error_message(e) if e.errno in DISK_ERRNOS else None


def _sqlite_disk_line(e: Exception) -> Optional[str]:
    """One line for SQLite's full-disk and read-only errors, whose exceptions name no file, else None."""
    if type(e).__module__ != "sqlite3" or type(e).__name__ != "OperationalError":
        return None
    text = str(e)
    if not any(w in text for w in ("disk is full", "readonly", "read-only", "unable to open", "disk I/O error")):
        return None
    return (
        f"SQLite: {text}: a KB store or cache is on a full, read-only or foreign folder; free space there or "
        "point data.kb_store / paths.* at a writable folder of your own"
    )


def _user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's to fix: printed as one clear line instead of a traceback."""
    from qkvqa.errors import QkvqaError

    return (QkvqaError,)


if __name__ == "__main__":
    sys.exit(main())
