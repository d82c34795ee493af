"""What a stream's two flavours share: its progress, and the base of its proxy.

The rounds that outlive the call and the streams that hold them are ``_streams_async.py``
(``AsyncHeldRound``, ``AsyncRoundStream``, ``AsyncRoundStreamManager``, the source) and
``_streams_sync.py`` (``HeldRound``, ``RoundStream``, ``RoundStreamManager``, generated from it
by ``scripts/unasync.py``).

* **Progress** (``ProgressMeter``): a stream whose round declared a size reports the answer's
  tokens received so far every ``PROGRESS_EVERY`` seconds (the cap line's fit, design §4,
  refinement 5), and its round ends with the tokens received in all. Mid-stream the count is the
  usage the items carried or, when larger, the answer's characters / 4 (no SDK counts tokens
  before its last event); at the end the usage's own count wins when there is one.
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

from ._common import log
from ._prices import UsageTracker, _get, output_tokens

#: Seconds between a stream's progress reports: the pool clock's period (``grow_interval``'s
#: default), so each clock tick sees fresh progress and a stream costs one call per period.
PROGRESS_EVERY = 15.0
#: Characters per token of an answer's text, for the count before the usage arrives.
CHARS_PER_TOKEN = 4.0


# -- progress -----------------------------------------------------------------------------------------
def answer_chars(item: Any) -> int:
    """Characters of answer one stream item carries: an OpenAI chat chunk's deltas (content, tool
    call arguments), a Responses or stream-helper event's text delta, an Anthropic
    ``content_block_delta`` (text, tool input JSON, thinking)."""
    n = 0
    for choice in _get(item, "choices") or ():
        delta = _get(choice, "delta")
        content = _get(delta, "content")
        n += len(content) if isinstance(content, str) else 0
        for call in _get(delta, "tool_calls") or ():
            args = _get(_get(call, "function"), "arguments")
            n += len(args) if isinstance(args, str) else 0
    delta = _get(item, "delta")
    if isinstance(delta, str):
        return n + len(delta)
    for name in ("text", "partial_json", "thinking"):
        part = _get(delta, name)
        n += len(part) if isinstance(part, str) else 0
    return n


class ProgressMeter:
    """The answer tokens a stream has received, and when its round should next report them."""

    def __init__(self, report: Callable[[float], Any] | None, clock: Callable[[], float] = time.monotonic):
        self.report = report  # None: the round declared no size, nothing is counted
        self.chars = 0
        self.sent = 0.0
        self._clock = clock
        self._last = clock()

    def see(self, item: Any, usage: UsageTracker) -> float | None:
        """Count one item; the tokens to report now, or None (not due, nothing new)."""
        if self.report is None:
            return None
        self.chars += answer_chars(item)
        now = self._clock()
        if now - self._last < PROGRESS_EVERY:
            return None
        got = max(output_tokens(usage.flat) or 0, math.ceil(self.chars / CHARS_PER_TOKEN))
        if got <= self.sent:
            return None
        self._last, self.sent = now, float(got)
        return self.sent

    def received(self, usage: UsageTracker) -> float | None:
        """The tokens received in all: the usage's count, else the characters' estimate."""
        if self.report is None:
            return None
        exact = output_tokens(usage.flat)
        return float(exact if exact is not None else math.ceil(self.chars / CHARS_PER_TOKEN))


def _report_failed(exc: BaseException) -> None:
    # progress is advice to the estimate: a failed report never fails the caller's stream
    log.warning("stream_progress_failed", error=repr(exc))


# -- streams ------------------------------------------------------------------------------------------
class _StreamBase:
    """What the sync and async stream proxies share: the inner stream, the usage seen, the
    progress meter, and everything else passed through (``response``, ``text_stream``,
    ``get_final_message`` ...). ``report(tokens)``: the round's progress call, None when the
    round declared no size."""

    def __init__(self, inner: Any, end: Callable[..., Any], report: Callable[[float], Any] | None = None):
        self.inner = inner
        self.usage = UsageTracker()
        self.meter = ProgressMeter(report)
        self._end = end
        self._ended = False

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "usage", "meter", "_end", "_ended"):  # not set yet (a failed __init__)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _ending(self) -> bool:
        """True once: the caller that gets it ends the round."""
        if self._ended:
            return False
        self._ended = True
        self.usage.see_snapshot(self.inner)
        return True
