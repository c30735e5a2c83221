"""Config dataclasses of the data layer (the `data:` section of an experiment)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional


@dataclass
class ImagesConfig:
    """Where query and article images live, per source dataset (data-formats.md section 4 and 5)."""

    inaturalist_root: Optional[str] = None
    inaturalist_layout: str = "id2name"          # id2name | flat
    inaturalist_id2name: Optional[str] = None    # train_id2name.json / val_id2name.json
    landmarks_root: Optional[str] = None
    landmarks_layout: str = "abc_sharded"        # abc_sharded (a/b/c/{id}.jpg) | flat
    infoseek_root: Optional[str] = None
    extensions: List[str] = field(default_factory=lambda: [".jpg", ".JPEG"])
    kb_image_csvs: List[str] = field(default_factory=list)   # OMGM title -> image CSVs (globs allowed)
    kb_image_root: Optional[str] = None                      # root the CSVs' img_path is relative to
    max_images_per_title: int = 10


@dataclass
class DataConfig:
    """The dataset of a run: questions, knowledge base and images."""

    dataset: str = "evqa"                        # evqa | infoseek
    root: Optional[str] = None                   # relative paths below are resolved against it
    kb_source: Optional[str] = None              # KB JSON dict or JSONL
    kb_store: Optional[str] = None               # directory written by `qkvqa kb build`
    train_questions: Optional[str] = None       # E-VQA CSV or EchoSight-style InfoSeek CSV
    val_questions: Optional[str] = None
    test_questions: Optional[str] = None
    infoseek_references: Optional[str] = None    # infoseek_val.jsonl
    infoseek_qtypes: Optional[str] = None        # infoseek_val_qtype.jsonl
    include_two_hop: bool = False                # keep 2_hop rows (only for "all" metrics)
    max_questions: Optional[int] = None          # cap per split (debugging)
    batch_size: int = 8
    num_workers: int = 0
    images: ImagesConfig = field(default_factory=ImagesConfig)
