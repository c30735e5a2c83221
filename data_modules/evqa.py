"""E-VQA DataModule: the E-VQA question CSVs (single-hop, optionally 2_hop) with iNaturalist / GLDv2 images."""
from __future__ import annotations

from pathlib import Path

from qkvqa.data.config import reads_two_hop
from qkvqa.data.questions import Question, read_evqa_csv
from qkvqa.data_modules.base import KBVQADataModule


class EVQADataModule(KBVQADataModule):
    """E-VQA questions (`data_id` = E-VQA_{i} over single-hop rows, E-VQA_2hop_{j} over 2_hop rows when read)
    and their first query image. 2_hop rows are read when `include_two_hop` is true, or for an evaluation
    (`qkvqa.data.config.for_evaluation` resolves null to true)."""

    dataset_name = "E-VQA"

    def read_questions(self, split: str, path: Path) -> list[Question]:
        return read_evqa_csv(path, split=split, include_two_hop=reads_two_hop(self.config, evaluation=False))
