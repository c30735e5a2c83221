"""`qkvqa inspect`'s site builder without a browser: files, index columns, shards, thumbnails, plots, compare, errors."""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path

import pytest
from PIL import Image

from qkvqa.cli.main import main
from qkvqa.errors import ConfigError, DataError
from qkvqa.inspect.runs import flips, load_run, pair_runs
from qkvqa.inspect.site import COLUMNS, build_site, recall_curve

GOLD = "https://en.wikipedia.org/wiki/Gold"


def make_trace(i: int, correct: bool, before, after, image=None, qtype="templated", answer="Clover") -> dict:
    """A trace in the traces.jsonl shape (docs/data-formats.md), gold article ranked `before` / `after`."""
    urls = [f"https://en.wikipedia.org/wiki/A{k}" for k in range(5)]
    stage1 = list(urls)
    if before:
        stage1[before - 1] = GOLD
    fused = list(urls)
    if after:
        fused[after - 1] = GOLD
    s1rank = {u: k + 1 for k, u in enumerate(stage1)}
    context = f"The larvae feed on {answer.lower()} and {answer.upper()}." if i % 2 == 0 else "Nothing useful here."
    category = None if qtype == "2_hop" else ("R1-" if after == 1 else "NR-") + ("C" if correct else "W")
    if category == "NR-W" and not before:
        category = "not_retrieved"
    return {
        "trace_version": 1,
        "data_id": f"Q{i}",
        "question": f"What do the larvae of insect {i} feed on?",
        "dataset": "evqa",
        "split": "test",
        "question_type": qtype,
        "image": image,
        "gold": {"answers": [answer], "urls": [GOLD], "section_index": 2},
        "stage1": [{"url": u, "title": u.rsplit("/", 1)[1], "sim": 0.9 - 0.1 * k} for k, u in enumerate(stage1)],
        "filter": {
            "name": "qff",
            "alpha": 0.9,
            "articles": [
                {
                    "url": u,
                    "title": u.rsplit("/", 1)[1],
                    "stage1_rank": s1rank.get(u),
                    "sim_ret": 0.5,
                    "qff": 0.4,
                    "fused": 1.0 - 0.1 * k,
                    "sections": [{"index": 0, "title": "Lead", "score": 0.3}],
                }
                for k, u in enumerate(fused)
            ],
        },
        "cda": {
            "mode": "full",
            "U": 2,
            "theta": 0.5,
            "kept": fused[:2],
            "chunks": [
                {
                    "url": fused[0],
                    "section_index": 0,
                    "chunk_index": 0,
                    "tokens": 12,
                    "score": 0.8,
                    "selected": True,
                    "text": context,
                },
                {
                    "url": fused[1],
                    "section_index": 1,
                    "chunk_index": 0,
                    "tokens": 9,
                    "score": 0.1,
                    "selected": False,
                    "text": None,
                },
            ],
        },
        "context": context,
        "prediction": answer if correct else "moss",
        "skipped": None,
        "verdict": {
            "correct": correct,
            "score": float(correct),
            "references": [{"answer": answer, "em": correct, "bem": None}],
        },
        "gold_rank": {"before": before, "after": after},
        "answer_in_context": answer.lower() in context.lower(),
        "category": category,
        "seconds": {"retrieve": 0.01, "filter": 0.1, "select": 0.05, "generate": 0.2},
    }


def write_run(root: Path, name: str, traces: list[dict]) -> Path:
    run = root / name
    run.mkdir(parents=True)
    (run / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in traces), encoding="utf-8")
    (run / "status.json").write_text(json.dumps({"run_id": name, "state": "finished", "command": "evaluate"}))
    (run / "scores.json").write_text(
        json.dumps(
            {
                "accuracy": 50.0,
                "n_skipped": 0,
                "recall_before_filter": {"recall@1": 25.0},
                "recall_after_filter": {"recall@1": 50.0},
            }
        )
    )
    return run


def read_js(path: Path, name: str):
    """The JSON a data script assigns to window.<name>."""
    text = path.read_text(encoding="utf-8")
    prefix = f"window.{name} = "
    assert text.startswith(prefix) and text.rstrip().endswith(";")
    return json.loads(text[len(prefix) :].rstrip().rstrip(";"))


@pytest.fixture
def image(tmp_path) -> str:
    path = tmp_path / "query.jpg"
    Image.new("RGB", (900, 600), (200, 40, 40)).save(path)
    return str(path)


@pytest.fixture
def runs(tmp_path, image):
    """Two runs over the same 7 questions (B in another order): A right on 0-3, B right on 2-5."""
    ranks = [(1, 1), (3, 1), (2, 4), (None, None), (5, 2), (1, 1), (4, 3)]
    a = [make_trace(i, i < 4, *ranks[i], image=image, qtype="2_hop" if i == 6 else "templated") for i in range(7)]
    b = [make_trace(i, 2 <= i <= 5, *ranks[i], image=image) for i in reversed(range(7))]
    return write_run(tmp_path, "run_a", a), write_run(tmp_path, "run_b", b)


