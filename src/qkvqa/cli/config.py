"""`qkvqa config show|list`: print a resolved config, or list the experiments and presets."""
from __future__ import annotations

import argparse

from qkvqa.config.cli import add_config_dir_arg, add_override_args, config_from_args


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
                            description="List the experiments (NAME.yaml) and presets (presets/NAME.yaml) of the\n"
                                        "--config-dir directories, $QKVQA_CONFIG_PATH and the main experiments\n"
                                        "directory (the checkout's experiments/, or the copy installed with qkvqa);\n"
                                        "names found outside the main directory show where they come from.",
                            formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_dir_arg(lister)
    lister.set_defaults(func=_list)


def _show(args: argparse.Namespace) -> int:
    from qkvqa.config.load import to_yaml

    print(to_yaml(config_from_args(args)), end="")
    return 0


def _list(args: argparse.Namespace) -> int:
    from qkvqa.config.load import experiment_sources, experiments_dir, preset_sources

    root, search = experiments_dir(), args.config_dir
    print(f"experiments (main directory {root}):")
    for name, directory in experiment_sources(root, search).items():
        print(f"  {name}" + ("" if directory == root else f"  ({directory})"))
    print("presets:")
    for name, path in preset_sources(root, search).items():
        print(f"  {name}" + ("" if path.parent.parent == root else f"  ({path.parent.parent})"))
    return 0
