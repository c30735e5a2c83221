"""Issue 34 item 4, the inspect site: the gold answer in the table, one gold-rank notation with its legend, dropped
chunks with their text and the evidence section flagged. Real evaluations, a real site, a real headless Chromium."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from qkvqa.cli.main import main
from qkvqa.pipeline.traces import CHUNK_TEXT_CHARS
from qkvqa.run.rundir import clear_run_env
from tests.integration.test_inspect_browser import _open, browser  # noqa: F401  (a module fixture)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sites(eval_env, tmp_path_factory, monkeypatch_module):
    """Two evaluations of the same questions (A: the top-1 article's chunks, exact match; B: CDA, the tiny BEM) and
    their sites, A alone and A compared with B (run ids of their own: the eval_env runs root is shared)."""
    monkeypatch_module.setenv("QKVQA_EXPERIMENTS", str(eval_env["root"]))
    for run_id, overrides in (
        ("inspect34-a", ["eval.judge=em_only", "cda.mode=top1_article_chunks", "cda.K1=64"]),
        ("inspect34-b", ["eval.judge=bem"]),
    ):
        clear_run_env()
        assert main(["evaluate", "experiment=world_eval", f"run_id={run_id}", *overrides]) == 0
    clear_run_env()
    a, b = eval_env["runs"] / "inspect34-a", eval_env["runs"] / "inspect34-b"
    out = tmp_path_factory.mktemp("inspect34")
    assert main(["inspect", str(a), "--out", str(out / "single"), "--shard-size", "8"]) == 0
    assert main(["inspect", str(a), "--compare", str(b), "--out", str(out / "compare"), "--shard-size", "8"]) == 0
    return {"a": a, "b": b, "single": out / "single", "compare": out / "compare"}


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def _traces(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "traces.jsonl").read_text(encoding="utf-8").splitlines()]


def _index(site: Path) -> dict:
    text = (site / "data" / "index.js").read_text(encoding="utf-8")
    return json.loads(re.sub(r"^window\.\w+ = ", "", text.strip()).rstrip(";"))


def test_dropped_chunks_keep_their_text_up_to_the_cap(sites):
    chunks = [c for t in _traces(sites["b"]) for c in ((t.get("cda") or {}).get("chunks") or [])]
    dropped = [c for c in chunks if not c["selected"]]
    assert dropped and all(c["text"] for c in dropped)
    assert all(len(c["text"]) <= CHUNK_TEXT_CHARS + 1 for c in chunks)


def test_the_index_holds_each_questions_gold_answer(sites):
    index, traces = _index(sites["single"]), _traces(sites["a"])
    gold = index["columns"].index("gold")
    assert [row[gold] for row in index["rows"]] == [" | ".join(t["gold"]["answers"])[:120] for t in traces]


def test_the_table_shows_the_gold_answer_and_one_gold_rank_notation_with_its_legend(browser, sites):  # noqa: F811
    _open(browser, sites["compare"])
    heads = browser.execute_script("return [...document.querySelectorAll('#qtable thead th')].map(e => e.textContent);")
    assert "gold answer" in heads and "gold rank: stage 1 → filter" in heads and "gold rank: A → B" in heads
    legend = browser.execute_script("return document.getElementById('rank-legend').textContent;")
    assert "↑n" in legend and "↓n" in legend and "–" in legend
    cells = browser.execute_script(
        "return [...document.querySelectorAll('#qtable tbody tr')].map(tr => "
        "[...tr.children].map(td => td.textContent));"
    )
    traces = _traces(sites["a"])
    first = cells[0]
    assert " | ".join(traces[0]["gold"]["answers"]) in first
    at = [heads.index("gold rank: stage 1 → filter"), heads.index("gold rank: A → B")]
    moves = [row[i] for row in cells for i in at]
    assert moves and all(re.fullmatch(r"(\d+|–) → (\d+|–) ?(↑\d*|↓\d*|=)?", m.strip()) for m in moves), moves[:5]


def test_a_question_view_flags_the_evidence_section_and_shows_dropped_chunks(browser, sites):  # noqa: F811
    traces = _traces(sites["b"])
    pos = next(
        i for i, t in enumerate(traces) if any(not c["selected"] for c in (t.get("cda") or {}).get("chunks", []))
    )
    _open(browser, sites["compare"], f"#/q/{pos}")
    from tests.helpers.browser import wait_for

    wait_for(browser, f"document.getElementById('view-question').dataset.loaded === '{pos}'")
    dropped = browser.execute_script(
        "return [...document.querySelectorAll('table.chunks tr.dropped td.chunktext')].map(td => td.textContent);"
    )
    assert dropped and all(dropped)
    evidence_expected = any(
        c["url"] == h["url"] and c["section_index"] == h["section_index"]
        for t in (traces[pos],)
        for h in (t["gold"].get("hops") or [{"url": t["gold"]["urls"][0], "section_index": t["gold"]["section_index"]}])
        for c in t["cda"]["chunks"]
    )
    flagged = browser.execute_script("return document.querySelectorAll('table.chunks tr.evidence-row').length;")
    assert (flagged > 0) == evidence_expected
