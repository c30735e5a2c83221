"""Every sweep YAML example a user may copy (`qkvqa sweep --help`, docs/sweeps.md, the missing-command error)
parses with the loader the sweep uses and passes the sweep's own command check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from qkvqa.cli.sweep import DESCRIPTION
from qkvqa.errors import ConfigError
from qkvqa.sweep.spec import parse_sweep, read_sweep_yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = (REPO / "docs" / "sweeps.md").read_text(encoding="utf-8")


def _examples() -> list[tuple[str, str]]:
    """(where, YAML text): the docs' ```yaml blocks, their inline `[...]` commands, the help's `command:` lines,
    and the example in the error for a sweep file without a command."""
    out = [
        (f"docs/sweeps.md yaml block {i}", block)
        for i, block in enumerate(re.findall(r"```yaml\n(.*?)```", DOCS, flags=re.S))
    ]
    out += [
        (f"docs/sweeps.md inline {span}", f"command: {span}") for span in re.findall(r"`(\[[^`]*\$\{[^`]*\])`", DOCS)
    ]
    out += [
        (f"qkvqa sweep --help: {line.strip()}", line.strip())
        for line in DESCRIPTION.splitlines()
        if line.strip().startswith("command:")
    ]
    with pytest.raises(ConfigError) as refused:
        parse_sweep({"method": "grid", "parameters": {"qff.alpha": {"value": 0.5}}})
    out += [
        ("the missing-command error", f"command: {span}")
        for span in re.findall(r"e\.g\. (\[.*?\])", str(refused.value))
    ]
    return out


EXAMPLES = _examples()


def test_the_examples_were_found():
    wheres = " ".join(where for where, _ in EXAMPLES)
    assert "yaml block" in wheres and "inline" in wheres and "--help" in wheres and "missing-command" in wheres


@pytest.mark.parametrize("where, text", EXAMPLES, ids=[where for where, _ in EXAMPLES])
def test_every_sweep_yaml_example_parses_and_its_command_is_accepted(where, text):
    try:
        raw = read_sweep_yaml(text)
    except yaml.YAMLError as e:
        pytest.fail(f"{where}: not valid YAML: {e}")
    assert isinstance(raw, dict), where
    if "command" in raw:
        spec = parse_sweep(
            {"method": "grid", "parameters": {"qff.alpha": {"value": 0.5}}, "program": "train.py", **raw}
        )
        assert "${args_no_hyphens}" in spec.command, where
        assert all(isinstance(token, str) for token in spec.command), where  # no {'env': None} mappings
