"""Rounds that outlive the call that opened them, and the streams that hold them (asyncio: the
source of ``_streams_sync.py``, which ``scripts/unasync.py`` generates from it).

* **Rounds that outlive the call** (``AsyncHeldRound``): a stream's round is opened by the call
  and closed when the stream ends, in a copy of the caller's context, so the caller does not
  find itself "inside" that round after the call returned (no join into it, no delegation under
  it). Under asyncio each step runs as a task in that copy, the release shielded from the
  caller's cancellation (``aenter_in``, ``aexit_in``).
* **Streams** (``AsyncRoundStream`` and the manager of the SDKs' ``.stream()`` helpers): the
  round ends when the stream is exhausted, closed or left (``async with``), or fails
  (classified); a stream dropped unclosed ends its round when it is collected (logged).
"""
from __future__ import annotations

import contextvars
import threading
from typing import Any, Callable

from ._primitives import aend_unclosed, aenter_in, aexit_in, arunning_loop
from ._streams import _report_failed, _StreamBase


# -- rounds that outlive the call that opened them ----------------------------------------------------
class AsyncHeldRound:
    """A ``round()`` opened by one call and closed later (a stream's end), in a copy of the
    caller's context: the round's own context variables never leak into the caller's."""

    def __init__(self, cm: Any):
        self._cm, self._ctx = cm, contextvars.copy_context()
        self._open = False
        self._lock = threading.Lock()  # closed once, whichever thread ends the stream first
        self.handle: Any = None

    async def open(self) -> Any:
        self.handle = await aenter_in(self._ctx, self._cm)
        self._open = True
        return self.handle

    async def close(self, exc: BaseException | None = None) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
        await aexit_in(self._ctx, self._cm, exc)


# -- streams ------------------------------------------------------------------------------------------
class AsyncRoundStream(_StreamBase):
    """An SDK stream whose round ends with it: exhausted, closed, left (``async with``) or
    failed. ``end(exc, stream)`` is called once."""

    def __init__(self, inner: Any, end: Callable[..., Any], report: Callable[[float], Any] | None = None):
        super().__init__(inner, end, report)
        self._loop = arunning_loop()

    def __aiter__(self) -> "AsyncRoundStream":
        return self

    async def __anext__(self) -> Any:
        try:
            item = await anext(self.inner)
        except StopAsyncIteration:
            await self._finish(None)
            raise
        except BaseException as exc:
            await self._finish(exc)
            raise
        self.usage.see(item)
        got = self.meter.see(item, self.usage)
        if got is not None:
            try:
                await self.meter.report(got)  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001 - see _report_failed
                _report_failed(exc)
            except BaseException as exc:  # interrupted while reporting: the round ends as if while reading
                await self._finish(exc)
                raise
        return item

    async def close(self) -> None:
        try:
            await self.inner.close()
        finally:
            await self._finish(None)

    aclose = close  # asyncio only

    async def __aenter__(self) -> "AsyncRoundStream":
        return self

    async def __aexit__(self, _t: Any, exc: BaseException | None, _tb: Any) -> None:
        try:
            await self.inner.close()
        finally:
            await self._finish(exc)

    async def _finish(self, exc: BaseException | None) -> None:
        if self._ending():
            await self._end(exc, self)

    def __del__(self) -> None:
        aend_unclosed(self, "stream", "close the stream or leave its async with block; its round ends now")


class AsyncRoundStreamManager:
    """The manager an SDK's ``.stream(...)`` helper returns, admitted: the round opens (and the
    request goes) at ``async with``, and ends when the block is left."""

    def __init__(self, start: Callable[[], Any]):
        self._start = start
        self._inner: Any = None
        self._stream: AsyncRoundStream | None = None

    async def __aenter__(self) -> AsyncRoundStream:
        self._inner, stream, end, report = await self._start()
        self._stream = AsyncRoundStream(stream, end, report)
        return self._stream

    async def __aexit__(self, t: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            await self._inner.__aexit__(t, exc, tb)
        finally:
            await self._stream._finish(exc)  # type: ignore[union-attr]
