"""InfoSeek DataModule: EchoSight-style CSVs, the official JSONL or ReflectiVA's query shards, joined with the official
references."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from qkvqa.data.questions import (InfoSeekReference, Question, attach_infoseek_references,
                                  read_infoseek_csv, read_infoseek_jsonl_questions, read_infoseek_references,
                                  read_webdataset_questions)
from qkvqa.data.shards import is_shard_pattern
from qkvqa.data_modules.base import KBVQADataModule
from qkvqa.errors import ConfigError


class InfoSeekDataModule(KBVQADataModule):
    """InfoSeek questions; val/test questions carry their reference (answer_eval, data_split, String/Numerical/Time)."""

    dataset_name = "InfoSeek"

    def __init__(self, config):
        super().__init__(config)
        self._references: Optional[dict[str, InfoSeekReference]] = None
        self.reference_overlap: dict[str, dict[str, int]] = {}

    def references(self) -> Optional[dict[str, InfoSeekReference]]:
        """The official references with question types, or None when `data.infoseek_references` is not set."""
        if self._references is None and self.config.infoseek_references is not None:
            self._references = read_infoseek_references(self.path("infoseek_references"),
                                                        self.path("infoseek_qtypes"))
        return self._references

    def read_questions(self, split: str, path: Path) -> list[Question]:
        if is_shard_pattern(path):
            references = self.references()
            if references is None:
                raise ConfigError(f"data.infoseek_references must be set to read questions from the shards {path}: "
                                  "they hold no answers (the official infoseek_val.jsonl does)")
            shards = self.image_loader.resolver.shards(path)
            return read_webdataset_questions(shards, references, name=str(path))
        if path.suffix == ".jsonl":
            qtypes = self.path("infoseek_qtypes")
            if qtypes is None:
                raise ConfigError(f"data.infoseek_qtypes must be set to read questions from {path}")
            return read_infoseek_jsonl_questions(path, qtypes)
        questions = read_infoseek_csv(path, split=split)
        references = self.references()
        if references is not None and split != "train":
            self.reference_overlap[split] = attach_infoseek_references(questions, references, name=f"{split} ({path})")
        return questions
