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
from typing import Any, AsyncIterator, Callable, Iterable, Mapping

import redis
import redis.asyncio as aredis
from ._log import get_logger

from . import scripts
from .base import CURRENT_HANDLE, CURRENT_ROUND, ClientBase, charge_record, release_record, translated
from .outbox import Retry
from .classify import outcome_of, retry_after_of
from .client import CONNECT_TIMEOUT, SOCKET_TIMEOUT, Round, fail_fast_options, policy_of
from .core import (UNREACHABLE, Bound, Call, Charged, Core, Decision, Progress, Released, Retried, Rollover, Seat, Tick,
                   decode_ledger)
from .errors import AdmissionError, BadArgument, NoPolicy, UnknownSeat, NotYourSeat, Unavailable, WaitTimeout

log = get_logger("admission")

#: close(): seconds between cancels of the clock task until it ends.
CANCEL_AGAIN = 0.1


class AsyncRound(Round):
    async def report(self, signal: str, retry_after: float | None = None) -> Released:  # type: ignore[override]
        return await self._adm.report(self.seat, signal=signal, retry_after=retry_after)

    async def charge(self, cost_usd: float, key: str) -> Charged:  # type: ignore[override]
        return await self._adm.charge(self.seat, cost_usd=cost_usd, key=key)

    async def progress(self, tokens: float) -> Progress:  # type: ignore[override]
        return await self._adm.progress([(self.seat, tokens)])


