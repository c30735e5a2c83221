"""The command line qkvqa remembers for the commands it suggests is always this call's, never an earlier one's."""

from __future__ import annotations

import pytest

from qkvqa.cli.main import main
from qkvqa.utils.command_line import invocation, suggest


@pytest.mark.slow
def test_each_call_remembers_its_own_command_and_overrides(capsys):
    # In CI, a `qkvqa train` test left its overrides behind and a later `retrieve` suggested them in its fix.
    assert main(["config", "show", "experiment=evqa_qff", "seed=5"]) == 0
    assert invocation() == ("config show", ["experiment=evqa_qff", "seed=5"])
    assert main(["config", "show", "seed=7"]) == 0
    capsys.readouterr()
    assert invocation() == ("config show", ["seed=7"])
    assert suggest("index build", keep=("seed",), fallback=["experiment=x"]) == "qkvqa index build seed=7"
    assert main(["config", "show"]) == 0
    assert suggest("index build", fallback=["experiment=x"]) == "qkvqa index build experiment=x"
