"""The sweep command contract: W&B's `${args_no_hyphens}` rendering reaches our parser with the sweep's types."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from qkvqa.cli.main import main
from qkvqa.sweep.command import render_args, render_command

REPO = Path(__file__).resolve().parents[2]
# One value of every kind a sweep can hold, with the dotted keys they are swept under.
PARAMS = {
    "qff.alpha": 0.3,
    "qff.lr": 1e-05,  # Python renders 1e-05 (no dot)
    "cda.U": None,  # rendered as the text None
    "cda.theta": 0.0,
    "trainer.deterministic": True,  # rendered True
    "qff.learnable_temperature": False,
    "seed": 7,
    "eval.judge": "em_only",
    "qff.betas": [0.9, 0.99],  # rendered as a Python list repr
    "trainer.precision": "bf16-mixed",
}


@pytest.mark.slow
def test_rendering_matches_wandbs_agent():
    from wandb.sdk.launch.sweeps.utils import create_sweep_command_args

    theirs = create_sweep_command_args({"args": {k: {"value": v} for k, v in PARAMS.items()}})
    ours = render_args(PARAMS)
    assert set(ours) <= set(theirs)
    for macro, tokens in ours.items():
        assert tokens == theirs[macro], macro
    assert "cda.U=None" in ours["args_no_hyphens"] and "qff.lr=1e-05" in ours["args_no_hyphens"]


def _assert_typed_like_the_sweep(cfg):
    for key, value in PARAMS.items():
        got = OmegaConf.select(cfg, key)
        got = OmegaConf.to_container(got) if OmegaConf.is_config(got) else got
        assert got == value and type(got) is type(value), (key, got, value)


@pytest.mark.slow
def test_cli_accepts_rendered_overrides_with_their_types(capsys):
    tokens = render_args(PARAMS)["args_no_hyphens"]
    assert main(["config", "show", *tokens]) == 0
    _assert_typed_like_the_sweep(OmegaConf.create(capsys.readouterr().out))


def test_command_macros_expand_like_the_agent(monkeypatch):
    monkeypatch.setenv("QKVQA_TEST_EXP", "evqa_qff")
    argv = render_command(
        [
            "${env}",
            "${interpreter}",
            "${program}",
            "experiment=${envvar:QKVQA_TEST_EXP}",
            "--flag=${envvar:QKVQA_UNSET}",
            "${args_no_hyphens}",
            "${args_json_file}",
        ],
        {"a.b": 1, "c": True},
        program="prog.py",
        interpreter="/venv/bin/python",
        args_json_file="/tmp/args.json",
    )
    assert argv == [
        "/usr/bin/env",
        "/venv/bin/python",
        "prog.py",
        "experiment=evqa_qff",
        "--flag=QKVQA_UNSET",
        "a.b=1",
        "c=True",
        "/tmp/args.json",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("form", ["module", "program"])
def test_rendered_command_runs_our_cli(tmp_path, form):
    """The agent's canonical form ([${env}, ${interpreter}, ${program}, ${args_no_hyphens}]) and ours (-m qkvqa.cli)."""
    if form == "program":
        program = tmp_path / "qkvqa_config_show.py"
        program.write_text(
            "import sys\nfrom qkvqa.cli.main import main\nsys.exit(main(['config', 'show', *sys.argv[1:]]))\n"
        )
        command = ["${env}", "${interpreter}", "${program}", "${args_no_hyphens}"]
    else:
        program = None
        command = ["${env}", "${interpreter}", "-m", "qkvqa.cli", "config", "show", "${args_no_hyphens}"]
    argv = render_command(command, PARAMS, program=str(program) if program else None, interpreter=sys.executable)
    out = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    _assert_typed_like_the_sweep(OmegaConf.create(out.stdout))
