"""The demo's comparison helpers: recall curves, multi-entity R@1, the markdown table and the plots."""

from __future__ import annotations

import json

import pytest

from qkvqa.demo.report import COLUMNS, markdown_table, multi_entity_r1, plot_recall, recall_curve


def _row(qid, urls):
    return {"data_id": qid, "ranking": [{"url": u, "score": 1.0} for u in urls]}


GOLD = {"q1": {"a"}, "q2": {"b"}, "q3": {"z"}}
ROWS = [_row("q1", ["a", "b"]), _row("q2", ["a", "c", "b"]), _row("q3", ["a"])]


def test_recall_curve_counts_the_first_gold_position():
    curve = recall_curve(ROWS, GOLD)
    assert len(curve) == 20
    assert curve[0] == 100 / 3 and curve[2] == 200 / 3 and curve[-1] == 200 / 3


def test_multi_entity_r1_uses_only_the_listed_questions():
    assert multi_entity_r1(ROWS, GOLD, {"q1", "q2"}) == 50.0
    assert multi_entity_r1(ROWS, GOLD, set()) is None


def test_markdown_table_has_every_column_and_formats_missing_values(tmp_path):
    row = {c: None for c in COLUMNS} | {
        "setting": "retrieval only",
        "R@1": 12.345,
        "s/q filter": 0.01234,
        "curve": [1.0] * 20,
    }
    table = markdown_table([row])
    assert table.splitlines()[0] == "| " + " | ".join(COLUMNS) + " |"
    assert "| retrieval only | 12.3 |" in table and "0.012" in table and "n/a" in table
    path = plot_recall([row], tmp_path / "r.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_coinciding_recall_curves_are_drawn_distinguishably_and_say_so():
    from qkvqa.demo.report import recall_figure

    rising = [float(k) for k in range(1, 21)]
    rows = [
        {"setting": "retrieval only", "curve": rising},
        {"setting": "QFF per_layer", "curve": list(rising)},
        {"setting": "QFF input", "curve": [k + 1.0 for k in rising]},
    ]
    fig = recall_figure(rows)
    lines = fig.axes[0].get_lines()
    assert [list(line.get_ydata()) for line in lines] == [r["curve"] for r in rows]  # values not shifted
    assert len({(line.get_marker(), line.get_linestyle()) for line in lines}) == 3
    hidden, top = lines[0], lines[1]  # the same values: the later one is on top,
    assert top.get_zorder() > hidden.get_zorder() and top.get_markersize() > hidden.get_markersize()
    assert top.get_markerfacecolor() == "none"  # hollow, so the one below shows through
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["retrieval only", "QFF per_layer (same curve as retrieval only)", "QFF input"]


def test_the_study_figures_the_demo_report_and_readme_cite_are_the_studys():
    """The demo's report and the README quote the focus study; the figures they quote must be those of
    bench/out/qff_focus_v1.json (the random-init study), so that a rerun study cannot leave them stale."""
    import json
    from pathlib import Path
    from statistics import mean, stdev

    from qkvqa.demo.run import HONEST

    repo = Path(__file__).resolve().parents[2]
    study = json.loads((repo / "bench/out/qff_focus_v1.json").read_text())["worlds"]
    text = " ".join(HONEST.split())

    def seeds(world, variant):
        return [s["all"]["section_r1"] for s in study[world]["variants"][variant]["per_seed"].values()]

    for variant in ("per_layer", "none"):
        values = seeds("controlled", variant)
        assert f"{mean(values):.1f} +- {stdev(values):.1f}" in text
    controlled = study["controlled"]["variants"]["per_layer"]["diff_vs_none"]["section_r1"]
    assert (
        f"{controlled['mean']:.1f} points (95 % interval {controlled['ci95_low']:.1f} to "
        f"{controlled['ci95_high']:+.1f})"
    ) in text
    default = study["default"]["variants"]["per_layer"]["diff_vs_none"]["section_r1"]
    assert f"{default['mean']:.1f} ({default['ci95_low']:.1f} to {default['ci95_high']:+.1f})" in text
    assert f"from {min(default['per_seed']):.1f} to {max(default['per_seed']):+.1f}" in text
    # the study with the reading init: its positive control and the best focus variant (bench/out/qff_focus_random_init)
    again = json.loads((repo / "bench/out/qff_focus_random_init.json").read_text())["worlds"]["controlled"]
    for diff, words in (
        (again["positive_control"]["diff_vs_none"]["section_r1"], "95 % interval "),
        (again["variants"]["per_layer_lr10_pt"]["diff_vs_none"]["section_r1"], ""),
    ):
        assert f"{diff['mean']:+.1f}" in text and (
            f"({words}{diff['ci95_low']:+.1f} to {diff['ci95_high']:+.1f}" in text
            or f"({words}{diff['ci95_low']:.1f} to {diff['ci95_high']:+.1f}" in text
        ), diff
    readme = " ".join((repo / "README.md").read_text(encoding="utf-8").split()).replace("−", "-")
    control = again["positive_control"]["diff_vs_none"]["section_r1"]
    assert (
        f"{control['mean']:+.1f} points ({control['n_seeds']} seeds, interval {control['ci95_low']:+.1f} to "
        f"{control['ci95_high']:+.1f})"
    ) in readme
    assert f"{control['n_seeds']} seeds;" in text  # the demo report says how many seeds
    best = again["variants"]["per_layer_lr10_pt"]["diff_vs_none"]["section_r1"]
    assert f"leave focus at {best['mean']:+.1f} ({best['ci95_low']:.1f} to {best['ci95_high']:+.1f})" in readme
    assert (
        f"section R@1 {controlled['mean']:.1f} points, 95 % interval {controlled['ci95_low']:.1f} to "
        f"{controlled['ci95_high']:+.1f}"
    ) in readme


def test_the_goals_say_met_or_missed_and_by_how_much():
    from qkvqa.demo.report import goal_lines

    labels = ["stage 1", "QFF none", "QFF focus", "full", "top-1 section"]

    def row(label, r20, in_context, accuracy):
        return {"setting": label, "R@20": r20, "answer in context %": in_context, "accuracy E-VQA": accuracy}

    rows = [row("stage 1", 80.0, 10.0, 5.0), row("QFF none", 80.0, 20.0, 30.0), row("full", 80.0, 60.0, 20.0)]
    text = "\n".join(goal_lines(rows, labels))
    assert "stage-1 R@20 (stage 1): 80.0, goal 90 **missed by 10.0 points**" in text
    assert "answer in context (full): 60.0, goal 50 met" in text
    assert "goal 25 **missed by 5.0 points**" in text
    assert "**no**: QFF none is 10.0 points at or above it" in text


def test_exact_match_reads_each_traces_gold_answers(tmp_path):
    from qkvqa.demo.report import exact_match_accuracy

    traces = [
        {"data_id": "q1", "prediction": "Near threatened.", "gold": {"answers": ["Near Threatened"]}},
        {"data_id": "q2", "prediction": "The answer is: Madagascar.", "gold": {"answers": ["Madagascar"]}},
        {"data_id": "q4", "prediction": "It is native to Madagascar.", "gold": {"answers": ["Madagascar"]}},
        {"data_id": "q3", "prediction": "", "gold": {"answers": [""]}},
        {"data_id": "other", "prediction": "x", "gold": {"answers": ["x"]}},
    ]
    (tmp_path / "traces.jsonl").write_text("\n".join(json.dumps(t) for t in traces), encoding="utf-8")
    gold = {"q1": set(), "q2": set(), "q3": set(), "q4": set()}
    # the official normalisation drops case, punctuation and "the answer is"; an empty answer or a sentence misses
    assert exact_match_accuracy(tmp_path, gold) == pytest.approx(50.0)
    assert exact_match_accuracy(tmp_path / "none", gold) is None


def test_a_missed_goal_says_why_from_the_runs_own_figures(tmp_path):
    from qkvqa.demo.report import goal_lines, miss_reasons

    gold = {f"q{i}": {f"u{i}"} for i in range(4)}
    stage1, full = tmp_path / "stage1", tmp_path / "full"
    stage1.mkdir(), full.mkdir()
    ranked = lambda *urls: [{"url": u, "score": 1.0} for u in urls]  # noqa: E731
    predictions = [
        {"data_id": "q0", "ranking": ranked("u0")},
        {"data_id": "q1", "ranking": ranked("x", "u1")},
        {"data_id": "q2", "ranking": ranked("x")},  # a multi-entity photo, missed
        {"data_id": "q3", "ranking": ranked("u3")},  # a multi-entity photo, found
    ]
    (stage1 / "predictions.jsonl").write_text("\n".join(json.dumps(p) for p in predictions))
    traces = [
        {"data_id": "q0", "gold_rank": {"after": 1}, "answer_in_context": True, "prediction": "It is in Peru.",
         "gold": {"answers": ["Peru"]}, "verdict": {"correct": False}},
        {"data_id": "q1", "gold_rank": {"after": 1}, "answer_in_context": True, "prediction": "Peru",
         "gold": {"answers": ["Peru"]}, "verdict": {"correct": True}},
        {"data_id": "q2", "gold_rank": {"after": 3}, "answer_in_context": False, "prediction": "x",
         "gold": {"answers": ["y"]}, "verdict": {"correct": False}},
        {"data_id": "q3", "skipped": "query image missing"},
    ]  # fmt: skip
    (full / "traces.jsonl").write_text("\n".join(json.dumps(t) for t in traces))
    reasons = miss_reasons(stage1, full, gold, multi={"q2", "q3"})
    assert "top 20 for 100 % of 2 single-entity photos and 50 % of 2 multi-entity ones" in reasons["stage1"]
    assert "came first after the filter for 67 % of 3 answered questions" in reasons["in_context"]
    assert "reached the context for 100 % of 2 of those" in reasons["in_context"]
    assert "scored correct for 50 % of 2 questions" in reasons["accuracy"]
    assert "contained a reference for 100 % of 2" in reasons["accuracy"]
    # a world without multi-entity photos says so, as every other count does, not "0 % of 0"
    assert "and none of 0 multi-entity ones" in miss_reasons(stage1, full, gold, multi=set())["stage1"]
    labels = ["stage 1", "QFF none", "QFF focus", "full", "top-1 section"]
    rows = [
        {"setting": "stage 1", "R@20": 75.0, "answer in context %": 10.0, "accuracy E-VQA": 5.0},
        {"setting": "full", "R@20": 75.0, "answer in context %": 66.7, "accuracy E-VQA": 33.3},
    ]
    text = "\n".join(goal_lines(rows, labels, reasons))
    assert "goal 90 **missed by 15.0 points**; why: the gold article is in the top 20" in text
    assert "why" not in text.split("\n")[1] and "why" not in text.split("\n")[2]  # met goals give no reason
