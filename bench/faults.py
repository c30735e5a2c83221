"""Fault injection: each fault is applied to a fresh copy of a small world, one qkvqa command runs, and the outcome is classed.

Run: `.venv/bin/python bench/faults.py [--only NAME ...] [--keep DIR]` (about 10 minutes on 2 cores).

The world is `qkvqa synth` with tiny components, its stage-1 index built once (`embed`, `index
build`), and a trained-for-two-steps QFF (`train`). For every fault the world, its caches and runs
are copied, the fault is applied, and one command runs in a subprocess. Outcomes:

- `refused`: a non-zero exit whose last stderr line is qkvqa's one-line error (`qkvqa CMD: error: ...`);
- `same`: exit 0 and the same figures as the pristine world (a harmless change, e.g. a touched file);
- `counted`: exit 0, other figures, and the run counts the fault (skipped images);
- `traceback`: a raw Python traceback;
- `silently wrong`: exit 0 with other figures and nothing counted.

Each fault states the outcome it must have; the table (bench/out/faults.md and .json) shows both,
and the closing notes of issues "No silently wrong number" and "Training never loses work" cite it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import yaml

REPO = Path(__file__).resolve().parents[1]
OUT = Path(__file__).resolve().parent / "out"
QKVQA = [sys.executable, "-m", "qkvqa.cli"]
TINY = {
    "image_encoder": "evaclip_hf",
    "text_encoder": "evaclip_hf",
    "qformer": "blip2_qff",
    "reranker": "bge_reranker",
    "generator": "llama3",
    "judge": "bem",
}


@dataclass
class Fault:
    """One injected fault: what it does to the copy, the command, and the outcome it must have."""

    name: str
    what: str
    apply: Callable[[Path], None]  # gets the copy's root (world/, cache/, runs/, experiments/)
    command: list[str]
    expect: str  # refused | same | counted
    in_place: bool = False  # applied to the pristine world itself (a resume must see its own paths)


def _flip(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0x5A
    path.write_bytes(bytes(data))


def _truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _only(root: Path, pattern: str) -> Path:
    found = sorted(root.glob(pattern))
    assert found, f"nothing matches {pattern} under {root}"
    return found[0]


def _edit_same_size(path: Path) -> None:
    text = path.read_bytes()
    at = text.index(b"section_texts") + 40
    path.write_bytes(text[:at] + bytes(reversed(text[at : at + 12])) + text[at + 12 :])


def _latin1_csv(path: Path) -> None:
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    lines[2] = lines[2].replace("?", " é?", 1)
    path.write_bytes("".join(lines).encode("latin-1"))


def _extra_field(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[3] = lines[3].rstrip("\n") + ",surplus\n"
    path.write_text("".join(lines), encoding="utf-8")


def _drop_images(root: Path, share: float) -> None:
    images = sorted((root / "world/evqa/images/inaturalist").rglob("*.jpg"))
    for image in images[: int(len(images) * share)]:
        image.unlink()


def _replace_one_image(root: Path, data: Optional[bytes], size: Optional[tuple] = None) -> None:
    import csv

    from PIL import Image

    def landmark(row):
        image_id = row["dataset_image_ids"].split("|")[0]
        return root / "world/evqa/images/landmarks" / image_id[0] / image_id[1] / image_id[2] / f"{image_id}.jpg"

    def readable(path):
        try:
            with Image.open(path) as image:
                image.load()
            return True
        except OSError:
            return False

    with open(root / "world/evqa/test.csv", newline="", encoding="utf-8") as f:
        path = next(
            landmark(r) for r in csv.DictReader(f) if r["dataset_name"] == "landmarks" and readable(landmark(r))
        )
    if size is not None:
        Image.new("RGB", size, (10, 200, 30)).save(path)
    elif data is None:
        path.unlink()
    else:
        path.write_bytes(data)


def _conflicting_reference(root: Path) -> None:
    path = root / "world/infoseek/infoseek_val.jsonl"
    lines = path.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    first["answer_eval"] = (
        ["something else"] if isinstance(first["answer_eval"][0], str) else [{"wikidata": 1.0, "range": [0, 2]}]
    )
    path.write_text("\n".join(lines + [json.dumps(first)]) + "\n", encoding="utf-8")


def _drop_qtype(root: Path) -> None:
    path = root / "world/infoseek/infoseek_val_qtype.jsonl"
    path.write_text("\n".join(path.read_text(encoding="utf-8").splitlines()[1:]) + "\n", encoding="utf-8")


def _results_of_nothing(root: Path) -> None:
    (root / "foreign_results.json").write_text(json.dumps({"not-a-question": {"retrieved_entities": []}}))


def _qff_config(root: Path, change: Callable[[dict], None]) -> None:
    path = root / "runs/trained/qff/qff_config.json"
    meta = json.loads(path.read_text())
    change(meta)
    path.write_text(json.dumps(meta))


def faults() -> list[Fault]:
    retrieve = ["retrieve", "experiment=w"]
    qff = [
        "evaluate",
        "experiment=w",
        "eval.stop_after=filter",
        "run_id=f",
        "qff.checkpoint={root}/runs/trained/qff",
        "qff.image_transform=squash",
        "qff.blip_text_preprocess=false",
    ]  # what demo_world trained it with
    evaluate_filter = ["evaluate", "experiment=w", "eval.stop_after=filter", "run_id=f", "qff.allow_untrained=true"]
    score_strict = [
        "score",
        "infoseek",
        "--predictions",
        "{root}/infoseek_predictions.jsonl",
        "--references",
        "{root}/world/infoseek/infoseek_val.jsonl",
        "--qtypes",
        "{root}/world/infoseek/infoseek_val_qtype.jsonl",
        "--strict",
    ]
    return [
        Fault(
            "kb_touched",
            "the KB JSON touched (rsync without -t)",
            lambda r: os.utime(r / "world/kb/encyclopedic_kb_wiki.json", (1, 1)),
            retrieve,
            "same",
        ),
        Fault(
            "kb_copied",
            "the KB JSON copied without -p and data.kb_source pointed at the copy",
            lambda r: shutil.copy(r / "world/kb/encyclopedic_kb_wiki.json", r / "kb_copy.json"),
            retrieve + ["data.kb_source={root}/kb_copy.json"],
            "same",
        ),
        Fault(
            "kb_same_size_edit",
            "the KB JSON edited in place, same size",
            lambda r: _edit_same_size(r / "world/kb/encyclopedic_kb_wiki.json"),
            retrieve,
            "refused",
        ),
        Fault(
            "kb_store_flipped",
            "one byte of kb.sqlite flipped",
            lambda r: _flip(r / "world/kb/store/kb.sqlite", 0.6),
            retrieve,
            "refused",
        ),
        Fault(
            "kb_store_truncated",
            "kb.sqlite truncated",
            lambda r: _truncate(r / "world/kb/store/kb.sqlite"),
            retrieve,
            "refused",
        ),
        Fault(
            "kb_manifest_garbage",
            "the KB store's manifest.json overwritten with garbage",
            lambda r: (r / "world/kb/store/manifest.json").write_text("{oops"),
            retrieve,
            "refused",
        ),
        Fault(
            "index_flipped",
            "one byte inside index.faiss flipped",
            lambda r: _flip(_only(r / "cache/indexes", "kb_text*/**/index.faiss"), 0.7),
            retrieve,
            "refused",
        ),
        Fault(
            "index_rows_swapped",
            "vector_rows.npy rewritten with a shuffled mapping",
            lambda r: _shuffle_rows(_only(r / "cache/indexes", "kb_text*/**/vector_rows.npy")),
            retrieve,
            "refused",
        ),
        Fault(
            "index_manifest_gone",
            "the index manifest deleted (an interrupted build)",
            lambda r: _only(r / "cache/indexes", "kb_text*/**/manifest.json").unlink(),
            retrieve,
            "refused",
        ),
        Fault(
            "embedding_shard_flipped",
            "one byte of an embedding shard flipped, then `index build`",
            lambda r: _flip(_only(r / "cache/embeddings", "kb_text*/shard-*.npy"), 0.8),
            ["index", "build", "experiment=w", "run_id=ib"],
            "refused",
        ),
        Fault(
            "questions_latin1",
            "the E-VQA test CSV saved as Latin-1",
            lambda r: _latin1_csv(r / "world/evqa/test.csv"),
            retrieve,
            "refused",
        ),
        Fault(
            "questions_extra_field",
            "a test CSV row with one field too many",
            lambda r: _extra_field(r / "world/evqa/test.csv"),
            retrieve,
            "refused",
        ),
        Fault(
            "id2name_truncated",
            "the iNaturalist id2name JSON truncated",
            lambda r: _truncate(r / "world/evqa/val_id2name.json"),
            retrieve,
            "refused",
        ),
        Fault(
            "image_root_renamed",
            "the landmarks image folder renamed",
            lambda r: (r / "world/evqa/images/landmarks").rename(r / "world/evqa/images/landmarks_old"),
            retrieve,
            "refused",
        ),
        Fault(
            "image_missing",
            "one query image deleted (under the bound)",
            lambda r: _replace_one_image(r, None),
            retrieve,
            "counted",
        ),
        Fault(
            "images_mostly_missing",
            "every iNaturalist image deleted (a half-copied folder)",
            lambda r: _drop_images(r, 1.0),
            retrieve,
            "refused",
        ),
        Fault(
            "image_not_an_image",
            "one query image replaced by text bytes",
            lambda r: _replace_one_image(r, b"this is not a jpeg"),
            retrieve,
            "counted",
        ),
        Fault(
            "image_2px",
            "one query image 2x2 pixels",
            lambda r: _replace_one_image(r, None, (2, 2)),
            retrieve,
            "counted",
        ),
        Fault(
            "reference_conflict",
            "an InfoSeek reference id repeated with another answer, scored --strict",
            _conflicting_reference,
            score_strict,
            "refused",
        ),
        Fault("qtype_missing", "an InfoSeek reference without a question type", _drop_qtype, score_strict, "refused"),
        Fault(
            "results_of_nothing",
            "retrieval.results that cover none of the split's questions",
            _results_of_nothing,
            retrieve + ["retrieval.results={root}/foreign_results.json"],
            "refused",
        ),
        Fault(
            "qff_weights_flipped",
            "one byte of the trained QFF's model.safetensors flipped",
            lambda r: _flip(r / "runs/trained/qff/model.safetensors", 0.9),
            qff,
            "refused",
        ),
        Fault(
            "qff_preprocessing_changed",
            "a trained QFF used with another image transform than it was trained with",
            lambda r: None,
            qff + ["qff.image_transform=targetpad"],
            "refused",
        ),
        Fault(
            "qff_config_garbage",
            "the trained QFF's qff_config.json truncated",
            lambda r: _truncate(r / "runs/trained/qff/qff_config.json"),
            qff,
            "refused",
        ),
        Fault(
            "last_ckpt_flipped",
            "one byte of a training run's last.ckpt flipped, then resume",
            lambda r: _flip(r / "runs/trained/last.ckpt", 0.5),
            ["train", "experiment=wt", "run_id=trained", "resume=auto", "trainer.max_steps=4"],
            "refused",
            True,
        ),
        Fault(
            "last_ckpt_truncated",
            "a training run's last.ckpt truncated (disk full while saving), then resume",
            lambda r: (_truncate(r / "runs/trained/last.ckpt", 0.3), (r / "runs/trained/last.ckpt.sha256").unlink()),
            ["train", "experiment=wt", "run_id=trained", "resume=auto", "trainer.max_steps=4"],
            "refused",
            True,
        ),
        Fault("config_k1_zero", "cda.K1=0", lambda r: None, evaluate_filter + ["cda.K1=0"], "refused"),
        Fault("config_alpha", "qff.alpha=1.5", lambda r: None, evaluate_filter + ["qff.alpha=1.5"], "refused"),
        Fault(
            "config_gpu",
            "trainer.accelerator=gpu on a machine without one",
            lambda r: None,
            ["train", "experiment=wt", "run_id=gpu", "trainer.accelerator=gpu"],
            "refused",
        ),
        Fault(
            "config_protocol_typo",
            "data.protocol=echosight_100K (a typo)",
            lambda r: None,
            retrieve + ["data.protocol=echosight_100K"],
            "refused",
        ),
        Fault(
            "kb_store_is_an_index",
            "data.kb_store pointed at an index directory",
            lambda r: None,
            retrieve + ["data.kb_store={index_dir}"],
            "refused",
        ),
        # issue 44 (the fourth round): keys on content, shared roots, one line before the expensive work
        Fault(
            "kb_text_edited_same_urls",
            "the KB's lead sections edited under the same URLs and its store rebuilt (stale vectors reused before)",
            _edit_kb_text_and_rebuild,
            retrieve,
            "refused",
        ),
        Fault(
            "index_manifest_symlink",
            "the cached index's manifest.json replaced by a symlink to a copy (a shared cache)",
            _symlink_index_manifest,
            retrieve,
            "refused",
        ),
        Fault(
            "encoder_option_typo",
            "components.image_encoder.options.preproces=targetpad (a typo, ignored before)",
            lambda r: None,
            retrieve + ["components.image_encoder.options.preproces=targetpad"],
            "refused",
        ),
        Fault(
            "reranker_slot_holds_bem",
            "components.reranker.kind=bem (a judge in the reranker's slot)",
            lambda r: None,
            evaluate_filter + ["components.reranker.kind=bem"],
            "refused",
        ),
        Fault(
            "qff_without_safetensors",
            "the trained QFF folder copied without model.safetensors",
            lambda r: (r / "runs/trained/qff/model.safetensors").unlink(),
            qff,
            "refused",
        ),
        Fault(
            "run_dir_planted_by_another_user",
            "ROOT/RUN_ID pre-created by another user with .lock and metrics.csv linked to the victim's file",
            _planted_run_dir,
            evaluate_filter + ["run_id=victim"],
            "refused",
        ),
        Fault(
            "compare_malformed_config",
            "one run directory of the runs root holds a malformed config.yaml",
            lambda r: ((r / "runs/broken").mkdir(), (r / "runs/broken/config.yaml").write_text("a: [unclosed\n")),
            ["compare", "{root}/runs"],
            "same",
        ),
    ]


def _edit_kb_text_and_rebuild(root: Path) -> None:
    """Prefix every lead section with the same words (the URLs stay), then rebuild the KB store as a user would."""
    path = root / "world/kb/encyclopedic_kb_wiki.json"
    kb = json.loads(path.read_text(encoding="utf-8"))
    for entry in kb.values():
        entry["section_texts"][0] = "Edited lead section. " + entry["section_texts"][0]
    path.write_text(json.dumps(kb), encoding="utf-8")
    shutil.rmtree(root / "world/kb/store")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    subprocess.run(
        QKVQA + ["kb", "build", "--source", str(path), "--out", str(root / "world/kb/store")],
        env=env,
        check=True,
        capture_output=True,
    )


def _symlink_index_manifest(root: Path) -> None:
    manifest = next((root / "cache/indexes").glob("kb_text*/*/manifest.json"))
    copy = root / "planted_manifest.json"
    shutil.copy(manifest, copy)
    manifest.unlink()
    manifest.symlink_to(copy)


def _planted_run_dir(root: Path) -> None:
    """Another user's ROOT/RUN_ID in a 1777 run root, with links to a file of the victim's (needs root to chown)."""
    victim = root / "victim_file.txt"
    victim.write_text("keep me\n")
    run_dir = root / "runs/victim"
    run_dir.mkdir(parents=True)
    (run_dir / ".lock").symlink_to(victim)
    (run_dir / "metrics.csv").symlink_to(victim)
    os.chmod(root / "runs", 0o1777)
    if os.geteuid() == 0:
        os.chown(run_dir, 65534, 65534)


def _shuffle_rows(path: Path) -> None:
    import numpy as np

    rows = np.load(path)
    np.save(path, np.random.default_rng(0).permutation(rows))


def _run(argv: list[str], env: dict, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(QKVQA + argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def _figures(stdout: str) -> dict:
    """The numbers a command printed (its last JSON object), without paths and timings."""
    text = stdout.strip()
    start = text.rfind("\n{") + 1 if not text.startswith("{") else 0
    try:
        values = json.loads(text[start:])
    except ValueError:
        return {}
    return {k: v for k, v in values.items() if isinstance(v, (int, float)) and "seconds" not in k}


def classify(result: subprocess.CompletedProcess, baseline: dict, command: str) -> tuple[str, str]:
    err = result.stderr.strip().splitlines()
    if "Traceback (most recent call last)" in result.stderr:
        return "traceback", next((line for line in reversed(err) if line.strip()), "")[:200]
    if result.returncode != 0:
        last = err[-1] if err else ""
        return ("refused" if last.startswith(f"qkvqa {command}: error:") else "traceback"), last[:300]
    figures = _figures(result.stdout)
    if figures == baseline:
        return "same", ""
    skipped = [k for k in figures if "missing" in k or "skipped" in k]
    if any(figures.get(k, 0) > baseline.get(k, 0) for k in skipped):
        return "counted", ", ".join(
            f"{k}: {baseline.get(k)} -> {figures[k]}" for k in skipped if figures[k] != baseline.get(k)
        )
    changed = {k: (baseline.get(k), v) for k, v in figures.items() if baseline.get(k) != v}
    return "silently wrong", json.dumps(changed)[:300]


def setup(work: Path, env: dict) -> Path:
    """The pristine world: synth, embed + index, a QFF trained two steps, InfoSeek predictions to score."""
    root = work / "pristine"
    (root / "experiments").mkdir(parents=True)
    for name in ("base", "presets", "demo"):
        (root / "experiments" / name).symlink_to(REPO / "experiments" / name)
    subprocess.run(
        QKVQA + ["synth", "--out", str(root / "world"), "--entities", "36"], env=env, check=True, capture_output=True
    )
    data = yaml.safe_load((root / "world/data_evqa.yaml").read_text())
    common = {
        "paths": {"cache_dir": "{root}/cache", "checkpoints_root": "{root}/runs"},
        "trainer": {"accelerator": "cpu", "enable_progress_bar": False},
        "logger": {"wandb": {"enabled": False}},
        "components": {
            name: {"kind": kind, "tiny": True, "device": "cpu", "dtype": "fp32"} for name, kind in TINY.items()
        },
    }
    w = {
        **common,
        "task": "evaluate",
        "data": {**data, "root": "{root}/world", "batch_size": 4},
        "retrieval": {"shard_size": 64},
        "generation": {"max_new_tokens": 4, "batch_size": 4},
    }
    (root / "templates").mkdir()
    (root / "templates/w.yaml").write_text(yaml.safe_dump(w))
    (root / "templates/wt.yaml").write_text(
        yaml.safe_dump(
            {
                "presets": ["demo_world"],
                **common,
                "paths": {**common["paths"], "world_dir": "{root}/world"},
                "trainer": {**common["trainer"], "max_steps": 2},
            }
        )
    )
    _materialise(root)
    for argv in (
        ["embed", "experiment=w", "run_id=e"],
        ["index", "build", "experiment=w", "run_id=i"],
        ["embed", "experiment=wt", "run_id=e2"],
        ["index", "build", "experiment=wt", "run_id=i2"],
        ["train", "experiment=wt", "run_id=trained"],
    ):
        result = _run(_fill(argv, root), env, root)
        if result.returncode != 0:
            raise RuntimeError(f"setup {argv} failed:\n{result.stderr[-3000:]}")
    refs = [json.loads(line) for line in (root / "world/infoseek/infoseek_val.jsonl").read_text().splitlines() if line]
    (root / "infoseek_predictions.jsonl").write_text(
        "".join(json.dumps({"data_id": r["data_id"], "prediction": r["answer"][0]}) + "\n" for r in refs)
    )
    return root


def _fill(argv: list[str], root: Path) -> list[str]:
    index_dir = (
        next((root / "cache/indexes").glob("kb_text*/*/manifest.json"), root).parent
        if (root / "cache/indexes").exists()
        else root
    )
    return [a.replace("{root}", str(root)).replace("{index_dir}", str(index_dir)) for a in argv]


def _materialise(root: Path) -> None:
    """The experiments of a copy: its templates with {root} filled in."""
    for path in (root / "templates").glob("*.yaml"):
        (root / "experiments" / path.name).write_text(path.read_text().replace("{root}", str(root)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="run only these faults")
    parser.add_argument("--keep", help="work directory to keep (default: a temp dir, removed)")
    args = parser.parse_args()
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="qkvqa_faults_"))
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "WANDB_MODE": "disabled",
        "OMP_NUM_THREADS": "1",
        "QKVQA_PROGRESS": "0",
        "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)]),
    }
    started = time.time()
    try:
        pristine = setup(work, {**env, "QKVQA_EXPERIMENTS": str(work / "pristine/experiments")})
        rows = []
        baselines: dict = {}
        for fault in sorted(faults(), key=lambda f: f.in_place):  # the ones that alter the pristine world last
            if args.only and fault.name not in args.only:
                continue
            copy = pristine if fault.in_place else work / fault.name
            if not fault.in_place:
                shutil.rmtree(copy, ignore_errors=True)
                shutil.copytree(pristine, copy, symlinks=True)
                _materialise(copy)
            fault_env = {**env, "QKVQA_EXPERIMENTS": str(copy / "experiments")}
            argv = _fill(fault.command, copy)
            key = tuple(a for a in argv if "=" not in a or a.startswith(("experiment", "eval.", "qff.checkpoint")))
            if fault.expect == "same" or fault.expect == "counted":
                base = work / "base"
                if key not in baselines:
                    shutil.rmtree(base, ignore_errors=True)
                    shutil.copytree(pristine, base, symlinks=True)
                    _materialise(base)
                    result = _run(
                        _fill(fault.command, base), {**env, "QKVQA_EXPERIMENTS": str(base / "experiments")}, base
                    )
                    baselines[key] = _figures(result.stdout)
            fault.apply(copy)
            t0 = time.time()
            result = _run(argv, fault_env, copy)
            outcome, detail = classify(result, baselines.get(key, {}), argv[0])
            rows.append(
                {
                    "fault": fault.name,
                    "what": fault.what,
                    "command": " ".join(["qkvqa", *fault.command]),
                    "expected": fault.expect,
                    "outcome": outcome,
                    "ok": outcome == fault.expect,
                    "detail": detail,
                    "seconds": round(time.time() - t0, 1),
                }
            )
            print(f"{fault.name:28s} expected {fault.expect:8s} got {outcome:15s} {detail[:110]}", flush=True)
            if not args.keep and not fault.in_place:
                shutil.rmtree(copy, ignore_errors=True)
        counts = {
            o: sum(r["outcome"] == o for r in rows)
            for o in ("refused", "same", "counted", "traceback", "silently wrong")
        }
        result = {
            "faults": rows,
            "counts": counts,
            "all_as_expected": all(r["ok"] for r in rows),
            "seconds": round(time.time() - started, 1),
        }
        OUT.mkdir(parents=True, exist_ok=True)
        if not args.only:
            (OUT / "faults.json").write_text(json.dumps(result, indent=2) + "\n")
            lines = ["| fault | command | expected | outcome | what qkvqa said |", "|---|---|---|---|---|"]
            lines += [
                f"| {r['what']} | `{r['command']}` | {r['expected']} | {r['outcome']} | "
                f"{r['detail'].replace('|', '/')[:160]} |"
                for r in rows
            ]
            (OUT / "faults.md").write_text("\n".join(lines + ["", f"counts: {counts}"]) + "\n")
        print(json.dumps(counts))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
