"""`qkvqa train` / `qkvqa rerank` on the synthetic world: run record, checkpoints, the exported QFF, exact resume, drops."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from qkvqa.cli.main import main
from qkvqa.config.load import compose
from qkvqa.data.benchmark import build_benchmark
from qkvqa.data.kb import KBStore
from qkvqa.qff.builder import build_qff_component
from qkvqa.qff.rerank import QFFReranker, load_qff_component
from qkvqa.retrieval.results import read_results
from qkvqa.run.rundir import clear_run_env
from tests.helpers.qff_study import mine_world

pytestmark = pytest.mark.slow

QUIET = ["trainer.enable_progress_bar=false", "trainer.log_every_n_steps=1", "trainer.num_sanity_val_steps=0"]


@pytest.fixture(scope="module")
def mined(world, tmp_path_factory) -> dict:
    """Overrides of demo/qff_per_layer with pools mined from stage-1 stand-in results, and the work directory."""
    work = tmp_path_factory.mktemp("qff_train")
    return {"overrides": mine_world(world, work), "work": work}


def train(mined: dict, run_id: str, *overrides: str) -> Path:
    clear_run_env()
    assert (
        main(["train", "experiment=demo/qff_per_layer", f"run_id={run_id}", *mined["overrides"], *QUIET, *overrides])
        == 0
    )
    return mined["work"] / "runs" / run_id


@pytest.fixture(scope="module")
def trained(mined) -> Path:
    """A short training run: 6 steps, validation on 8 val questions every 3 steps, under umask 0o022."""
    old = os.umask(0o022)
    try:
        return train(mined, "qff-cli", "trainer.max_steps=6", "trainer.val_check_interval=3", "qff.max_val_samples=8")
    finally:
        os.umask(old)


def test_train_writes_the_run_record_checkpoints_and_the_trained_qff(trained, mined):
    status = json.loads((trained / "status.json").read_text())
    assert status["state"] == "finished" and status["command"] == "train"
    summary = json.loads((trained / "summary.json").read_text())
    assert summary["global_step"] == 6 and 0 <= summary["val/article_r1"] <= 100
    assert {
        "val/section_r1",
        "val/stage1_article_r1",
        "val/loss",
        "train/loss",
        "train/epoch_loss",
        "train/gate",
    } <= set(summary)
    assert Path(summary["best_model_path"]).is_file() and summary["best_model_path"] != str(trained / "last.ckpt")
    ckpt = torch.load(trained / "last.ckpt", weights_only=True)
    assert ckpt["qkvqa"]["config"]["qff"]["focus"] == "per_layer" and ckpt["qkvqa"]["world_size"] == 1
    assert ckpt["qkvqa"]["global_batch_size"] == 4
    assert not any(k.startswith("model.base.vision_model.") for k in ckpt["state_dict"])
    assert any(k.startswith("model.q_xattn.") for k in ckpt["state_dict"]) and "qff_frozen_vit" in ckpt
    names = {row.split(",")[2] for row in (trained / "metrics.csv").read_text().splitlines()[1:]}
    assert {
        "train/loss",
        "train/acc1",
        "train/pos_sim",
        "train/temperature",
        "train/samples_per_s",
        "train/gate",
        "train/gate_layer0",
        "train/focus_grad_norm",
        "train/grad_norm",
        "train/lr/qformer",
        "train/lr/focus_blocks",
        "val/article_r1",
    } <= names
    assert not {"train/loss_step", "train/loss_epoch"} & names
    assert 0 <= summary["train/acc1"] <= 100 and summary["train/grad_norm"] > 0  # rates in percent
    samples = json.loads((trained / "qff_samples.json").read_text())
    assert samples["samples"]["train"]["kept"] > 0 and samples["empty_batches"] == 0


def test_every_file_of_the_run_is_shareable_under_umask_022(trained):
    """config.yaml, status.json, checkpoints and their sidecars, the exported safetensors: 0644, directories 0755."""
    paths = [trained, *trained.rglob("*")]
    assert {"config.yaml", "status.json", "last.ckpt", "last.ckpt.sha256", "model.safetensors"} <= {
        p.name for p in paths
    }
    wrong = {
        str(p.relative_to(trained)): oct(p.stat().st_mode & 0o777)
        for p in paths
        if not p.is_symlink() and p.stat().st_mode & 0o777 != (0o755 if p.is_dir() else 0o644)
    }
    assert wrong == {}


def test_rerank_writes_omgm_step_2b_results_with_section_scores_and_recall(trained, mined):
    clear_run_env()
    stage1 = mined["work"] / "stage1_val.json"
    assert (
        main(
            [
                "rerank",
                "experiment=demo/qff_per_layer",
                "run_id=rerank-val",
                "split=val",
                f"qff.checkpoint={trained / 'qff'}",
                f"retrieval.results={stage1}",
                "data.max_questions=6",
                *mined["overrides"],
            ]
        )
        == 0
    )
    run_dir = mined["work"] / "runs" / "rerank-val"
    reranked = json.loads((run_dir / "reranked_val.json").read_text())
    before = read_results(stage1)
    cfg = compose("demo/qff_per_layer", [], mined["overrides"])
    store = KBStore.open(Path(cfg.data.root) / cfg.data.kb_store)
    assert len(reranked) == 6
    for qid, value in reranked.items():
        urls = [e["url"] for e in value["retrieved_entities"]]
        assert sorted(urls) == sorted(before[qid].urls[:20])
        fused = value["retrieval_similarities"]
        assert fused == sorted(fused, reverse=True)
        for url, score, stage, qff, sec_sim, sec_idx in zip(
            urls, fused, value["stage1_similarities"], value["qff_scores"], value["sec_sim"], value["sec_idx"]
        ):
            assert stage == before[qid].similarities[before[qid].urls.index(url)]
            assert score == pytest.approx(0.9 * stage + 0.1 * qff)
            assert len(sec_sim) == len(sec_idx) and qff == (max(sec_sim) if sec_sim else 0.0)
            titles = store.get_by_url(url).section_titles
            assert all(titles[i] not in ("References", "External links") for i in sec_idx)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {
        "rerank/val/recall@1",
        "rerank/val/recall@20",
        "rerank/val/stage1/recall@1",
        "rerank/val/evidence_section_recall@1",
    } <= set(summary)
    assert summary["rerank/val/recall@20"] == summary["rerank/val/stage1/recall@20"]


def table5_focus_and_alpha(run_dir: Path) -> list[str]:
    """The QFF focus and alpha cells of report.md's Table 5 row."""
    section = (run_dir / "report.md").read_text().split("## Table 5")[1].split("\n## ")[0]
    header, row = [line for line in section.splitlines() if line.startswith("| ")]
    cells = dict(zip([c.strip() for c in header.split("|")], [c.strip() for c in row.split("|")]))
    return [cells["QFF focus"], cells["alpha"]]


