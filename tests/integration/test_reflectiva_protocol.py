"""ReflectiVA's InfoSeek protocol (preset infoseek_reflectiva_data) end to end, on the synthetic world in its layout:
a Wiki100k-style KB, a foreign knn.index + knn.json adopted by `qkvqa index import`, webdataset query shards."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from qkvqa.cli.main import main
from qkvqa.run.rundir import clear_run_env
from tests.integration.conftest import REPO, tiny

SHARDS = "val-{0000..0002}.tar"


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def reflectiva_world(world: dict, out: Path) -> dict:
    """The world's InfoSeek val set in ReflectiVA's files: KB {url: {"wikipedia_content"}}, 3 query shards with
    `{data_id}.question` and `{data_id}.img.jpg` (none for an image the world leaves missing; the second question's
    is corrupt bytes), the references."""
    src = Path(world["dir"])
    out.mkdir(parents=True)
    kb = json.loads((src / "kb/encyclopedic_kb_wiki.json").read_text(encoding="utf-8"))
    (out / "Wiki100k_ver_1_0-all.json").write_text(
        json.dumps({url: {"wikipedia_content": "\n\n".join(entry["section_texts"])} for url, entry in kb.items()}),
        encoding="utf-8",
    )
    for name in ("infoseek_val.jsonl", "infoseek_val_qtype.jsonl"):
        shutil.copy(src / "infoseek" / name, out / name)
    (out / "wiki_image").symlink_to(src / "infoseek/wiki_image")  # OMGM's wiki images (output/, full/), as released
    refs = [json.loads(line) for line in (out / "infoseek_val.jsonl").read_text().splitlines() if line.strip()]
    with_image = 0
    for shard in range(3):
        with tarfile.open(out / f"val-{shard:04d}.tar", "w") as tar:
            for ref in refs[shard::3]:
                _add(tar, f"{ref['data_id']}.question", ref["question"].encode("utf-8"))
                image = next((p for p in (src / "infoseek/images/val").glob(f"{ref['image_id']}.*")), None)
                if image is not None:
                    corrupt = ref is refs[1]
                    _add(tar, f"{ref['data_id']}.img.jpg", b"not a jpeg" if corrupt else image.read_bytes())
                    with_image += 1
    return {"dir": out, "references": refs, "kb_urls": list(kb), "with_image": with_image}


def _foreign_index(own_dir: Path, kb_urls: list[str], out: Path, seed: int = 0) -> None:
    """knn.index + knn.json as another tool writes them: the same vectors in a shuffled order, URL lists per row."""
    import faiss

    index = faiss.read_index(str(own_dir / "index.faiss"))
    rows = np.load(own_dir / "vector_rows.npy")
    vectors = index.reconstruct_n(0, index.ntotal)
    order = np.random.default_rng(seed).permutation(index.ntotal)
    foreign = faiss.IndexFlatIP(index.d)
    foreign.add(vectors[order])
    faiss.write_index(foreign, str(out / "knn.index"))
    (out / "knn.json").write_text(json.dumps([[kb_urls[rows[i]], "summary"] for i in order]))


def _rankings(run_out: str) -> dict:
    results = json.loads(Path(json.loads(run_out)["results"]).read_text())
    return {
        qid: [e["url"] if isinstance(e, dict) else e for e in value["retrieved_entities"]]
        for qid, value in results.items()
    }


@pytest.mark.slow
def test_the_reflectiva_protocol_runs_from_its_own_files_and_says_whose_numbers_it_compares_with(
    world, tmp_path, monkeypatch, capsys
):
    refl = reflectiva_world(world, tmp_path / "reflectiva")
    root = tmp_path / "experiments"
    root.mkdir()
    for name in ("base", "presets"):
        (root / name).symlink_to(REPO / "experiments" / name)
    (root / "refl.yaml").write_text(
        yaml.safe_dump(
            {
                "presets": ["infoseek_reflectiva_data"],
                "task": "evaluate",
                "data": {
                    "root": str(refl["dir"]),
                    "test_questions": SHARDS,
                    "images": {"infoseek_shards": SHARDS, "max_missing_fraction": 0.34},
                    "batch_size": 4,
                },
                "components": {
                    "image_encoder": tiny("evaclip_hf"),
                    "text_encoder": tiny("evaclip_hf"),
                    "qformer": tiny("blip2_qff"),
                    "reranker": tiny("bge_reranker"),
                    "generator": tiny("llama3"),
                    "judge": tiny("bem"),
                },
                "paths": {"cache_dir": str(tmp_path / "cache"), "checkpoints_root": str(tmp_path / "runs")},
                "trainer": {"accelerator": "cpu", "enable_progress_bar": False},
                "logger": {"wandb": {"enabled": False}},
                "generation": {"max_new_tokens": 4, "batch_size": 4},
                "retrieval": {"shard_size": 64},
                "qff": {"allow_untrained": True},
            }
        ),
        encoding="utf-8",
    )
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(root))

    def run(*argv: str) -> str:
        clear_run_env()
        capsys.readouterr()
        assert main(list(argv)) == 0, argv
        return capsys.readouterr().out.strip().splitlines()[-1]

    built = json.loads(
        run(
            "kb",
            "build",
            "--source",
            str(refl["dir"] / "Wiki100k_ver_1_0-all.json"),
            "--out",
            str(refl["dir"] / "kb_store"),
        )
    )
    assert built["articles"] == len(refl["kb_urls"])
    # A stage-1 index of our own, shuffled and written as ReflectiVA's knn.index / knn.json, then adopted.
    own = f"retrieval.index_dir={tmp_path / 'own_index'}"
    run("embed", "experiment=refl", own)
    run("index", "build", "experiment=refl", own)
    _foreign_index(tmp_path / "own_index", refl["kb_urls"], refl["dir"])
    imported = json.loads(
        run(
            "index",
            "import",
            "--faiss",
            str(refl["dir"] / "knn.index"),
            "--urls",
            str(refl["dir"] / "knn.json"),
            "experiment=refl",
        )
    )
    assert imported["count"] == len(refl["kb_urls"]) and imported["unmapped_vectors"] == 0
    # The imported index ranks every question exactly as the one it was made from: the URL mapping is right.
    theirs = _rankings(run("retrieve", "experiment=refl", "run_id=theirs"))
    ours = _rankings(run("retrieve", "experiment=refl", own, "run_id=ours"))
    assert theirs == ours and len(theirs) == len(refl["references"])
    assert sum(bool(urls) for urls in theirs.values()) == refl["with_image"] - 1  # the corrupt image ranks nothing
    # The evaluation: every val row counts (ReflectiVA's set), and the card says whose numbers it compares with.
    run("evaluate", "experiment=refl", "run_id=eval", "eval.judge=em_only")
    run_dir = tmp_path / "runs" / "eval"
    scores = json.loads((run_dir / "scores.json").read_text())
    assert scores["n_questions"] == len(refl["references"])
    assert scores["n_skipped"] == len(refl["references"]) - refl["with_image"] + 1
    card = scores["protocol"]
    assert card["protocol"] == "reflectiva_wiki100k" and "ReAG 47.2" in card["protocol_comparable_to"]
    because = " ".join(card["not_comparable_because"])
    assert "data.protocol = reflectiva_wiki100k" in because and "73,620" in because
    report = (run_dir / "report.md").read_text()
    assert "ReAG 47.2" in report and "Wiki100k" in report
    assert scores["qff_article_images"]["ranked_articles"] > 0  # the CSVs give the image-less KB its images
    assert scores["qff_article_images"]["without_image"] < scores["qff_article_images"]["ranked_articles"]
    evaluated = json.loads((run_dir / "question_ids.json").read_text())
    assert evaluated["ids"] == [r["data_id"] for shard in range(3) for r in refl["references"][shard::3]]
    # InfoSeek traces: the images live in shards (no path), the verdict per accepted answer or range
    traces = [json.loads(line) for line in (run_dir / "traces.jsonl").read_text().splitlines()]
    assert [t["data_id"] for t in traces] == evaluated["ids"] and all(t["image"] is None for t in traces)
    assert sum(t["skipped"] is not None for t in traces) == scores["n_skipped"]
    for t in traces:
        assert t["dataset"] == "infoseek" and t["split"].startswith("val_unseen_")
        assert [r["answer"] for r in t["verdict"]["references"]] == t["gold"]["answers"]
        assert t["verdict"]["correct"] == (not t["skipped"] and any(r["em"] for r in t["verdict"]["references"]))
    assert evaluated["protocol_questions"] == 73620
    # A flipped byte in the adopted index is caught by `index check`, naming the file.
    path = refl["dir"] / "index" / "index.faiss"
    data = bytearray(path.read_bytes())
    data[-5] ^= 0xFF
    path.write_bytes(bytes(data))
    clear_run_env()
    capsys.readouterr()
    assert main(["index", "check", "experiment=refl"]) == 2
    assert "index.faiss: corrupt index file" in capsys.readouterr().err


def test_reflectiva_shards_read_as_questions_with_their_references_and_images(world, tmp_path):
    from qkvqa.data_modules import build_data_module

    refl = reflectiva_world(world, tmp_path / "reflectiva")
    dm = build_data_module(
        {
            "dataset": "infoseek",
            "protocol": "reflectiva_wiki100k",
            "root": str(refl["dir"]),
            "test_questions": SHARDS,
            "infoseek_references": "infoseek_val.jsonl",
            "infoseek_qtypes": "infoseek_val_qtype.jsonl",
            "images": {"infoseek_shards": SHARDS},
        }
    )
    questions = dm.questions("test")
    first = refl["references"][0]
    q = next(q for q in questions if q.data_id == first["data_id"])
    assert (q.question, q.reference.answer_eval, q.split) == (
        first["question"],
        first["answer_eval"],
        first["data_split"],
    )
    loaded = [dm.image_loader.load("infoseek", q.image_id) for q in questions]
    assert sum(image is not None for image in loaded) == refl["with_image"] - 1  # one corrupt image
    assert dm.image_loader.counts()["missing"] == len(questions) - refl["with_image"]
    skip = next(s for s in dm.image_loader.skipped.values() if s.reason == "corrupt")
    assert ".tar#" in skip.path
