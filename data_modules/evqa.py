"""E-VQA DataModule: the E-VQA question CSVs (single-hop, optionally 2_hop) with iNaturalist / GLDv2 images."""

from __future__ import annotations

from qkvqa.data.benchmark import EVQABenchmark
from qkvqa.data_modules.base import KBVQADataModule


class EVQADataModule(KBVQADataModule):
    """E-VQA questions and their first query image (how they are read: `qkvqa.data.benchmark.EVQABenchmark`)."""

    benchmark_class = EVQABenchmark
