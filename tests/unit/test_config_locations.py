"""Where configs come from: experiment=path/to/file.yaml, --config-dir and $QKVQA_CONFIG_PATH, the main directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from qkvqa.cli.main import main
from qkvqa.config.load import (
    CONFIG_PATH_ENV,
    checkout_experiments,
    compose,
    experiment_sources,
    experiments_dir,
    list_experiments,
)
from qkvqa.errors import ConfigError
from qkvqa.run.rundir import new_run_id


@pytest.fixture
def main_root(tmp_path: Path, monkeypatch) -> Path:
    """A main experiments directory (base, a preset, one experiment) as $QKVQA_EXPERIMENTS; no search path."""
    root = tmp_path / "main"
    (root / "base").mkdir(parents=True)
    (root / "presets").mkdir()
    (root / "base" / "a.yaml").write_text("seed: 1\n")
    (root / "presets" / "fast.yaml").write_text("trainer:\n  max_steps: 3\n")
    (root / "shipped.yaml").write_text("qff:\n  alpha: 0.7\n")
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(root))
    monkeypatch.delenv(CONFIG_PATH_ENV, raising=False)
    return root


def user_dir(path: Path, **files: str) -> Path:
    """A directory laid out like experiments/: `files` maps relative names (presets/x) to YAML text."""
    for name, text in files.items():
        (path / f"{name}.yaml").parent.mkdir(parents=True, exist_ok=True)
        (path / f"{name}.yaml").write_text(text)
    return path


@pytest.mark.slow
def test_an_experiment_file_outside_the_checkout_is_read_by_its_path(main_root, tmp_path, monkeypatch):
    mine = user_dir(tmp_path / "elsewhere", mine="presets: [fast]\nqff:\n  alpha: 0.3\n") / "mine.yaml"
    cfg = compose(str(mine))
    assert cfg.qff.alpha == 0.3 and cfg.seed == 1 and cfg.trainer.max_steps == 3  # base and its preset still apply
    assert cfg.experiment == str(mine.resolve())
    monkeypatch.chdir(tmp_path)
    assert compose("elsewhere/mine.yaml").experiment == str(mine.resolve())  # relative to the working dir
    assert "-mine-" in new_run_id(cfg.experiment)  # run ids use the file's name
    with pytest.raises(ConfigError, match=r"experiment=elsewhere/nope\.yaml: no such file"):
        compose("elsewhere/nope.yaml")


@pytest.mark.slow
def test_the_search_path_adds_experiments_and_presets_and_the_first_match_wins(main_root, tmp_path, monkeypatch):
    first = user_dir(tmp_path / "first", mine="qff:\n  alpha: 0.1\n", **{"presets/slow": "trainer:\n  max_steps: 30\n"})
    second = user_dir(
        tmp_path / "second", mine="qff:\n  alpha: 0.2\n", other="seed: 5\n", shipped="qff:\n  alpha: 0.9\n"
    )
    monkeypatch.setenv(CONFIG_PATH_ENV, f"{first}{os.pathsep}{second}")
    assert list_experiments() == ["mine", "other", "shipped"]
    assert experiment_sources() == {"mine": first, "other": second, "shipped": second}
    assert compose("mine").qff.alpha == 0.1 and compose("other").seed == 5
    assert compose("shipped").qff.alpha == 0.9  # the search path comes before the main directory
    assert compose("mine", ["slow", "fast"]).trainer.max_steps == 3
    # --config-dir comes before $QKVQA_CONFIG_PATH
    assert compose("mine", search=[second]).qff.alpha == 0.2


def test_config_dir_on_the_command_line(main_root, tmp_path, capsys):
    mine = user_dir(tmp_path / "cfgs", mine="qff:\n  alpha: 0.25\n", **{"presets/mypreset": "seed: 11\n"})
    assert main(["config", "show", "--config-dir", str(mine), "experiment=mine", "preset=mypreset"]) == 0
    out = capsys.readouterr().out
    assert "alpha: 0.25" in out and "seed: 11" in out and "experiment: mine" in out
    assert main(["config", "list", "--config-dir", str(mine)]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert f"  mine  ({mine})" in listed and "  shipped" in listed and f"  mypreset  ({mine})" in listed
    assert main(["config", "list"]) == 0
    assert "  mine" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_missing_search_directory_or_experiment_is_one_line_naming_it(main_root, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(CONFIG_PATH_ENV, str(tmp_path / "gone"))
    with pytest.raises(ConfigError, match=r"\$QKVQA_CONFIG_PATH .*gone: no such directory"):
        compose("shipped")
    monkeypatch.delenv(CONFIG_PATH_ENV)
    assert main(["config", "show", "--config-dir", str(tmp_path / "nodir"), "experiment=shipped"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--config-dir" in err[0] and "nodir: no such directory" in err[0]
    with pytest.raises(ConfigError, match=r"no experiment 'shiped' in .*did you mean \['shipped'\]"):
        compose("shiped")


def test_the_main_directory_is_the_checkouts_outside_it(monkeypatch, tmp_path):
    monkeypatch.delenv("QKVQA_EXPERIMENTS", raising=False)
    monkeypatch.chdir(tmp_path)
    assert experiments_dir() == checkout_experiments() and (checkout_experiments() / "base").is_dir()
    (tmp_path / "experiments" / "base").mkdir(parents=True)
    assert experiments_dir() == tmp_path / "experiments"  # a project's own experiments/ first
