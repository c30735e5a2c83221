"""Config composition: merge order, overrides, ~key, unknown keys, types, floats and None."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from qkvqa.config.cli import split_overrides
from qkvqa.config.load import compose, from_saved, list_experiments, to_plain, to_yaml
from qkvqa.errors import ConfigError


@pytest.fixture
def exp_root(tmp_path: Path) -> Path:
    """A small experiments tree: base, two presets and an experiment in a sub-folder."""
    (tmp_path / "base").mkdir()
    (tmp_path / "presets").mkdir()
    (tmp_path / "ablations").mkdir()
    (tmp_path / "base" / "a.yaml").write_text("qff:\n  alpha: 0.5\nseed: 1\n")
    (tmp_path / "base" / "b.yaml").write_text("qff:\n  alpha: 0.6\n")  # later base files win
    (tmp_path / "presets" / "fast.yaml").write_text("trainer:\n  max_steps: 3\nseed: 2\n")
    (tmp_path / "presets" / "slow.yaml").write_text("trainer:\n  max_steps: 30\n")
    (tmp_path / "ablations" / "no_focus.yaml").write_text("qff:\n  focus: none\nseed: 3\n")
    (tmp_path / "needs_preset.yaml").write_text("presets: [fast]\ncda:\n  K1: 8\n")
    return tmp_path


@pytest.mark.slow
def test_merge_order_base_presets_experiment_overrides(exp_root):
    cfg = compose(None, [], [], root=exp_root)
    assert cfg.qff.alpha == 0.6 and cfg.seed == 1
    cfg = compose("ablations/no_focus", ["fast"], [], root=exp_root)
    assert cfg.trainer.max_steps == 3 and cfg.qff.focus == "none" and cfg.seed == 3  # experiment beats preset
    assert cfg.experiment == "ablations/no_focus" and list(cfg.presets) == ["fast"]
    cfg = compose("ablations/no_focus", ["fast", "slow"], ["seed=9"], root=exp_root)
    assert cfg.trainer.max_steps == 30 and cfg.seed == 9  # later preset, then CLI


def test_experiment_can_name_its_presets(exp_root):
    cfg = compose("needs_preset", [], [], root=exp_root)
    assert cfg.trainer.max_steps == 3 and cfg.cda.K1 == 8 and list(cfg.presets) == ["fast"]


@pytest.mark.slow
def test_command_line_presets_apply_after_the_experiments_in_the_order_typed(exp_root):
    # `slow` then `fast` typed: fast (also named by the experiment) comes last and wins
    cfg = compose("needs_preset", ["slow", "fast"], [], root=exp_root)
    assert list(cfg.presets) == ["slow", "fast"] and cfg.trainer.max_steps == 3
    cfg = compose("needs_preset", ["slow"], [], root=exp_root)
    assert list(cfg.presets) == ["fast", "slow"] and cfg.trainer.max_steps == 30


@pytest.mark.slow
def test_unknown_key_names_key_and_nearest(exp_root):
    with pytest.raises(ConfigError) as e:
        compose(None, [], ["qff.alhpa=0.3"], root=exp_root)
    assert "qff.alhpa" in str(e.value) and "qff.alpha" in str(e.value)
    with pytest.raises(ConfigError, match="trainer.max_steps"):
        compose(None, [], ["trainer.max_step=3"], root=exp_root)


def test_unknown_key_in_yaml_names_the_file(exp_root):
    (exp_root / "typo.yaml").write_text("cda:\n  K_1: 3\n")
    with pytest.raises(ConfigError) as e:
        compose("typo", [], [], root=exp_root)
    assert "typo.yaml" in str(e.value) and "cda.K_1" in str(e.value) and "cda.K1" in str(e.value)


def test_wrong_type_names_key_and_expected_type(exp_root):
    with pytest.raises(ConfigError) as e:
        compose(None, [], ["trainer.max_steps=many"], root=exp_root)
    assert "trainer.max_steps" in str(e.value) and "integer" in str(e.value)
    with pytest.raises(ConfigError, match="expected float"):
        compose(None, [], ["qff.alpha=high"], root=exp_root)


@pytest.mark.slow
def test_floats_and_none_parse_as_users_expect(exp_root):
    cfg = compose(
        None,
        [],
        ["qff.lr=1e-05", "qff.alpha=1e-1", "cda.U=null", "cda.theta=None", "qff.checkpoint=None"],
        root=exp_root,
    )
    assert cfg.qff.lr == pytest.approx(1e-5) and isinstance(cfg.qff.lr, float)
    assert cfg.qff.alpha == pytest.approx(0.1)
    assert cfg.cda.U is None and cfg.cda.theta is None and cfg.qff.checkpoint is None


def test_none_into_non_optional_is_an_error(exp_root):
    with pytest.raises(ConfigError, match="trainer.max_steps"):
        compose(None, [], ["trainer.max_steps=None"], root=exp_root)


@pytest.mark.slow
def test_tilde_restores_default_and_deletes_free_keys(exp_root):
    cfg = compose(None, [], ["qff.alpha=0.2", "~qff.alpha"], root=exp_root)
    assert cfg.qff.alpha == 0.9  # the schema default
    cfg = compose(None, [], ["components.qformer.options.depth=3", "~components.qformer.options.depth"], root=exp_root)
    assert "depth" not in cfg.components.qformer.options
    with pytest.raises(ConfigError, match="unknown config key"):
        compose(None, [], ["~qff.nope"], root=exp_root)


@pytest.mark.slow
def test_bad_arguments_and_missing_experiment(exp_root):
    with pytest.raises(ConfigError, match="key=value"):
        compose(None, [], ["alpha"], root=exp_root)
    with pytest.raises(ConfigError, match="ablations/no_focus"):
        compose("ablations/no_focs", [], [], root=exp_root)
    with pytest.raises(ConfigError, match="no preset"):
        compose(None, ["turbo"], [], root=exp_root)


def test_split_overrides():
    exp, presets, rest = split_overrides(["experiment=x", "preset=a,b", "presets=c", "qff.alpha=1"])
    assert exp == "x" and presets == ["a", "b", "c"] and rest == ["qff.alpha=1"]


@pytest.mark.slow
def test_saved_yaml_reloads_to_identical_config(exp_root, tmp_path):
    cfg = compose("ablations/no_focus", ["fast"], ["qff.lr=3e-06", "cda.U=null"], root=exp_root)
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))
    assert to_plain(from_saved(path)) == to_plain(cfg)


def test_list_experiments(exp_root):
    assert list_experiments(exp_root) == ["ablations/no_focus", "needs_preset"]


@pytest.mark.slow  # seconds: `make test` runs it, `make test-fast` does not
def test_repository_experiments_all_compose(experiments_root):
    names = list_experiments(experiments_root)
    for name in names:
        cfg = compose(name, [], [], root=experiments_root)
        assert cfg.experiment == name
    for preset in sorted(p.stem for p in (experiments_root / "presets").glob("*.yaml")):
        assert preset in compose(None, [preset], [], root=experiments_root).presets


def test_plain_config_has_no_omegaconf_objects(exp_root):
    plain = to_plain(compose(None, [], [], root=exp_root))

    def walk(x):
        assert not OmegaConf.is_config(x)
        if isinstance(x, dict):
            for v in x.values():
                walk(v)
        elif isinstance(x, list):
            for v in x:
                walk(v)

    walk(plain)


def test_lowercase_none_is_a_string_value(exp_root):
    cfg = compose(None, [], ["qff.focus=none", "qff.checkpoint=None"], root=exp_root)
    assert cfg.qff.focus == "none" and cfg.qff.checkpoint is None


@pytest.mark.parametrize(
    "override, message",
    [
        ("data.batch_size=0", "data.batch_size=0 is out of range: it must be at least 1"),
        ("cda.K1=0", "cda.K1=0 is out of range"),
        ("qff.alpha=1.5", "qff.alpha=1.5 is out of range: it must be in [0.0, 1.0]"),
        ("cda.chunk_tokens=0", "cda.chunk_tokens=0 is out of range"),
        ("eval.stop_after=cda", "eval.stop_after='cda' is not one of generation, filter"),
        ("cda.top1_section_by=both", "cda.top1_section_by='both' is not one of qff, bge, fused"),
        ("qff.gate=sigmoid", "qff.gate='sigmoid' is not one of tanh, none"),
    ],
)
def test_values_out_of_their_declared_range_are_refused_when_composed(override, message):
    with pytest.raises(ConfigError) as error:
        compose(None, [], [override])
    assert message in str(error.value)


@pytest.mark.slow  # seconds: `make test` runs it, `make test-fast` does not
def test_every_shipped_experiment_passes_the_value_checks():
    for name in list_experiments():
        compose(name, [], [])
    assert compose(None, [], ["cda.U=null", "cda.theta=null", "qff.dropout=null"]).cda.U is None


@pytest.mark.slow
def test_a_gpu_the_machine_lacks_is_one_config_error_before_any_work():
    """Issue 14 item 7: trainer.accelerator=gpu without a GPU was Lightning's 30-line traceback."""
    import torch

    from qkvqa.config.load import compose
    from qkvqa.errors import ConfigError
    from qkvqa.run.trainer import check_hardware

    cfg = compose("evqa_qff", ["cpu"], ["trainer.accelerator=gpu", "components.qformer.device=cuda:0"])
    check_hardware(compose("evqa_qff", ["cpu"], []), ["qformer"])  # a CPU config passes anywhere
    if torch.cuda.is_available():
        check_hardware(cfg, ["qformer"])
    else:
        with pytest.raises(
            ConfigError,
            match=r"trainer.accelerator=gpu, components.qformer.device=cuda:0, but this "
            r"machine has no CUDA GPU.*preset=cpu",
        ):
            check_hardware(cfg, ["qformer"])


