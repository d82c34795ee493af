"""The asyncio client: the same core (core.Core, waiting.Book) as the sync client in client.py;
only the I/O and the waiting primitives differ.

    adm = AsyncAdmission.from_url("redis://127.0.0.1:6379/0", mesh="prod", pod="pod-a")
    async with adm.round(lane="reviews", model="sonnet@anthropic", round_id="thr-1/r2") as r:
        ...
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

import redis
import redis.asyncio as aredis
import structlog

from . import scripts
from .base import ClientBase
from .classify import outcome_of
from .client import CONNECT_TIMEOUT, SOCKET_TIMEOUT, Round, fail_fast_options, policy_of
from .core import UNREACHABLE, Call, Core, Decision, Released, Seat, Tick
from .errors import Unavailable, WaitTimeout

log = structlog.get_logger("admission")


class AsyncRound(Round):
    async def report(self, signal: str) -> Released:  # type: ignore[override]
        return await self._adm.report(self.seat, signal=signal)


class AsyncAdmission(ClientBase):
    """One pod's handle on one mesh, for asyncio workers."""

    def __init__(self, client: aredis.Redis, *, mesh: str, pod: str, background: bool = True,
                 seed: int | None = None):
        super().__init__(client, mesh=mesh, pod=pod, background=background, seed=seed)
        self._lock = asyncio.Lock()
        self._wakers: dict[str, asyncio.Condition] = {}  # per pool, on one lock
        self._task: asyncio.Task | None = None

    @classmethod
    def from_url(cls, url: str, *, mesh: str, pod: str, connect_timeout: float = CONNECT_TIMEOUT,
                 socket_timeout: float = SOCKET_TIMEOUT, **kwargs: Any) -> "AsyncAdmission":
        client = aredis.Redis.from_url(url, **fail_fast_options(connect_timeout, socket_timeout))
        return cls(client, mesh=mesh, pod=pod, **kwargs)

    async def _exec(self, call: Call):
        try:
            reply = await scripts.acall(self.redis, call.script, call.keys, call.args)
        except redis.ResponseError as exc:
            raise Core.translate(exc) from None
        return call.decode(reply)

    async def _exec_or_raise(self, call: Call):
        try:
            return await self._exec(call)
        except UNREACHABLE as exc:
            raise Unavailable(f"admission unavailable: {exc}") from exc

    async def apply_policy(self, policy: str | Path | Mapping[str, Any], expected_version: int | None = None) -> int:
        return await self._exec_or_raise(self.core.apply(policy_of(policy), expected_version))

    async def policy(self) -> dict[str, Any]:
        return self._policy_of(await self.redis.hmget(self.core.config_key, "version", "policy"))

    async def tunables(self) -> dict[str, float]:
        return self._note_tunables(*await self.redis.hmget(self.core.config_key, "version", "tunables"))

    async def try_admit(self, *, lane: str, model: str, round_id: str, agent: str | None = None,
                        now: float | None = None, draw: float | None = None, wait: bool = False,
                        parent: str | None = None, revision: str | None = None) -> Decision:
        call = self.core.admit(lane=lane, model=model, round_id=round_id, agent=agent, now=now, draw=draw,
                               wait=wait, parent=parent, revision=revision)
        try:
            d = await self._exec(call)
        except UNREACHABLE as exc:
            log.warning("admission_unavailable", round=round_id, error=str(exc))
            return self.core.unavailable(lane=lane, model=model, round_id=round_id)
        if self._note_decision(d, lane, wait):
            self._ensure_clock()
        return d

    async def report(self, seat: Seat, *, signal: str, now: float | None = None) -> Released:
        return await self._exec_or_raise(self.core.report(seat, signal=signal, now=now))

    async def release(self, seat: Seat, *, outcome: str = "clean", seconds: float = 0.0,
                      cost_usd: float | None = None, now: float | None = None) -> Released:
        r = await self._exec_or_raise(self.core.release(seat, outcome=outcome, seconds=seconds,
                                                        cost_usd=cost_usd, now=now))
        self._book.drop(seat.id)
        return r

    async def admit_waiting(self, *, lane: str, model: str, round_id: str, timeout: float = 600.0,
                            agent: str | None = None, parent: str | None = None,
                            revision: str | None = None) -> Decision:
        deadline = time.monotonic() + timeout
        ask = dict(lane=lane, model=model, round_id=round_id, agent=agent, parent=parent, revision=revision)
        self._book.enqueue(lane, model, round_id)
        d = await self.try_admit(**ask, wait=True)
        while not d.admitted:
            waker = self._waker(model)
            async with waker:
                while (left := deadline - time.monotonic()) > 0:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(waker.wait(), min(left, self._tunables["grow_interval"]))
                    if self._book.is_oldest(lane, model, round_id):
                        break
            if time.monotonic() >= deadline:
                self._book.dequeue(lane, model, round_id)
                with contextlib.suppress(*UNREACHABLE):
                    await self._exec(self.core.withdraw(round_id))
                await self._wake(model)
                raise WaitTimeout(f"round {round_id} waited {timeout:g}s for {model} (last refusal: {d.reason})")
            d = await self.try_admit(**ask, wait=True)
        await self._wake(model)  # the next oldest may ask now
        return d

    def _waker(self, pool: str) -> asyncio.Condition:
        if pool not in self._wakers:
            self._wakers[pool] = asyncio.Condition(self._lock)
        return self._wakers[pool]

    async def _wake(self, pool: str | None = None) -> None:
        """Wake the waiters of one pool (a release there), or of every pool (the clock)."""
        async with self._lock:
            for waker in [self._waker(pool)] if pool else list(self._wakers.values()):
                waker.notify_all()

    @contextlib.asynccontextmanager
    async def round(self, *, lane: str, model: str, round_id: str, timeout: float = 600.0,
                    agent: str | None = None, parent: str | None = None,
                    revision: str | None = None) -> AsyncIterator[AsyncRound]:
        d = self._own(await self.admit_waiting(lane=lane, model=model, round_id=round_id, timeout=timeout,
                                               agent=agent, parent=parent, revision=revision))
        handle, started = AsyncRound(self, d), time.monotonic()  # type: ignore[arg-type]
        try:
            yield handle
        except BaseException as exc:
            await self._finish(handle, outcome_of(exc), started)
            raise
        else:
            await self._finish(handle, handle.outcome or "clean", started)

    async def _finish(self, handle: Round, outcome: str, started: float) -> None:
        try:
            await self.release(handle.seat, outcome=outcome, seconds=time.monotonic() - started,
                               cost_usd=handle.cost_usd)
        except Unavailable:
            self._book.drop(handle.seat.id)
            log.warning("release_unavailable", round=handle.seat.id)

    async def heartbeat(self, now: float | None = None):
        seats = [h.seat for h in self._book.seats.values()]
        hb = await self._exec_or_raise(self.core.heartbeat(seats, self._book.tickets(), now))
        lost = self._note_heartbeat(hb)
        if lost or hb.reasserted or hb.lost_tickets:
            log.warning("heartbeat_repair", lost=lost, reasserted=hb.reasserted, lost_tickets=hb.lost_tickets)
        return hb

    async def tick(self, now: float | None = None) -> Tick:
        return await self._exec_or_raise(self.core.tick(now))

    def _ensure_clock(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._clock())

    async def _clock(self) -> None:
        pubsub, next_beat, next_tick = None, 0.0, 0.0
        while True:
            try:
                if pubsub is None:
                    pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
                    await pubsub.subscribe(self.core.wake_channel)
                msg = await pubsub.get_message(timeout=0.5)
                if msg is not None:
                    await self._wake(msg["data"].decode())
                now = time.monotonic()
                if now >= next_beat:
                    t = await self.tunables()
                    await self.heartbeat()
                    for held, signal in self._book.overdue(t["stall_after"], t["round_cap"]):
                        await self.report(held.seat, signal=signal)
                    next_beat = now + t["lease_ttl"] / 3
                if now >= next_tick:
                    await self.tick()
                    next_tick = now + self._tunables["grow_interval"]
                    await self._wake()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # keep the clock alive through outages
                log.warning("clock_error", error=repr(exc))
                pubsub = None
                await asyncio.sleep(0.5)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def __aenter__(self) -> "AsyncAdmission":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def census(self, now: float | None = None) -> dict[str, Any]:
        return await self._exec_or_raise(self.core.census(now))

    async def plan(self, *, lane: str, model: str, wanted: int, now: float | None = None) -> int:
        return sum((await self._exec_or_raise(self.core.plan(lane=lane, pools=[model], wanted=wanted, now=now))).values())

    async def allowance(self, *, lane: str, now: float | None = None, wanted: int = 10_000) -> int:
        return sum((await self._exec_or_raise(self.core.plan(lane=lane, pools=None, wanted=wanted, now=now))).values())
