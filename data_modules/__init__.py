"""LightningDataModules of qkvqa: E-VQA and InfoSeek evaluation questions with their query images, over the
`qkvqa.data.benchmark.Benchmark` each holds."""

from qkvqa.data_modules.base import KBVQADataModule, QuestionImageDataset, collate_samples
from qkvqa.data_modules.evqa import EVQADataModule
from qkvqa.data_modules.infoseek import InfoSeekDataModule

DATA_MODULES = {"evqa": EVQADataModule, "infoseek": InfoSeekDataModule}


def build_data_module(config) -> KBVQADataModule:
    """The DataModule for `config.dataset` (a DataConfig, dict or DictConfig `data:` section, or a Benchmark,
    which it then holds)."""
    from qkvqa.data.benchmark import Benchmark, build_benchmark

    benchmark = config if isinstance(config, Benchmark) else build_benchmark(config)
    return DATA_MODULES[benchmark.config.dataset](benchmark)


__all__ = [
    "DATA_MODULES",
    "EVQADataModule",
    "InfoSeekDataModule",
    "KBVQADataModule",
    "QuestionImageDataset",
    "build_data_module",
    "collate_samples",
]