def test_an_evaluation_of_reranked_results_reports_the_alpha_that_produced_them(trained, mined, capsys):
    clear_run_env()
    stage1 = mined["work"] / "stage1_val.json"
    common = [
        "experiment=demo/qff_per_layer",
        "split=val",
        f"retrieval.results={stage1}",
        "data.max_questions=6",
        "data.include_two_hop=true",
        *mined["overrides"],
    ]  # rerank and evaluate read the same rows
    assert main(["rerank", "run_id=rerank-a05", f"qff.checkpoint={trained / 'qff'}", "qff.alpha=0.5", *common]) == 0
    reranked = mined["work"] / "runs" / "rerank-a05" / "reranked_val.json"
    made = json.loads(reranked.with_name("reranked_val.meta.json").read_text())["produced_by"]
    assert (
        made["qff.alpha"] == 0.5
        and made["run_id"] == "rerank-a05"
        and made["qformer"]["weights"] == str(trained / "qff")
    )
    precomputed = ["eval.filter=precomputed", f"eval.reranked_results={reranked}", "eval.stop_after=filter", *common]

    def evaluate(run_id, *extra):
        clear_run_env()
        capsys.readouterr()
        code = main(["evaluate", f"run_id={run_id}", *precomputed, *extra])
        return code, capsys.readouterr().err

    code, err = evaluate("pre-a09")  # the config's alpha (0.9) did not make the file
    assert code == 2 and "was reranked with qff.alpha=0.5" in err and "set qff.alpha=0.5" in err
    assert not (mined["work"] / "runs" / "pre-a09").exists()  # refused before the run started
    code, err = evaluate("pre-a05", "qff.alpha=0.5")
    assert code == 0, err
    run_dir = mined["work"] / "runs" / "pre-a05"
    card = json.loads((run_dir / "scores.json").read_text())["protocol"]["filter"]
    assert (
        card["alpha"] == 0.5 and card["focus"] == "per_layer" and card["produced_by"] == "qkvqa rerank run rerank-a05"
    )
    assert table5_focus_and_alpha(run_dir) == ["per_layer", "0.50"]
    # the val file's ranking for the test questions: E-VQA ids repeat per file, so coverage alone passed it
    code, err = evaluate("pre-test", "qff.alpha=0.5", "split=test")
    assert code == 2 and "was reranked for the val questions" in err and "rerank with split=test" in err, err
    assert not (mined["work"] / "runs" / "pre-test").exists()
    # a file of unknown origin (OMGM's): the report says so instead of printing the config's alpha
    reranked.with_name("reranked_val.meta.json").rename(reranked.with_name("kept.meta.json"))
    assert evaluate("pre-unknown")[0] == 0
    assert table5_focus_and_alpha(mined["work"] / "runs" / "pre-unknown") == ["unknown", "unknown"]  # not 0.90
    # a sidecar of another version of the file is refused
    reranked.with_name("kept.meta.json").rename(reranked.with_name("reranked_val.meta.json"))
    reranked.write_text(reranked.read_text().replace("]", " ]", 1))
    code, err = evaluate("pre-stale", "qff.alpha=0.5")
    assert code == 2 and "does not describe" in err


