"""Config dataclasses of the data layer (the `data:` section of an experiment)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, List, Mapping, Optional

from qkvqa.errors import ConfigError


@dataclass
class ImagesConfig:
    """Where query and article images live, per source dataset (data-formats.md section 4 and 5)."""

    inaturalist_root: Optional[str] = None
    inaturalist_layout: str = "id2name"  # id2name | flat
    inaturalist_id2name: Optional[str] = None  # train_id2name.json / val_id2name.json
    inaturalist_id2name_extra: List[str] = field(default_factory=list)  # more id2name maps, merged after the first
    landmarks_root: Optional[str] = None
    landmarks_layout: str = "abc_sharded"  # abc_sharded (a/b/c/{id}.jpg) | flat
    infoseek_root: Optional[str] = None
    # webdataset shards holding the InfoSeek query images as `{data_id}.img.jpg` (ReflectiVA's
    # val-{0000..0014}.tar); when set, InfoSeek images are read from them instead of infoseek_root.
    infoseek_shards: Optional[str] = None
    extensions: List[str] = field(default_factory=lambda: [".jpg", ".JPEG"])
    kb_image_csvs: List[str] = field(default_factory=list)  # OMGM title -> image CSVs (globs allowed)
    # The folder holding OMGM's full/ (its wiki_img_path_prefix): the CSVs' img_path is full/wiki_image_split/...
    kb_image_root: Optional[str] = None
    max_images_per_title: int = 10
    # Local pixel store for KB `image_urls` (fallback when a title has no CSV image): the file of
    # https://host/a/b.jpg is {kb_image_url_store}/host/a/b.jpg (a `wget --force-directories` mirror).
    kb_image_url_store: Optional[str] = None
    # The share of a split's query images, and of the KB's listed article images, that may be missing (or lie outside
    # their root) before any work starts; above it the run stops with the counts and the first paths tried (a wrong
    # root or a half-copied folder), below it each is a counted skip.
    max_missing_fraction: float = 0.02


@dataclass
class DataConfig:
    """The dataset of a run: questions, knowledge base and images."""

    dataset: str = "evqa"  # evqa | infoseek
    root: Optional[str] = None  # relative paths below are resolved against it
    kb_source: Optional[str] = None  # KB JSON dict or JSONL
    kb_store: Optional[str] = None  # directory written by `qkvqa kb build`
    # How a ReflectiVA Wiki100k entry's `wikipedia_content` becomes sections (data-formats.md section 2.3):
    # spacy_300 (default) = ReflectiVA's own passages, spaCy blank-English sentences packed into passages of at most
    # 300 spaCy tokens (aimagelab/ReflectiVA rag_evaluation/infoseek/release_retrieval.py); blank_lines = one section
    # per blank-line paragraph. Set at `qkvqa kb build --reflectiva-passages`; a store cut by the other rule is refused.
    reflectiva_passages: str = "spacy_300"
    train_questions: Optional[str] = None  # E-VQA CSV or EchoSight-style InfoSeek CSV
    val_questions: Optional[str] = None
    test_questions: Optional[str] = None  # InfoSeek: also the official infoseek_val.jsonl
    infoseek_references: Optional[str] = None  # infoseek_val.jsonl
    infoseek_qtypes: Optional[str] = None  # infoseek_val_qtype.jsonl
    # Which published evaluation protocol the files follow, named in every report (qkvqa.data.protocols):
    # evqa_2m and echosight_100k (the paper's), reflectiva_wiki100k (ReAG, CC-VQA), or custom.
    protocol: Optional[str] = None
    # E-VQA 2_hop rows: null = the task decides (evaluation reads every row, the paper's headline "all";
    # training, mining and retrieval read single-hop rows); true / false force it.
    include_two_hop: Optional[bool] = None
    max_questions: Optional[int] = None  # cap per split: the first N rows (debugging)
    sample_questions: Optional[int] = None  # a seeded random sample of N questions per split, in file order
    sample_seed: int = 0  # the sample's seed (every trial of a sweep gets the same subset)
    drop_missing_images: bool = True  # drop questions whose image is missing/corrupt from batches (counted)
    batch_size: int = 8
    num_workers: int = 0
    images: ImagesConfig = field(default_factory=ImagesConfig)


def _from_mapping(cls: type, values: Mapping[str, Any], prefix: str) -> Any:
    """Build dataclass `cls` from a mapping, rejecting unknown keys with the nearest valid names."""
    import difflib

    names = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in names:
            close = difflib.get_close_matches(key, list(names), n=3)
            raise ConfigError(
                f"unknown key '{prefix}{key}'"
                + (f"; did you mean {', '.join(close)}?" if close else f"; valid keys: {', '.join(names)}")
            )
        if key == "images" and isinstance(value, Mapping):
            value = _from_mapping(ImagesConfig, value, f"{prefix}images.")
        kwargs[key] = value
    return cls(**kwargs)


def reads_two_hop(config: DataConfig, evaluation: bool) -> bool:
    """Whether E-VQA 2_hop rows are read: `include_two_hop` when set, else only for an evaluation."""
    return evaluation if config.include_two_hop is None else bool(config.include_two_hop)


def for_evaluation(config: DataConfig) -> DataConfig:
    """The config an evaluation reads its questions with: every E-VQA row unless `include_two_hop` says otherwise
    (paper section 4.1 reports "the complete results including two-hop questions")."""
    return dataclasses.replace(config, include_two_hop=reads_two_hop(config, evaluation=True))


def data_config_from_dict(values: Any) -> DataConfig:
    """A DataConfig from a DataConfig, a plain dict or an OmegaConf DictConfig (the `data:` section)."""
    if isinstance(values, DataConfig):
        return values
    if not isinstance(values, Mapping):
        raise ConfigError(f"data config must be a mapping, found {type(values).__name__}")
    if type(values).__name__ == "DictConfig":
        from omegaconf import OmegaConf

        values = OmegaConf.to_container(values, resolve=True)
    return _from_mapping(DataConfig, values, "data.")


def resolve_data_path(config: DataConfig, path: Optional[str]) -> Optional[Path]:
    """`path` as given when absolute (or None), else relative to `config.root` when that is set."""
    if path is None:
        return None
    resolved = Path(path).expanduser()
    if not resolved.is_absolute() and config.root is not None:
        resolved = Path(config.root).expanduser() / resolved
    return resolved
