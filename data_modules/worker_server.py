"""Imported first by the fork server that starts DataLoader workers beside a live process group: it ignores the stop
signals (the main process alone honours them) and preloads what the workers import (samplers.worker_start_context)."""

import signal

import torch  # noqa: F401  (preloaded: each worker forked from the server has it)

import qkvqa.data_modules  # noqa: F401  (the datasets and collate functions the workers unpickle)
import qkvqa.data_modules.evaluation  # noqa: F401
import qkvqa.data_modules.qff_train  # noqa: F401
from qkvqa.data_modules.samplers import STOP_SIGNALS

for _sig in STOP_SIGNALS:
    signal.signal(_sig, signal.SIG_IGN)
