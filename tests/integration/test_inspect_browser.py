"""`qkvqa inspect` in a real headless Chromium: the site of two real tiny evaluations, opened from file://.

The table shows every trace; a filter shows as many questions as traces.jsonl says; a question's view shows its
image (loaded) and the gold answer highlighted in its context; compare mode counts the flips the two runs' correct
sets differ by. Screenshots go under the test's tmp dir (and $QKVQA_ARTIFACTS when set).
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from pathlib import Path

import pytest

from qkvqa.cli.main import main
from qkvqa.pipeline.traces import CHUNK_TEXT_CHARS
from qkvqa.run.rundir import clear_run_env
from tests.helpers.browser import chromium, missing, screenshot, wait_for

pytestmark = pytest.mark.slow


def _traces(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "traces.jsonl").read_text(encoding="utf-8").splitlines()]


def _correct(traces: list[dict]) -> set[str]:
    return {t["data_id"] for t in traces if (t.get("verdict") or {}).get("correct")}


@pytest.fixture(scope="module")
def browser():
    reason = missing()
    if reason:  # `make test` installs the browser (.ci/install_browser.sh): in CI a missing one is a failure
        (pytest.fail if os.environ.get("CI") else pytest.skip)(reason)
    with chromium() as driver:
        yield driver


@pytest.fixture(scope="module")
def sites(eval_env, tmp_path_factory):
    """Two real evaluations of the same questions and their sites: A alone, and A compared with B. A gives the
    generator every chunk of the top-1 article (so a question whose gold article the filter ranks first has its
    answer in the context) and judges by exact match; B is CDA judged by the tiny random BEM, so that verdicts
    differ between the runs."""
    import torch

    threads, previous = torch.get_num_threads(), os.environ.get("QKVQA_EXPERIMENTS")
    torch.set_num_threads(1)
    os.environ["QKVQA_EXPERIMENTS"] = str(eval_env["root"])
    try:
        for run_id, overrides in (
            ("inspect-a", ["eval.judge=em_only", "cda.mode=top1_article_chunks", "cda.K1=64"]),
            ("inspect-b", ["eval.judge=bem"]),
        ):
            clear_run_env()
            assert main(["evaluate", "experiment=world_eval", f"run_id={run_id}", *overrides]) == 0
    finally:
        torch.set_num_threads(threads)
        if previous is None:
            os.environ.pop("QKVQA_EXPERIMENTS", None)
        else:
            os.environ["QKVQA_EXPERIMENTS"] = previous
        clear_run_env()
    a, b = eval_env["runs"] / "inspect-a", eval_env["runs"] / "inspect-b"
    out = tmp_path_factory.mktemp("inspect")
    assert main(["inspect", str(a), "--out", str(out / "single"), "--shard-size", "8"]) == 0
    assert main(["inspect", str(a), "--compare", str(b), "--out", str(out / "compare"), "--shard-size", "8"]) == 0
    return {"a": a, "b": b, "single": out / "single", "compare": out / "compare", "shots": out / "screenshots"}


def _open(driver, site: Path, hash_: str = "") -> None:
    driver.get((site / "index.html").as_uri() + hash_)
    wait_for(driver, "document.body.dataset.ready === '1'")


def _shown(driver) -> int:
    return int(driver.execute_script("return document.getElementById('shown-count').dataset.shown;"))


def _select(driver, select_id: str, value: str) -> None:
    driver.execute_script(
        "const s = document.getElementById(arguments[0]); s.value = arguments[1];s.dispatchEvent(new Event('change'));",
        select_id,
        value,
    )


def test_the_table_lists_every_trace_and_filters_count_as_the_traces_do(browser, sites):
    traces = _traces(sites["a"])
    _open(browser, sites["single"])
    assert int(browser.execute_script("return document.getElementById('total-count').textContent;")) == len(traces)
    assert _shown(browser) == len(traces)
    rows = browser.execute_script("return document.querySelectorAll('#qtable tbody tr').length;")
    assert rows == min(len(traces), 100)
    screenshot(browser, sites["shots"] / "inspect_table.png", height=900)
    _select(browser, "f-verdict", "0")
    wrong = [t for t in traces if t.get("verdict") and not t["verdict"]["correct"]]
    assert wrong and _shown(browser) == len(wrong)
    _select(browser, "f-verdict", "")
    category, count = Counter(t["category"] for t in traces if t["category"]).most_common(1)[0]
    code = browser.execute_script("return window.QKVQA_INDEX.codes.category.indexOf(arguments[0]);", category)
    _select(browser, "f-category", str(code))
    assert _shown(browser) == count
    _select(browser, "f-category", "")
    _select(browser, "f-aic", "1")
    assert _shown(browser) == sum(1 for t in traces if t["answer_in_context"] is True)
    _select(browser, "f-aic", "")
    two_hop = sum(1 for t in traces if t["question_type"] == "2_hop")
    code = browser.execute_script("return window.QKVQA_INDEX.codes.type.indexOf('2_hop');")
    _select(browser, "f-type", str(code))
    assert two_hop and _shown(browser) == two_hop
    _select(browser, "f-type", "")
    target = traces[len(traces) // 2]
    browser.execute_script(
        "const i = document.getElementById('f-search'); i.value = arguments[0];i.dispatchEvent(new Event('input'));",
        target["question"].upper(),
    )
    same_question = sum(1 for t in traces if t["question"] == target["question"])
    wait_for(browser, f"+document.getElementById('shown-count').dataset.shown === {same_question}")


def test_a_question_shows_its_image_and_highlights_the_gold_answer_in_its_context(browser, sites):
    traces = _traces(sites["a"])
    chosen = next(
        (
            i
            for i, t in enumerate(traces)
            if t["image"]
            and t["context"]
            and any(a.lower() in t["context"].lower() for a in t["gold"]["answers"] if a.strip())
        ),
        None,
    )
    assert chosen is not None, "no trace of the tiny evaluation has its answer in its context"
    _open(browser, sites["single"], f"#/q/{chosen}")
    wait_for(browser, f"document.getElementById('view-question').dataset.loaded === '{chosen}'")
    wait_for(browser, "document.getElementById('q-image').complete")
    assert browser.execute_script("return document.getElementById('q-image').naturalWidth;") > 0
    marks = browser.execute_script("return [...document.querySelectorAll('#context mark')].map(m => m.textContent);")
    answers = {a.lower() for a in traces[chosen]["gold"]["answers"]}
    assert marks and {m.lower() for m in marks} <= answers
    text = browser.execute_script("return document.getElementById('view-question').textContent;")
    assert traces[chosen]["question"] in text and "Stage 1" in text and "Filter:" in text
    screenshot(browser, sites["shots"] / "inspect_question.png")


def test_a_two_hop_question_shows_both_hops_with_their_evidence_sections(browser, sites):
    traces = _traces(sites["a"])
    chosen = next(i for i, t in enumerate(traces) if t["question_type"] == "2_hop")
    hops = traces[chosen]["gold"]["hops"]
    assert len(hops) == 2 and hops[0]["url"] != hops[1]["url"]
    _open(browser, sites["single"], f"#/q/{chosen}")
    wait_for(browser, f"document.getElementById('view-question').dataset.loaded === '{chosen}'")
    text = browser.execute_script("return document.getElementById('q-gold').textContent;")
    for number, hop in enumerate(hops, 1):
        assert f"hop {number}: {hop['title']} · evidence section {hop['section_index']}" in text, text
        assert hop["section_title"] in text
    seen = traces[chosen]["gold"]["url_used_in_train"]
    assert ("unseen in training" if seen is False else "seen in training") in text


def test_compare_mode_counts_the_flips_the_two_correct_sets_differ_by(browser, sites):
    a, b = _traces(sites["a"]), _traces(sites["b"])
    right_to_wrong, wrong_to_right = len(_correct(a) - _correct(b)), len(_correct(b) - _correct(a))
    assert right_to_wrong + wrong_to_right > 0  # the judges differ: the check below is not vacuous
    browser.set_window_size(1400, 1000)
    _open(browser, sites["compare"], "#/compare")
    wait_for(browser, "document.getElementById('flip-rw') !== null")
    count = lambda name: int(browser.execute_script(f"return document.getElementById('{name}').textContent;"))  # noqa: E731
    assert (count("flip-rw"), count("flip-wr")) == (right_to_wrong, wrong_to_right)
    assert (count("correct-a"), count("correct-b")) == (len(_correct(a)), len(_correct(b)))
    screenshot(browser, sites["shots"] / "inspect_compare.png")
    browser.set_window_size(1400, 1000)
    browser.execute_script("location.hash = '#/'")
    _select(browser, "f-flip", "wr")
    assert _shown(browser) == wrong_to_right
    flipped = browser.execute_script("return document.querySelector('#qtable tbody tr').dataset.pos;")
    browser.execute_script("location.hash = arguments[0]", f"#/q/{flipped}")
    wait_for(browser, f"document.getElementById('view-question').dataset.loaded === '{flipped}'")
    sides = browser.execute_script(
        "return [...document.querySelectorAll('#view-question .pair h2')].map(h => h.textContent);"
    )
    assert sides == ["A: inspect-a", "B: inspect-b"]
    screenshot(browser, sites["shots"] / "inspect_pair.png")
    browser.set_window_size(1400, 1000)
    browser.execute_script("location.hash = '#/plots'")
    wait_for(browser, "document.getElementById('plot-recall') !== null")
    points = browser.execute_script("return document.querySelectorAll('#plot-recall circle').length;")
    assert points == 4 * len(
        json.loads((sites["compare"] / "data" / "meta.js").read_text().split(" = ", 1)[1].rstrip().rstrip(";"))[
            "plots"
        ]["recall"]["k"]
    )
    screenshot(browser, sites["shots"] / "inspect_plots.png")


# Issue 34 item 4: the gold answer in the table, one gold-rank notation with its legend, dropped chunks with their
# text and the evidence section flagged.


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


def test_the_table_shows_the_gold_answer_and_one_gold_rank_notation_with_its_legend(browser, sites):
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


def test_a_question_view_flags_the_evidence_section_and_shows_dropped_chunks(browser, sites):
    traces = _traces(sites["b"])
    pos = next(
        i for i, t in enumerate(traces) if any(not c["selected"] for c in (t.get("cda") or {}).get("chunks", []))
    )
    _open(browser, sites["compare"], f"#/q/{pos}")
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