def test_the_site_holds_every_question_in_the_index_and_in_shards_with_thumbnails(runs, tmp_path):
    site = build_site(runs[0], out=tmp_path / "site", shard_size=3)
    out = site.out
    assert site.index_html == out / "index.html" and site.questions == 7 and site.shards == 3
    html = (out / "index.html").read_text(encoding="utf-8")
    assert '<script src="data/index.js">' in html and "http" not in html.replace("http-equiv", "")  # no network
    index = read_js(out / "data" / "index.js", "QKVQA_INDEX")
    assert index["columns"] == list(COLUMNS) and [r[0] for r in index["rows"]] == [f"Q{i}" for i in range(7)]
    col = {c: k for k, c in enumerate(index["columns"])}
    assert [r[col["correct"]] for r in index["rows"]] == [1, 1, 1, 1, 0, 0, 0]
    assert [r[col["after"]] for r in index["rows"]][:4] == [1, 1, 4, 0]  # 0: not in the list
    shards = sorted((out / "data" / "a").glob("*.js"))
    assert [p.name for p in shards] == ["00000.js", "00001.js", "00002.js"]
    text = shards[1].read_text(encoding="utf-8")
    assert text.startswith('QKVQA.shard("a",1,')
    rows = json.loads(text[len('QKVQA.shard("a",1,') :].rstrip().rstrip(");"))
    assert [r["data_id"] for r in rows] == ["Q3", "Q4", "Q5"] and rows[0]["_thumb"].endswith(".jpg")
    (thumb,) = (out / "thumbs").glob("*.jpg")  # one image, one thumbnail
    with Image.open(thumb) as img:
        assert img.format == "JPEG" and max(img.size) <= 320
    meta = read_js(out / "data" / "meta.js", "QKVQA_META")
    assert meta["compare"] is False and meta["runs"]["a"]["headline"]["accuracy"] == 50.0
    assert meta["plots"]["accuracy_by_type"]["a"]["templated"] == {
        "n": 6,
        "correct": 4,
        "accuracy": pytest.approx(66.667),
    }


def test_recall_curves_count_an_absent_gold_article_as_a_miss_and_leave_two_hop_rows_out(runs):
    traces = load_run(runs[0]).traces
    # single-hop rows 0-5: before ranks 1, 3, 2, -, 5, 1; after 1, 1, 4, -, 2, 1
    assert recall_curve(traces, "before", 5) == pytest.approx([100 * n / 6 for n in (2, 3, 4, 4, 5)], abs=1e-3)
    assert recall_curve(traces, "after", 5) == pytest.approx([100 * n / 6 for n in (3, 4, 4, 5, 5)], abs=1e-3)


def test_compare_pairs_questions_by_id_and_counts_flips_as_the_difference_of_the_correct_sets(runs, tmp_path):
    a, b = load_run(runs[0]), load_run(runs[1])
    pairing = pair_runs(a, b)
    assert [b.traces[j]["data_id"] for j in pairing] == a.ids()
    counts = flips(a, b)
    assert counts["right_to_wrong"] == len(a.correct_ids() - b.correct_ids()) == 2  # Q0, Q1
    assert counts["wrong_to_right"] == len(b.correct_ids() - a.correct_ids()) == 2  # Q4, Q5
    site = build_site(runs[0], compare=runs[1])
    assert site.out == runs[0] / "inspect-vs-run_b" and site.flips == counts
    index = read_js(site.out / "data" / "index.js", "QKVQA_INDEX")
    col = {c: k for k, c in enumerate(index["columns"])}
    assert [(r[col["correct"]], r[col["b_correct"]]) for r in index["rows"]][:2] == [(1, 0), (1, 0)]
    assert sorted((site.out / "data" / "b").glob("*.js"))


def test_compare_refuses_runs_over_different_questions(runs, tmp_path, image):
    other = write_run(tmp_path, "run_c", [make_trace(i, True, 1, 1, image=image) for i in range(3, 9)])
    with pytest.raises(
        ConfigError, match="same questions.*3 questions only in run_a, 2 only in run_c.*inspect each alone"
    ):
        build_site(runs[0], compare=other)


def test_a_run_without_traces_says_why_and_how_to_get_them(tmp_path, capsys):
    run = tmp_path / "old_run"
    run.mkdir()
    (run / "status.json").write_text(json.dumps({"run_id": "old_run", "state": "finished", "command": "evaluate"}))
    with pytest.raises(
        DataError,
        match=r"traces.jsonl: missing \(the run predates traces or has not finished\); "
        r"rerun `qkvqa evaluate` .*run_id=old_run resume=auto",
    ):
        load_run(run)
    assert main(["inspect", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "traces.jsonl" in err and "rerun `qkvqa evaluate`" in err


def test_a_malformed_trace_is_named_by_file_line_and_field(runs):
    path = runs[0] / "traces.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = json.dumps({**json.loads(lines[2]), "trace_version": 7})
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match="traces.jsonl: line 3: field trace_version is 7"):
        load_run(runs[0])


def test_a_rebuild_removes_the_shards_a_larger_build_left(runs, tmp_path, image):
    out = tmp_path / "site"
    build_site(runs[0], out=out, shard_size=2)
    assert len(list((out / "data" / "a").glob("*.js"))) == 4
    small = write_run(tmp_path, "small", [make_trace(i, True, 1, 1) for i in range(3)])  # no image
    build_site(small, out=out, shard_size=2)
    assert len(list((out / "data" / "a").glob("*.js"))) == 2 and not list((out / "thumbs").glob("*.jpg"))


def test_the_cli_prints_the_site_and_the_flip_counts(runs, tmp_path, capsys):
    assert main(["inspect", str(runs[0]), "--compare", str(runs[1]), "--out", str(tmp_path / "s")]) == 0
    out = capsys.readouterr().out
    assert "2 right -> wrong, 2 wrong -> right" in out and f"site: {(tmp_path / 's' / 'index.html').as_uri()}" in out


def test_serve_answers_on_localhost_and_refuses_a_taken_port(runs, tmp_path):
    from qkvqa.inspect.serve import make_server

    site = build_site(runs[0], out=tmp_path / "site")
    server = make_server(site.out, 0)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/index.js", timeout=10) as response:
            assert response.status == 200 and response.read().startswith(b"window.QKVQA_INDEX = ")
        with pytest.raises(ConfigError, match=f"--serve {port}: cannot listen.*choose another port"):
            make_server(site.out, port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
