"""`qkvqa config show|list`: print a resolved config, or list the experiments and presets."""

from __future__ import annotations

import argparse

from qkvqa.config.cli import add_config_dir_arg, add_override_args, config_from_args


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the `config` command."""
    parser = subparsers.add_parser(
        "config",
        help="show a resolved config or list experiments",
        description="Inspect configs without running anything.",
    )
    sub = parser.add_subparsers(dest="config_command", metavar="<show|list>", required=True)
    show = sub.add_parser(
        "show",
        help="print the resolved config of an experiment (or one KEY's subtree)",
        description="Print the config that `experiment=NAME key=value ...` resolves to "
        "(base, presets, experiment, overrides), as YAML; a bare KEY (`qff`, "
        "`components.qformer`, `trainer.max_steps`) prints only that part. A tiny "
        "model's word list (vocab_texts) shows as its length: the whole config.yaml "
        "of a run has it.",
    )
    add_override_args(show)
    show.set_defaults(func=_show)
    lister = sub.add_parser(
        "list",
        help="list experiments and presets",
        description="List the experiments (NAME.yaml) and presets (presets/NAME.yaml) of the\n"
        "--config-dir directories, $QKVQA_CONFIG_PATH and the main experiments\n"
        "directory (the checkout's experiments/, or the copy installed with qkvqa);\n"
        "names found outside the main directory show where they come from.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_dir_arg(lister)
    lister.set_defaults(func=_list)


def _show(args: argparse.Namespace) -> int:
    import yaml

    from qkvqa.config.load import did_you_mean, to_plain
    from qkvqa.errors import ConfigError
    from qkvqa.loggers.wandb import compact_config

    keys = [t for t in args.overrides if "=" not in t and not t.startswith(("~", "+"))]
    args.overrides = [t for t in args.overrides if t not in keys]
    cfg = config_from_args(args)
    plain = compact_config(to_plain(cfg))  # a tiny model's word list is data, shown as its length
    if not keys:
        print(yaml.safe_dump(plain, sort_keys=False, allow_unicode=True), end="")
        return 0
    for key in keys:
        node = plain
        for part in key.split("."):
            if not isinstance(node, dict) or part not in node:
                known = [k for k, _ in _dotted(plain)]
                raise ConfigError(f"config show {key}: no such key{did_you_mean(key, known)}")
            node = node[part]
        text = yaml.safe_dump({key: node}, sort_keys=False, allow_unicode=True, default_flow_style=False)
        print(text, end="")
    return 0


def _dotted(node, prefix: str = ""):
    """(dotted key, value) of every key of a plain config, sections included."""
    for key, value in node.items():
        yield f"{prefix}{key}", value
        if isinstance(value, dict):
            yield from _dotted(value, f"{prefix}{key}.")


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
