"""`qkvqa convert-llava`: write an original LLaVA checkpoint (ReflectiVA's generator) as a transformers Llava directory."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `convert-llava` command."""
    parser = subparsers.add_parser(
        "convert-llava",
        help="convert an original LLaVA checkpoint (ReflectiVA) for kind reflectiva",
        description="Convert a checkpoint in the original LLaVA layout (config.json model_type llava_llama, keys "
        "model.layers.*, model.mm_projector.0/2, ...; e.g. aimagelab/ReflectiVA) into a directory that "
        "transformers' LlavaForConditionalGeneration loads: key map, LlavaConfig, a LlavaImageProcessor "
        "that pads to a square with the mean colour (LLaVA's expand2square), the checkpoint's tokenizer "
        "with an added <image> token and its chat template. LLaVA does not save the CLIP vision tower; "
        "it loads it from config mm_vision_tower, so pass that directory with --vision-tower. The output "
        "records the source's fingerprint and the converter version (qkvqa_llava_conversion.json). "
        "Kind reflectiva loads the result (docs/generation.md).",
        epilog="example: qkvqa convert-llava weights/aimagelab/ReflectiVA --vision-tower "
        "weights/openai/clip-vit-large-patch14-336 --out weights/reflectiva-llava-hf --source-id "
        "aimagelab/ReflectiVA",
    )
    parser.add_argument("src", help="the LLaVA checkpoint directory (config.json, weights, tokenizer)")
    parser.add_argument(
        "--vision-tower",
        help="the CLIP directory of config mm_vision_tower (openai/clip-vit-large-patch14-336 for ReflectiVA)",
    )
    parser.add_argument("--out", required=True, help="the directory to write (new or empty)")
    parser.add_argument(
        "--source-id",
        help="the hub id the source was downloaded from, recorded in the output "
        "(found by itself for a directory of the HF cache)",
    )
    parser.set_defaults(func=_convert)


def _convert(args: argparse.Namespace) -> int:
    import sys

    from qkvqa.generation.llava_convert import convert_llava

    record = convert_llava(args.src, args.out, vision_tower=args.vision_tower, source_id=args.source_id)
    if not record["source"].get("hub_id"):
        print(
            "qkvqa convert-llava: the record names no hub id (the source is not in the HF cache); convert again "
            "with --source-id OWNER/NAME (aimagelab/ReflectiVA) so that the protocol card can match the paper row",
            file=sys.stderr,
        )
    print(
        json.dumps(
            {
                "out": args.out,
                "converter_version": record["converter_version"],
                "source_sha256": record["source"]["fingerprint"]["sha256"],
                "vision_tower_weights": record["vision_tower"]["weights_from"],
            }
        )
    )
    return 0
