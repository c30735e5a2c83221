"""Every `qkvqa` command and sub-command answers --help, and bad input gives one clear line."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from qkvqa.cli.main import build_parser, main


def _all_command_paths(parser: argparse.ArgumentParser, prefix=()):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield prefix + (name,)
                yield from _all_command_paths(sub, prefix + (name,))


COMMANDS = sorted(set(_all_command_paths(build_parser())))


def test_there_are_commands():
    assert ("config",) in COMMANDS and ("config", "show") in COMMANDS


@pytest.mark.slow
@pytest.mark.parametrize("path", COMMANDS, ids=[" ".join(p) for p in COMMANDS])
def test_help_works_for_every_command(path, capsys):
    with pytest.raises(SystemExit) as e:
        main([*path, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: qkvqa " + " ".join(path) in out


def test_top_level_help_lists_commands(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for (name,) in [p for p in COMMANDS if len(p) == 1]:
        assert name in out


def test_config_error_is_one_line_with_exit_code_2(capsys):
    assert main(["config", "show", "qff.alhpa=1"]) == 2
    err = capsys.readouterr().err
    assert "unknown config key 'qff.alhpa'" in err and "qff.alpha" in err and "Traceback" not in err


@pytest.mark.slow
def test_console_script_runs():
    out = subprocess.run(
        [sys.executable, "-m", "qkvqa.cli", "config", "show", "cda.K1=7"], capture_output=True, text=True, check=True
    ).stdout
    assert "K1: 7" in out
