"""Which item a lane that chooses its work submits first (the bug pool): DESIGN §5 "Urgency"."""
from __future__ import annotations

import math

#: The seed's severity weights.
SEVERITY = {"red-main": 32, "B": 16, "H": 8, "M": 4, "L": 2, None: 1, "": 1}
AGING_UNIT = 86_400.0


def urgency(severity: str | None, age_seconds: float, aging_unit: float = AGING_UNIT) -> float:
    """(1 + severity weight) × (1 + age / aging_unit): an eight-day-old low bug comes before a
    fresh blocking one, and nothing waits for ever."""
    if severity not in SEVERITY:
        raise ValueError(f"unknown severity {severity!r}; known: red-main, B, H, M, L or None")
    if not math.isfinite(age_seconds) or age_seconds < 0:
        raise ValueError(f"age_seconds must be a finite number >= 0, got {age_seconds!r}")
    if not aging_unit > 0:
        raise ValueError("aging_unit must be > 0")
    return (1 + SEVERITY[severity]) * (1 + age_seconds / aging_unit)
