"""LightningDataModules of qkvqa: E-VQA and InfoSeek evaluation questions with their query images."""
from qkvqa.data_modules.base import KBVQADataModule, QuestionImageDataset, collate_samples
from qkvqa.data_modules.evqa import EVQADataModule
from qkvqa.data_modules.infoseek import InfoSeekDataModule

DATA_MODULES = {"evqa": EVQADataModule, "infoseek": InfoSeekDataModule}


def build_data_module(config) -> KBVQADataModule:
    """The DataModule for `config.dataset` (a DataConfig, dict or DictConfig `data:` section)."""
    from qkvqa.data.config import data_config_from_dict
    from qkvqa.errors import ConfigError

    config = data_config_from_dict(config)
    if config.dataset not in DATA_MODULES:
        raise ConfigError(f"data.dataset: {config.dataset!r} is not one of {', '.join(DATA_MODULES)}")
    return DATA_MODULES[config.dataset](config)


def datamodule_for(cfg) -> KBVQADataModule:
    """The DataModule of a run config's `data:` section (KB store, article images, questions, query image loader)."""
    return build_data_module(cfg.data)


__all__ = ["DATA_MODULES", "EVQADataModule", "InfoSeekDataModule", "KBVQADataModule", "QuestionImageDataset",
           "build_data_module", "collate_samples", "datamodule_for"]