@pytest.fixture(scope="module")
def straight(mined) -> Path:
    """4 steps without validation or monitor, so last.ckpt holds the final weights."""
    return train(
        mined,
        "resume-a",
        "trainer.max_steps=4",
        "trainer.limit_val_batches=0",
        "checkpoint.monitor=null",
        "trainer.deterministic=true",
    )


def test_a_lightning_checkpoint_reranks_like_the_exported_qff(straight, mined, world):
    from PIL import Image

    base = [*mined["overrides"], "retrieval.top_k=5"]
    exported_cfg = compose("demo/qff_per_layer", [], [*base, f"qff.checkpoint={straight / 'qff'}"])
    exported = QFFReranker.from_config(exported_cfg, build_benchmark(exported_cfg.data))
    ckpt_cfg = compose("demo/qff_per_layer", [], [*base, f"qff.checkpoint={straight / 'last.ckpt'}"])
    from_ckpt = QFFReranker.from_config(
        ckpt_cfg, build_benchmark(ckpt_cfg.data), component=load_qff_component(ckpt_cfg)
    )
    stage1 = read_results(mined["work"] / "stage1_val.json")
    record = next(q for q in world["questions"]["evqa/val.csv"] if q["question_type"] != "2_hop")
    image = Image.open(Path(world["dir"]) / world["images"][f"{record['dataset_name']}/{record['image_id']}"]["path"])
    question = "which conservation status does this animal have?"
    a = exported.rerank(question, image.convert("RGB"), stage1[record["data_id"]])
    b = from_ckpt.rerank(question, image.convert("RGB"), stage1[record["data_id"]])
    assert a.urls == b.urls and a.section_indices == b.section_indices
    flat = [x for scores in a.section_scores for x in scores]
    assert flat == pytest.approx([x for scores in b.section_scores for x in scores], abs=1e-6)
    assert len(a.urls) == 5 and a.best_section() is not None


def test_qff_trainer_load_from_checkpoint_rebuilds_the_trained_model(straight):
    from qkvqa.models.qff_module import QFFTrainer
    from qkvqa.qff.model import QFFModel

    module = QFFTrainer.load_from_checkpoint(straight / "last.ckpt", map_location="cpu")
    exported = QFFModel.from_checkpoint(straight / "qff")  # the weights `qkvqa train` exported at the end
    state = module.model.state_dict()
    assert state.keys() == exported.state_dict().keys()
    for key, value in exported.state_dict().items():
        assert torch.equal(state[key], value), key
    assert (
        module.vision_fingerprint
        == torch.load(straight / "last.ckpt", weights_only=True)["qff_frozen_vit"]["fingerprint"]
    )


