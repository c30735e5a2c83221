"""The doctor's data checks: configured paths, questions and query images per split, the KB store, KB images per CSV, the index."""

from __future__ import annotations

import glob
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from qkvqa.doctor.report import Check
from qkvqa.errors import QkvqaError
from qkvqa.pipeline.filters import filter_kind

# what a query image header read costs is small, but InfoSeek's train split has ~1M; beyond this many per split the
# images opened are a seeded sample (existence is checked for every one)
OPEN_IMAGES = 5000
# an index file up to this size is also read with faiss (vector count, dim, row mapping); a larger one is checked by its
# manifest and sha256 only, so that doctor stays a matter of seconds
READ_INDEX_BYTES = 1 << 30


def _err(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, QkvqaError) else str(exc)


def splits_read(cfg: Any) -> list[str]:
    """The question splits the config's task reads: evaluate / retrieve / rerank one split, train the training split
    (and val when validation pools are set)."""
    if cfg.task == "train":
        return ["train"] + (["val"] if cfg.qff.val_negatives else [])
    split = cfg.eval.split if cfg.task == "evaluate" else cfg.retrieval.split
    return [split]


def path_checks(cfg: Any, splits: list[str]) -> list[Check]:
    """Every configured path: present, or fail (needed now), todo (a later command writes it) or warn (optional)."""
    from qkvqa.data.config import data_config_from_dict, resolve_data_path

    data = data_config_from_dict(cfg.data)
    images = data.images
    need, later, optional = [], [], []
    if data.root is not None:
        need.append(("data.root", Path(data.root).expanduser()))
    rel = lambda p: resolve_data_path(data, p)  # noqa: E731
    for split in splits:
        if getattr(data, f"{split}_questions") is not None:
            need.append((f"data.{split}_questions", rel(getattr(data, f"{split}_questions"))))
    for key in ("infoseek_references", "infoseek_qtypes"):
        if getattr(data, key) is not None:
            need.append((f"data.{key}", rel(getattr(data, key))))
    if data.kb_source:  # needed to build a store that is not there yet, else only checked against
        store_built = data.kb_store is not None and rel(data.kb_store).exists()
        (optional if store_built else need).append(("data.kb_source", rel(data.kb_source)))
    if data.kb_store:
        later.append(("data.kb_store", rel(data.kb_store), "qkvqa kb build --source KB --out DIR writes it"))
    dataset_roots = {"evqa": ("inaturalist_root", "landmarks_root"), "infoseek": ("infoseek_root",)}
    for key in dataset_roots.get(data.dataset, ()):
        if getattr(images, key) is not None and not (key == "infoseek_root" and images.infoseek_shards):
            need.append((f"data.images.{key}", rel(getattr(images, key))))
    if data.dataset == "evqa" and images.inaturalist_layout == "id2name":
        if images.inaturalist_id2name:
            need.append(("data.images.inaturalist_id2name", rel(images.inaturalist_id2name)))
        for i, extra in enumerate(images.inaturalist_id2name_extra):
            need.append((f"data.images.inaturalist_id2name_extra[{i}]", rel(extra)))
    if images.kb_image_root:
        need.append(("data.images.kb_image_root", rel(images.kb_image_root)))
    if images.kb_image_url_store:
        optional.append(("data.images.kb_image_url_store", rel(images.kb_image_url_store)))
    for key, hint in (
        ("retrieval.index_dir", "qkvqa index build (or index import) writes it"),
        ("retrieval.summaries", "qkvqa summarize writes it"),
        ("qff.vit_cache", "qkvqa cache-vit writes it"),
        ("qff.negatives", "qkvqa mine writes it"),
        ("qff.val_negatives", "qkvqa mine split=val writes it"),
    ):
        value = OmegaConf.select(cfg, key)
        if value:
            later.append((key, Path(value).expanduser(), hint))
    untrained = []
    weights = filter_kind(cfg.eval.filter).trained_weights(cfg) if cfg.task == "evaluate" else None
    if weights:  # the trained weights the filter kind evaluates (the QFF's RUN/qff)
        key, value, hint = weights
        if value:
            later.append((key, Path(value).expanduser(), hint))
        else:
            untrained.append(
                Check(
                    "paths",
                    key,
                    "todo",
                    f"not set: eval.filter={cfg.eval.filter} evaluates trained weights ({hint}); pass {key}=PATH",
                )
            )
    for key in ("retrieval.results", "eval.reranked_results"):
        value = OmegaConf.select(cfg, key)
        if value:
            need.append((key, Path(value).expanduser()))
    if cfg.paths.weights_dir:
        need.append(("paths.weights_dir", Path(cfg.paths.weights_dir).expanduser()))
    checks = untrained
    for key, path in need:
        checks.append(
            Check("paths", key, "ok" if path.exists() else "fail", str(path) if path.exists() else f"{path}: not found")
        )
    for key, path, hint in later:
        checks.append(
            Check(
                "paths",
                key,
                "ok" if path.exists() else "todo",
                str(path) if path.exists() else f"{path}: not there yet ({hint})",
            )
        )
    for key, path in optional:
        checks.append(
            Check(
                "paths",
                key,
                "ok" if path.exists() else "warn",
                str(path) if path.exists() else f"{path}: not found (optional)",
            )
        )
    for i, pattern in enumerate(images.kb_image_csvs):
        full = str(rel(pattern))
        found = sorted(glob.glob(full))
        checks.append(
            Check(
                "paths",
                f"data.images.kb_image_csvs[{i}]",
                "ok" if found else "fail",
                f"{len(found)} files match {full}" if found else f"no file matches {full}",
            )
        )
    return checks


