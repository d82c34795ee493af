# GENERATED from admission/integrations/_streams_async.py by scripts/unasync.py: do not edit by hand.
# Edit admission/integrations/_streams_async.py and run `python scripts/unasync.py` (tests/test_unasync.py fails while this is stale).
"""Rounds that outlive the call that opened them, and the streams that hold them (asyncio: the
source of ``_streams_sync.py``, which ``scripts/unasync.py`` generates from it).

* **Rounds that outlive the call** (``HeldRound``): a stream's round is opened by the call
  and closed when the stream ends, in a copy of the caller's context, so the caller does not
  find itself "inside" that round after the call returned (no join into it, no delegation under
  it). Under asyncio each step runs as a task in that copy, the release shielded from the
  caller's cancellation (``enter_in``, ``exit_in``).
* **Streams** (``RoundStream`` and the manager of the SDKs' ``.stream()`` helpers): the
  round ends when the stream is exhausted, closed or left (``with``), or fails
  (classified); a stream dropped unclosed ends its round when it is collected (logged).
"""
from __future__ import annotations

import contextvars
import threading
from typing import Any, Callable

from ._primitives import end_unclosed, enter_in, exit_in, running_loop
from ._streams import _report_failed, _StreamBase


# -- rounds that outlive the call that opened them ----------------------------------------------------
class HeldRound:
    """A ``round()`` opened by one call and closed later (a stream's end), in a copy of the
    caller's context: the round's own context variables never leak into the caller's."""

    def __init__(self, cm: Any):
        self._cm, self._ctx = cm, contextvars.copy_context()
        self._open = False
        self._lock = threading.Lock()  # closed once, whichever thread ends the stream first
        self.handle: Any = None

    def open(self) -> Any:
        self.handle = enter_in(self._ctx, self._cm)
        self._open = True
        return self.handle

    def close(self, exc: BaseException | None = None) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
        exit_in(self._ctx, self._cm, exc)


# -- streams ------------------------------------------------------------------------------------------
class RoundStream(_StreamBase):
    """An SDK stream whose round ends with it: exhausted, closed, left (``with``) or
    failed. ``end(exc, stream)`` is called once."""

    def __init__(self, inner: Any, end: Callable[..., Any], report: Callable[[float], Any] | None = None):
        super().__init__(inner, end, report)
        self._loop = running_loop()

    def __iter__(self) -> "RoundStream":
        return self

    def __next__(self) -> Any:
        try:
            item = next(self.inner)
        except StopIteration:
            self._finish(None)
            raise
        except BaseException as exc:
            self._finish(exc)
            raise
        self.usage.see(item)
        got = self.meter.see(item, self.usage)
        if got is not None:
            try:
                self.meter.report(got)  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001 - see _report_failed
                _report_failed(exc)
            except BaseException as exc:  # interrupted while reporting: the round ends as if while reading
                self._finish(exc)
                raise
        return item

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self._finish(None)


    def __enter__(self) -> "RoundStream":
        return self

    def __exit__(self, _t: Any, exc: BaseException | None, _tb: Any) -> None:
        try:
            self.inner.close()
        finally:
            self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if self._ending():
            self._end(exc, self)

    def __del__(self) -> None:
        end_unclosed(self, "stream", "close the stream or leave its with block; its round ends now")


class RoundStreamManager:
    """The manager an SDK's ``.stream(...)`` helper returns, admitted: the round opens (and the
    request goes) at ``with``, and ends when the block is left."""

    def __init__(self, start: Callable[[], Any]):
        self._start = start
        self._inner: Any = None
        self._stream: RoundStream | None = None

    def __enter__(self) -> RoundStream:
        self._inner, stream, end, report = self._start()
        self._stream = RoundStream(stream, end, report)
        return self._stream

    def __exit__(self, t: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self._inner.__exit__(t, exc, tb)
        finally:
            self._stream._finish(exc)  # type: ignore[union-attr]
