# GENERATED from admission/aio.py by scripts/unasync.py: do not edit by hand.
# Edit admission/aio.py and run `python scripts/unasync.py` (tests/test_unasync.py fails while this is stale).
"""The client every pod's worker calls. Written once, for asyncio, in ``admission/aio.py``; the
sync client ``admission/client.py`` is generated from it by ``scripts/unasync.py``.

    adm = Admission.from_url("redis://127.0.0.1:6379/0", mesh="prod", pod="pod-a")
    with adm.round(lane="reviews", model="sonnet@anthropic", round_id="thr-1/r2") as r:
        ...   # waits when refused, heartbeats, releases on exit

Every decision is one Lua script; this class builds arguments (core.Core), keeps the pod's
leases alive and wakes its waiters. What differs between the flavours (a lock, a thread or a
task for the clock, blocking work, cancellation) is in ``_primitives.py``.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Iterator, Callable, Iterable

import redis

from . import scripts
from ._log import get_logger
from .mesh import Mesh, decode_policy
from ._primitives import Clock, Lock, blocking, blocking_calling, check_confirm, shielded
from .base import (CONNECT_TIMEOUT, CURRENT_HANDLE, CURRENT_ROUND, SOCKET_TIMEOUT, ClientBase, RoundBase,
                   charge_record, fail_fast_options, policy_of, release_record, translated)
from .classify import outcome_of, retry_after_of
from .codes import UNAVAILABLE as UNAVAILABLE_REASON, Status
from .core import UNREACHABLE, Bound, Call, Charged, Core, Decision, Progress, Released, Retried, Seat, Taken, Tick
from .errors import AdmissionError, NoPolicy, NotYourSeat, Unavailable, UnknownSeat, WaitTimeout
from .outbox import Retry

__all__ = ["Admission", "Round", "CONNECT_TIMEOUT", "SOCKET_TIMEOUT", "fail_fast_options", "policy_of"]

log = get_logger("admission")

#: A waiter that gives up withdraws its ticket within this long (else its lease expires it).
WITHDRAW_TIMEOUT = 2.0


class Round(RoundBase):
    """What ``Admission.round`` yields: the seat, and what the round will report on exit."""

    def report(self, signal: str, retry_after: float | None = None) -> Released:
        """A load or closing signal in the middle of the round (``Admission.report``); the
        seat stays held."""
        return self._adm.report(self.seat, signal=signal, retry_after=retry_after)

    def charge(self, cost_usd: float, key: str) -> Charged:
        """Book a cost mid-round (a long round's steps), once per ``key``."""
        return self._adm.charge(self.seat, cost_usd=cost_usd, key=key)

    def reserve_call(self, *, input_tokens: float | None = None, max_tokens: float | None = None,
                     timeout: float = 600.0) -> Taken:
        """Before each call this round sends to the provider: take that call's request and tokens
        (``input_tokens``, the answer budget ``max_tokens``) from its pool's rate ceilings (design
        §5.9). The round's first call is the admit's own reservation; each later one takes its
        own, and while a ceiling cannot cover it the call waits the refusal's ``wait_s``, seat
        held, up to ``timeout`` s (then ``WaitTimeout``). The release reconciles every call at
        once. When Redis cannot be reached the call goes ahead (its seat is held; the ceiling
        cannot be checked) and the answer says ``reason="admission-unavailable"``."""
        self._calls += 1
        if self._calls == 1:
            return Taken(True)
        key, deadline = f"call-{self._calls}", time.monotonic() + timeout
        while True:
            try:
                t = self._adm.take(self.seat, key=key, input_tokens=input_tokens, max_tokens=max_tokens)
            except Unavailable as exc:
                log.warning("call_not_reserved", round=self.seat.id, pool=self.pool, error=str(exc))
                return Taken(True, reason=UNAVAILABLE_REASON)
            left = deadline - time.monotonic()
            if t.taken or t.lost:
                return t
            if left <= 0:
                raise WaitTimeout(f"a call of round {self.seat.id} waited {timeout:g}s for {self.pool} "
                                  f"(last refusal: {t.reason})", t.reason)
            self._adm._clock.sleep(max(0.01, min(t.wait_s, left)))

    def progress(self, tokens: float, reading: Any = None) -> Progress:
        """The tokens this round has received so far (a declared round: the cap line's fit), with
        the provider's rate-limit headers (``reading``, default the round's ``rate_reading``):
        its scope learns from them as from the release's."""
        reading = self.rate_reading if reading is None else reading
        return self._adm.progress([(self.seat, tokens, reading)] if reading is not None else [(self.seat, tokens)])


class Admission(ClientBase):
    """One pod's handle on one mesh."""

    def __init__(self, client: redis.Redis, *, mesh: str, pod: str, background: bool = True,
                 seed: int | None = None, outbox: Any = None, health: Any = False, confirm_replicas: int = 0,
                 confirm_timeout: float = 0.25):
        """``outbox``: a file path (one per pod) where the releases and charges that meet an
        unreachable Redis wait, durably, to be replayed once; without one they wait in memory.
        ``health``: True = this pod's clock runs the planes' health samplers of the policy (each
        pool's ``health_url``); a list = these samplers (``admission.health.Sampler``).
        ``confirm_replicas``: with replicas (Sentinel, Cluster), a release or charge is confirmed
        by ``WAIT confirm_replicas`` (up to ``confirm_timeout`` s); one not confirmed waits in the
        outbox and is applied again (it counts once) until it is, so a failover loses no dollar
        (asyncio: a single server or Sentinel; redis.asyncio's cluster client is not supported)."""
        check_confirm(client, confirm_replicas)
        super().__init__(client, mesh=mesh, pod=pod, background=background, seed=seed, outbox=outbox,
                         health=health, confirm_replicas=confirm_replicas, confirm_timeout=confirm_timeout)
        self._lock = Lock()  # the pool's wake-ups; ``self._lock.book`` guards the book
        self._wakers: dict[str, Any] = {}  # per pool, on that lock
        self._clock = Clock(f"admission-clock-{pod}")
        self.ops = Mesh(client, mesh=mesh)  # the mesh's operator commands, on this connection
        # A restarted pod replays its outbox at once; the samplers run whether or not a round is
        # held. The asyncio clock is a task: built inside a running loop it starts here, built
        # before the loop runs it starts at the client's first awaited call.
        if background and (len(self._pending) or self._health):
            self._ensure_clock()

    @classmethod
    def from_url(cls, url: str, *, mesh: str, pod: str, connect_timeout: float = CONNECT_TIMEOUT,
                 socket_timeout: float = SOCKET_TIMEOUT, **kwargs: Any) -> "Admission":
        """A client that fails fast: a dead server is a shed decision within about
        connect_timeout + socket_timeout (times one quick retry)."""
        client = redis.Redis.from_url(url, **fail_fast_options(connect_timeout, socket_timeout))
        return cls(client, mesh=mesh, pod=pod, **kwargs)

    # -- plumbing ------------------------------------------------------------------------------
    def _exec(self, call: Call):
        self._clock.resume()  # a clock asked for before the loop ran starts now (a no-op for a thread)
        try:
            reply = scripts.call(self.redis, call.script, call.keys, call.args)
        except redis.ResponseError as exc:
            raise Core.translate(exc) from None
        return call.decode(reply)

    def _exec_or_raise(self, call: Call):
        try:
            return self._exec(call)
        except UNREACHABLE as exc:
            raise Unavailable(f"admission unavailable: {exc}") from exc

    def _exec_ledger(self, call: Call, replicas: int) -> tuple[Any, int]:
        """A ledger write, then (``replicas`` > 0) WAIT for that many replicas: (the result, how
        many confirmed it)."""
        if not replicas:
            return self._exec_or_raise(call), 0
        with translated():
            reply, acked = scripts.call_confirmed(self.redis, call.script, call.keys, call.args, replicas,
                                                  self._confirm_ms)
        return call.decode(reply), acked

    # -- policy --------------------------------------------------------------------------------
    def policy(self) -> dict[str, Any]:
        """The live policy with its ``version`` (what this pod runs by; ``ops`` applies one)."""
        self._clock.resume()
        return decode_policy(self.redis.hmget(self.core.config_key, "version", "policy"))

    def tunables(self) -> dict[str, float]:
        """The live tunables (re-read when the policy version changes), and with them the
        alternatives, pins and lanes of agents."""
        self._clock.resume()
        return self._note_tunables(*self.redis.hmget(self.core.config_key, *self.POLICY_FIELDS))

    def _know_policy(self) -> None:
        """The first ask of this client reads the live moves once (the clock keeps them)."""
        if self._tunables_version < 0:
            try:
                self.tunables()
            except UNREACHABLE:
                pass  # the ask itself will say so

    # -- one round -----------------------------------------------------------------------------
    def try_admit(self, *, lane: str | None = None, model: str, round_id: str, agent: str | None = None,
                  now: float | None = None, draw: float | None = None, wait: bool = False,
                  parent: str | None = None, revision: int | None = None,
                  alternatives: list[str] | None = None, borrow: str | None = None,
                  move_to: Callable[[str], bool] | None = None, tokens: float | None = None,
                  input_tokens: float | None = None, max_tokens: float | None = None) -> Decision:
        """Ask once. ``wait=True`` leaves a waiter ticket when refused (renewed by this pod's
        heartbeat). An unreachable Redis gives a refusal with reason ``admission-unavailable``.
        A refused try (``wait=False``) changes nothing: a waiter elsewhere keeps its place.
        ``lane`` may be left out when the policy names the agent's lane ([agents]).
        Refused on ``model``, the round moves to the first of the pool's alternatives that admits
        it, in one call, only when the caller says where it can call: ``move_to`` keeps the pools
        it can run on (e.g. its SDK client's provider), ranked by a Thompson draw, or
        ``alternatives`` ranks them itself. Neither: the round stays on ``model``.
        ``tokens``: the round's size as the worker knows it (prompt and answer budget); the cap
        line keeps it waiting while, at the pool's measured seconds per token, it would not end
        before ``round_cap`` (design §4)."""
        self._know_policy()
        lane = self._lane(lane, agent)
        if alternatives is None and not borrow:
            alternatives = self._ranking(model, lane, agent, move_to)
        wait = wait and not borrow  # a borrow never waits
        call = self.core.admit(lane=lane, model=model, round_id=round_id, agent=agent, now=now, draw=draw,
                               wait=wait, parent=parent, revision=revision, borrow=borrow,
                               alternatives=alternatives or (), tokens=tokens,
                               input_tokens=input_tokens, max_tokens=max_tokens)
        try:
            d = self._exec(call)
        except UNREACHABLE as exc:
            log.warning("admission_unavailable", round=round_id, error=str(exc))
            d = self.core.unavailable(lane=lane, model=model, round_id=round_id, borrow=borrow)
        if d.stats:
            self._note_stats(d.stats)
        with self._lock.book:
            clock = self._note_decision(d, lane, wait)
        if clock:
            self._ensure_clock()
        if self._stale_tunables(d):  # a new policy: its moves for the next ask
            try:
                self.tunables()
            except UNREACHABLE:
                pass
        if d.moved_from:
            log.info("round_moved", round=round_id, lane=d.lane, asked=d.moved_from, pool=d.pool, reason=d.reason)
        return d

    def report(self, seat: Seat, *, signal: str, now: float | None = None,
               retry_after: float | None = None, ceiling: str | None = None,
               reset_s: float | None = None) -> Released:
        """A load signal in the middle of a round (stall, round cap, 429); the seat stays. A
        ``retry_after`` with rate_limited pauses the pool (the provider's Retry-After). The signal
        ``ceiling`` with ``ceiling=`` (rpm, tpm, ...) and ``reset_s``: a 429 naming a spent rate
        ceiling, not load (that bucket is empty until the reset)."""
        return self._exec_or_raise(self.core.report(seat, signal=signal, now=now, retry_after=retry_after,
                                                    ceiling=ceiling, reset_s=reset_s))

    def progress(self, received: Iterable[tuple[Any, ...]], now: float | None = None) -> Progress:
        """The tokens each of this pod's running rounds has received so far, (seat, tokens) pairs
        in one call. A round that declared its size gives the cap line's fit a point for the
        stretch since its last report (design §4, refinement 5): a pool never measured has its
        line while its first rounds run. Report every 15 to 60 s of a streaming round, not per
        token. Seats that are not this pod's live ones come back in ``lost``; nothing is written
        for them. A (seat, tokens, reading) triple also carries the provider's rate-limit headers
        (``ratelimits.Reading``): the seat's scope learns from them (design §5.9)."""
        return self._exec_or_raise(self.core.progress(received, now=now))

    def release(self, seat: Seat, *, outcome: str = "clean", seconds: float = 0.0,
                cost_usd: float | None = None, now: float | None = None, at: float | None = None,
                retry_after: float | None = None, received: float | None = None, usage: Any = None,
                ceiling: str | None = None, reset_s: float | None = None, reading: Any = None) -> Released:
        """End a round: free the seat, count the outcome, book its cost (to the UTC day of ``at``,
        default now). Safe to retry after a lost reply.
        The pod stops renewing the seat first, whatever the answer: an ended round is never
        re-asserted. ``retry_after``: the provider's Retry-After (s) with a rate_limited outcome
        pauses new admissions on the pool until then (at most the tunable retry_after_max).
        ``received``: the tokens the round received in all, when its declared size was an upper
        bound (an answer budget): the cap line's fit measures its last stretch with it.
        ``reading``: the provider's rate-limit headers of the round's last response
        (``ratelimits.Reading``): the pool's ceilings learn from them (design §5.9).
        When Redis cannot apply it now (unreachable, no policy yet) the release waits in the
        outbox and is replayed once, as a round's own; the answer then says ``queued``. A seat
        Redis no longer knows raises ``UnknownSeat``, its cost booked all the same."""
        call = self.core.release(seat, outcome=outcome, seconds=seconds, cost_usd=cost_usd, now=now, at=at,
                                 retry_after=retry_after, received=received, usage=usage, ceiling=ceiling,
                                 reset_s=reset_s, reading=reading)
        record = release_record(seat, outcome, seconds, cost_usd, at, retry_after, received, usage=usage,
                                ceiling=ceiling, reset_s=reset_s, reading=reading)
        return self._end(record, call, now)

    def take(self, seat: Seat, *, key: str, input_tokens: float | None = None,
             max_tokens: float | None = None, now: float | None = None) -> Taken:
        """One more call of a running round takes its request and tokens from the pool's rate
        ceilings, once per call ``key`` (one attempt: ``Round.reserve_call`` waits and retries).
        Refused, the answer names the ceiling and its ``wait_s``; the seat stays."""
        return self._exec_or_raise(self.core.take(seat, key=key, input_tokens=input_tokens,
                                                  max_tokens=max_tokens, now=now))

    def charge(self, seat: Seat, *, cost_usd: float, key: str, at: float | None = None,
               now: float | None = None) -> Charged:
        """Book a cost to the spend ledger mid-round, once per (seat, key). When Redis cannot
        apply it now the charge waits in the outbox (``queued``) and is replayed once."""
        call = self.core.charge(seat, cost_usd=cost_usd, key=key, at=at, now=now)
        try:
            charged, acked = self._exec_ledger(call, self._confirming())
        except (Unavailable, NoPolicy) as exc:
            blocking(self._queue, charge_record(seat, cost_usd, key, at), type(exc).__name__)
            return Charged(False, "", "", queued=True)
        if acked < self._confirm_replicas:
            blocking(self._queue, charge_record(seat, cost_usd, key, at), str(self._unconfirmed(acked)))
        return charged

    def flush(self) -> int:
        """Replay the ledger records waiting for Redis now (the clock does it every beat);
        returns how many are still waiting. Under asyncio the outbox's own work (file and
        fsync) runs in a thread, the calls on the loop."""
        blocking_calling(self._pending.replay, self._apply_record)
        return len(self._pending)

    # -- the fence between planes ------------------------------------------------------------------
    def retry(self, seat: Seat, *, now: float | None = None, attempt: str | None = None) -> Retried:
        """An attempt of this seated round failed: spend one retry of the plane where it ran
        (``retry_same_plane``), or learn that none is left (``compensate_or_shed``: compensate or
        drop inside that plane; never retry on another plane's budget). The count is kept in
        Redis beside the intent, so a restarted pod goes on from it. ``attempt``: a key of the
        failed attempt, so a retry sent again after a lost reply spends nothing more."""
        return self._exec_or_raise(self.core.retry(seat, now, attempt))

    def bind(self, seat: Seat | str, revision: int, *, now: float | None = None) -> Bound:
        """Bind a result to the revision it observed: ``reject_stale_revision`` when the intent's
        watermark has moved past it (never replay it onto the primary; release the attempt's
        seat inside its own plane)."""
        rid = seat if isinstance(seat, str) else seat.id
        return self._exec_or_raise(self.core.bind(action="bind", round_id=rid, revision=revision, now=now))

    def advance(self, round_id: str, revision: int, *, now: float | None = None) -> Bound:
        """The intent moved on to ``revision`` (the fixture changed): older results are stale."""
        return self._exec_or_raise(self.core.bind(action="advance", round_id=round_id, revision=revision, now=now))

    def report_health(self, pool: str, *, depth: int, running: int | None = None, ok: bool = True,
                      at: float | None = None, now: float | None = None) -> float:
        """Write a health sample of a plane (a lease: fresh for the pool's health_max_age);
        returns until when it counts as capacity."""
        return self._exec_or_raise(self.core.health(pool=pool, depth=depth, running=running, ok=ok, at=at,
                                                    now=now))

    # -- the provider's day ----------------------------------------------------------------------
    def admit_waiting(self, *, lane: str | None = None, model: str, round_id: str, timeout: float = 600.0,
                      agent: str | None = None, parent: str | None = None, revision: int | None = None,
                      move_to: Callable[[str], bool] | None = None, tokens: float | None = None,
                      input_tokens: float | None = None, max_tokens: float | None = None) -> Decision:
        """Ask, and when refused wait as a waiter until admitted or ``timeout`` (WaitTimeout).
        With ``move_to`` the waiter re-asks across the alternatives it keeps, woken by a release
        on any of them; without it the round stays on ``model``.
        Every way out that is not an admission (timeout, an error, an interrupt, a cancellation
        such as ``asyncio.timeout``) removes the waiter from the pod's book and withdraws its
        ticket."""
        deadline = time.monotonic() + timeout
        self._know_policy()
        lane = self._lane(lane, agent)
        ask = dict(lane=lane, model=model, round_id=round_id, agent=agent, parent=parent, revision=revision,
                   move_to=move_to, tokens=tokens, input_tokens=input_tokens, max_tokens=max_tokens)
        with self._lock.book:
            self._check_free(round_id)
            self._book.wait(lane, model, round_id)
        if self.background:
            self._ensure_clock()  # every waiting path has its clock (heartbeat, wake-ups)
        d: Decision | None = None
        try:
            while True:
                with self._lock.book:
                    gen = self._gens.get(model, 0)
                    self._book.asking(round_id)
                d = self.try_admit(**ask, wait=True)
                if d.admitted:
                    break
                self._sleep_until_turn(model, round_id, gen, self._retry_after(d), deadline)
                if time.monotonic() >= deadline:
                    raise WaitTimeout(f"round {round_id} waited {timeout:g}s for {model} (last refusal: {d.reason})",
                                      d.reason)
        finally:
            if d is None or not d.admitted:
                self._give_up(model, round_id)
        self._wake(model)  # the next oldest may ask now
        return d

    def _sleep_until_turn(self, pool: str, round_id: str, gen: int, interval: float, deadline: float) -> None:
        """Sleep until this waiter may ask again: it is the pod's oldest of its lane and pool (or
        has no place yet), and the pool was woken since its last ask began (a wake-up during
        the ask is not lost) or ``interval`` has passed."""
        asked = time.monotonic()
        with self._lock:
            waker = self._waker(pool)
            while (now := time.monotonic()) < deadline:
                if self._book.may_ask(round_id) and (self._gens.get(pool, 0) != gen or now - asked >= interval):
                    return
                rest = asked + interval - now
                waker.wait(min(deadline - now, rest if rest > 0 else interval))

    def _waker(self, pool: str) -> Any:
        """The condition a pool's waiters sleep on (call with the lock held)."""
        if pool not in self._wakers:
            self._wakers[pool] = self._lock.condition()
        return self._wakers[pool]

    def _wake(self, pool: str | None = None) -> None:
        """Wake the waiters of one pool (a release there) and of the pools that list it as an
        alternative, or of every pool (the clock)."""
        with self._lock:
            for p in self._woken(pool) if pool else list(self._wakers):
                self._gens[p] = self._gens.get(p, 0) + 1
                self._waker(p).notify_all()

    def _give_up(self, pool: str, round_id: str) -> None:
        """The waiter leaves the pod's book first, before any (even a cancelled task does:
        no heartbeat renews it from now on), then withdraws its ticket, shielded from a second
        cancellation and bounded in time (the ticket's lease expires on its own)."""
        with self._lock.book:
            self._book.leave(round_id)

        def withdraw() -> None:
            self._wake(pool)
            self._exec(self.core.withdraw(round_id))
        try:
            shielded(withdraw(), timeout=WITHDRAW_TIMEOUT)
        except BaseException as exc:  # noqa: BLE001 - the ticket's lease expires on its own
            log.info("withdraw_failed", round=round_id, error=repr(exc))
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise

    @contextlib.contextmanager
    def round(self, *, lane: str | None = None, model: str, round_id: str, timeout: float = 600.0,
              agent: str | None = None, parent: str | None = None, revision: int | None = None,
              move_to: Callable[[str], bool] | None = None,
              tokens: float | None = None, input_tokens: float | None = None,
              max_tokens: float | None = None) -> Iterator[Round]:
        """Wait for a seat, keep it alive, release it on exit with the classified outcome.
        Inside, a nested ``round()`` is this round's delegated sub-round (``parent`` defaults to
        the round held here, in this thread or task or a task it starts; ``parent=""`` for
        none). The round may run on an alternative of ``model``: ``handle.pool`` says where."""
        d = self._own(self.admit_waiting(lane=lane, model=model, round_id=round_id, timeout=timeout,
                                         agent=agent, parent=self._parent(parent), revision=revision,
                                         move_to=move_to, tokens=tokens,
                                         input_tokens=input_tokens, max_tokens=max_tokens))
        handle, started = Round(self, d), time.monotonic()
        token, held = CURRENT_ROUND.set(d.round_id), CURRENT_HANDLE.set(handle)
        try:
            yield handle
        except BaseException as exc:
            self._finish(handle, outcome_of(exc), started, raising=False, retry_after=retry_after_of(exc))
            raise
        else:
            self._finish(handle, handle.outcome or "clean", started, raising=True)
        finally:
            with contextlib.suppress(ValueError):  # exited in another context than entered
                CURRENT_ROUND.reset(token)
                CURRENT_HANDLE.reset(held)

    def _finish(self, handle: Round, outcome: str, started: float, raising: bool,
                retry_after: float | None = None) -> None:
        """The round ended: released as ``release()`` does (``_end``); a refusal for good is
        recorded there, and a bad value set on the round is raised once the seat is released."""
        record, bad = self._exit_record(handle, outcome, time.monotonic() - started, retry_after)
        try:
            self._end(record)
        except AdmissionError:
            pass  # refused for good: recorded by _apply
        if bad is not None and raising:
            raise bad

    def _end(self, record: dict[str, Any], call: Call | None = None, now: float | None = None) -> Released:
        """The one way a round ends (``release()`` and ``round()``'s exit): its seat leaves the
        book at once; the release is applied now, or, while Redis cannot apply it (unreachable,
        no policy yet, cancelled on the way), kept in the outbox and replayed once by the clock:
        the answer then says ``queued``. One applied but not confirmed by the replicas waits
        there too. ``call``, ``now``: the release as the caller built it."""
        seat = Seat(*record["seat"])
        with self._lock.book:
            self._book.drop(seat.id)
        try:
            released, acked = shielded(self._apply(record, self._confirming(), call, now),
                                       on_cancel=lambda: self._queue(record, "cancelled"))
        except Retry as exc:
            blocking(self._queue, record, str(exc))
            return Released(Status.RELEASED, seat.pool, False, None, queued=True)
        if acked < self._confirm_replicas:  # applied, but a failover could still lose it: it waits
            blocking(self._queue, record, str(self._unconfirmed(acked)))
        if isinstance(released, UnknownSeat):
            raise released
        if released.stats is not None:
            self._note_stats({released.pool: released.stats})
        return released

    def _apply(self, record: dict[str, Any], replicas: int, call: Call | None = None,
               now: float | None = None) -> tuple[Any, int]:
        """Apply one ledger record (``call``: as built, else from the record): (the answer, how
        many replicas confirmed it). Raises ``Retry`` while Redis cannot apply it (unreachable,
        no policy yet). A release whose seat Redis no longer knows is recorded and its cost
        booked; its answer is that ``UnknownSeat``. Any other refusal is recorded and raised."""
        lost_seat_charge = None  # built only when Redis no longer knows the seat (rare)
        if call is None:
            call, lost_seat_charge = self._calls(record, self.core, now)
        try:
            try:
                return self._exec_ledger(call, replicas)
            except UnknownSeat as exc:
                if lost_seat_charge is None:
                    _, lost_seat_charge = self._calls(record, self.core, now)
                acked = replicas
                if lost_seat_charge is not None:
                    _, acked = self._exec_ledger(lost_seat_charge, replicas)
                self._unapplied(record, exc, cost_booked=lost_seat_charge is not None)
                return exc, acked
        except (Unavailable, NoPolicy) as exc:
            raise Retry(type(exc).__name__) from exc
        except AdmissionError as exc:
            self._unapplied(record, exc)
            raise

    def _apply_record(self, record: dict[str, Any], replicas: int | None = None) -> None:
        """Replay one ledger record. Raises ``Retry`` while Redis cannot apply it (unreachable, no
        policy yet), ``Unconfirmed`` while too few replicas have it. ``replicas``: how many to
        WAIT for (default ``confirm_replicas``; a replay always waits)."""
        _, acked = self._apply(record, self._confirm_replicas if replicas is None else replicas)
        if acked < self._confirm_replicas:
            raise self._unconfirmed(acked)

    # -- the clock -----------------------------------------------------------------------------
    def heartbeat(self, now: float | None = None):
        """Renew every lease this pod holds (one call); the background clock calls it."""
        with self._lock.book:
            snap = self._book.snapshot()
        hb = self._exec_or_raise(self.core.heartbeat(snap.seats_list(), list(snap.tickets), now))
        with self._lock.book:
            lost, lost_tickets, pools = self._note_heartbeat(snap, hb, now)
        for pool in pools:
            self._wake(pool)
        if lost or hb.reasserted or lost_tickets:
            log.warning("heartbeat_repair", lost=lost, reasserted=hb.reasserted, lost_tickets=lost_tickets)
        return hb

    def tick(self, now: float | None = None) -> Tick:
        """The pool clock: growth steps, bounded sweep, wake-ups. Idempotent across pods."""
        return self.ops.tick(now)

    def _watchdog(self) -> None:
        """Report stalls and round caps; a signal counts as sent only once Redis applied it."""
        t = self._tunables
        with self._lock.book:
            due = self._book.overdue(t["stall_after"], t["round_cap"])
        for held, signal in due:
            try:
                self.report(held.seat, signal=signal)
            except NotYourSeat:
                pass  # the seat is another pod's now: nothing of ours to report
            except AdmissionError as exc:  # unreachable, unknown until re-asserted: next beat
                log.warning("report_retry", round=held.seat.id, signal=signal, error=str(exc))
                continue
            log.warning("round_overdue", round=held.seat.id, signal=signal)
            with self._lock.book:
                self._book.signalled(held, signal)

    def _step(self, name: str, fn) -> bool:
        """One duty of the clock; a failing one never stops the others (a cancellation is no
        Exception: it ends the clock)."""
        try:
            fn()
            return True
        except Exception as exc:  # keep the clock alive through outages
            log.warning("clock_error", step=name, error=repr(exc))
            return False

    def _beat(self) -> None:
        self.tunables()
        self.heartbeat()

    def _sample_health(self) -> None:
        """The planes' health samplers that are due (``health=``): a failed one writes nothing."""
        if self._health_stale():
            self._health_rebuild(self.policy())
        due = self._health_due()
        if due:
            self._health_run.run_once(self, due)

    def _ensure_clock(self) -> None:
        self._clock.start(self._run_clock)

    def _run_clock(self) -> None:
        pubsub = None
        next_beat = next_tick = 0.0
        while not self._clock.stopped():
            try:
                if pubsub is None:
                    pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
                    pubsub.subscribe(self.core.wake_channel)
                msg = pubsub.get_message(timeout=0.5)
                if msg is not None:
                    self._wake(msg["data"].decode())
            except Exception as exc:
                log.warning("clock_error", step="wake-ups", error=repr(exc))
                pubsub = None
                self._clock.sleep(0.5)
            now = time.monotonic()
            if now >= next_beat:
                # a failed heartbeat is retried on the next turn (about 0.5 s), not a period later
                if self._step("heartbeat", self._beat):
                    next_beat = now + self._tunables["lease_ttl"] / 3
                self._step("watchdog", self._watchdog)
            if len(self._pending):  # every turn: a backlog of ledger records drains as Redis answers
                self._step("pending", self.flush)
            if self._health:
                self._step("health", self._sample_health)
            if now >= next_tick:
                self._step("tick", self.tick)
                next_tick = now + self._tunables["grow_interval"]
                self._wake()

    def close(self) -> None:
        """Stop the background clock (held seats then expire with their leases)."""
        self._clock.stop()

    def __enter__(self) -> "Admission":
        self._clock.resume()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- reading -------------------------------------------------------------------------------
    def plan(self, *, lane: str | None = None, model: str, wanted: int, now: float | None = None,
             agent: str | None = None, move_to: Callable[[str], bool] | None = None) -> int:
        """How many of ``wanted`` new rounds of ``lane`` would start now on ``model`` or, moving,
        on its alternatives that ``move_to`` keeps (none without it; not for a hard pin); nothing
        seated."""
        return sum((self.plan_pools(lane=lane, pools=[model], wanted=wanted, now=now, agent=agent,
                                    move_to=move_to)).values())

    def plan_pools(self, *, lane: str | None = None, pools: list[str] | None, wanted: int,
                   now: float | None = None, agent: str | None = None,
                   move_to: Callable[[str], bool] | None = None) -> dict[str, int]:
        """Plan per pool: the pools asked for (None: the lane's), then the alternatives ``move_to``
        keeps that would take some of the rest (as ``try_admit`` moves)."""
        if move_to is not None:
            self._know_policy()
        return self._exec_or_raise(self.core.plan(lane=lane, pools=pools, wanted=wanted, now=now, agent=agent,
                                                  moves=self._movable(move_to)))

    def allowance(self, *, lane: str | None = None, now: float | None = None, wanted: int = 10_000,
                  agent: str | None = None, move_to: Callable[[str], bool] | None = None) -> int:
        """What a lane that starts work paces itself by: plan over the lane's pools."""
        return sum((self.plan_pools(lane=lane, pools=None, wanted=wanted, now=now, agent=agent,
                                    move_to=move_to)).values())
