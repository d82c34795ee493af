"""Rounds that outlive the call that opened them, and the streams that hold them.

* **Rounds that outlive the call** (``HeldRound``, ``AsyncHeldRound``): a stream's round is
  opened by the call and closed when the stream ends, in a copy of the caller's context, so the
  caller does not find itself "inside" that round after the call returned (no join into it, no
  delegation under it).
* **Streams** (``RoundStream``, ``AsyncRoundStream`` and the managers of the SDKs' ``.stream()``
  helpers): the round ends when the stream is exhausted, closed or left (``with``), or fails
  (classified); a stream dropped unclosed ends its round when it is collected (logged).
* **Progress** (``ProgressMeter``): a stream whose round declared a size reports the answer's
  tokens received so far every ``PROGRESS_EVERY`` seconds (the cap line's fit, design §4,
  refinement 5), and its round ends with the tokens received in all. Mid-stream the count is the
  usage the items carried or, when larger, the answer's characters / 4 (no SDK counts tokens
  before its last event); at the end the usage's own count wins when there is one.
"""
from __future__ import annotations

import asyncio
import contextvars
import math
import threading
import time
from typing import Any, Callable

from ._common import log
from ._prices import UsageTracker, _get, output_tokens

#: Seconds between a stream's progress reports: the pool clock's period (``grow_interval``'s
#: default), so each clock tick sees fresh progress and a stream costs one call per period.
PROGRESS_EVERY = 15.0
#: Characters per token of an answer's text, for the count before the usage arrives.
CHARS_PER_TOKEN = 4.0


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
        end_unclosed(self, "stream", "close the stream or use it in a with-block; its round ends now")


class AsyncRoundStream(_StreamBase):
    """``RoundStream`` for asyncio streams (``async for``, ``await close()``, ``async with``)."""

    def __init__(self, inner: Any, end: Callable[..., Any], report: Callable[[float], Any] | None = None):
        super().__init__(inner, end, report)
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
        got = self.meter.see(item, self.usage)
        if got is not None:
            try:
                await self.meter.report(got)  # type: ignore[misc]
            except Exception as exc:  # noqa: BLE001 - see _report_failed
                _report_failed(exc)
            except BaseException as exc:  # cancelled while reporting: the round ends as if while reading
                await self._finish(exc)
                raise
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

    def __init__(self, start: Callable[[], tuple[Any, Any, Callable[..., Any], Any]]):
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


class AsyncRoundStreamManager:
    """``RoundStreamManager`` for ``async with``."""

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
