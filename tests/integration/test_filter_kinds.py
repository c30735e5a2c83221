"""A filter kind is one class (issues 36 and 45): this test names one in a user's own code by its import path
(`tests.helpers.plugin_kinds:ReversedKind`, stage 1's order reversed, a deliberately bad filter), with no edit to
qkvqa, and runs an evaluation with it: the pipeline builds it, the card names it with its source's sha256, the
report names it, the traces carry its ranking."""

from __future__ import annotations

import json

import pytest

from qkvqa.cli.main import main
from qkvqa.config import schema
from qkvqa.pipeline import filters
from qkvqa.pipeline.filters import FILTER_KINDS, FilterKind, register_filter_kind
from qkvqa.run.rundir import clear_run_env

pytestmark = pytest.mark.slow


REVERSED = "tests.helpers.plugin_kinds:ReversedKind"


def test_a_kind_named_by_import_path_runs_an_evaluation(eval_env, monkeypatch):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    clear_run_env()
    assert (
        main(
            [
                "evaluate",
                "experiment=world_eval",
                "run_id=reversed",
                "eval.judge=em_only",
                f"eval.filter={REVERSED}",
                "data.max_questions=6",
            ]
        )
        == 0
    )
    run_dir = eval_env["runs"] / "reversed"
    scores = json.loads((run_dir / "scores.json").read_text())
    card = scores["protocol"]["filter"]
    assert {k: card[k] for k in ("kind", "order")} == {"kind": REVERSED, "order": "stage 1 reversed"}
    assert card["plugin"]["import_path"] == REVERSED and len(card["plugin"]["source_sha256"]) == 64
    assert "qformer" not in scores["protocol"]["models"]  # it loads no QFF
    traces = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    reordered = 0
    for trace in traces:
        stage1 = [a["url"] for a in trace["stage1"]]
        assert [a["url"] for a in trace["filter"]["articles"]] == stage1[::-1]
        assert trace["filter"]["name"] == REVERSED and trace["filter"]["alpha"] is None
        reordered += len(stage1) > 1
    assert reordered >= 3  # questions with a stage-1 ranking (the others' images are missing)
    report = (run_dir / "report.md").read_text()
    assert f"after {REVERSED}" in report and f"kind {REVERSED}" in report


def test_every_schema_filter_has_its_kind_and_an_unknown_one_is_named():
    assert set(schema.EVAL_FILTERS) == set(FILTER_KINDS)
    from qkvqa.errors import ConfigError

    with pytest.raises(ConfigError, match="eval.filter must be one of retrieval, qff, precomputed, got 'nope'"):
        filters.filter_kind("nope")
    with pytest.raises(ConfigError, match="eval.filter 'tests.helpers.plugin_kinds:WordOverlapKind' is not a subclass"):
        filters.filter_kind("tests.helpers.plugin_kinds:WordOverlapKind")


@pytest.fixture
def learned_kind(monkeypatch):
    """A kind with trained weights and settings of its own (say a QFF variant): its class says which config keys it
    reads and which trained weights an evaluation needs."""
    monkeypatch.setitem(schema.CHOICES, "eval.filter", (*schema.EVAL_FILTERS, "learned"))

    @register_filter_kind
    class LearnedKind(FilterKind):
        name = "learned"
        config_keys = ("qff.", "components.qformer.")

        def trained_weights(self, cfg):
            return ("qff.checkpoint", cfg.qff.checkpoint or None, "a trainer of its own writes it")

    yield
    FILTER_KINDS.pop("learned", None)


def test_compare_and_doctor_ask_the_kind_not_its_name(learned_kind, tmp_path):
    """`qkvqa compare` shows a kind's own settings only for its runs, and `qkvqa doctor` checks the trained weights
    it names (both compared `eval.filter` with "qff" / "precomputed" before): nothing outside its class changes."""
    from qkvqa.compare.rows import RunRow
    from qkvqa.compare.table import applies
    from qkvqa.config.load import compose
    from qkvqa.doctor.data import path_checks

    def row(kind):
        return RunRow("r", "finished", None, {"eval.filter": kind}, {}, None, "", task="evaluate")

    assert applies(row("learned"), "qff.focus") and applies(row("learned"), "components.qformer.pretrained")
    assert not applies(row("learned"), "eval.reranked_results")  # the precomputed kind's own key
    assert not applies(row("retrieval"), "qff.focus") and applies(row("precomputed"), "qff.alpha")
    assert applies(row("learned"), "cda.K1")  # not a filter's key: the other rules decide

    cfg = compose("demo/evaluate", [], ["eval.filter=learned", f"paths.world_dir={tmp_path}"])
    todo = [c for c in path_checks(cfg, ["test"]) if c.item == "qff.checkpoint"]
    assert len(todo) == 1 and todo[0].status == "todo" and "a trainer of its own writes it" in todo[0].detail
    given = compose("demo/evaluate", [], ["eval.filter=learned", f"qff.checkpoint={tmp_path / 'trained'}"])
    rows = [c for c in path_checks(given, ["test"]) if c.item == "qff.checkpoint"]
    assert len(rows) == 1 and str(tmp_path / "trained") in rows[0].detail
    none = compose("demo/evaluate", [], ["eval.filter=retrieval"])
    assert not [c for c in path_checks(none, ["test"]) if c.item == "qff.checkpoint"]