def test_an_interrupted_run_resumes_mid_epoch_to_the_same_weights(straight, mined):
    common = [
        "trainer.limit_val_batches=0",
        "checkpoint.monitor=null",
        "trainer.deterministic=true",
        "qff.schedule_steps=4",
    ]  # the schedule of the uninterrupted run
    train(mined, "resume-b", "trainer.max_steps=2", *common)
    resumed = train(mined, "resume-b", "trainer.max_steps=4", *common, "resume=auto")
    a = torch.load(straight / "last.ckpt", weights_only=True)
    b = torch.load(resumed / "last.ckpt", weights_only=True)
    cfg = compose("demo/qff_per_layer", [], [*mined["overrides"], f"qff.checkpoint={straight / 'qff'}"])
    exported = build_qff_component(cfg.components.qformer, cfg.qff).model.state_dict()
    for key, value in exported.items():  # the exported QFF is the final weights (the ViT is not in ckpts)
        reference = a["state_dict"].get("model." + key)
        assert (reference is None) == key.startswith("base.vision_model.")
        if reference is not None:
            torch.testing.assert_close(value, reference, rtol=0, atol=0)
    assert exported["q_gate"].abs().sum() > 0, "training moves the zero-initialised gates"
    assert (
        a["global_step"] == b["global_step"] == 4
        and b["loops"]["fit_loop"]["epoch_progress"]["current"]["completed"] == 0
    ), "4 of the epoch's batches: the resume happened mid-epoch"
    for key in a["state_dict"]:
        torch.testing.assert_close(b["state_dict"][key], a["state_dict"][key], rtol=0, atol=0)
    opt_a, opt_b = a["optimizer_states"][0]["state"], b["optimizer_states"][0]["state"]
    for pid in opt_a:
        torch.testing.assert_close(opt_b[pid]["exp_avg"], opt_a[pid]["exp_avg"], rtol=0, atol=0)
    assert a["lr_schedulers"][0]["_last_lr"] == b["lr_schedulers"][0]["_last_lr"]


def test_a_batch_whose_samples_were_all_dropped_is_skipped_and_counted(world, mined, tmp_path):
    copy = tmp_path / "world"
    shutil.copytree(world["dir"], copy, symlinks=True)
    records = {q["data_id"]: q for q in world["questions"]["evqa/train.csv"]}
    lost = next(q for q in records.values() if q["question_type"] != "2_hop" and q["dataset_name"] == "landmarks")
    (copy / world["images"][f"landmarks/{lost['image_id']}"]["path"]).unlink()
    overrides = [o for o in mined["overrides"] if not o.startswith("paths.world_dir=")]
    run = train(
        {**mined, "overrides": [f"paths.world_dir={copy}", *overrides]},
        "drops",
        "data.batch_size=1",
        "trainer.max_epochs=1",
        "trainer.limit_val_batches=0",
        "checkpoint.monitor=null",
    )
    report = json.loads((run / "qff_samples.json").read_text())
    users = sum(
        1
        for q in records.values()
        if q["image_id"] == lost["image_id"]
        and q["question_type"] != "2_hop"
        and q["gold_urls"][0] not in {e["url"] for e in world["entities"] if e["image_mode"] == "none"}
    )
    assert report["empty_batches"] == report["dropped_in_batches"] == users >= 1
    assert json.loads((run / "status.json").read_text())["state"] == "finished"


def test_a_run_past_an_explicit_schedule_is_refused_up_front(mined, capsys):
    """Issue 15 item 9: a resume past qff.schedule_steps trained, then crashed in OneCycleLR over last.ckpt."""
    clear_run_env()
    capsys.readouterr()
    assert (
        main(
            [
                "train",
                "experiment=demo/qff_per_layer",
                "run_id=past-schedule",
                *mined["overrides"],
                *QUIET,
                "qff.schedule_steps=4",
                "trainer.max_steps=6",
                "resume=auto",
            ]
        )
        == 2
    )
    assert "runs past the OneCycle schedule of qff.schedule_steps=4" in capsys.readouterr().err
    assert not (mined["work"] / "runs" / "past-schedule").exists()