def _open_ok(path: Path) -> Optional[str]:
    """None when `path` opens as an image (header read), else the reason."""
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.size
        return None
    except (OSError, ValueError, Image.DecompressionBombError) as e:
        return str(e) or type(e).__name__


def question_kind(question: Any) -> str:
    """The question type a report counts by: E-VQA's question_type; InfoSeek's official type (String / Numerical /
    Time) and split (unseen_question / unseen_entity) when its reference is joined."""
    ref = question.reference
    if ref is not None:
        split = str(ref.data_split).replace("val_", "").replace("test_", "")
        return f"{ref.question_type or '?'}/{split}"
    return question.question_type or "-"


def question_checks(dm: Any, splits: list[str], open_images: int = OPEN_IMAGES) -> list[Check]:
    """Per split: the questions read per question type, and per image source the query images found, missing (first
    path tried) and unreadable (header read, a sample beyond `open_images`); fail above max_missing_fraction."""
    import random

    from qkvqa.data.images import MISSING

    checks = []
    resolver = dm.image_loader.resolver
    bound = float(dm.config.images.max_missing_fraction)
    for split in splits:
        try:
            questions = dm.questions(split)
        except Exception as e:  # DataError names file, line, field: that is the line shown
            checks.append(Check("questions", split, "fail", _err(e)))
            continue
        types = Counter(question_kind(q) for q in questions)
        checks.append(
            Check(
                "questions",
                split,
                "ok" if questions else "fail",
                f"{len(questions):,} questions read from {dm.path(f'{split}_questions')}: "
                + ", ".join(f"{t} {n:,}" for t, n in sorted(types.items())),
            )
        )
        try:
            resolver.check_roots(questions)
        except Exception as e:
            checks.append(Check("images", f"{split} query images", "fail", _err(e)))
            continue
        by_source: dict[str, list] = defaultdict(list)
        for q in questions:
            by_source[q.dataset_name].append(q)
        for source, qs in sorted(by_source.items()):
            try:
                entries = [(q, resolver.file_entry(source, q.image_id)) for q in qs]
            except Exception as e:  # an id2name map missing or malformed
                checks.append(Check("images", f"{split} {source}", "fail", _err(e)))
                continue
            missing = [q for q, entry in entries if entry == MISSING]
            found = [entry for _, entry in entries if entry != MISSING]
            shards = source in resolver.shard_patterns
            opened = found if shards or len(found) <= open_images else random.Random(0).sample(found, open_images)
            unreadable = (
                [] if shards else [(e, r) for e in opened if (r := _open_ok(Path(e.rsplit(":", 2)[0]))) is not None]
            )
            share = len(missing) / len(qs) if qs else 0.0
            status = "fail" if share > bound else "warn" if missing or unreadable else "ok"
            detail = f"{len(found):,} of {len(qs):,} found"
            missing_types = Counter(question_kind(q) for q in missing)
            if missing:
                first = missing[0]
                detail += (
                    f", {len(missing):,} missing ({100 * share:.1f}%, bound {100 * bound:g}%; "
                    + ", ".join(f"{t} {n}" for t, n in sorted(missing_types.items()))
                    + f"), first {first.image_id}: {resolver._tried(source, first.image_id)}"
                )
            detail += (
                f", {len(unreadable)} unreadable of {len(opened):,} opened" if not shards else " (in webdataset shards)"
            )
            if unreadable:
                detail += f", first {unreadable[0][0].rsplit(':', 2)[0]} ({unreadable[0][1]})"
            checks.append(Check("images", f"{split} {source}", status, detail))
    return checks


