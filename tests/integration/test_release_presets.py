"""The shipped data presets run on the public layouts with nothing changed but `data.root` (issue 30 item 3).

`qkvqa synth` writes each release in its own folder as its owners lay it out (src/qkvqa/synth/world.py):
`evqa/` the E-VQA release (encyclopedic_vqa README: the CSVs and KB JSON; iNaturalist 2021 `train/`/`val/`
category folders with EchoSight's id2name maps beside them; GLDv2 `a/b/c/{id}.jpg`; OMGM's wiki images,
`wiki_image/output/*.csv` and `wiki_image/full/wiki_image_split/...`), `infoseek/` EchoSight's InfoSeek files.
Each preset is used as shipped: only `data.root`, the tiny components and where runs and caches go are set.
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml

from qkvqa.cli.main import main
from qkvqa.run.rundir import clear_run_env
from tests.fixtures_world import make_world
from tests.integration.conftest import REPO, tiny

# Large enough that the world's deliberately missing query images stay under the shipped 2 % bound.
ENTITIES = 120
TINY_COMPONENTS = {
    "image_encoder": tiny("evaclip_hf"),
    "text_encoder": tiny("evaclip_hf"),
    "qformer": tiny("blip2_qff"),
    "reranker": tiny("bge_reranker"),
    "generator": tiny("llama3"),
    "judge": tiny("bem"),
}


@pytest.fixture(scope="module")
def release_world(tmp_path_factory) -> dict:
    return make_world(tmp_path_factory.mktemp("release"), entities=ENTITIES)


@pytest.fixture
def run(tmp_path, monkeypatch, capsys):
    """`run(preset, root, *argv)`: the qkvqa command on experiment `P.yaml` = preset P with only data.root set."""
    root = tmp_path / "experiments"
    root.mkdir()
    for name in ("base", "presets"):
        (root / name).symlink_to(REPO / "experiments" / name)
    monkeypatch.setenv("QKVQA_EXPERIMENTS", str(root))

    def _run(preset: str, data_root: Path, *argv: str) -> str:
        (root / f"{preset}.yaml").write_text(
            yaml.safe_dump(
                {
                    "presets": [preset],
                    "data": {"root": str(data_root)},
                    "components": TINY_COMPONENTS,
                    "paths": {"cache_dir": str(tmp_path / "cache"), "checkpoints_root": str(tmp_path / "runs")},
                    "trainer": {"accelerator": "cpu", "enable_progress_bar": False},
                    "logger": {"wandb": {"enabled": False}},
                    "qff": {"allow_untrained": True},
                }
            ),
            encoding="utf-8",
        )
        clear_run_env()
        capsys.readouterr()
        assert main([*argv, f"experiment={preset}"]) == 0, argv
        return capsys.readouterr().out.strip().splitlines()[-1]

    return _run


def _preset_data(name: str) -> dict:
    return yaml.safe_load((REPO / "experiments/presets" / f"{name}.yaml").read_text(encoding="utf-8"))["data"]


def test_the_demo_preset_differs_from_evqa_data_only_in_its_root():
    demo, real = _preset_data("demo_world"), _preset_data("evqa_data")
    for key in ("kb_source", "kb_store", "train_questions", "val_questions", "test_questions"):
        assert demo[key] == real[key], key
    for key, value in real["images"].items():
        assert demo["images"][key] == value, key
    assert demo["root"] != real["root"]


@pytest.mark.slow
def test_preset_evqa_data_runs_on_the_e_vqa_release_layout(release_world, run, tmp_path):
    evqa = Path(release_world["dir"]) / "evqa"
    assert {"encyclopedic_kb_wiki.json", "train.csv", "val.csv", "test.csv"} <= {p.name for p in evqa.iterdir()}
    csv_rows = (evqa / "wiki_image/output/wiki_image_url_part_1_processed.csv").read_text().splitlines()
    assert csv_rows[1].split(",")[2].startswith("full/wiki_image_split/wiki_entity_image_")
    id2name = json.loads((evqa / "images/inaturalist/train_id2name.json").read_text())
    assert id2name and all(name.startswith("train/") for name in id2name.values())
    assert all((evqa / "images/inaturalist" / name).is_file() for name in id2name.values())
    run("evqa_data", evqa, "embed")
    run("evqa_data", evqa, "index", "build")
    mined = json.loads(run("evqa_data", evqa, "mine", "split=train"))
    assert mined["kept"] > 0 and mined["dropped"]["no_gold_image"] < mined["kept"]
    run("evqa_data", evqa, "evaluate", "run_id=evqa-filter", "eval.stop_after=filter")
    scores = json.loads((tmp_path / "runs/evqa-filter/scores.json").read_text())
    images = scores["qff_article_images"]
    assert images["ranked_articles"] > 0 and images["without_image"] < images["ranked_articles"] / 4
    assert scores["n_skipped"] <= 2  # the world's deliberate skips, nothing else


@pytest.mark.slow
def test_preset_infoseek_data_runs_on_echosights_infoseek_layout(release_world, run, tmp_path):
    infoseek = Path(release_world["dir"]) / "infoseek"
    run("infoseek_data", infoseek, "embed")
    run("infoseek_data", infoseek, "index", "build")
    run("infoseek_data", infoseek, "evaluate", "run_id=infoseek-filter", "eval.stop_after=filter")
    scores = json.loads((tmp_path / "runs/infoseek-filter/scores.json").read_text())
    assert scores["n_skipped"] == 1  # oven_05001795, missing in the release too
    images = scores["qff_article_images"]
    assert images["ranked_articles"] > 0 and images["without_image"] < images["ranked_articles"] / 4


def _reflectiva_release(world: Path, out: Path) -> list[dict]:
    """ReflectiVA's files (README of aimagelab/ReflectiVA: Wiki100k_ver_1_0-all.json, val-{0000..0014}.tar with
    `{data_id}.question` / `{data_id}.img.jpg`) made from the world's InfoSeek val set, beside OMGM's wiki images."""
    from tests.integration.test_reflectiva_protocol import _add

    infoseek = world / "infoseek"
    out.mkdir()
    kb = json.loads((infoseek / "wiki_100_dict_v4.json").read_text(encoding="utf-8"))
    (out / "Wiki100k_ver_1_0-all.json").write_text(
        json.dumps({url: {"wikipedia_content": "\n\n".join(entry["section_texts"])} for url, entry in kb.items()}),
        encoding="utf-8",
    )
    for name in ("infoseek_val.jsonl", "infoseek_val_qtype.jsonl"):
        shutil.copy(infoseek / name, out / name)
    shutil.copytree(infoseek / "wiki_image", out / "wiki_image")
    refs = [json.loads(line) for line in (out / "infoseek_val.jsonl").read_text().splitlines() if line.strip()]
    for shard in range(15):
        with tarfile.open(out / f"val-{shard:04d}.tar", "w") as tar:
            for ref in refs[shard::15]:
                _add(tar, f"{ref['data_id']}.question", ref["question"].encode("utf-8"))
                image = next((infoseek / "images/val").glob(f"{ref['image_id']}.*"), None)
                if image is not None:
                    _add(tar, f"{ref['data_id']}.img.jpg", image.read_bytes())
    return refs


@pytest.mark.slow
def test_preset_infoseek_reflectiva_data_runs_on_reflectivas_layout(release_world, run, tmp_path):
    from tests.integration.test_reflectiva_protocol import _foreign_index

    refl = tmp_path / "reflectiva"
    refs = _reflectiva_release(Path(release_world["dir"]), refl)
    clear_run_env()
    assert (
        main(["kb", "build", "--source", str(refl / "Wiki100k_ver_1_0-all.json"), "--out", str(refl / "kb_store")]) == 0
    )
    own = f"retrieval.index_dir={tmp_path / 'own_index'}"  # scaffolding: the index ReflectiVA would ship
    run("infoseek_reflectiva_data", refl, "embed", own)
    run("infoseek_reflectiva_data", refl, "index", "build", own)
    kb_urls = list(json.loads((refl / "Wiki100k_ver_1_0-all.json").read_text()))
    _foreign_index(tmp_path / "own_index", kb_urls, refl)
    run(
        "infoseek_reflectiva_data",
        refl,
        "index",
        "import",
        "--faiss",
        str(refl / "knn.index"),
        "--urls",
        str(refl / "knn.json"),
    )
    run("infoseek_reflectiva_data", refl, "evaluate", "run_id=refl-filter", "eval.stop_after=filter")
    scores = json.loads((tmp_path / "runs/refl-filter/scores.json").read_text())
    assert scores["n_questions"] == len(refs) and scores["n_skipped"] == 1
    images = scores["qff_article_images"]
    assert images["ranked_articles"] > 0 and images["without_image"] < images["ranked_articles"] / 4