@pytest.mark.slow
@pytest.mark.parametrize("token", ["run_id=none", "run_id=None", "run_id=NONE", "run_id=null", "run_id=~", "run_id="])
def test_run_id_none_or_null_means_no_run_id_and_a_new_run(exp_root, tmp_path, monkeypatch, token):
    from qkvqa.run.rundir import clear_run_env, resolve_run

    cfg = compose(None, [], [token, f"paths.checkpoints_root={tmp_path / 'runs'}"], root=exp_root)
    assert cfg.run_id is None and "run_id: null" in to_yaml(cfg)
    clear_run_env()
    run = resolve_run(cfg)
    assert run.run_id.lower() != "none" and run.run_dir.name == run.run_id and not run.resumed
    monkeypatch.setenv("WANDB_SWEEP_ID", "sweep1")  # a W&B sweep agent's run id is taken, as documented
    monkeypatch.setenv("WANDB_RUN_ID", "agent-run")
    clear_run_env()
    assert resolve_run(cfg).run_id == "agent-run"
    clear_run_env()


def test_a_run_id_that_only_contains_none_is_kept(exp_root):
    assert compose(None, [], ["run_id=none-2"], root=exp_root).run_id == "none-2"
    assert compose(None, [], ["qff.focus=none"], root=exp_root).qff.focus == "none"  # the focus mode, not null


