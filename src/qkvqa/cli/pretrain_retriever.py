"""`qkvqa pretrain-retriever`: train (or find) the stage-1 image encoder trained here on the train split (cached)."""

from __future__ import annotations

import argparse
import json

from qkvqa.config.cli import add_override_args, config_from_args


def register(subparsers) -> None:
    """Add the `pretrain-retriever` command."""
    parser = subparsers.add_parser(
        "pretrain-retriever",
        help="train the stage-1 image encoder here, contrastively on the train split (cached)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Build the image encoder that components.image_encoder names (tiny or real) and train its\n"
        "image path with InfoNCE: each training question's image (data.train_questions, never val or\n"
        "test) against a KB image of its gold article, the batch's other KB images as negatives,\n"
        "retrieval.pretrain.steps steps of retrieval.pretrain.batch_size images. Nothing is downloaded.\n"
        "The result is the encoder's HF directory under {paths.cache_dir}/retriever_init/, keyed on\n"
        "every input (the base encoder, the world's images and questions, the settings, the code); a\n"
        "later call with the same inputs reuses it, a changed input trains another. Prints the\n"
        "directory, the losses and the overrides that make embed / index / train / evaluate load it.\n\n"
        "  qkvqa pretrain-retriever experiment=demo/evaluate paths.world_dir=/tmp/world\n"
        "  qkvqa embed experiment=demo/evaluate paths.world_dir=/tmp/world \\\n"
        "      components.image_encoder.pretrained=DIR components.image_encoder.tiny=false",
    )
    parser.add_argument("--force", action="store_true", help="train it again even when a matching one is cached")
    add_override_args(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from qkvqa.data.benchmark import build_benchmark
    from qkvqa.retrieval.pretrain import build, encoder_overrides

    cfg = config_from_args(args)
    out, record = build(cfg, build_benchmark(cfg.data), force=args.force)
    print(json.dumps({"pretrained": str(out), **record["figures"], "use": " ".join(encoder_overrides(out))}))
    return 0
