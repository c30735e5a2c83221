"""`qkvqa inspect`: write (and optionally serve) the static error-analysis site of an evaluation run."""

from __future__ import annotations

import argparse
from pathlib import Path

DESCRIPTION = """\
Write a self-contained static web site of an evaluation run's per-question traces (traces.jsonl):
the protocol card and headline metrics; a question table filtered by verdict, Table 3 category,
question type, split, answer-in-context and free text; each question's image, gold answers,
prediction and verdict, stage-1 list, QFF re-ranking (where the gold article moved), kept articles,
chunks and context with the gold answers highlighted; Recall@K and accuracy-per-type plots.
--compare OTHER_RUN adds the questions that flipped between the two runs (right -> wrong is right in
RUN_DIR and wrong in OTHER_RUN), gold-rank deltas and both traces side by side.
Open OUT/index.html in a browser (file:// works), or serve it with --serve PORT. docs/inspect.md.

  qkvqa inspect checkpoints/evqa_none --compare checkpoints/evqa_per_layer
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `inspect` command."""
    parser = subparsers.add_parser(
        "inspect",
        help="a static web site of an evaluation run, for error analysis",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="an evaluation run directory (checkpoints/<run_id>)"
    )
    parser.add_argument(
        "--compare",
        type=Path,
        metavar="OTHER_RUN",
        help="a second evaluation run over the same questions: flips, gold-rank deltas, side by side",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where the site goes (default: RUN_DIR/inspect, or RUN_DIR/inspect-vs-<OTHER> with --compare)",
    )
    parser.add_argument(
        "--serve", type=int, metavar="PORT", help="after building, serve the site on http://127.0.0.1:PORT until Ctrl-C"
    )
    parser.add_argument(
        "--shard-size", type=int, default=None, metavar="N", help="questions per trace shard file (default: 500)"
    )
    parser.set_defaults(func=_inspect)


def _inspect(args: argparse.Namespace) -> int:
    from qkvqa.errors import ConfigError
    from qkvqa.inspect.site import SHARD_SIZE, build_site

    if args.serve is not None and not 0 < args.serve < 65536:
        raise ConfigError(f"--serve {args.serve}: a port is 1-65535")
    site = build_site(args.run_dir, out=args.out, compare=args.compare, shard_size=args.shard_size or SHARD_SIZE)
    line = f"inspect: {site.questions} questions"
    if site.flips is not None:
        line += (
            f"; {site.flips['right_to_wrong']} right -> wrong, {site.flips['wrong_to_right']} wrong -> right "
            "against the compared run"
        )
    print(line)
    print(f"site: {site.index_html.as_uri()}", flush=True)
    if args.serve is not None:
        from qkvqa.inspect.serve import serve

        serve(site.out, args.serve)
    return 0
