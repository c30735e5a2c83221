"""Error types whose message tells the user what is wrong and how to fix it."""
from __future__ import annotations


class QkvqaError(Exception):
    """Base class: the CLI prints these as one line, without a traceback."""


class ConfigError(QkvqaError, ValueError):
    """A config key, value or file is wrong; the message names the key and the fix."""


class DataError(QkvqaError, ValueError):
    """An input file is malformed; the message names the file, the line and the field."""


class MissingWeightsError(QkvqaError, FileNotFoundError):
    """Model weights are not on disk; the message says where to put them."""


class StaleArtifactError(QkvqaError, RuntimeError):
    """An index, cache or run record does not match the data or config it is used with."""
