"""`qkvqa pretrain-qformer`: build (or find) the Q-Former whose text layers are pretrained here (components.qformer.init=pretrained_here)."""

from __future__ import annotations

import argparse
import json

from qkvqa.config.cli import add_override_args, config_from_args


def register(subparsers) -> None:
    """Add the `pretrain-qformer` command."""
    parser = subparsers.add_parser(
        "pretrain-qformer",
        help="pretrain the Q-Former's text layers here by masked-language modelling (cached)",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Build the Q-Former that components.qformer names (tiny or real, as `qkvqa train` would) and\n"
        "train its text path (word and position embeddings, each layer's self-attention and text\n"
        "feed-forward) to predict masked tokens of the KB's candidate sections (data.kb_source) and of\n"
        "the training questions (data.train_questions), qff.text_pretrain.steps steps of\n"
        "qff.text_pretrain.batch_size texts (BERT's 80/10/10 masking, qff.text_pretrain.mask_prob).\n"
        "Nothing is downloaded. The result is an HF Blip2ForImageTextRetrieval directory under\n"
        "{paths.cache_dir}/qformer_init/, keyed on every input (the base weights, the corpus files'\n"
        "sha256, the settings, the code); a later call with the same inputs reuses it, a changed input\n"
        "builds another. `qkvqa train ... components.qformer.init=pretrained_here` starts from it (and\n"
        "builds it first when it is missing). Prints the directory and the MLM losses.\n\n"
        "  qkvqa pretrain-qformer experiment=demo/qff_per_layer paths.world_dir=/tmp/world\n"
        "  qkvqa train experiment=demo/qff_per_layer paths.world_dir=/tmp/world \\\n"
        "      components.qformer.init=pretrained_here\n"
        "  qkvqa pretrain-qformer experiment=demo/qff_per_layer paths.world_dir=/tmp/world --force",
    )
    parser.add_argument("--force", action="store_true", help="build it again even when a matching one is cached")
    add_override_args(parser)
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from qkvqa.qff.pretrain_here import build

    cfg = config_from_args(args)
    out, record = build(cfg, force=args.force)
    print(
        json.dumps(
            {
                "pretrained": str(out),
                **record["figures"],
                "use": "components.qformer.init=pretrained_here (qkvqa train finds this directory)",
            }
        )
    )
    return 0