@pytest.mark.slow
def test_environment_values_are_used_but_records_keep_the_interpolation(exp_root, monkeypatch, tmp_path):
    """Issue 31 item 7: a secret read with oc.env is resolved when read, never in to_yaml / to_plain, and a saved
    config reloads (and compares for resume) as the same config."""
    from qkvqa.config.load import environment_keys, from_saved, to_plain, to_yaml
    from qkvqa.run.resume import config_changes

    monkeypatch.setenv("QKVQA_TEST_SECRET", "hunter2")
    cfg = compose(
        None,
        [],
        [
            "logger.wandb.group=${oc.env:QKVQA_TEST_SECRET}",
            "logger.wandb.project=p_${seed}",
            "logger.wandb.entity=team_${logger.wandb.group}",
        ],
        root=exp_root,
    )
    assert cfg.logger.wandb.group == "hunter2" and cfg.logger.wandb.project == f"p_{cfg.seed}"
    assert cfg.logger.wandb.entity == "team_hunter2"
    assert environment_keys(cfg) == {"logger.wandb.group", "logger.wandb.entity"}
    assert "hunter2" not in to_yaml(cfg) and "hunter2" not in json.dumps(to_plain(cfg))
    assert to_plain(cfg)["logger"]["wandb"] == {
        **to_plain(cfg)["logger"]["wandb"],
        "group": "${oc.env:QKVQA_TEST_SECRET}",
        "project": f"p_{cfg.seed}",
    }
    (tmp_path / "config.yaml").write_text(to_yaml(cfg))
    saved = from_saved(tmp_path / "config.yaml")
    assert saved.logger.wandb.group == "hunter2" and config_changes(saved, cfg) == {}
