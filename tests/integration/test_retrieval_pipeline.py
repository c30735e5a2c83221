"""Stage 1 end to end through the CLI on the synthetic world: embed -> index build -> retrieve -> Recall@K."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from qkvqa.cli.main import main
from qkvqa.data.questions import read_evqa_csv
from qkvqa.metrics.retrieval import evqa_recall_at_k
from qkvqa.retrieval.results import read_results, read_results_stage1
from qkvqa.run.rundir import clear_run_env
from tests.fixtures_world import make_world
from tests.helpers.eval_env import experiments_dir

TINY = {"kind": "evaclip_hf", "tiny": True, "device": "cpu", "dtype": "fp32"}
SHARD_SIZE = 16


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core box their barriers cost 10x."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def experiments(tmp_path, world, monkeypatch) -> Path:
    """An experiments/ directory with the repository's base and presets and `world.yaml` on the synthetic world."""
    root = experiments_dir(
        tmp_path,
        world,
        "world",
        {
            "components": {"image_encoder": TINY, "text_encoder": TINY},
            "paths": {"cache_dir": str(tmp_path / "cache"), "checkpoints_root": str(tmp_path / "runs")},
            "retrieval": {"shard_size": SHARD_SIZE},
        },
    )
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(root))
    return root


def _run(capsys, *argv) -> dict:
    """Run one command in-process as its own run (a fresh run id each time); its JSON line."""
    clear_run_env()
    assert main(list(argv)) == 0, capsys.readouterr().err
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _check_results(path: Path, world: dict, top_k: int) -> dict:
    """Layout, no duplicate URLs, at most K per question, similarities sorted, URLs and titles from the KB."""
    raw = json.loads(path.read_text(encoding="utf-8"))
    questions = read_evqa_csv(Path(world["dir"]) / "evqa/test.csv")
    assert set(raw) == {q.data_id for q in questions}
    titles = {e["url"]: e["title"] for e in world["entities"]}
    for value in raw.values():
        assert set(value) == {"retrieved_entities", "retrieval_similarities"}
        urls = [e["url"] for e in value["retrieved_entities"]]
        assert len(urls) <= top_k and len(urls) == len(set(urls)) == len(value["retrieval_similarities"])
        assert all(titles[e["url"]] == e["title"] for e in value["retrieved_entities"])
        assert value["retrieval_similarities"] == sorted(value["retrieval_similarities"], reverse=True)
    results = read_results(path)
    rows = [
        {"data_id": q.data_id, "wikipedia_url": "|".join(q.gold_urls), "question_type": q.question_type}
        for q in questions
    ]
    return evqa_recall_at_k({qid: r.urls for qid, r in results.items()}, rows)


@pytest.mark.slow
def test_image_to_summary_end_to_end(experiments, world, capsys):
    articles = world["counts"]["articles"]
    embedded = _run(capsys, "embed", "experiment=world")
    assert embedded["what"] == "kb_text" and embedded["vectors"] == articles
    assert embedded["shards_computed"] == embedded["shards_total"] == -(-articles // SHARD_SIZE)
    built = _run(capsys, "index", "build", "experiment=world")
    assert (built["mode"], built["count"], built["factory"]) == ("image_to_summary", articles, "Flat")
    manifest = json.loads((Path(built["index_dir"]) / "manifest.json").read_text())
    assert manifest["text_source"] == {"summary_source": "lead_section"} and manifest["kb"]["articles"] == articles
    out = _run(capsys, "retrieve", "experiment=world")
    run_dir = Path(out["run_dir"])
    summary = json.loads((run_dir / "summary.json").read_text())
    recalls = [summary[f"retrieval/test/recall@{k}"] for k in (1, 5, 10, 20)]
    assert all(0.0 <= r <= 100.0 for r in recalls) and recalls == sorted(recalls)
    assert summary["retrieval/test/recall@20"] > 0  # 20 of ~36 articles: some gold is in
    independent = _check_results(Path(out["results"]), world, top_k=20)
    assert [independent[f"recall@{k}"] for k in (1, 5, 10, 20)] == pytest.approx(recalls)
    deliberate = [s for s in world["deliberate_skips"] if s["file"] == "evqa/test.csv"]
    skipped = json.loads((run_dir / "skipped_images.json").read_text())
    assert (
        {k: n for k, n in skipped["counts"].items() if n}
        == {"missing": 1, "corrupt": 1}
        == {s["reason"]: 1 for s in deliberate}
    )
    assert summary["retrieval/test/n_missing_query_images"] == summary["retrieval/test/n_without_results"] >= 2
    assert _run(capsys, "embed", "experiment=world")["shards_computed"] == 0  # resumed: nothing to do

    echosight = {
        qid: {
            "retrieved_entries": [e["url"] for e in v["retrieved_entities"]],
            "retrieval_similarities": v["retrieval_similarities"],
        }
        for qid, v in json.loads(Path(out["results"]).read_text()).items()
    }
    (experiments / "echosight.json").write_text(json.dumps(echosight))
    rescored = _run(capsys, "retrieve", "experiment=world", f"retrieval.results={experiments / 'echosight.json'}")
    assert [rescored[f"recall@{k}"] for k in (1, 5, 10, 20)] == pytest.approx(recalls)
    assert read_results(rescored["results"]) == read_results(out["results"])  # titles filled in from the KB
    # what stage 1 embedded travels with the file qkvqa wrote (its sidecar), not with a foreign one
    assert read_results_stage1(out["results"])["text"] == "lead_section"
    assert read_results_stage1(rescored["results"]) is None  # read from EchoSight's: unknown


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_image_to_image_end_to_end_dedupes_articles(experiments, world, capsys):
    args = ["experiment=world", "retrieval.mode=image_to_image", "retrieval.top_k=5"]
    embedded = _run(capsys, "embed", *args)
    assert embedded["what"] == "kb_images" and embedded["vectors"] > world["counts"]["articles"]
    assert embedded["missing_images"] > 0
    built = _run(capsys, "index", "build", *args)
    summary = json.loads((Path(built["run_dir"]) / "summary.json").read_text())
    skipped = {k.split("/")[-1]: v for k, v in summary.items() if k.startswith("index/kb_skipped/")}
    assert skipped["missing_images"] == embedded["missing_images"] and "vectors" not in skipped  # skips, not vectors
    assert summary["index/count"] == embedded["vectors"]
    out = _run(capsys, "retrieve", *args, "split=test")
    recall = _check_results(Path(out["results"]), world, top_k=5)
    assert recall["recall@5"] == pytest.approx(out["recall@5"]) and "recall@20" not in out


@pytest.mark.slow  # seconds-long: `make test`, not the fast loop
def test_index_of_another_kb_is_refused_in_one_line(experiments, world, tmp_path, capsys):
    _run(capsys, "embed", "experiment=world")
    built = _run(capsys, "index", "build", "experiment=world")
    other = make_world(tmp_path / "other", entities=24, seed=1)
    clear_run_env()
    assert (
        main(["retrieve", "experiment=world", f"data.root={other['dir']}", f"retrieval.index_dir={built['index_dir']}"])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert (
        "does not match" in err
        and "KB URL checksum" in err
        and f"KB article count: index {world['counts']['articles']}, KB store 24" in err
    )
    assert "qkvqa index build experiment=world " in err  # the fix, with the user's own overrides after it
    clear_run_env()
    assert main(["index", "check", "experiment=world", "components.image_encoder.options.seed=1"]) == 2
    assert "query encoder" in capsys.readouterr().err
