"""`qkvqa evaluate` on the synthetic world with tiny components: exactly once, strict scores, resume, DDP."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qkvqa.cli.main import main
from qkvqa.run.rundir import clear_run_env
from tests.helpers.faults import signal_once_answered

REPO = Path(__file__).resolve().parents[2]


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "predictions.jsonl").read_text().splitlines()]


def _traces(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]


TRACE_FIELDS = {
    "trace_version",
    "data_id",
    "question",
    "dataset",
    "split",
    "question_type",
    "image",
    "gold",
    "stage1",
    "filter",
    "cda",
    "context",
    "prediction",
    "skipped",
    "verdict",
    "gold_rank",
    "answer_in_context",
    "category",
    "seconds",
}


def _check_traces(run_dir: Path, top_k: int = 20) -> list[dict]:
    """traces.jsonl holds the contract's fields for every question in prediction order, and agrees with
    predictions.jsonl and scores.json (accuracy numerator, Table 3, recall after the filter, answer in context)."""
    rows, traces = _rows(run_dir), _traces(run_dir)
    scores = json.loads((run_dir / "scores.json").read_text())
    assert [t["data_id"] for t in traces] == [r["data_id"] for r in rows]
    generated = scores["stop_after"] != "filter"
    for t, r in zip(traces, rows):
        assert set(t) >= TRACE_FIELDS and t["trace_version"] == 1 and t["dataset"] == "evqa", t.keys()
        assert (t["prediction"], t["skipped"], t["context"]) == (
            r["prediction"],
            r.get("skipped"),
            r.get("context_text"),
        )
        assert set(t["gold"]) == {"answers", "urls", "section_index", "hops", "url_used_in_train"} and t["gold"]["urls"]
        # every hop keeps its URL and evidence section (a 2_hop row two, from its `a|b` fields)
        hops = t["gold"]["hops"]
        assert [h["url"] for h in hops] == t["gold"]["urls"] and hops[0]["section_index"] == t["gold"]["section_index"]
        assert len(hops) == (2 if t["question_type"] == "2_hop" else 1)
        assert all(isinstance(h["section_index"], int) and h["section_title"] for h in hops)
        assert isinstance(t["gold"]["url_used_in_train"], bool)
        assert set(t["seconds"]) == {"retrieve", "filter", "select", "generate"}
        articles = t["filter"]["articles"]
        assert [a["url"] for a in articles] == [a["url"] for a in r.get("ranking") or []]
        assert [a["fused"] for a in articles] == pytest.approx([a["score"] for a in r.get("ranking") or []], rel=1e-5)
        assert t["filter"]["name"] == "qff" and 0 <= t["filter"]["alpha"] <= 1
        if r.get("skipped"):
            assert t["cda"] is None and articles == [] and (t["verdict"] is None or not t["verdict"]["correct"])
            continue
        assert t["image"] and Path(t["image"]).is_absolute() and Path(t["image"]).is_file()
        assert 0 < len(t["stage1"]) <= top_k and all(set(s) == {"url", "title", "sim"} for s in t["stage1"])
        for a in articles:  # every filtered article is one of stage 1's, with its QFF and fused score
            assert t["stage1"][a["stage1_rank"] - 1]["url"] == a["url"] and a["title"]
            assert a["sim_ret"] == t["stage1"][a["stage1_rank"] - 1]["sim"] and a["qff"] is not None
            alpha = t["filter"]["alpha"]
            assert a["fused"] == pytest.approx(alpha * a["sim_ret"] + (1 - alpha) * a["qff"], abs=1e-5)
            assert all(set(x) == {"index", "title", "score"} for x in a["sections"])
        assert [a["fused"] for a in articles] == sorted((a["fused"] for a in articles), reverse=True)
        if not generated:
            assert t["cda"] is None and t["verdict"] is None and t["category"] is None
            continue
        cda, context = t["cda"], r["context"]
        assert cda["mode"] == context["mode"] and cda["kept"] == [
            r["ranking"][i]["url"] for i in context["kept_articles"]
        ]
        key = lambda c: (c["url"], c["section_index"], c["chunk_index"])  # noqa: E731
        selected = [c for c in cda["chunks"] if c["selected"]]
        assert sorted(map(key, selected)) == sorted(map(key, context["chunks"]))
        assert {key(c): c["score"] for c in selected} == pytest.approx(
            {key(c): c["score"] for c in context["chunks"]}, rel=1e-5
        )
        assert len(cda["chunks"]) == min(cda["n_chunks"], 12) and len(selected) <= 12
        assert all(c["text"] for c in cda["chunks"])  # selected and dropped chunks keep their text (issue 34)
        assert {c["url"] for c in cda["chunks"]} <= set(cda["kept"]) and len(cda["chunks"]) >= len(selected)
        assert all(c["text"] in t["context"] for c in selected)
    verdicts = [t["verdict"] for t in traces if t["verdict"] is not None]
    if generated:
        assert len(verdicts) == len(traces)
        assert sum(v["correct"] for v in verdicts) == scores["benchmark"]["all"]["correct"]
        for t, v in zip(traces, verdicts):
            assert [x["answer"] for x in v["references"]] == t["gold"]["answers"]
            if not t["skipped"]:
                assert v["correct"] == (
                    any(x["em"] for x in v["references"]) or any((x["bem"] or 0) >= 0.5 for x in v["references"])
                )
        cells = {c: sum(t["category"] == c for t in traces) for c in ("R1-C", "R1-W", "NR-C", "not_retrieved", "NR-W")}
        table3, n = scores["error_analysis"], sum(cells.values())
        assert n == table3["n"] == sum(t["category"] is not None for t in traces)
        assert 100.0 * (cells["R1-C"] + cells["R1-W"]) / n == pytest.approx(table3["r1"])
        assert 100.0 * cells["NR-C"] / n == pytest.approx(table3["nr_c"])
        if cells["R1-C"] + cells["R1-W"]:
            assert 100.0 * cells["R1-C"] / (cells["R1-C"] + cells["R1-W"]) == pytest.approx(table3["r1_c"])
        assert all(
            (t["gold_rank"]["before"] is None) == (t["category"] == "not_retrieved")
            for t in traces
            if t["category"] in ("not_retrieved", "NR-W")
        )
        in_context = [t["answer_in_context"] for t in traces if t["answer_in_context"] is not None]
        assert 100.0 * sum(in_context) / len(in_context) == pytest.approx(scores["answer_in_context"])
    single = [t for t in traces if t["question_type"] != "2_hop"]  # Recall@K over single-hop rows
    for when, name in (("after", "recall_after_filter"), ("before", "recall_before_filter")):
        assert scores[name]["n_queries"] == len(single)
        for k in (1, 5):
            hits = sum(1 for t in single if t["gold_rank"][when] is not None and t["gold_rank"][when] <= k)
            assert 100.0 * hits / len(single) == pytest.approx(scores[name][f"recall@{k}"]), (when, k)
    return traces


def _expected_ids(world) -> list[str]:
    from qkvqa.data.questions import read_evqa_csv

    return [q.data_id for q in read_evqa_csv(Path(world["dir"]) / "evqa/test.csv", include_two_hop=True)]


@pytest.mark.slow
def test_evaluate_writes_each_question_once_with_strict_scores(eval_env, world, monkeypatch, capsys):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    clear_run_env()
    assert main(["evaluate", "experiment=world_eval", "run_id=single", "eval.judge=em_only"]) == 0
    run_dir = eval_env["runs"] / "single"
    rows = _rows(run_dir)
    assert [r["data_id"] for r in rows] == _expected_ids(world)
    skipped = [r for r in rows if r.get("skipped")]
    assert len(skipped) == 2  # the world's deliberately missing/corrupt images
    answered = [r for r in rows if not r.get("skipped")]
    for r in answered:
        assert isinstance(r["prediction"], str) and r["context"]["mode"] == "full"
        assert len(r["context"]["chunks"]) <= 6 and set(r["seconds"]) == {"retrieve", "filter", "select", "generate"}
        assert len({c["url"] for c in r["context"]["chunks"]}) <= 2  # U = 2 articles at most
    scores = json.loads((run_dir / "scores.json").read_text())
    # one denominator: every question of the split, two-hop rows included, the unanswered ones counted wrong
    two_hop = [r for r in rows if r["data_id"].startswith("E-VQA_2hop_")]
    assert two_hop and scores["n_scored"] == len(rows) and scores["benchmark"]["coverage"]["n_missing"] == 0
    assert scores["benchmark"]["all"]["n"] == len(rows) and scores["benchmark"]["two_hop"]["n"] == len(two_hop)
    assert sorted(s["data_id"] for s in scores["skipped"]) == sorted(r["data_id"] for r in skipped)
    evaluated = json.loads((run_dir / "question_ids.json").read_text())
    assert evaluated["ids"] == _expected_ids(world) and evaluated["per_question_type"]["2_hop"] == len(two_hop)
    single = len(rows) - len(two_hop)  # Tables 3 and 4 over single-hop rows only (paper section 4.1)
    assert scores["error_analysis"]["n"] == scores["recall_after_filter"]["n_queries"] == single
    # issue 20: one trace per question, agreeing with the predictions and the report
    traces = _check_traces(run_dir)
    # `qkvqa score` on the same predictions.jsonl gives the same numbers
    capsys.readouterr()
    assert (
        main(
            [
                "score",
                "evqa",
                "--predictions",
                str(run_dir / "predictions.jsonl"),
                "--questions",
                str(Path(world["dir"]) / "evqa/test.csv"),
                "--em-only",
                "--strict",
            ]
        )
        == 0
    )
    scored = json.loads(capsys.readouterr().out)
    for subset in ("single_hop", "two_hop", "all"):
        assert scored[subset] == scores["benchmark"][subset], subset
    assert scores["benchmark"]["label"].startswith("EM only") or "EM" in scores["benchmark"]["label"]
    report = (run_dir / "report.md").read_text()
    for table in ("Table 2", "Table 3", "Table 4", "Table 5"):
        assert table in report
    assert "accuracy means nothing" in report
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval/n_skipped"] == 2 and "eval/recall@20_after_filter" in summary
    assert summary["eval/accuracy"] == scored["all"]["accuracy"]
    # the protocol card heads the report, and says why this run is not comparable to the paper
    assert report.index("## Protocol") < report.index("## Table 2")
    card = summary["protocol"]
    assert card == scores["protocol"]
    assert (
        card["dataset"] == "evqa"
        and card["n_questions"] == len(rows)
        and card["per_question_type"]["2_hop"] == len(two_hop)
    )
    assert card["kb"]["articles"] > 0 and len(card["kb"]["url_checksum"]) >= 16
    assert {"qformer", "reranker", "generator"} <= set(card["models"]) and card["judge"] == "EM only"
    because = " ".join(card["not_comparable_because"])
    assert card["comparable"] is False and "no paper row" in because and "tiny random components" in because
    assert f"{len(rows)} questions" in because and "exact match only" in because
    assert "**comparable to paper (no paper row): no, because" in report
    # issue 32 item 3: stage 1 names the text of the index it searched, read from that index's manifest
    assert card["stage1"]["text"] == "each article's lead section (retrieval.summary_source=lead_section)"
    assert "(0 unanswerable, counted as wrong)" in report or "unanswerable, counted as wrong" in report
    # Issue 14 item 4: the judge may change on a finished run, which is re-scored without regenerating.
    answers = (run_dir / "predictions.jsonl").read_text()
    capsys.readouterr()
    assert main(["score", "run", str(run_dir), "data.max_questions=3"]) == 2
    assert "is not a scoring key" in capsys.readouterr().err
    clear_run_env()
    from qkvqa.pipeline.predictions import PredictionStore

    reads, read_rows = [], PredictionStore.rows
    monkeypatch.setattr(PredictionStore, "rows", lambda store: reads.append(1) or read_rows(store))
    assert main(["score", "run", str(run_dir), "eval.judge=bem"]) == 0
    monkeypatch.setattr(PredictionStore, "rows", read_rows)
    # five reads of the predictions, not one per question (46 here before: quadratic in the questions, about 7
    # minutes on E-VQA's 5,750 test questions and hours on InfoSeek's 73k)
    assert len(reads) <= 5
    rescored = json.loads((run_dir / "scores.json").read_text())
    assert (run_dir / "predictions.jsonl").read_text() == answers
    assert "BEM" in rescored["benchmark"]["label"] and rescored["protocol"]["judge"] != "EM only"
    assert rescored["benchmark"]["all"]["n"] == scores["benchmark"]["all"]["n"]
    assert rescored["benchmark"]["all"]["correct"] >= scores["benchmark"]["all"]["correct"]  # EM, then BEM
    # the re-score rewrites the traces with the judge's verdict per reference, where EM rejected every reference
    rejudged = {t["data_id"]: t for t in _check_traces(run_dir)}
    for t in traces:
        references = rejudged[t["data_id"]]["verdict"]["references"]
        assert [x["em"] for x in references] == [x["em"] for x in t["verdict"]["references"]]
        assert all(
            (x["bem"] is not None) == (not t["skipped"] and not any(r["em"] for r in references)) for x in references
        )
    # Issue 14 item 1: the stage-1 results kept in the run are refused once the KB has changed under them.
    from qkvqa.pipeline.evaluate import RETRIEVAL_META

    meta = json.loads((run_dir / RETRIEVAL_META).read_text())
    (run_dir / RETRIEVAL_META).write_text(json.dumps({**meta, "kb_url_checksum": "sha256:another"}))
    clear_run_env()
    capsys.readouterr()
    assert main(["score", "run", str(run_dir)]) == 2
    assert "made over another KB" in capsys.readouterr().err
    # Recall after the QFF is computed on the same questions and articles: R@20 cannot change by re-ranking 20.
    assert summary["eval/recall@20_after_filter"] == summary["eval/recall@20_before_filter"]


EVALUATE = [sys.executable, "-m", "qkvqa.cli", "evaluate", "experiment=world_eval", "eval.judge=em_only"]


@pytest.fixture(scope="module")
def one_rank(eval_env) -> tuple[Path, dict]:
    """An uninterrupted one-process evaluation, which the signal and the DDP tests compare with, and the environment
    all of them run in (one intra-op thread: the same kernels in every run, so bit-identical floats)."""
    env = {**eval_env["env"], "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        EVALUATE + ["run_id=one_rank"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return eval_env["runs"] / "one_rank", env


@pytest.mark.slow
def test_evaluation_stopped_by_sigterm_and_sigkill_resumes_to_the_uninterrupted_predictions(eval_env, world, one_rank):
    """Issue 15 item 8: SIGTERM stops promptly (143, `interrupted`); SIGKILL loses at most the batch in flight;
    the merged predictions hold each question once and equal an uninterrupted run's (batches of 4: the resumed run
    batches the questions left, so its batches differ from the uninterrupted run's)."""
    cmd, (whole, env), runs = EVALUATE, one_rank, eval_env["runs"]
    part = runs / "killed" / "predictions.parts" / "rank0.jsonl"
    termed = signal_once_answered(cmd + ["run_id=killed"], env, part, 4, signal.SIGTERM)
    assert termed.returncode == 143, termed.stderr[-3000:]
    assert termed.seconds_to_stop < 30
    status = json.loads((runs / "killed" / "status.json").read_text())
    assert status["state"] == "interrupted" and "SIGTERM" in status["error"], status
    answered = len(part.read_text().splitlines())
    expected = _expected_ids(world)
    assert 4 <= answered < len(expected)
    killed = signal_once_answered(cmd + ["run_id=killed", "resume=auto"], env, part, answered + 3, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL
    resumed = subprocess.run(
        cmd + ["run_id=killed", "resume=auto"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    rows = _rows(runs / "killed")
    assert [r["data_id"] for r in rows] == expected
    all_part_ids = [json.loads(line)["data_id"] for line in part.read_text().splitlines() if line.strip()]
    assert len(all_part_ids) == len(set(all_part_ids)) == len(expected)  # nothing answered twice
    volatile = ("seconds", "timing", "time")
    strip = lambda r: {k: v for k, v in r.items() if not any(w in k for w in volatile)}  # noqa: E731
    assert [strip(r) for r in rows] == [strip(r) for r in _rows(whole)]
    # the traces too: written in the same part lines as the predictions, so the same after the kills
    assert [strip(t) for t in _traces(runs / "killed")] == [strip(t) for t in _traces(whole)]
    status = json.loads((runs / "killed" / "status.json").read_text())
    assert status["state"] == "finished" and len(status["attempts"]) == 3


@pytest.mark.ddp
@pytest.mark.slow
def test_ddp_evaluation_answers_each_question_exactly_once_and_matches_single_process(eval_env, world, one_rank):
    base, (single, env) = EVALUATE, one_rank
    ddp = subprocess.run(
        base + ["run_id=two_ranks", "preset=ddp_cpu_sim"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ddp.returncode == 0, ddp.stderr[-3000:]
    runs = eval_env["runs"]
    parts = {
        p.name: [json.loads(line)["data_id"] for line in p.read_text().splitlines()]
        for p in (runs / "two_ranks" / "predictions.parts").glob("rank*.jsonl")
    }
    assert sorted(parts) == ["rank0.jsonl", "rank1.jsonl"] and all(parts.values())
    ids = [q for part in parts.values() for q in part]
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(_expected_ids(world))  # 38 questions on 2 ranks
    one = {r["data_id"]: r for r in _rows(single)}
    two = {r["data_id"]: r for r in _rows(runs / "two_ranks")}
    assert {q: r["ranking"] for q, r in one.items() if "ranking" in r} == {
        q: r["ranking"] for q, r in two.items() if "ranking" in r
    }
    # every rank's stage records reach the traces, merged by rank 0 in question order as in one process
    strip = lambda t: {k: v for k, v in t.items() if k != "seconds"}  # noqa: E731
    assert [strip(t) for t in _check_traces(runs / "two_ranks")] == [strip(t) for t in _traces(single)]
    s1 = json.loads((single / "summary.json").read_text())
    s2 = json.loads((runs / "two_ranks" / "summary.json").read_text())
    for key in (
        "eval/recall@1_after_filter",
        "eval/recall@5_after_filter",
        "eval/r1",
        "eval/section_r1",
        "eval/answer_in_context",
        "eval/accuracy",
    ):
        assert s1[key] == s2[key], key
    assert json.loads((runs / "two_ranks" / "status.json").read_text())["world_size"] == 2
    # The same under torchrun, all ranks started at once and no run_id (issue 16 item 3): one run directory named
    # by the launch, ranks >= 1 wait for rank 0's stage 1, each question answered once, the same rankings.
    before = set(runs.iterdir())
    launched = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=2",
            "-m",
            "qkvqa.cli",
            "evaluate",
            "experiment=world_eval",
            "eval.judge=em_only",
            "preset=ddp_cpu_sim",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert launched.returncode == 0, launched.stdout[-2000:] + launched.stderr[-3000:]
    (run_dir,) = set(runs.iterdir()) - before
    ids = [
        json.loads(line)["data_id"]
        for p in (run_dir / "predictions.parts").glob("rank*.jsonl")
        for line in p.read_text().splitlines()
    ]
    assert len(ids) == len(set(ids)) and sorted(ids) == sorted(_expected_ids(world))
    assert {q: r["ranking"] for q, r in one.items() if "ranking" in r} == {
        r["data_id"]: r["ranking"] for r in _rows(run_dir) if "ranking" in r
    }


@pytest.mark.ddp
@pytest.mark.slow
def test_a_two_rank_evaluation_with_one_batch_finishes_when_a_rank_has_nothing_to_do(eval_env):
    """One fixed batch for two ranks (as near the end of a resumed run): Lightning skips its predict epoch hooks on
    the rank without a batch, so a barrier there would have held the other rank forever."""
    cmd = [
        sys.executable,
        "-m",
        "qkvqa.cli",
        "evaluate",
        "experiment=world_eval",
        "eval.judge=em_only",
        "preset=ddp_cpu_sim",
        "data.max_questions=3",
        "generation.batch_size=4",
        "run_id=one_batch",
    ]
    env = {**eval_env["env"], "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    parts = sorted((eval_env["runs"] / "one_batch" / "predictions.parts").glob("rank*.jsonl"))
    assert [p.name for p in parts] == ["rank0.jsonl"]  # rank 1 had no batch
    assert len(_rows(eval_env["runs"] / "one_batch")) == 3


def _split_sorted_infoseek(world, tmp_path) -> str:
    """The world's InfoSeek test CSV with every unseen_question row first, as a sorted release would be."""
    import csv

    references = {
        json.loads(line)["data_id"]: json.loads(line)["data_split"]
        for line in (Path(world["dir"]) / "infoseek/infoseek_val.jsonl").read_text().splitlines()
    }
    with open(Path(world["dir"]) / "infoseek/infoseek_test_filtered.csv", newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        columns, rows = reader.fieldnames, list(reader)
    rows.sort(key=lambda row: not references[row["data_id"]].endswith("unseen_question"))
    out = tmp_path / "sorted.csv"
    with open(out, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)
    return str(out)


def _infoseek_data(world, **questions: str) -> list[str]:
    """`data.*` overrides for the world's InfoSeek files, with the given question files (test_questions=, ...)."""
    keys = {
        "dataset": "infoseek",
        "root": world["dir"],
        "kb_store": "kb/store",
        **questions,
        "infoseek_references": "infoseek/infoseek_val.jsonl",
        "infoseek_qtypes": "infoseek/infoseek_val_qtype.jsonl",
    }
    return [f"data.{k}={v}" for k, v in keys.items()]


@pytest.mark.slow
def test_an_infoseek_subset_without_one_split_is_refused_before_any_model_runs(world, tmp_path, capsys):
    sorted_csv = _split_sorted_infoseek(world, tmp_path)
    data = _infoseek_data(world, test_questions=sorted_csv)
    clear_run_env()
    code = main(
        ["evaluate", "run_id=first_rows", f"paths.checkpoints_root={tmp_path / 'runs'}", *data, "data.max_questions=5"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "hold no unseen_entity question" in err and "data.sample_questions" in err
    assert not (tmp_path / "runs" / "first_rows").exists()  # refused before the run started


@pytest.mark.slow
@pytest.mark.parametrize("split_override", ["split=val", "eval.split=val"])
def test_split_is_short_for_eval_split_as_for_retrieve_mine_and_rerank(world, tmp_path, capsys, split_override):
    sorted_csv = _split_sorted_infoseek(world, tmp_path)  # refused when evaluated: its first 5 rows are one split
    data = _infoseek_data(world, val_questions=sorted_csv)
    clear_run_env()
    code = main(
        [
            "evaluate",
            "run_id=val_split",
            f"paths.checkpoints_root={tmp_path / 'runs'}",
            *data,
            "data.max_questions=5",
            split_override,
        ]
    )
    err = capsys.readouterr().err
    # the val file was the one evaluated (the test file, the default split's, holds both InfoSeek splits)
    assert code == 2 and f"{sorted_csv}: the 5 questions evaluated hold no unseen_entity question" in err, err


@pytest.mark.slow
def test_a_seeded_question_sample_is_random_in_file_order_and_repeatable(world):
    from qkvqa.data_modules import build_data_module

    config = yaml_data(world, "infoseek")
    everything = [q.data_id for q in build_data_module(config).questions("test")]
    first = [q.data_id for q in build_data_module({**config, "sample_questions": 10}).questions("test")]
    again = [q.data_id for q in build_data_module({**config, "sample_questions": 10}).questions("test")]
    other = [
        q.data_id for q in build_data_module({**config, "sample_questions": 10, "sample_seed": 1}).questions("test")
    ]
    assert first == again != other and len(first) == 10 and first != everything[:10]
    assert first == [q for q in everything if q in set(first)]  # file order kept


def yaml_data(world, dataset: str) -> dict:
    import yaml

    return yaml.safe_load((Path(world["dir"]) / f"data_{dataset}.yaml").read_text(encoding="utf-8"))


@pytest.mark.slow
def test_a_filter_only_evaluation_ranks_every_question_and_answers_none(eval_env, world, monkeypatch):
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    clear_run_env()
    assert (
        main(
            [
                "evaluate",
                "experiment=world_eval",
                "run_id=filter_only",
                "eval.stop_after=filter",
                "components.generator.pretrained=/nonexistent",
                "components.generator.tiny=false",
            ]
        )
        == 0
    )
    run_dir = eval_env["runs"] / "filter_only"  # (the generator is never built)
    rows = _rows(run_dir)
    assert [r["data_id"] for r in rows] == _expected_ids(world)
    answered = [r for r in rows if not r.get("skipped")]
    assert all(r["prediction"] is None and "context" not in r and r["ranking"] for r in answered)
    scores = json.loads((run_dir / "scores.json").read_text())
    assert scores["accuracy"] is None and scores["error_analysis"] is None and scores["stop_after"] == "filter"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert "eval/recall@1_after_filter" in summary and "eval/accuracy" not in summary
    traces = _check_traces(run_dir)  # ranked, with no CDA, answer or verdict
    assert all(t["cda"] is None and t["verdict"] is None and (t["prediction"] is None or t["skipped"]) for t in traces)
    assert any(t["gold_rank"]["after"] is not None for t in traces)


@pytest.mark.slow
def test_a_missing_judge_or_generator_stops_the_evaluation_before_stage_1(eval_env, monkeypatch, capsys):
    """Issue 14 item 4: a missing BEM directory was found after every answer had been generated."""
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    for key in ("judge", "generator"):
        clear_run_env()
        capsys.readouterr()
        started = time.time()
        assert (
            main(
                [
                    "evaluate",
                    "experiment=world_eval",
                    f"run_id=preflight_{key}",
                    f"components.{key}.tiny=false",
                    f"components.{key}.pretrained={eval_env['root']}/no_such_weights",
                ]
            )
            == 2
        )
        err = capsys.readouterr().err
        assert f"components.{key}:" in err and "no_such_weights" in err and time.time() - started < 60
        assert not (eval_env["runs"] / f"preflight_{key}").exists()  # nothing ran, nothing left behind
