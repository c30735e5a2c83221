"""Sweep files: validation, W&B distributions, grid order, seeded random search, value-type drift."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from qkvqa.errors import ConfigError
from qkvqa.sweep.params import DISTRIBUTIONS, grid_points, parse_parameter, random_point
from qkvqa.sweep.spec import check_value_types, load_sweep, parse_sweep

REPO = Path(__file__).resolve().parents[2]
COMMAND = ["${env}", "${interpreter}", "-m", "qkvqa.cli", "train", "${args_no_hyphens}"]


def _sweep(parameters, method="grid", **extra):
    return parse_sweep({"method": method, "parameters": parameters, "command": COMMAND, **extra})


@pytest.mark.slow
@pytest.mark.parametrize("name", ["alpha_sweep", "cda_grid"])
def test_shipped_sweeps_validate_and_keep_their_types(name):
    spec = load_sweep(REPO / "experiments" / "sweeps" / f"{name}.yaml")
    assert spec.name == name and spec.method == "grid" and spec.goal == "maximize" and spec.metric
    check_value_types(spec)
    assert "evaluate" in spec.command and "${args_no_hyphens}" in spec.command


def test_alpha_sweep_is_figure_5_grid():
    spec = load_sweep(REPO / "experiments" / "sweeps" / "alpha_sweep.yaml")
    alphas = [p["qff.alpha"] for p in spec.trial_params(None, 0)]
    assert alphas == [pytest.approx(i / 10) for i in range(11)] and all(type(a) is float for a in alphas)
    # the paper's y-axis: article R@1 after the filter; no CDA or generation in any trial
    assert spec.metric == "eval/recall@1_after_filter"
    assert all(p["eval.stop_after"] == "filter" for p in spec.trial_params(None, 0))


def test_cda_grid_covers_table_6_keys_with_null_limits():
    spec = load_sweep(REPO / "experiments" / "sweeps" / "cda_grid.yaml")
    assert set(spec.parameters) == {"cda.U", "cda.theta", "cda.chunk_tokens", "cda.K1", "cda.K2"}
    points = spec.trial_params(None, 0)
    assert (
        len(points) == 108 and any(p["cda.U"] is None for p in points) and any(p["cda.theta"] is None for p in points)
    )


def test_grid_order_first_parameter_slowest():
    spec = _sweep({"seed": {"values": [1, 2]}, "qff.alpha": {"values": [0.25, 0.75]}, "notes": {"value": "x"}})
    assert spec.trial_params(None, 0) == [
        {"seed": 1, "qff.alpha": 0.25, "notes": "x"},
        {"seed": 1, "qff.alpha": 0.75, "notes": "x"},
        {"seed": 2, "qff.alpha": 0.25, "notes": "x"},
        {"seed": 2, "qff.alpha": 0.75, "notes": "x"},
    ]
    assert len(spec.trial_params(3, 0)) == 3


def test_grid_expands_integer_and_quantised_ranges():
    assert parse_parameter("a", {"min": 2, "max": 5}).grid_values() == [2, 3, 4, 5]
    q = parse_parameter("b", {"distribution": "q_uniform", "min": 0.0, "max": 1.0, "q": 0.25}).grid_values()
    assert q == [0.0, 0.25, 0.5, 0.75, 1.0]
    with pytest.raises(ConfigError, match="grid search needs"):
        grid_points({"lr": parse_parameter("lr", {"distribution": "log_uniform_values", "min": 1e-6, "max": 1e-3})})


def test_distribution_inference_follows_wandb():
    assert parse_parameter("a", {"value": 3}).distribution == "constant"
    assert parse_parameter("a", {"values": [1, 2]}).distribution == "categorical"
    assert parse_parameter("a", {"values": [1, 2], "probabilities": [0.5, 0.5]}).distribution == "categorical_w"
    assert parse_parameter("a", {"min": 1, "max": 4}).distribution == "int_uniform"
    assert parse_parameter("a", {"min": 1, "max": 4.0}).distribution == "uniform"


BOUNDS = {"min": 0.001, "max": 0.1}
CASES = {
    "constant": ({"value": "x"}, lambda v: v == "x"),
    "categorical": ({"values": [1, 2]}, lambda v: v in (1, 2)),
    "categorical_w": ({"values": ["a", "b"], "probabilities": [0.0, 1.0]}, lambda v: v == "b"),
    "int_uniform": ({"min": 1, "max": 3}, lambda v: type(v) is int and 1 <= v <= 3),
    "uniform": ({"min": 0.5, "max": 0.7}, lambda v: 0.5 <= v <= 0.7),
    "q_uniform": ({"min": 0, "max": 10, "q": 5}, lambda v: type(v) is int and v in (0, 5, 10)),
    "log_uniform": ({"min": -3.0, "max": -1.0}, lambda v: math.exp(-3) <= v <= math.exp(-1)),
    "log_uniform_values": (BOUNDS, lambda v: 0.001 <= v <= 0.1),
    "q_log_uniform": ({"min": 0.0, "max": 3.0, "q": 1}, lambda v: type(v) is int and 1 <= v <= 20),
    "q_log_uniform_values": ({"min": 1, "max": 100, "q": 1}, lambda v: type(v) is int and 1 <= v <= 100),
    "inv_log_uniform": ({"min": 1.0, "max": 3.0}, lambda v: math.exp(-3) <= v <= math.exp(-1)),
    "inv_log_uniform_values": (BOUNDS, lambda v: 0.001 <= v <= 0.1),
    "normal": ({"mu": 5.0, "sigma": 0.001}, lambda v: abs(v - 5) < 0.1),
    "q_normal": ({"mu": 5.0, "sigma": 0.001, "q": 1}, lambda v: v == 5),
    "log_normal": ({"mu": 0.0, "sigma": 0.001}, lambda v: abs(v - 1) < 0.1),
    "q_log_normal": ({"mu": 0.0, "sigma": 0.001, "q": 1}, lambda v: v == 1),
    "beta": ({"a": 2.0, "b": 2.0}, lambda v: 0 <= v <= 1),
    "q_beta": ({"a": 2.0, "b": 2.0, "q": 0.5}, lambda v: v in (0.0, 0.5, 1.0)),
}


def test_every_wandb_distribution_is_covered():
    assert set(CASES) == set(DISTRIBUTIONS)


@pytest.mark.parametrize("distribution", sorted(CASES))
def test_distribution_samples_stay_in_range(distribution):
    config, ok = CASES[distribution]
    p = parse_parameter("x", {"distribution": distribution, **config})
    rng = random.Random(7)
    values = [p.sample(rng) for _ in range(200)]
    assert all(ok(v) for v in values), values[:5]


def test_seeded_random_search_is_reproducible_and_extends_as_a_prefix():
    spec = _sweep(
        {
            "qff.lr": {"distribution": "log_uniform_values", "min": 1e-6, "max": 1e-3},
            "seed": {"min": 0, "max": 1000},
            "eval.judge": {"values": ["bem", "em_only"]},
        },
        method="random",
    )
    five = spec.trial_params(5, seed=3)
    assert five == spec.trial_params(5, seed=3)
    assert spec.trial_params(8, seed=3)[:5] == five
    assert spec.trial_params(5, seed=4) != five
    assert len({p["qff.lr"] for p in five}) == 5
    assert random_point(spec.parameters, 3, 2) == five[2]


def test_controller_only_keys_are_named():
    assert _sweep({"a": {"value": 1}}).controller_only_keys() == []
    spec = _sweep(
        {"a": {"value": 1}},
        early_terminate={"type": "hyperband", "min_iter": 3},
        metric={"name": "m", "goal": "maximize", "target": 0.9},
    )
    assert spec.controller_only_keys() == ["early_terminate", "metric.target"]


def test_random_search_needs_a_count_or_run_cap():
    spec = _sweep({"qff.alpha": {"min": 0.0, "max": 1.0}}, method="random")
    with pytest.raises(ConfigError, match="--count"):
        spec.trial_params(None, 0)
    assert len(_sweep({"qff.alpha": {"min": 0.0, "max": 1.0}}, method="random", run_cap=4).trial_params(None, 0)) == 4


def test_bayes_is_refused_by_the_local_runner():
    spec = _sweep({"qff.alpha": {"min": 0.0, "max": 1.0}}, method="bayes", metric={"name": "m", "goal": "maximize"})
    with pytest.raises(ConfigError, match="--backend wandb"):
        spec.trial_params(4, 0)


@pytest.mark.parametrize(
    "raw, message",
    [
        ({"method": "hyperband", "parameters": {"a": {"value": 1}}, "command": COMMAND}, "method must be one of"),
        ({"method": "grid", "parameters": {}, "command": COMMAND}, "parameters"),
        ({"method": "grid", "parameters": {"run_id": {"values": ["a"]}}, "command": COMMAND}, "may not be swept"),
        (
            {"method": "grid", "parameters": {"qff": {"parameters": {"alpha": {"value": 1.0}}}}, "command": COMMAND},
            "flat dotted names",
        ),
        ({"method": "grid", "parameters": {"a": {"value": 1}}}, "give a `command:`"),
        (
            {"method": "grid", "parameters": {"a": {"value": 1}}, "command": ["python", "t.py", "${args}"]},
            "args_no_hyphens",
        ),
        (
            {"method": "grid", "parameters": {"a": {"value": 1}}, "command": ["${interpreter}", "${args_no_hyphen}"]},
            "unknown macro",
        ),
        (
            {
                "method": "grid",
                "parameters": {"a": {"value": 1}},
                "command": ["${interpreter}", "${program}", "${args_no_hyphens}"],
            },
            "no `program:`",
        ),
        ({"method": "grid", "parameters": {"a": {"min": 3, "max": 1}}, "command": COMMAND}, "greater than max"),
        (
            {"method": "grid", "parameters": {"a": {"distribution": "zipf", "min": 1, "max": 2}}, "command": COMMAND},
            "unknown distribution",
        ),
        (
            {
                "method": "grid",
                "parameters": {"a": {"value": 1}},
                "metric": {"name": "m", "goal": "up"},
                "command": COMMAND,
            },
            "minimize or maximize",
        ),
    ],
)
def test_invalid_sweeps_are_refused_with_a_reason(raw, message):
    with pytest.raises(ConfigError, match=message):
        parse_sweep(raw)


def test_name_comes_from_the_file_and_is_made_path_safe(tmp_path):
    path = tmp_path / "fig5.yaml"
    path.write_text(f"method: grid\ncommand: {COMMAND!r}\nparameters:\n  qff.lr:\n    values: [1.0e-5]\n")
    assert load_sweep(path).name == "fig5"
    path.write_text(path.read_text() + "name: my sweep/1\n")
    spec = load_sweep(path)
    assert spec.name == "my-sweep-1" and spec.raw["parameters"]["qff.lr"]["values"] == [1e-5]


@pytest.mark.parametrize(
    "text, key, hint",
    [
        ("[1e-5]", "qff.lr", "'1e-5' (str)"),  # YAML 1.1 (PyYAML, wandb sweep) reads 1e-5 as text
        ("[None]", "cda.theta", "'None' (str)"),  # `None` is text in YAML; null is None
        ("[1]", "qff.alpha", "1 (int)"),  # an int for a float key is logged as 1.0
        ("[yes]", "notes", "True (bool)"),  # YAML 1.1 bool for a str key
    ],
)
def test_values_that_would_drift_are_refused(tmp_path, text, key, hint):
    path = tmp_path / "drift.yaml"
    path.write_text(f"method: grid\ncommand: {COMMAND!r}\nparameters:\n  {key}:\n    values: {text}\n")
    spec = load_sweep(path)
    with pytest.raises(ConfigError) as e:
        check_value_types(spec)
    assert key in str(e.value) and hint in str(e.value)


@pytest.mark.slow
def test_typed_values_and_unknown_keys(tmp_path):
    ok = _sweep(
        {
            "qff.lr": {"values": [1.0e-5, 3.0e-5]},
            "cda.U": {"values": [None, 2]},
            "trainer.deterministic": {"values": [True, False]},
            "qff.betas": {"value": [0.9, 0.99]},
            "qff.alpha": {"min": 0.1, "max": 0.9},
        },
        method="random",
    )
    check_value_types(ok)
    with pytest.raises(ConfigError, match="qff.alhpa"):
        check_value_types(_sweep({"qff.alhpa": {"values": [0.5]}}))
