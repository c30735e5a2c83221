"""`qkvqa doctor` on the synthetic world in the public release layouts (evqa/, infoseek/): green on the world as
written, and each broken variant (an image root one folder off, a malformed 2_hop row, a missing id2name map, a
missing model directory, a corrupt index) gets its own FAIL row and exit status 1."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from qkvqa.cli.main import main

pytestmark = pytest.mark.usefixtures("single_thread")
TINY = {
    name: {"kind": kind, "tiny": True, "device": "cpu"}
    for name, kind in (
        ("image_encoder", "evaclip_hf"),
        ("text_encoder", "evaclip_hf"),
        ("qformer", "blip2_qff"),
        ("reranker", "bge_reranker"),
        ("generator", "llama3"),
        ("judge", "bem"),
    )
}


@pytest.fixture
def doctor(tmp_path, capsys):
    """`doctor(world_dir, *overrides, experiment=...)` -> (exit status, rows by (area, item), printed text)."""

    def _doctor(world_dir, *overrides, experiment="demo/evaluate", json_out=True):
        capsys.readouterr()
        argv = [
            "doctor",
            *(["--json"] if json_out else []),
            f"experiment={experiment}",
            f"paths.world_dir={world_dir}",
            f"paths.cache_dir={tmp_path / 'cache'}",
            f"paths.checkpoints_root={tmp_path / 'runs'}",
            *overrides,
        ]
        status = main(argv)
        out = capsys.readouterr().out
        if not json_out:
            return status, {}, out
        report = json.loads(out)
        assert report["ok"] == (status == 0)
        return status, {(c["area"], c["item"]): c for c in report["checks"]}, out

    return _doctor


def failed(rows: dict) -> dict:
    return {key: row["detail"] for key, row in rows.items() if row["status"] == "fail"}


@pytest.fixture
def world_copy(world, tmp_path) -> Path:
    """A copy of the session world that a test may break."""
    out = tmp_path / "world"
    shutil.copytree(world["dir"], out, symlinks=True)
    return out


@pytest.mark.slow
def test_the_e_vqa_release_layout_passes(world, doctor):
    status, rows, _ = doctor(world["dir"])
    assert status == 0, failed(rows)
    assert not failed(rows)
    test_rows = json.loads(Path(world["dir"], "world.json").read_text())["counts"]["questions:evqa/test.csv"]
    questions = rows[("questions", "test")]
    assert questions["status"] == "ok" and f"{test_rows:,} questions read" in questions["detail"]
    assert "2_hop" in questions["detail"]  # evaluation reads the 2_hop rows too
    sources = {item for area, item in rows if area == "images"}
    assert sources == {"test inaturalist", "test landmarks"}
    assert rows[("kb", "store")]["status"] == "ok"
    assert {item for area, item in rows if area == "kb images"} >= {
        "main images",
        "wiki_image_url_part_1_processed.csv",
    }
    assert rows[("index", "image_to_image")]["status"] == "todo"  # not built yet: a later command writes it
    assert rows[("models", "components.generator")]["status"] == "ok"
    assert any(area == "disk" for area, _ in rows)


@pytest.mark.slow
def test_the_infoseek_release_layout_passes(world, doctor, tmp_path):
    experiment = tmp_path / "infoseek.yaml"
    experiment.write_text(
        yaml.safe_dump(
            {
                "presets": ["cpu", "infoseek_data"],
                "task": "evaluate",
                "data": {"root": str(Path(world["dir"]) / "infoseek"), "images": {"max_missing_fraction": 0.34}},
                "components": TINY,
                "retrieval": {"mode": "image_to_image"},
                "eval": {"judge": "em_only"},
                "logger": {"wandb": {"enabled": False}},
            }
        ),
        encoding="utf-8",
    )
    status, rows, _ = doctor(world["dir"], experiment=str(experiment))
    assert status == 0, failed(rows)
    assert rows[("images", "test infoseek")]["status"] in ("ok", "warn")
    assert "Numerical" in rows[("questions", "test")]["detail"] or "String" in rows[("questions", "test")]["detail"]


@pytest.mark.slow
def test_the_table_is_one_line_per_check_and_says_nothing_is_blocking(world, doctor):
    status, _, out = doctor(world["dir"], json_out=False)
    assert status == 0
    lines = out.strip().splitlines()
    assert lines[0].split()[:4] == ["status", "area", "item", "detail"]
    assert lines[-1].startswith("doctor: nothing blocking")
    assert not any(line.startswith("FAIL") for line in lines)


@pytest.mark.slow
def test_a_kb_image_root_one_folder_off_fails_naming_the_folder(world, doctor):
    status, rows, _ = doctor(world["dir"], "data.images.kb_image_root=wiki_image/full")
    assert status == 1
    csv_rows = {item: d for (area, item), d in failed(rows).items() if area == "kb images" and item.endswith(".csv")}
    assert csv_rows, failed(rows)
    detail = next(iter(csv_rows.values()))
    assert "wiki_image/full/full/wiki_image_split" in detail  # the first missing path tried
    assert f"exists under {Path(world['dir']) / 'evqa' / 'wiki_image'}" in detail  # and where it is


@pytest.mark.slow
def test_a_query_image_root_one_folder_off_fails(world, doctor):
    status, rows, _ = doctor(world["dir"], "data.images.landmarks_root=images")
    assert status == 1
    assert rows[("images", "test landmarks")]["status"] == "fail"
    assert "missing" in rows[("images", "test landmarks")]["detail"]


@pytest.mark.slow
def test_a_malformed_two_hop_row_fails_with_its_file_and_line(world_copy, doctor):
    import csv

    path = world_copy / "evqa" / "test.csv"
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    fields = list(rows[0])
    line = next(i for i, row in enumerate(rows) if row["question_type"] == "2_hop")
    rows[line]["wikipedia_url"] = rows[line]["wikipedia_url"].split("|")[0]  # one URL for two hops
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
    status, checks, _ = doctor(world_copy)
    assert status == 1
    detail = failed(checks)[("questions", "test")]
    assert str(path) in detail and "wikipedia_url" in detail and "2_hop" in detail


@pytest.mark.slow
def test_a_missing_id2name_map_fails(world_copy, doctor):
    (world_copy / "evqa" / "images" / "inaturalist" / "val_id2name.json").unlink()
    status, rows, _ = doctor(world_copy)
    assert status == 1
    bad = failed(rows)
    assert "val_id2name.json: not found" in bad[("paths", "data.images.inaturalist_id2name_extra[0]")]
    assert "id2name map not found" in bad[("images", "test inaturalist")]


@pytest.mark.slow
def test_a_missing_model_directory_fails_with_the_download_command(world, doctor, tmp_path):
    status, rows, _ = doctor(
        world["dir"],
        "preset=local_weights",
        f"paths.weights_dir={tmp_path / 'weights'}",
        "components.reranker.tiny=false",
        "components.reranker.pretrained=BAAI/bge-reranker-v2-m3",
    )
    assert status == 1
    detail = failed(rows)[("models", "components.reranker")]
    assert f"no directory at {tmp_path / 'weights' / 'BAAI' / 'bge-reranker-v2-m3'}" in detail
    assert (
        f"huggingface-cli download BAAI/bge-reranker-v2-m3 --include '*.json' '*.safetensors' sentencepiece.bpe.model "
        f"--local-dir {tmp_path / 'weights'}/BAAI/bge-reranker-v2-m3"
    ) in detail  # the command that fills it
    other = rows[("models", "components.generator")]
    assert other["status"] == "ok"  # a tiny component is not redirected


def _build_index(world_dir: Path, tmp_path: Path) -> Path:
    """`qkvqa embed` and `qkvqa index build` of the demo experiment (tiny encoders) into tmp_path/index."""
    from qkvqa.run.rundir import clear_run_env

    common = [
        "experiment=demo/evaluate",
        f"paths.world_dir={world_dir}",
        f"paths.cache_dir={tmp_path / 'cache'}",
        f"paths.checkpoints_root={tmp_path / 'runs'}",
        f"retrieval.index_dir={tmp_path / 'index'}",
    ]
    for command in (["embed"], ["index", "build"]):
        clear_run_env()
        assert main([*command, *common]) == 0, command
    clear_run_env()
    return tmp_path / "index"


@pytest.mark.slow
def test_an_index_of_other_settings_and_a_corrupt_index_fail(world_copy, doctor, tmp_path):
    index = _build_index(world_copy, tmp_path)
    status, rows, _ = doctor(world_copy, f"retrieval.index_dir={index}")
    assert status == 0, failed(rows)
    assert rows[("index", "image_to_image")]["status"] == "ok"
    status, rows, _ = doctor(world_copy, f"retrieval.index_dir={index}", "retrieval.index_factory=HNSW32")
    assert status == 1
    assert "index factory" in failed(rows)[("index", "image_to_image")]
    index_file = index / "index.faiss"
    data = bytearray(index_file.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte, same size
    index_file.write_bytes(bytes(data))
    status, rows, _ = doctor(world_copy, f"retrieval.index_dir={index}")
    assert status == 1
    assert "index.faiss" in failed(rows)[("index", "image_to_image")]


@pytest.mark.slow
def test_load_builds_every_model_of_the_run(world, doctor):
    import io
    from contextlib import redirect_stdout

    out = io.StringIO()
    with redirect_stdout(out):
        status = main(["doctor", "--json", "--load", "experiment=demo/evaluate", f"paths.world_dir={world['dir']}"])
    report = json.loads(out.getvalue())
    loads = {c["item"]: c for c in report["checks"] if c["item"].startswith("load ")}
    assert status == 0, [c for c in report["checks"] if c["status"] == "fail"]
    assert set(loads) == {"load image_encoder", "load qformer", "load reranker", "load generator"}
    assert all(c["status"] == "ok" for c in loads.values())
    assert "one image embedded" in loads["load image_encoder"]["detail"]
    # EVA-CLIP's model-card example: a diagram against its three captions (a real model must pick "a diagram")
    assert "a drawn diagram against 'a diagram'" in loads["load image_encoder"]["detail"]
    assert "'a dog'" in loads["load image_encoder"]["detail"] and "'a cat'" in loads["load image_encoder"]["detail"]
    assert "model card pairs scored" in loads["load reranker"]["detail"]
