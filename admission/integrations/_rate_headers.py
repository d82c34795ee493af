"""The providers' rate-limit headers, read after every response into the round it ran in.

Every integration calls ``note`` (or ``note_error``) with what a response already carries (its
headers, its status, its error's text: no extra request), and the round's handle then says:

* ``rate_reading``: the ``ratelimits.Reading`` of the last response (success or error, streamed
  or not), sent with the round's end;
* on a 429 whose headers or error name a spent rate ceiling (``ratelimits.spent_ceiling``):
  ``ceiling`` (``rpm``, ``tpm`` ...) and ``reset_s`` (that limit's reset, else the Retry-After),
  so the round ends ``ceiling`` (that bucket is held until its reset) instead of
  ``rate_limited`` (load, which cuts the pool's estimate). A 429 that names no ceiling stays a
  capacity refusal.

A reading that fails (headers of an odd shape, a bug) is logged and forgotten: it never fails
the call it came with.
"""
from __future__ import annotations

from typing import Any

from ._common import log
from .. import ratelimits
from ..classify import text_of
from ..core import MAX_CEILING_RESET


def response_of(source: Any) -> Any:
    """The HTTP response an SDK object came in: an exception's ``response``, a stream's
    (``response``, the helpers' ``_response`` / ``_raw_stream.response``), a raw response
    itself; None when it has none (a refused connection)."""
    for candidate in (source, getattr(source, "response", None), getattr(source, "_response", None),
                      getattr(getattr(source, "_raw_stream", None), "response", None)):
        if candidate is not None and hasattr(candidate, "headers") and hasattr(candidate, "status_code"):
            return candidate
    return None


def reset_of(reading: ratelimits.Reading, kind: str) -> float | None:
    """Seconds until a spent ceiling resets: its limit's reset, else the Retry-After (at most
    what a release takes)."""
    lim = reading.get(kind)
    reset = lim.reset_s if lim is not None and lim.reset_s is not None else reading.retry_after
    return None if reset is None else min(float(reset), float(MAX_CEILING_RESET))


def note(handle: Any, headers: Any, status: Any, error: Any = None) -> ratelimits.Reading | None:
    """Read a response's rate-limit headers into ``handle`` (see the module's docstring);
    ``error``: the error's text (or the exception) a 429 may name its ceiling in. Never raises."""
    if handle is None or headers is None:
        return None
    try:
        reading = ratelimits.read(headers, status, error)
        handle.rate_reading = reading
        # the last response says how the round ends: a spent ceiling, or none (a later capacity
        # 429 of a joined call is load again)
        spent = reading.spent
        handle.ceiling, handle.reset_s = (spent, reset_of(reading, spent)) if spent else (None, None)
        return reading
    except Exception as exc:  # noqa: BLE001 - advice to the ceilings, never a failed call
        log.warning("ratelimit_read_failed", round=getattr(getattr(handle, "seat", None), "id", None),
                    error=repr(exc))
        return None


def note_response(handle: Any, source: Any) -> ratelimits.Reading | None:
    """``note`` for what an SDK call returned (a raw response, a stream): no text to read."""
    response = response_of(source)
    if response is None:
        return None
    return note(handle, getattr(response, "headers", None), getattr(response, "status_code", None))


def note_error(handle: Any, exc: BaseException) -> ratelimits.Reading | None:
    """``note`` for an SDK's error: its response's headers and status, its text."""
    response = response_of(exc)
    if response is None:
        return None
    try:
        text = text_of(exc)
    except Exception:  # noqa: BLE001 - no text: the headers alone may still name the ceiling
        text = None
    status = getattr(exc, "status_code", None) or getattr(response, "status_code", None)
    return note(handle, getattr(response, "headers", None), status, text)