def kb_checks(dm: Any) -> tuple[list[Check], Optional[Any]]:
    """The KB store opens and matches its source (size and sampled fingerprint); (checks, store or None)."""
    try:
        store = dm.kb_store()
    except Exception as e:
        return [Check("kb", "store", "fail", _err(e))], None
    source = dm.path("kb_source")
    checked = source is not None and source.exists()
    return [
        Check(
            "kb",
            "store",
            "ok" if checked else "warn",
            f"{len(store):,} articles in {dm.path('kb_store')}; "
            + (
                f"matches {source} (size, sampled fingerprint)"
                if checked
                else "its KB source file is not there, so it was not checked against it"
            ),
        )
    ], store


def kb_image_checks(dm: Any, store: Optional[Any]) -> tuple[list[Check], dict]:
    """Per title -> image CSV: the rows tried and the image files missing, with the first missing path and, when the
    files sit one folder up or down, that folder; then the KB's main images found. (checks, counts for the disk
    estimate)."""
    from qkvqa.data.benchmark import kb_titles
    from qkvqa.data.images import ArticleImageIndex, _expand_globs, _under

    config = dm.config.images
    if not config.kb_image_csvs:
        return [], {}
    root = dm.config.root
    image_root = _under(root, config.kb_image_root)
    url_store = _under(root, config.kb_image_url_store)
    titles = set(kb_titles(store)) if store is not None else None
    checks, with_image, tried_total, missing_total = [], set(), 0, 0
    bound = float(config.max_missing_fraction)
    for csv_path in _expand_globs(config.kb_image_csvs, root):
        try:
            index = ArticleImageIndex.from_csvs([csv_path], image_root, config.max_images_per_title, url_store)
        except Exception as e:
            checks.append(Check("kb images", csv_path.name, "fail", _err(e)))
            continue
        counts = index.missing_counts(titles)
        tried_total += counts["tried"]
        missing_total += counts["missing"]
        with_image |= set(index.by_title)
        share = counts["missing"] / counts["tried"] if counts["tried"] else 0.0
        detail = f"{counts['tried']:,} images listed for KB articles, {counts['missing']:,} missing"
        first = next((e for e in index.missing_examples if titles is None or e[0] in titles), None)
        if first is not None:
            detail += (
                f" ({100 * share:.1f}%), first {first[1]}{' (outside the image root)' if first[2] != 'missing' else ''}"
            )
            detail += _one_folder_off(image_root, Path(first[1]))
        checks.append(
            Check(
                "kb images", csv_path.name, "fail" if share > bound else "warn" if counts["missing"] else "ok", detail
            )
        )
    if titles is not None:
        found = len(titles & with_image)
        fallback = ""
        if url_store is not None and url_store.is_dir():
            fallback = f"; articles without one may use data.images.kb_image_url_store ({url_store})"
        status = "fail" if not found and url_store is None else "ok" if found == len(titles) else "warn"
        checks.append(
            Check(
                "kb images",
                "main images",
                status,
                f"{found:,} of {len(titles):,} KB articles ({100 * found / max(len(titles), 1):.1f}%) have a "
                f"main image in the CSVs{fallback}",
            )
        )
        if tried_total and missing_total > bound * tried_total:
            checks.append(
                Check(
                    "kb images",
                    "all CSVs",
                    "fail",
                    f"{missing_total:,} of {tried_total:,} KB images missing, more than "
                    f"data.images.max_missing_fraction={bound}: embed, mine, train and evaluate stop",
                )
            )
    return checks, {"kb_images": tried_total - missing_total}


