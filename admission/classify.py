"""The one classifier (DESIGN §6): what a round saw -> the outcome it reports on release."""
from __future__ import annotations

import re

_RATE = re.compile(r"(?i)\b429\b|rate.?limit|too many requests")


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an SDK error carries (``status_code``, ``status`` or ``response``)."""
    for attr in ("status_code", "status", "http_status"):
        v = getattr(exc, attr, None)
        if isinstance(v, int):
            return v
    response = getattr(exc, "response", None)
    v = getattr(response, "status_code", None)
    return v if isinstance(v, int) else None


def outcome_of(exc: BaseException | None) -> str:
    """clean | rate_limited | error for the error a round ended with.

    A 429 is load. Stall and round cap are reported by the watchdog while the round runs, so a
    round that ends in an error after them still reports its error here. Provider closures
    (402, 401, 403 and the daily key limit) are counted as errors until the provider issue adds
    their closing signals.
    """
    if exc is None:
        return "clean"
    if status_of(exc) == 429 or _RATE.search(str(exc)):
        return "rate_limited"
    return "error"
