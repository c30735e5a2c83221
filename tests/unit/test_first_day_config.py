"""Issue 34: `eval.split=validation` (a common spelling) reads as the val split; a split that is none says which are."""

from __future__ import annotations

import pytest

from qkvqa.cli.main import main
from qkvqa.config.load import compose
from qkvqa.errors import ConfigError


@pytest.mark.slow
@pytest.mark.parametrize(
    "spelling, split",
    [
        ("validation", "val"),
        ("valid", "val"),
        ("dev", "val"),
        ("Validation", "val"),
        ("testing", "test"),
        ("val", "val"),
    ],
)
def test_a_split_alias_reads_as_its_split(spelling, split):
    assert compose(None, [], [f"eval.split={spelling}"]).eval.split == split


def test_a_split_that_is_none_is_one_line_listing_the_splits_and_aliases(capsys):
    with pytest.raises(ConfigError, match=r"eval.split='vall' is not one of train, val, test .*validation"):
        compose(None, [], ["eval.split=vall"])
    assert main(["evaluate", "eval.split=vall"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not one of train, val, test" in err[0], err


def test_the_shorthand_split_takes_the_alias_too():
    from qkvqa.cli.embed import expand_shorthands
    from qkvqa.cli.evaluate import SHORTHANDS

    cfg = compose(None, [], expand_shorthands(["split=validation"], SHORTHANDS))
    assert cfg.eval.split == "val"


@pytest.mark.slow
def test_config_show_key_prints_that_subtree_only(capsys):
    import yaml

    assert main(["config", "show", "experiment=demo/qff_per_layer", "qff", "trainer.max_steps"]) == 0
    out = capsys.readouterr().out
    shown = yaml.safe_load(out)
    assert set(shown) == {"qff", "trainer.max_steps"} and shown["qff"]["focus"] == "per_layer"
    assert main(["config", "show", "qff.alhpa"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "did you mean qff.alpha" in err[0]


@pytest.mark.slow
def test_the_dump_shows_a_tiny_models_word_list_as_its_length(capsys):
    import yaml

    assert main(["config", "show", "experiment=demo/qff_per_layer"]) == 0
    out = capsys.readouterr().out
    options = yaml.safe_load(out)["components"]["qformer"]["options"]
    assert options["vocab_texts"].startswith("<") and "items" in options["vocab_texts"]
    assert "abbey account" not in out and len(out.splitlines()) < 400
