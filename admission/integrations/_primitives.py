"""What really differs between the integrations' asyncio code (the ``*_async.py`` sources) and
the sync code generated from it (``*_sync.py``, by ``scripts/unasync.py``): entering and leaving
a round in a copy of the caller's context (as a task, shielded, under asyncio), and ending the
round of a stream dropped unclosed (on its loop, under asyncio). As in ``admission/_primitives``,
each comes in two flavours: ``aname`` (asyncio) / ``name`` (sync).
"""
from __future__ import annotations

import asyncio
import contextvars
from typing import Any

from ._common import log

_TASKS: set[asyncio.Task] = set()  # tasks started from a finalizer, kept until they end


def _exc_args(exc: BaseException | None) -> tuple:
    return (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)


# -- a round entered and left in a copy of the caller's context -------------------------------
async def aenter_in(ctx: contextvars.Context, cm: Any) -> Any:
    """``cm.__aenter__()`` as a task in ``ctx``. A caller cancelled just as the round was seated
    leaves the round at once (shielded), then sees its cancellation."""
    task = asyncio.get_running_loop().create_task(cm.__aenter__(), context=ctx)
    try:
        return await task
    except BaseException as exc:
        if task.done() and not task.cancelled() and task.exception() is None:
            await aexit_in(ctx, cm, exc)  # seated as the caller was cancelled
        raise


def enter_in(ctx: contextvars.Context, cm: Any) -> Any:
    return ctx.run(cm.__enter__)


async def aexit_in(ctx: contextvars.Context, cm: Any, exc: BaseException | None) -> None:
    """``cm.__aexit__`` as a task in ``ctx``, shielded from the caller's cancellation."""
    task = asyncio.get_running_loop().create_task(cm.__aexit__(*_exc_args(exc)), context=ctx)
    await asyncio.shield(task)


def exit_in(ctx: contextvars.Context, cm: Any, exc: BaseException | None) -> None:
    ctx.run(cm.__exit__, *_exc_args(exc))


# -- a stream dropped unclosed ----------------------------------------------------------------------
def arunning_loop() -> asyncio.AbstractEventLoop:
    """The loop an asyncio stream's finalizer ends its round on."""
    return asyncio.get_running_loop()


def running_loop() -> None:
    return None  # a sync stream's finalizer ends its round where it runs


def aend_unclosed(obj: Any, what: str, hint: str) -> None:
    """A finalizer's part: end the round of ``obj`` (a stream) left unclosed, logged, as a task
    on the loop it was made in (a finalizer may run in any thread, and cannot await)."""
    loop = obj.__dict__.get("_loop")
    if not obj.__dict__.get("_ended", True) and loop is not None and not loop.is_closed():
        log.warning(f"{what}_not_closed", hint=hint)
        loop.call_soon_threadsafe(_spawn, loop, obj._finish(None))


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


def _spawn(loop: asyncio.AbstractEventLoop, coro: Any) -> None:
    task = loop.create_task(coro)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)
