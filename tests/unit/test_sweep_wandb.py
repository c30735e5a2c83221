"""The W&B sweep backend without the network: sweep config, agent commands, agent environment, no leaks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from qkvqa.cli.main import main
from qkvqa.errors import ConfigError
from qkvqa.sweep.spec import load_sweep
from qkvqa.sweep.wandb_backend import (
    agent_commands,
    agent_env,
    preserved_wandb_env,
    run_wandb_sweep,
    wandb_sweep_config,
)

REPO = Path(__file__).resolve().parents[2]
ALPHA = REPO / "experiments" / "sweeps" / "alpha_sweep.yaml"


def test_sweep_config_is_the_file_with_name_and_project():
    spec = load_sweep(ALPHA)
    config = wandb_sweep_config(spec, "proj", "me")
    assert config["parameters"] == spec.raw["parameters"] and config["command"] == spec.raw["command"]
    assert config["name"] == "alpha_sweep" and config["project"] == "proj" and config["entity"] == "me"
    assert "project" not in spec.raw  # the loaded file itself is not changed


def test_agent_commands_split_the_count():
    cmds = agent_commands("me/proj/abc", parallel=3, count=7, interpreter="/v/bin/python")
    assert cmds == [["/v/bin/python", "-m", "wandb", "agent", "--count", str(n), "me/proj/abc"] for n in (3, 2, 2)]
    assert agent_commands("p/abc", parallel=2, count=1, interpreter="py") == [
        ["py", "-m", "wandb", "agent", "--count", "1", "p/abc"]
    ]
    assert agent_commands("abc", parallel=1, count=None, interpreter="py") == [["py", "-m", "wandb", "agent", "abc"]]
    with pytest.raises(ConfigError):
        agent_commands("abc", parallel=0, count=None)


def test_agent_env_has_no_leaked_ids_and_our_python_first():
    env = agent_env(
        {
            "PATH": "/usr/bin",
            "WANDB_RUN_ID": "old",
            "WANDB_SWEEP_ID": "old",
            "QKVQA_RUN_DIR": "/x",
            "WANDB_API_KEY": "k",
        }
    )
    assert not {"WANDB_RUN_ID", "WANDB_SWEEP_ID", "QKVQA_RUN_DIR"} & set(env) and env["WANDB_API_KEY"] == "k"
    # the agent runs `python` for ${interpreter}: it must be the interpreter running qkvqa
    assert env["PATH"].split(os.pathsep) == [os.path.dirname(sys.executable), "/usr/bin"]


def test_wandb_env_is_restored_after_sweep_creation(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    with preserved_wandb_env():
        os.environ["WANDB_PROJECT"] = "set-by-wandb.sweep"
        os.environ["WANDB_SWEEP_ID"] = "abc"
        os.environ["WANDB_MODE"] = "offline"
    assert "WANDB_PROJECT" not in os.environ and "WANDB_SWEEP_ID" not in os.environ
    assert os.environ["WANDB_MODE"] == "online"


class _Proc:
    def __init__(self, rc):
        self.rc = rc

    def wait(self):
        return self.rc


def test_run_creates_the_sweep_and_starts_agents(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_RUN_ID", "leaked")
    created, launched = [], []

    def create(config, project, entity):
        created.append((config["name"], project, entity))
        return "abc123"

    def launch(cmd, env):
        launched.append((cmd, env))
        return _Proc(len(launched) - 1)

    rc = run_wandb_sweep(
        load_sweep(ALPHA), project="proj", entity="me", parallel=2, count=11, create=create, launch=launch
    )
    assert created == [("alpha_sweep", "proj", "me")] and rc == 1
    assert [c[-3:] for c, _ in launched] == [["--count", "6", "me/proj/abc123"], ["--count", "5", "me/proj/abc123"]]
    assert all("WANDB_RUN_ID" not in env and env["WANDB_MODE"] == "online" for _, env in launched)
    assert os.environ["WANDB_RUN_ID"] == "leaked"  # only the children's environment is cleaned


def test_joining_an_existing_sweep_creates_nothing(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    launched = []
    run_wandb_sweep(
        load_sweep(ALPHA),
        project=None,
        entity=None,
        sweep_id="xyz",
        create=lambda *a: pytest.fail("must not create"),
        launch=lambda cmd, env: launched.append(cmd) or _Proc(0),
    )
    assert launched[0][-1] == "qkvqa/xyz"


def test_offline_mode_is_refused(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    with pytest.raises(ConfigError, match="--backend local"):
        run_wandb_sweep(load_sweep(ALPHA), project=None, entity=None)


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_cli_dry_run_prints_the_sweep_and_agents(capsys):
    assert main(["sweep", str(ALPHA), "--backend", "wandb", "--dry-run", "--project", "p", "--parallel", "2"]) == 0
    out = capsys.readouterr().out
    config = json.loads(out[: out.rindex("}") + 1])
    assert config["method"] == "grid" and config["project"] == "p"
    assert out.rstrip().splitlines()[-1].endswith("-m wandb agent 'p/<sweep id>'")


@pytest.mark.online
@pytest.mark.skipif(
    not (os.environ.get("WANDB_API_KEY") and os.environ.get("QKVQA_WANDB_TEST_PROJECT")),
    reason="needs WANDB_API_KEY and QKVQA_WANDB_TEST_PROJECT=entity/project",
)
def test_real_sweep_is_created_without_leaking_env(monkeypatch):
    from qkvqa.sweep.wandb_backend import create_sweep

    monkeypatch.setenv("WANDB_MODE", "online")
    entity, project = os.environ["QKVQA_WANDB_TEST_PROJECT"].split("/")
    before = {k: v for k, v in os.environ.items() if k.startswith("WANDB_")}
    sweep_id = create_sweep(wandb_sweep_config(load_sweep(ALPHA), project, entity), project, entity)
    assert sweep_id and {k: v for k, v in os.environ.items() if k.startswith("WANDB_")} == before
