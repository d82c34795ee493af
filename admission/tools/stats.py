"""The tools' one percentile (the benches' p50, p95 and p99)."""
from __future__ import annotations

import math
from typing import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-quantile of ``values`` (q = p / 100, in [0, 1]): the smallest value such
    that at least a share q of the values are <= it, i.e. the sorted values' element at index
    ceil(q * n) - 1 (clamped to the first and the last). NaN when there are no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]
