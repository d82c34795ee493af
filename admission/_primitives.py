"""What really differs between the asyncio client (``aio.py``, the source) and the sync client
generated from it (``client.py``, by ``scripts/unasync.py``): the lock, the clock (a task or a
thread), where blocking work runs, and shielding from cancellation. Each primitive comes in two
flavours with the same methods: ``AsyncX`` / ``X`` for classes, ``aname`` / ``name`` for
functions (the generator renames the first into the second, as ``scripts.acall`` / ``call``).
"""
from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, Awaitable, Callable

import redis.asyncio as aredis

from .errors import BadArgument

#: AsyncClock.stop(): seconds between cancels of the clock task until it ends.
CANCEL_AGAIN = 0.1


# -- the lock the pool's waiters sleep on, and the pod's book ----------------------------------
class AsyncCondition:
    def __init__(self, cond: asyncio.Condition) -> None:
        self._cond = cond

    async def wait(self, timeout: float) -> None:
        """Sleep (with the lock held) until notified or ``timeout`` s have passed."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._cond.wait(), timeout)

    def notify_all(self) -> None:
        self._cond.notify_all()


class Condition:
    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond

    def wait(self, timeout: float) -> None:
        self._cond.wait(timeout)

    def notify_all(self) -> None:
        self._cond.notify_all()


class AsyncLock:
    """The lock of the pool's wake-ups (``async with``) and its conditions. ``book`` guards the
    pod's book: nothing under asyncio, where one task runs at a time and no code awaits while it
    reads or writes the book."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.book: Any = contextlib.nullcontext()

    async def __aenter__(self) -> None:
        await self._lock.acquire()

    async def __aexit__(self, *exc: Any) -> None:
        self._lock.release()

    def condition(self) -> AsyncCondition:
        return AsyncCondition(asyncio.Condition(self._lock))


class Lock:
    """The sync flavour: one re-entrant lock for the wake-ups and the book (the clock's thread
    and the workers' threads share both)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.book: Any = self._lock

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def condition(self) -> Condition:
        return Condition(threading.Condition(self._lock))


# -- the pod's clock --------------------------------------------------------------------------
class AsyncClock:
    """The clock as a task on the running loop; it stops by cancellation. Asked for where no
    loop runs (an ``AsyncAdmission`` built before ``asyncio.run``), it starts at the client's
    first awaited call (``resume``)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._task: asyncio.Task | None = None
        self._due: Callable[[], Awaitable[None]] | None = None

    def start(self, run: Callable[[], Awaitable[None]]) -> None:
        """Start ``run`` unless the clock runs already."""
        if self._task is not None and not self._task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._due = run
            return
        self._due = None
        self._task = loop.create_task(run(), name=self._name)  # type: ignore[arg-type]

    def resume(self) -> None:
        """Start a clock asked for before a loop ran."""
        if self._due is not None:
            self.start(self._due)

    def stopped(self) -> bool:
        return False  # the task ends by cancellation

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def stop(self) -> None:
        """A cancel can be lost: on Python 3.11 redis-py's ``asyncio.wait_for`` swallows one that
        lands just as a command finishes sending, and the clock goes on; so cancel again until
        the task has ended (a single cancel hung close() for ever)."""
        self._due = None
        task = self._task
        if task is None:
            return
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_AGAIN)
        with contextlib.suppress(asyncio.CancelledError):
            await task


class Clock:
    """The clock as a daemon thread; it stops at its next turn once ``stop`` is called."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    def start(self, run: Callable[[], None]) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=run, name=self._name, daemon=True)
            self._thread.start()

    def resume(self) -> None:
        pass  # a thread starts wherever it is asked for

    def stopped(self) -> bool:
        return self._stop.is_set()

    def sleep(self, seconds: float) -> None:
        self._stop.wait(seconds)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


# -- blocking work and cancellation -------------------------------------------------------------
async def ablocking(fn: Callable[..., Any], *args: Any) -> Any:
    """Blocking work (the outbox's file writes and fsyncs) in a thread, off the loop."""
    return await asyncio.to_thread(fn, *args)


def blocking(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)  # a worker's thread may block


async def ablocking_calling(fn: Callable[[Callable[[Any], Any]], Any], step: Callable[[Any], Awaitable[Any]]) -> Any:
    """``fn(apply)`` in a thread, where each ``apply(x)`` runs the coroutine ``step(x)`` on this
    loop (the outbox's replay: its files in a thread, its calls on the loop)."""
    loop = asyncio.get_running_loop()

    def apply(x: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(step(x), loop).result()  # type: ignore[arg-type]

    return await asyncio.to_thread(fn, apply)


def blocking_calling(fn: Callable[[Callable[[Any], Any]], Any], step: Callable[[Any], Any]) -> Any:
    return fn(step)


async def ashielded(aw: Awaitable[Any], *, timeout: float | None = None,
                    on_cancel: Callable[[], Any] | None = None) -> Any:
    """Await ``aw`` shielded from the caller's cancellation (it goes on), for at most
    ``timeout`` s; a cancelled caller runs ``on_cancel`` first."""
    try:
        return await asyncio.wait_for(asyncio.shield(aw), timeout)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        raise


def shielded(result: Any, *, timeout: float | None = None, on_cancel: Callable[[], Any] | None = None) -> Any:
    return result  # nothing cancels a thread: the call has run


def acheck_confirm(client: Any, replicas: int) -> None:
    if replicas and isinstance(client, aredis.RedisCluster):
        raise BadArgument("confirm_replicas is not supported with redis.asyncio.RedisCluster")


def check_confirm(client: Any, replicas: int) -> None:
    pass  # the sync client confirms on a single server, Sentinel and Cluster
