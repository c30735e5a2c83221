"""A built wheel is a whole package: the experiment YAMLs ship inside it and `python -m qkvqa config ...` finds them outside a checkout."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from qkvqa.config.load import list_experiments

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# what setup.py packages (copied, so the build leaves nothing in the checkout)
SOURCES = ("src", "data_modules", "experiments", "setup.py", "setup.cfg", "pyproject.toml", "README.md", "LICENSE")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel of this checkout, built offline (no dependencies, no build isolation)."""
    work = tmp_path_factory.mktemp("wheel")
    for name in SOURCES:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(
                source, work / "src_tree" / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        elif source.is_file():
            (work / "src_tree").mkdir(exist_ok=True)
            shutil.copy2(source, work / "src_tree" / name)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(work / "dist"),
            str(work / "src_tree"),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (built,) = (work / "dist").glob("qkvqa-*.whl")
    return built


def test_the_wheel_carries_every_experiment_yaml_and_the_namespaced_data_modules(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = {str(p.relative_to(REPO)) for p in (REPO / "experiments").rglob("*.yaml")}
    assert len(shipped) > 20 and {f"qkvqa/{name}" for name in shipped} <= names
    assert {"qkvqa/__main__.py", "qkvqa/data_modules/__init__.py", "qkvqa/data_modules/qff_train.py"} <= names
    assert not [n for n in names if n.startswith("data_modules/") or n.startswith("experiments/")]


def test_an_installed_wheel_lists_and_composes_experiments_outside_the_checkout(wheel, tmp_path):
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)  # an installed wheel is its files under site-packages
    outside = tmp_path / "somewhere"
    outside.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("QKVQA_EXPERIMENTS", "QKVQA_CONFIG_PATH")}
    env["PYTHONPATH"] = str(site)  # before the checkout's editable install

    def qkvqa(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "qkvqa", *args], cwd=outside, env=env, capture_output=True, text=True, timeout=120
        )

    where = subprocess.run(
        [sys.executable, "-c", "import qkvqa, qkvqa.data_modules.qff_train; print(qkvqa.__file__)"],
        cwd=outside,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(site)
    listed = qkvqa("config", "list")
    assert listed.returncode == 0, listed.stderr
    assert f"main directory {site / 'qkvqa' / 'experiments'}" in listed.stdout
    lines = listed.stdout.splitlines()
    assert {f"  {name}" for name in list_experiments(REPO / "experiments")} <= set(lines)
    shown = qkvqa("config", "show", "experiment=evqa_qff", "qff.alpha=0.8")
    assert shown.returncode == 0, shown.stderr
    assert "experiment: evqa_qff" in shown.stdout and "alpha: 0.8" in shown.stdout


def test_the_wheel_carries_the_inspect_page(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"qkvqa/inspect/static/{name}" for name in ("index.html", "app.js", "style.css")} <= names