class AsyncAdmission(ClientBase):
    """One pod's handle on one mesh, for asyncio workers."""

    def __init__(self, client: aredis.Redis, *, mesh: str, pod: str, background: bool = True,
                 seed: int | None = None, outbox: Any = None, health: Any = False, confirm_replicas: int = 0,
                 confirm_timeout: float = 0.25):
        """The options of the sync ``Admission``; ``confirm_replicas`` needs a single server or
        Sentinel (redis.asyncio's cluster client is not supported here)."""
        if confirm_replicas and isinstance(client, aredis.RedisCluster):
            raise BadArgument("confirm_replicas is not supported with redis.asyncio.RedisCluster")
        super().__init__(client, mesh=mesh, pod=pod, background=background, seed=seed, outbox=outbox,
                         health=health, confirm_replicas=confirm_replicas, confirm_timeout=confirm_timeout)
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

    async def _exec_ledger(self, call: Call, replicas: int) -> tuple[Any, int]:
        if not replicas:
            return await self._exec_or_raise(call), 0
        with translated():
            reply, acked = await scripts.acall_confirmed(self.redis, call.script, call.keys, call.args, replicas,
                                                         self._confirm_ms)
        return call.decode(reply), acked

    async def apply_policy(self, policy: str | Path | Mapping[str, Any], expected_version: int | None = None, *,
                           recovery_hold: bool = True, now: float | None = None) -> int:
        applied = await self._exec_or_raise(self.core.apply(policy_of(policy), expected_version,
                                                            recovery_hold=recovery_hold, now=now))
        return applied.version

    async def policy(self) -> dict[str, Any]:
        return self._policy_of(await self.redis.hmget(self.core.config_key, "version", "policy"))

    async def tunables(self) -> dict[str, float]:
        return self._note_tunables(*await self.redis.hmget(self.core.config_key, *self.POLICY_FIELDS))

    async def _know_policy(self) -> None:
        if self._tunables_version < 0:
            try:
                await self.tunables()
            except UNREACHABLE:
                pass  # the ask itself will say so

    async def try_admit(self, *, lane: str | None = None, model: str, round_id: str, agent: str | None = None,
                        now: float | None = None, draw: float | None = None, wait: bool = False,
                        parent: str | None = None, revision: int | None = None,
                        alternatives: list[str] | None = None, borrow: str | None = None,
                        move_to: Callable[[str], bool] | None = None, tokens: float | None = None,
                        input_tokens: float | None = None, max_tokens: float | None = None) -> Decision:
        """As the sync client's: refused on ``model``, the round moves to the first alternative
        that admits it, in one call, only where the caller can call (``move_to``: the pools it can run
        on, in a Thompson draw; ``alternatives``: its own ranking; neither: it stays on ``model``)."""
        await self._know_policy()
        lane = self._lane(lane, agent)
        if alternatives is None and not borrow:
            alternatives = self._ranking(model, lane, agent, move_to)
        wait = wait and not borrow  # a borrow never waits
        call = self.core.admit(lane=lane, model=model, round_id=round_id, agent=agent, now=now, draw=draw,
                               wait=wait, parent=parent, revision=revision, borrow=borrow,
                               alternatives=alternatives or (), on_stats=self._note_stats, tokens=tokens,
                               input_tokens=input_tokens, max_tokens=max_tokens)
        try:
            d = await self._exec(call)
        except UNREACHABLE as exc:
            log.warning("admission_unavailable", round=round_id, error=str(exc))
            d = self.core.unavailable(lane=lane, model=model, round_id=round_id, borrow=borrow)
        if self._note_decision(d, lane, wait):
            self._ensure_clock()
        if self._stale_tunables(d):  # a new policy: its moves for the next ask
            try:
                await self.tunables()
            except UNREACHABLE:
                pass
        if d.moved_from:
            log.info("round_moved", round=round_id, lane=d.lane, asked=d.moved_from, pool=d.pool, reason=d.reason)
        return d

    async def report(self, seat: Seat, *, signal: str, now: float | None = None,
                     retry_after: float | None = None, ceiling: str | None = None,
                     reset_s: float | None = None) -> Released:
        return await self._exec_or_raise(self.core.report(seat, signal=signal, now=now, retry_after=retry_after,
                                                          ceiling=ceiling, reset_s=reset_s))

    async def progress(self, received: Iterable[tuple[Seat, float]], now: float | None = None) -> Progress:
        """See ``Admission.progress``."""
        return await self._exec_or_raise(self.core.progress(received, now=now))

    async def release(self, seat: Seat, *, outcome: str = "clean", seconds: float = 0.0,
                      cost_usd: float | None = None, now: float | None = None, at: float | None = None,
                      retry_after: float | None = None, received: float | None = None, usage: Any = None,
                      ceiling: str | None = None, reset_s: float | None = None) -> Released:
        call = self.core.release(seat, outcome=outcome, seconds=seconds, cost_usd=cost_usd, now=now, at=at,
                                 retry_after=retry_after, received=received, usage=usage, ceiling=ceiling,
                                 reset_s=reset_s)
        self._book.drop(seat.id)  # never renewed again, whatever the answer
        released, acked = await self._exec_ledger(call, self._confirming())
        if acked < self._confirm_replicas:  # applied, but a failover could still lose it: it waits
            await asyncio.to_thread(self._queue, release_record(seat, outcome, seconds, cost_usd, at, retry_after,
                                                                   received, usage=usage, ceiling=ceiling,
                                                                   reset_s=reset_s),
                                    str(self._unconfirmed(acked)))
        if released.stats is not None:
            self._note_stats({released.pool: released.stats})
        return released

    async def charge(self, seat: Seat, *, cost_usd: float, key: str, at: float | None = None,
                     now: float | None = None) -> Charged:
        call = self.core.charge(seat, cost_usd=cost_usd, key=key, at=at, now=now)
        try:
            charged, acked = await self._exec_ledger(call, self._confirming())
        except (Unavailable, NoPolicy) as exc:
            await asyncio.to_thread(self._queue, charge_record(seat, cost_usd, key, at), type(exc).__name__)
            return Charged(False, "", "", queued=True)
        if acked < self._confirm_replicas:
            await asyncio.to_thread(self._queue, charge_record(seat, cost_usd, key, at), str(self._unconfirmed(acked)))
        return charged

    async def flush(self) -> int:
        """Replay the ledger records waiting for Redis now; returns how many still wait. The
        outbox's own work (file and fsync) runs in a thread, the calls on this loop."""
        loop = asyncio.get_running_loop()

        def apply(record):
            return asyncio.run_coroutine_threadsafe(self._apply_record(record), loop).result()

        await asyncio.to_thread(self._pending.replay, apply)
        return len(self._pending)

    # -- the fence between planes ------------------------------------------------------------------
    async def retry(self, seat: Seat, *, now: float | None = None, attempt: str | None = None) -> Retried:
        """An attempt of this seated round failed: spend one retry of the plane where it ran
        (``retry_same_plane``), or learn that none is left (``compensate_or_shed``: compensate or
        drop inside that plane; never retry on another plane's budget). The count is kept in
        Redis beside the intent, so a restarted pod goes on from it. ``attempt``: a key of the
        failed attempt, so a retry sent again after a lost reply spends nothing more."""
        return await self._exec_or_raise(self.core.retry(seat, now, attempt))

    async def bind(self, seat: Seat | str, revision: int, *, now: float | None = None) -> Bound:
        """Bind a result to the revision it observed: ``reject_stale_revision`` when the intent's
        watermark has moved past it (never replay it onto the primary; release the attempt's
        seat inside its own plane)."""
        rid = seat if isinstance(seat, str) else seat.id
        return await self._exec_or_raise(self.core.bind(action="bind", round_id=rid, revision=revision, now=now))

    async def advance(self, round_id: str, revision: int, *, now: float | None = None) -> Bound:
        """The intent moved on to ``revision`` (the fixture changed): older results are stale."""
        return await self._exec_or_raise(self.core.bind(action="advance", round_id=round_id, revision=revision, now=now))

    async def report_health(self, pool: str, *, depth: int, running: int | None = None, ok: bool = True,
                      at: float | None = None, now: float | None = None) -> float:
        """Write a health sample of a plane (a lease: fresh for the pool's health_max_age);
        returns until when it counts as capacity."""
        return await self._exec_or_raise(self.core.health(pool=pool, depth=depth, running=running, ok=ok, at=at, now=now))

    async def report_budget(self, reading: Any, now: float | None = None) -> dict[str, Any]:
        return await self._exec_or_raise(self.core.budget(provider=reading.provider, limit_usd=reading.limit_usd,
                                                          spent_usd=reading.spent_usd, at=reading.at, now=now))

    async def close_provider(self, provider: str, *, why: str, seconds: float | None = None,
                             now: float | None = None) -> float:
        return await self._exec_or_raise(self.core.closure(action="close", provider=provider, why=why,
                                                           seconds=seconds, now=now))

    async def reopen_provider(self, provider: str, *, why: str, now: float | None = None) -> None:
        await self._exec_or_raise(self.core.closure(action="reopen", provider=provider, why=why, now=now))

    async def rollover(self, now: float | None = None) -> Rollover:
        return await self._exec_or_raise(self.core.rollover(now))

    async def ledger(self, day: str) -> dict[str, dict[str, float]]:
        return decode_ledger(await self.redis.hgetall(f"adm:{{{self.mesh}}}:spend:{day}"))

    async def admit_waiting(self, *, lane: str | None = None, model: str, round_id: str, timeout: float = 600.0,
                            agent: str | None = None, parent: str | None = None,
                            revision: str | None = None, move_to: Callable[[str], bool] | None = None,
                            tokens: float | None = None, input_tokens: float | None = None,
                            max_tokens: float | None = None) -> Decision:
        """As the sync client's: every way out that is not an admission (timeout, an error, a
        cancellation such as ``asyncio.timeout``) leaves the book and withdraws the ticket."""
        deadline = time.monotonic() + timeout
        await self._know_policy()
        lane = self._lane(lane, agent)
        ask = dict(lane=lane, model=model, round_id=round_id, agent=agent, parent=parent, revision=revision,
                   move_to=move_to, tokens=tokens, input_tokens=input_tokens, max_tokens=max_tokens)
        self._check_free(round_id)
        self._book.wait(lane, model, round_id)
        if self.background:
            self._ensure_clock()
        d: Decision | None = None
        try:
            while True:
                gen = self._gens.get(model, 0)
                self._book.asking(round_id)
                d = await self.try_admit(**ask, wait=True)
                if d.admitted:
                    break
                await self._sleep_until_turn(model, round_id, gen, self._retry_after(d), deadline)
                if time.monotonic() >= deadline:
                    raise WaitTimeout(f"round {round_id} waited {timeout:g}s for {model} (last refusal: {d.reason})",
                                      d.reason)
        finally:
            if d is None or not d.admitted:
                self._book.leave(round_id)  # first, synchronously: even a cancelled task leaves the book
                await self._give_up(model, round_id)
        await self._wake(model)  # the next oldest may ask now
        return d

    async def _sleep_until_turn(self, pool: str, round_id: str, gen: int, interval: float, deadline: float) -> None:
        asked = time.monotonic()
        waker = self._waker(pool)
        async with waker:
            while (now := time.monotonic()) < deadline:
                if self._book.may_ask(round_id) and (self._gens.get(pool, 0) != gen or now - asked >= interval):
                    return
                rest = asked + interval - now
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(waker.wait(), min(deadline - now, rest if rest > 0 else interval))

    def _waker(self, pool: str) -> asyncio.Condition:
        if pool not in self._wakers:
            self._wakers[pool] = asyncio.Condition(self._lock)
        return self._wakers[pool]

    async def _wake(self, pool: str | None = None) -> None:
        """Wake the waiters of one pool (a release there), or of every pool (the clock)."""
        async with self._lock:
            for p in self._woken(pool) if pool else list(self._wakers):
                self._gens[p] = self._gens.get(p, 0) + 1
                self._waker(p).notify_all()

    async def _give_up(self, pool: str, round_id: str) -> None:
        """Withdraw the ticket, shielded from a second cancellation and bounded in time."""
        async def withdraw() -> None:
            await self._wake(pool)
            await self._exec(self.core.withdraw(round_id))
        try:
            await asyncio.wait_for(asyncio.shield(withdraw()), timeout=2)
        except BaseException as exc:  # noqa: BLE001 - the ticket's lease expires on its own
            log.info("withdraw_failed", round=round_id, error=repr(exc))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise

    @contextlib.asynccontextmanager
    async def round(self, *, lane: str | None = None, model: str, round_id: str, timeout: float = 600.0,
                    agent: str | None = None, parent: str | None = None,
                    revision: str | None = None,
                    move_to: Callable[[str], bool] | None = None,
                    tokens: float | None = None, input_tokens: float | None = None,
                    max_tokens: float | None = None) -> AsyncIterator[AsyncRound]:
        """As the sync client's; a nested ``round()`` in this task (or a task it starts) is this
        round's delegated sub-round."""
        d = self._own(await self.admit_waiting(lane=lane, model=model, round_id=round_id, timeout=timeout,
                                               agent=agent, parent=self._parent(parent), revision=revision,
                                               move_to=move_to, tokens=tokens,
                                               input_tokens=input_tokens, max_tokens=max_tokens))
        handle, started = AsyncRound(self, d), time.monotonic()  # type: ignore[arg-type]
        token, held = CURRENT_ROUND.set(d.round_id), CURRENT_HANDLE.set(handle)
        try:
            yield handle
        except BaseException as exc:
            await self._finish(handle, outcome_of(exc), started, raising=False, retry_after=retry_after_of(exc))
            raise
        else:
            await self._finish(handle, handle.outcome or "clean", started, raising=True)
        finally:
            with contextlib.suppress(ValueError):  # exited in another context than entered
                CURRENT_ROUND.reset(token)
                CURRENT_HANDLE.reset(held)

    async def _finish(self, handle: Round, outcome: str, started: float, raising: bool,
                      retry_after: float | None = None) -> None:
        self._book.drop(handle.seat.id)
        record, bad = self._exit_record(handle, outcome, time.monotonic() - started, retry_after)
        try:
            await asyncio.shield(self._apply_record(record, self._confirming()))
        except Retry as exc:
            await asyncio.to_thread(self._queue, record, str(exc))
        except asyncio.CancelledError:
            self._queue(record, "cancelled")  # replayed by the clock; release and charge count once
            raise
        except AdmissionError:
            pass  # refused for good: recorded by _apply_record
        if bad is not None and raising:
            raise bad

    async def _apply_record(self, record: dict[str, Any], replicas: int | None = None) -> None:
        want = self._confirm_replicas if replicas is None else replicas
        call, lost_seat_charge = self._calls(record, self.core)
        try:
            try:
                _, acked = await self._exec_ledger(call, want)
            except UnknownSeat as exc:
                acked = want
                if lost_seat_charge is not None:
                    _, acked = await self._exec_ledger(lost_seat_charge, want)
                self._unapplied(record, exc, cost_booked=lost_seat_charge is not None)
        except (Unavailable, NoPolicy) as exc:
            raise Retry(type(exc).__name__) from exc
        except AdmissionError as exc:
            self._unapplied(record, exc)
            raise
        if acked < self._confirm_replicas:
            raise self._unconfirmed(acked)

    async def heartbeat(self, now: float | None = None):
        snap = self._book.snapshot()
        hb = await self._exec_or_raise(self.core.heartbeat(snap.seats_list(), list(snap.tickets), now))
        lost, lost_tickets, pools = self._note_heartbeat(snap, hb, now)
        for pool in pools:
            await self._wake(pool)
        if lost or hb.reasserted or lost_tickets:
            log.warning("heartbeat_repair", lost=lost, reasserted=hb.reasserted, lost_tickets=lost_tickets)
        return hb

    async def tick(self, now: float | None = None) -> Tick:
        return await self._exec_or_raise(self.core.tick(now))

    async def _watchdog(self) -> None:
        t = self._tunables
        for held, signal in self._book.overdue(t["stall_after"], t["round_cap"]):
            try:
                await self.report(held.seat, signal=signal)
            except NotYourSeat:
                pass
            except AdmissionError as exc:
                log.warning("report_retry", round=held.seat.id, signal=signal, error=str(exc))
                continue
            log.warning("round_overdue", round=held.seat.id, signal=signal)
            self._book.signalled(held, signal)

    async def _step(self, name: str, fn) -> bool:
        try:
            await fn()
            return True
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # keep the clock alive through outages
            log.warning("clock_error", step=name, error=repr(exc))
            return False

    async def _beat(self) -> None:
        await self.tunables()
        await self.heartbeat()

    async def _sample_health(self) -> None:
        if self._health_stale():
            self._health_rebuild(await self.policy())
        due = self._health_due()
        if due:
            await self._health_run.arun_once(self, due)

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
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("clock_error", step="wake-ups", error=repr(exc))
                pubsub = None
                await asyncio.sleep(0.5)
            now = time.monotonic()
            if now >= next_beat:
                if await self._step("heartbeat", self._beat):
                    next_beat = now + self._tunables["lease_ttl"] / 3
                await self._step("watchdog", self._watchdog)
            if len(self._pending):  # every turn: a backlog of ledger records drains as Redis answers
                await self._step("pending", self.flush)
            if self._health:
                await self._step("health", self._sample_health)
            if now >= next_tick:
                await self._step("tick", self.tick)
                next_tick = now + self._tunables["grow_interval"]
                await self._wake()

    async def close(self) -> None:
        """Stop the clock. A cancel can be lost: on Python 3.11 redis-py's ``asyncio.wait_for``
        swallows one that lands just as a command finishes sending, and the clock goes on; so
        cancel again until the task has ended (a single cancel hung close() for ever)."""
        task = self._task
        if task is None:
            return
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=CANCEL_AGAIN)
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def __aenter__(self) -> "AsyncAdmission":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def census(self, now: float | None = None) -> dict[str, Any]:
        return await self._exec_or_raise(self.core.census(now))

    async def plan(self, *, lane: str | None = None, model: str, wanted: int, now: float | None = None,
                   agent: str | None = None, move_to: Callable[[str], bool] | None = None) -> int:
        return sum((await self.plan_pools(lane=lane, pools=[model], wanted=wanted, now=now, agent=agent,
                                          move_to=move_to)).values())

    async def plan_pools(self, *, lane: str | None = None, pools: list[str] | None, wanted: int,
                         now: float | None = None, agent: str | None = None,
                         move_to: Callable[[str], bool] | None = None) -> dict[str, int]:
        if move_to is not None:
            await self._know_policy()
        return await self._exec_or_raise(self.core.plan(lane=lane, pools=pools, wanted=wanted, now=now, agent=agent,
                                                        moves=self._movable(move_to)))

    async def allowance(self, *, lane: str | None = None, now: float | None = None, wanted: int = 10_000,
                        agent: str | None = None, move_to: Callable[[str], bool] | None = None) -> int:
        return sum((await self.plan_pools(lane=lane, pools=None, wanted=wanted, now=now, agent=agent,
                                          move_to=move_to)).values())
