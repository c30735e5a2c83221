"""Progress bars for long loops: tqdm on rank zero, silent on other ranks and when disabled."""
from __future__ import annotations

import os
from typing import Iterable, Optional, TypeVar

from tqdm.auto import tqdm

from qkvqa.utils.logging import global_rank

T = TypeVar("T")


def progress(iterable: Optional[Iterable[T]] = None, *, desc: str = "", total: Optional[int] = None,
             unit: str = "it", **kwargs) -> tqdm:
    """Wrap a long loop in a tqdm bar; disabled off rank 0 or with QKVQA_PROGRESS=0."""
    disable = global_rank() != 0 or os.environ.get("QKVQA_PROGRESS", "1") == "0"
    return tqdm(iterable, desc=desc, total=total, unit=unit, disable=disable, dynamic_ncols=True,
                mininterval=0.5, **kwargs)
