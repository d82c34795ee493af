"""Rounds that outlive the call that opened them, and the streams that hold them.

* **Rounds that outlive the call** (``HeldRound``, ``AsyncHeldRound``): a stream's round is
  opened by the call and closed when the stream ends, in a copy of the caller's context, so the
  caller does not find itself "inside" that round after the call returned (no join into it, no
  delegation under it).
* **Streams** (``RoundStream``, ``AsyncRoundStream`` and the managers of the SDKs' ``.stream()``
  helpers): the round ends when the stream is exhausted, closed or left (``with``), or fails
  (classified); a stream dropped unclosed ends its round when it is collected (logged).
"""
from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any, Callable

from ._common import log
from ._prices import UsageTracker


def end_unclosed(obj: Any, what: str, hint: str) -> None:
    """A finalizer's part: end the round of ``obj`` (a stream, a response body) that was left
    unclosed, logged, never raising."""
    if obj.__dict__.get("_ended", True):
        return
    log.warning(f"{what}_not_closed", hint=hint)
    try:
        obj._finish(None)
    except Exception as exc:  # noqa: BLE001 - a finalizer never raises
        log.warning(f"{what}_round_end_failed", error=repr(exc))


# -- rounds that outlive the call that opened them ----------------------------------------------------
class HeldRound:
    """A ``round()`` opened by one call and closed later (a stream's end), in a copy of the
    caller's context: the round's own context variables never leak into the caller's."""

    def __init__(self, cm: Any):
        self._cm, self._ctx = cm, contextvars.copy_context()
        self._open = False
        self._lock = threading.Lock()
        self.handle: Any = None

    def open(self) -> Any:
        self.handle = self._ctx.run(self._cm.__enter__)
        self._open = True
        return self.handle

    def close(self, exc: BaseException | None = None) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
        args = (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)
        self._ctx.run(self._cm.__exit__, *args)


class AsyncHeldRound:
    """``HeldRound`` for asyncio: each step runs as a task in the round's own context copy; the
    release is shielded from the caller's cancellation."""

    def __init__(self, cm: Any):
        self._cm, self._ctx = cm, contextvars.copy_context()
        self._open = False
        self.handle: Any = None

    async def open(self) -> Any:
        task = asyncio.get_running_loop().create_task(self._cm.__aenter__(), context=self._ctx)
        try:
            self.handle = await task
        except BaseException as exc:
            if task.done() and not task.cancelled() and task.exception() is None:
                self.handle, self._open = task.result(), True  # seated as the caller was cancelled
                await self.close(exc)
            raise
        self._open = True
        return self.handle

    async def close(self, exc: BaseException | None = None) -> None:
        if not self._open:
            return
        self._open = False
        args = (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)
        task = asyncio.get_running_loop().create_task(self._cm.__aexit__(*args), context=self._ctx)
        await asyncio.shield(task)


# -- streams ------------------------------------------------------------------------------------------
class _StreamBase:
    """What the sync and async stream proxies share: the inner stream, the usage seen, and
    everything else passed through (``response``, ``text_stream``, ``get_final_message`` ...)."""

    def __init__(self, inner: Any, end: Callable[..., Any]):
        self.inner = inner
        self.usage = UsageTracker()
        self._end = end
        self._ended = False

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "usage", "_end", "_ended"):  # not set yet (a failed __init__)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _ending(self) -> bool:
        """True once: the caller that gets it ends the round."""
        if self._ended:
            return False
        self._ended = True
        self.usage.see_snapshot(self.inner)
        return True


class RoundStream(_StreamBase):
    """An SDK stream whose round ends with it: exhausted, closed, left (``with``) or failed.
    ``end(exc, stream)`` is called once."""

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
        end_unclosed(self, "stream", "close the stream or use it in a with-block; its round ends now")


class AsyncRoundStream(_StreamBase):
    """``RoundStream`` for asyncio streams (``async for``, ``await close()``, ``async with``)."""

    def __init__(self, inner: Any, end: Callable[..., Any]):
        super().__init__(inner, end)
        self._loop = asyncio.get_running_loop()

    def __aiter__(self) -> "AsyncRoundStream":
        return self

    async def __anext__(self) -> Any:
        try:
            item = await self.inner.__anext__()
        except StopAsyncIteration:
            await self._finish(None)
            raise
        except BaseException as exc:
            await self._finish(exc)
            raise
        self.usage.see(item)
        return item

    async def close(self) -> None:
        try:
            await self.inner.close()
        finally:
            await self._finish(None)

    aclose = close

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
        loop = self.__dict__.get("_loop")
        if not self.__dict__.get("_ended", True) and loop is not None and not loop.is_closed():
            log.warning("stream_not_closed", hint="close the stream or use it in async with; its round ends now")
            loop.call_soon_threadsafe(_spawn, loop, self._finish(None))


_TASKS: set[asyncio.Task] = set()  # tasks started from a finalizer, kept until they end


def _spawn(loop: asyncio.AbstractEventLoop, coro: Any) -> None:
    task = loop.create_task(coro)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


class RoundStreamManager:
    """The manager an SDK's ``.stream(...)`` helper returns, admitted: the round opens (and the
    request goes) at ``with``, and ends when the block is left."""

    def __init__(self, start: Callable[[], tuple[Any, Any, Callable[..., Any]]]):
        self._start = start
        self._inner: Any = None
        self._stream: RoundStream | None = None

    def __enter__(self) -> RoundStream:
        self._inner, stream, end = self._start()
        self._stream = RoundStream(stream, end)
        return self._stream

    def __exit__(self, t: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self._inner.__exit__(t, exc, tb)
        finally:
            self._stream._finish(exc)  # type: ignore[union-attr]


class AsyncRoundStreamManager:
    """``RoundStreamManager`` for ``async with``."""

    def __init__(self, start: Callable[[], Any]):
        self._start = start
        self._inner: Any = None
        self._stream: AsyncRoundStream | None = None

    async def __aenter__(self) -> AsyncRoundStream:
        self._inner, stream, end = await self._start()
        self._stream = AsyncRoundStream(stream, end)
        return self._stream

    async def __aexit__(self, t: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            await self._inner.__aexit__(t, exc, tb)
        finally:
            await self._stream._finish(exc)  # type: ignore[union-attr]
