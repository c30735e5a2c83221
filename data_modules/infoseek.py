"""InfoSeek DataModule: EchoSight-style CSVs, the official JSONL or ReflectiVA's query shards, joined with the official
references."""

from __future__ import annotations

from typing import Optional

from qkvqa.data.benchmark import InfoSeekBenchmark
from qkvqa.data.questions import InfoSeekReference
from qkvqa.data_modules.base import KBVQADataModule


class InfoSeekDataModule(KBVQADataModule):
    """InfoSeek questions (how they are read and joined with their references:
    `qkvqa.data.benchmark.InfoSeekBenchmark`)."""

    benchmark_class = InfoSeekBenchmark

    def references(self) -> Optional[dict[str, InfoSeekReference]]:
        """The official references with question types, or None when `data.infoseek_references` is not set."""
        return self.benchmark.references()

    @property
    def reference_overlap(self) -> dict[str, dict[str, int]]:
        """Per split, how the questions and the references overlap (`InfoSeekBenchmark.reference_overlap`)."""
        return self.benchmark.reference_overlap
