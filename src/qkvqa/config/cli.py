"""Shared argument handling for config-driven commands: `experiment=NAME preset=a,b key=value ~key`."""

from __future__ import annotations

import argparse

from omegaconf import DictConfig

from qkvqa.config.load import compose

OVERRIDES_HELP = (
    "experiment=NAME (experiments/NAME.yaml) or experiment=path/to/file.yaml, preset=a,b "
    "(experiments/presets/), then any key=value to override and ~key to restore a default; e.g. "
    "qff.alpha=0.8 trainer.devices=2"
)
CONFIG_DIR_HELP = (
    "a directory laid out like experiments/ (NAME.yaml, presets/NAME.yaml) searched before "
    "$QKVQA_CONFIG_PATH and the shipped experiments; repeatable, the first match wins"
)


def add_config_dir_arg(parser: argparse.ArgumentParser) -> None:
    """Add `--config-dir DIR` (repeatable) to a command's parser."""
    parser.add_argument("--config-dir", action="append", default=[], metavar="DIR", help=CONFIG_DIR_HELP)


def add_override_args(parser: argparse.ArgumentParser) -> None:
    """Add the positional override list and `--config-dir` to a command's parser."""
    add_config_dir_arg(parser)
    parser.add_argument("overrides", nargs="*", metavar="key=value", help=OVERRIDES_HELP)


def split_overrides(tokens: list[str]) -> tuple[str | None, list[str], list[str]]:
    """Separate `experiment=` and `preset=` from the other overrides."""
    experiment, presets, rest = None, [], []
    for token in tokens:
        if token.startswith("experiment="):
            experiment = token.split("=", 1)[1] or None
        elif token.startswith(("preset=", "presets=")):
            presets += [p for p in token.split("=", 1)[1].split(",") if p]
        else:
            rest.append(token)
    return experiment, presets, rest


def config_from_args(args: argparse.Namespace) -> DictConfig:
    """Compose the config named by a command's positional overrides."""
    experiment, presets, rest = split_overrides(list(args.overrides))
    return compose(experiment, presets, rest, search=getattr(args, "config_dir", None) or ())