def _one_folder_off(image_root: Optional[Path], missing: Path) -> str:
    """`; FILE is under X: set kb_image_root to X` when the missing file exists one folder up or down of the root."""
    if image_root is None or not image_root.is_dir():
        return ""
    try:
        relative = missing.relative_to(image_root)
    except ValueError:
        return ""
    for folder in (image_root.parent, *(p for p in image_root.iterdir() if p.is_dir())):
        if (folder / relative).is_file():
            return f"; {relative} exists under {folder}: data.images.kb_image_root should be that folder"
    parts = relative.parts
    if len(parts) > 1 and (image_root / Path(*parts[1:])).is_file():
        return f"; {Path(*parts[1:])} exists under {image_root}: data.images.kb_image_root is one folder too deep"
    return ""


def index_checks(cfg: Any, dm: Any, store: Optional[Any]) -> list[Check]:
    """The index of retrieval.mode: its manifest against the KB store and the config (mode, encoders, factory), its
    files against their sha256, the faiss file's vector count and dimension; todo when it is not built yet."""
    from qkvqa.retrieval.index import MANIFEST_FILE, index_differences, load_index, verify_index_files
    from qkvqa.retrieval.retrieve import expected_encoders, index_dir_for, rebuild_hint

    if cfg.retrieval.results or filter_kind(cfg.eval.filter).stage1_from_file and cfg.task == "evaluate":
        return (
            [Check("index", cfg.retrieval.mode, "ok", "not read: stage 1 comes from retrieval.results")]
            if cfg.retrieval.results
            else []
        )
    hint = rebuild_hint(cfg)
    try:
        if cfg.retrieval.index_dir:
            path = Path(cfg.retrieval.index_dir).expanduser()
        else:
            from qkvqa.retrieval.embed import Embedder, kb_set_kind

            path = index_dir_for(cfg, Embedder(cfg, kb_set_kind(cfg.retrieval.mode), benchmark=dm).set_path())
    except Exception as e:
        return [Check("index", cfg.retrieval.mode, "todo", f"its location depends on the KB embeddings: {_err(e)}")]
    if not (path / MANIFEST_FILE).is_file():
        return [Check("index", cfg.retrieval.mode, "todo", f"not built at {path}: {hint}")]
    if store is None:
        return [Check("index", cfg.retrieval.mode, "fail", f"{path}: cannot be checked without the KB store")]
    from qkvqa.utils.io import read_json

    try:
        manifest = read_json(path / MANIFEST_FILE)
        diffs = index_differences(
            manifest,
            kb_store=store,
            mode=cfg.retrieval.mode,
            encoders=expected_encoders(cfg),
            factory=cfg.retrieval.index_factory,
        )
        if diffs:
            return [
                Check(
                    "index", cfg.retrieval.mode, "fail", f"{path} does not match: {'; '.join(diffs)}. Rebuild: {hint}"
                )
            ]
        hashed = verify_index_files(path, manifest, hint)  # once per file version (a stamp beside each file)
        index_file = path / manifest.get("index_file", "index.faiss")
        if index_file.is_file() and index_file.stat().st_size <= READ_INDEX_BYTES:
            load_index(
                path,
                kb_store=store,
                mode=cfg.retrieval.mode,
                encoders=expected_encoders(cfg),
                factory=cfg.retrieval.index_factory,
                rebuild_hint=hint,
            )
    except Exception as e:
        return [Check("index", cfg.retrieval.mode, "fail", _err(e))]
    return [
        Check(
            "index",
            cfg.retrieval.mode,
            "ok",
            f"{path}: {manifest.get('count'):,} vectors x {manifest.get('dim')}, {manifest_factory_text(manifest)}, "
            f"KB checksum and encoders match, sha256 of {', '.join(hashed) or 'no file (older index)'} checked",
        )
    ]


def manifest_factory_text(manifest: dict) -> str:
    from qkvqa.retrieval.index import manifest_factory

    factory = manifest_factory(manifest)
    return f"factory {factory}" + (" (imported)" if manifest.get("imported") else "")
