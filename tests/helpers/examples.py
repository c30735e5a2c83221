"""How many examples a property test draws: its full count in `make test`, a tenth in the fast loop."""

from __future__ import annotations

import os


def examples(full: int) -> int:
    """`full`, or full // 10 (at least 20) when `make test-fast` sets QKVQA_FAST_LOOP=1."""
    if os.environ.get("QKVQA_FAST_LOOP") == "1":
        return max(20, full // 10)
    return full
