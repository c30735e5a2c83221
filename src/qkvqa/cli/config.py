"""`qkvqa config show|list`: print a resolved config, or list the experiments and presets."""
from __future__ import annotations

import argparse

from qkvqa.config.cli import add_override_args, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `config` command."""
    parser = subparsers.add_parser("config", help="show a resolved config or list experiments",
                                   description="Inspect configs without running anything.")
    sub = parser.add_subparsers(dest="config_command", metavar="<show|list>", required=True)
    show = sub.add_parser("show", help="print the resolved config of an experiment",
                          description="Print the config that `experiment=NAME key=value ...` resolves to "
                                      "(base, presets, experiment, overrides), as YAML.")
    add_override_args(show)
    show.set_defaults(func=_show)
    lister = sub.add_parser("list", help="list experiments and presets",
                            description="List experiments/*.yaml and experiments/presets/*.yaml.")
    lister.set_defaults(func=_list)


def _show(args: argparse.Namespace) -> int:
    from qkvqa.config.load import to_yaml

    print(to_yaml(config_from_args(args)), end="")
    return 0


def _list(args: argparse.Namespace) -> int:
    from qkvqa.config.load import experiments_dir, list_experiments

    root = experiments_dir()
    print("experiments:")
    for name in list_experiments(root):
        print(f"  {name}")
    print("presets:")
    for path in sorted((root / "presets").glob("*.yaml")):
        print(f"  {path.stem}")
    return 0
