"""What the sync and asyncio clients share besides the core: construction, the pod's book of
seats and waiters, the live tunables, and what to make of every answer (a decision, a
heartbeat, a release that could not be applied). Only I/O and waiting primitives differ
between them."""
from __future__ import annotations

import contextlib
import json
import time
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry as RedisRetry

from . import policy as policy_mod
from ._log import get_logger
from .alternatives import Thompson
from .codes import OUTCOMES, UNAVAILABLE
from .core import (UNREACHABLE, Call, Core, Decision, Heartbeat, Seat, Usage, _ceiling_args, _money, _reading, _received_total,
                   _retry_after)
from .errors import BadArgument, NotYourSeat, RoundInProgress, Unavailable
from .health import SamplerRun, samplers_from_policy
from .ledger import MAX_PENDING, Pending, charge_record, record_calls, release_record  # noqa: F401 (re-exported)
from .outbox import Outbox, Unconfirmed
from .waiting import Book, Snapshot

log = get_logger("admission")

#: Fail fast: a decision under an unreachable Redis is a shed within about this long.
CONNECT_TIMEOUT = 0.25
SOCKET_TIMEOUT = 0.5

#: A waiter whose last ask met an unreachable Redis asks again this soon (not on the pool
#: clock): rounds asking across a failover are admitted within about this of the promotion.
RETRY_UNAVAILABLE = 0.5
#: A waiter refused by a pause asks again this long after the pause's end (Redis' clock and
#: ours drift by a few ms).
PAUSE_MARGIN = 0.02
RECOVERING = "recovering"  # the refusal during the recovery hold (its end wakes nobody)
#: The round this task or thread holds (inside ``round()``): a nested ``round()`` is its
#: delegated sub-round unless it names another ``parent`` ("" = none). asyncio tasks inherit
#: it; a new thread starts without one (pass ``parent=`` there, or run it in a copied context).
CURRENT_ROUND: ContextVar[str | None] = ContextVar("admission_current_round", default=None)
#: The handle of that round (``Round`` / ``AsyncRound``): the SDK integrations join it (its cost
#: and load signals) instead of taking a second seat for a call made inside it.
CURRENT_HANDLE: ContextVar[Any] = ContextVar("admission_current_handle", default=None)


def current_round() -> Any:
    """The round this task or thread holds inside ``round()`` (its handle), or None."""
    return CURRENT_HANDLE.get()
NO_MOVES: dict[str, Any] = {"alternatives": {}, "pinLanes": [], "pinAgents": [], "agents": {}}


def fail_fast_options(connect_timeout: float = CONNECT_TIMEOUT, socket_timeout: float = SOCKET_TIMEOUT) -> dict:
    """redis-py options that bound a dead server to a fraction of a second (one quick retry,
    so a connection broken by a restart reconnects once)."""
    return dict(socket_connect_timeout=connect_timeout, socket_timeout=socket_timeout,
                retry=RedisRetry(NoBackoff(), 1), health_check_interval=0)


def policy_of(policy: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    return policy_mod.load(policy) if isinstance(policy, (str, Path)) else policy_mod.validate(policy)


class RoundBase:
    """What a client's ``round()`` yields: the seat, and what the round will report on exit
    (``Round`` and ``AsyncRound`` add the calls in their flavour)."""

    def __init__(self, adm: Any, decision: Decision):
        self.decision = decision
        self.seat: Seat = decision.seat  # type: ignore[assignment]
        self.pool = decision.pool
        self.outcome: str | None = None  # set to override the outcome reported on exit
        self.cost_usd: float | None = None  # set to the round's price
        self.retry_after: float | None = None  # set to the provider's Retry-After (s) it ended with
        self.received: float | None = None  # set to the tokens it received in all (declared: the fit's last point)
        self.usage: Any = None  # set to what the provider counted (core.Usage): the ceilings reconcile it
        self.ceiling: str | None = None  # set to the rate ceiling a 429 named as spent (rpm, tpm, ...)
        self.reset_s: float | None = None  # and the seconds until it resets
        # set to the provider's rate-limit headers of the latest response (ratelimits.Reading):
        # the exit's release (and progress) carries it, the ceilings learn from it
        self.rate_reading: Any = None
        self._calls = 0  # the calls reserve_call counted (the first is the admit's reservation)
        self._adm = adm


@contextlib.contextmanager
def translated() -> Iterator[None]:
    """A call's failures as the clients raise them: an ``ADM_`` reply as its error class, an
    unreachable server as ``Unavailable``."""
    try:
        yield
    except redis.ResponseError as exc:
        raise Core.translate(exc) from None
    except UNREACHABLE as exc:
        raise Unavailable(f"admission unavailable: {exc}") from exc


def _confirm_options(replicas: Any, timeout: Any) -> tuple[int, int]:
    if isinstance(replicas, bool) or not isinstance(replicas, int) or not 0 <= replicas <= 16:
        raise BadArgument(f"confirm_replicas must be a whole number in [0, 16], got {replicas!r}")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0.001 <= timeout <= 60:
        raise BadArgument(f"confirm_timeout must be seconds in [0.001, 60], got {timeout!r}")
    return replicas, max(1, round(timeout * 1000))


class ClientBase:
    def __init__(self, client: Any, *, mesh: str, pod: str, background: bool = True, seed: int | None = None,
                 outbox: str | Path | Outbox | None = None, health: bool | list[Any] = False,
                 confirm_replicas: int = 0, confirm_timeout: float = 0.25):
        # a ledger write (release, charge) is confirmed by WAIT on this many replicas before its
        # record may be forgotten; 0 = asynchronous replication's usual promise
        self._confirm_replicas, self._confirm_ms = _confirm_options(confirm_replicas, confirm_timeout)
        self.redis = client
        self.core = Core(mesh, pod, seed)
        self._thompson = Thompson(seed)  # the alternatives' ranking
        self.mesh, self.pod = mesh, pod
        self.background = background
        self._book = Book()
        if outbox is not None and not isinstance(outbox, Outbox):
            outbox = Outbox(outbox)  # one file per pod: a second opener is refused
        self._pending = Pending(outbox)
        self._gens: dict[str, int] = {}  # per pool: wake-ups so far (a waiter compares before/after its ask)
        self._tunables: dict[str, float] = {k: v[0] for k, v in policy_mod.TUNABLES.items()}
        self._tunables_version = -1
        self._moves: dict[str, Any] = NO_MOVES  # the live alternatives, pins and lanes of agents
        self._movers: dict[str, set[str]] = {}  # pool -> the pools that list it as an alternative
        self._stats: dict[str, tuple[float, float, float]] = {}  # pool -> successes, failures, mean USD
        # the planes' health samplers this pod's clock runs: none, the policy's (True: each pool's
        # health_url, rebuilt when the policy changes), or the caller's own
        self._health = health
        self._health_run: Any = None if isinstance(health, bool) else SamplerRun(health)
        self._health_version = -1
        # the server's clock minus this pod's, learned from each heartbeat: a record that waits
        # in the outbox is stamped on the server's clock, so a pod whose clock is off still books
        # it on the right day (and the server does not refuse it as stamped in the future)
        self._skew = 0.0

    #: What the clients read of the config hash for the live tunables and moves.
    POLICY_FIELDS = ("version", "tunables", "moves")

    def _note_tunables(self, version: Any, raw: Any, moves: Any = None) -> dict[str, float]:
        """Keep the live tunables and moves; re-decoded only when the policy version changed."""
        if raw and int(version) != self._tunables_version:
            self._tunables, self._tunables_version = json.loads(raw), int(version)
            mv = json.loads(moves) if moves else {}
            self._moves = {k: (mv.get(k) if isinstance(mv.get(k), type(v)) else v) for k, v in NO_MOVES.items()}
            movers: dict[str, set[str]] = {}
            for pool, alts in self._moves["alternatives"].items():
                for alt in alts:
                    movers.setdefault(alt, set()).add(pool)
            self._movers = movers
        return self._tunables

    def _health_stale(self) -> bool:
        """The policy's samplers must be built again (a new policy version)."""
        return self._health is True and self._health_version != self._tunables_version

    def _health_rebuild(self, policy: dict[str, Any]) -> None:
        self._health_run = SamplerRun(samplers_from_policy(policy))
        self._health_version = self._tunables_version

    def _health_due(self) -> list[Any]:
        return self._health_run.due(time.monotonic()) if self._health_run is not None else []

    # -- moving between pools (DESIGN §7) -----------------------------------------------------
    def _lane(self, lane: str | None, agent: str | None) -> str:
        """The lane a round asks on: its own, else its agent's ([agents]); the script decides
        (this is the pod's copy, for its book)."""
        return lane or (self._moves["agents"].get(agent or "", "") if agent else "")

    def _pinned(self, lane: str, agent: str | None) -> bool:
        return lane in self._moves["pinLanes"] or bool(agent and agent in self._moves["pinAgents"])

    def _ranking(self, pool: str, lane: str, agent: str | None,
                 move_to: Callable[[str], bool] | None = None) -> list[str]:
        """The pool's alternatives ranked by a Thompson draw over their last known outcome counts
        and mean cost; none for a hard pin (the script checks both again). ``move_to``: only the
        alternatives the caller can run on (an SDK client calls its own provider's pools); none
        without it: a caller that did not say where it can call stays on the pool it asked for
        (it would run its round on its own provider while the seat counts on another pool)."""
        if move_to is None:
            return []
        alts = [a for a in self._moves["alternatives"].get(pool, []) if move_to(a)]
        if not alts or self._pinned(lane, agent):
            return []
        return self._thompson.rank(alts, self._stats, self._tunables["cost_scale"])

    def _movable(self, move_to: Callable[[str], bool] | None) -> list[str]:
        """The alternatives a plan counts: those the caller can call (``move_to``), none without
        it, as an admission moves (the script keeps to each pool's own list and the pins)."""
        if move_to is None:
            return []
        return sorted({alt for alts in self._moves["alternatives"].values() for alt in alts if move_to(alt)})

    def _note_stats(self, stats: dict[str, tuple[float, float, float]]) -> None:
        self._stats.update(stats)

    def _woken(self, pool: str) -> list[str]:
        """The pools whose waiters a release on ``pool`` may admit: its own and the pools that
        list it as an alternative (a waiter re-asks across its alternatives)."""
        return [pool, *sorted(self._movers.get(pool, ()))]

    @staticmethod
    def _parent(parent: str | None) -> str | None:
        """The parent a round names, else the round this task holds (a nested round)."""
        return (parent or None) if parent is not None else CURRENT_ROUND.get()

    def _stale_tunables(self, d: Decision) -> bool:
        """The answer came under another policy version than the tunables this pod holds."""
        return d.reason != UNAVAILABLE and d.config_version != self._tunables_version

    def _retry_after(self, d: Decision) -> float:
        """How long a refused waiter sleeps before it asks again without a wake-up: the pool
        clock, or soon when Redis was unreachable or held new admissions after a restart (its
        end wakes nobody)."""
        if d.reason in (UNAVAILABLE, RECOVERING):
            return RETRY_UNAVAILABLE
        if d.reason == "provider-closed":  # a probe may go every probe_every
            return self._tunables["probe_every"]
        if d.reason == "paused" and d.paused_for > 0:  # the provider's Retry-After ends then
            return d.paused_for + PAUSE_MARGIN
        if d.ceiling and d.wait_s > 0:  # a rate ceiling: its bucket covers the round by then
            return d.wait_s
        return self._tunables["grow_interval"]

    def _check_free(self, round_id: str) -> None:
        """One live holder per round id per pod (call with the book's lock held)."""
        if self._book.busy(round_id):
            raise RoundInProgress(f"round {round_id} is already running or waiting in pod {self.pod}; "
                                  "a round id runs once at a time")

    def _note_decision(self, d: Decision, lane: str, wait: bool) -> bool:
        """Book an answer: a seat to keep alive, or a waiter's place. True when the clock must run.
        An admission (here or on another pod: same intent) ends the round's wait everywhere in
        the book; a refused try (wait=False) changes nothing."""
        if d.admitted:
            self._book.leave(d.round_id)
            if d.seat.pod == self.pod:
                self._book.hold(d.seat)
        elif wait:
            w = self._book.waiters.get(d.round_id)
            if w is None or (w.lane, w.pool) != (lane, d.pool):  # new, or its ticket moved there
                self._book.wait(lane, d.pool, d.round_id).asks = w.asks if w else 0
            self._book.placed(d.round_id, None if d.reason == UNAVAILABLE else d.waiting_since)
        return self.background and ((d.admitted and d.seat.pod == self.pod) or wait)

    def _own(self, d: Decision) -> Decision:
        """A round held by another pod (same intent id) must not run here too."""
        if d.seat is not None and d.seat.pod != self.pod:
            raise NotYourSeat(f"round {d.round_id} is already admitted and held by pod {d.seat.pod}")
        return d

    def _note_heartbeat(self, snap: Snapshot, hb: Heartbeat, now: float | None = None
                        ) -> tuple[list[str], list[str], set[str]]:
        """Drop the seats the server no longer has for this pod; forget the places of lost
        tickets. Only real losses count: what was released, admitted or re-asked while the
        heartbeat was in flight is not news. Returns (lost seats, lost tickets, pools to wake).
        A heartbeat on the server's clock (no ``now``) also tells this pod the server's time."""
        if now is None:
            self._skew = hb.lease_until - self._tunables["lease_ttl"] - time.time()
        lost, lost_tickets = self._book.real_losses(snap, hb.lost, hb.lost_tickets)
        for seat_id in lost:
            self._book.drop(seat_id)
        pools = set()
        for round_id in lost_tickets:  # it asks again for a place
            self._book.forget_place(round_id)
            pools.add(self._book.waiters[round_id].pool)
        return lost, lost_tickets, pools

    @staticmethod
    def _exit_record(handle: Any, outcome: str, seconds: float,
                     retry_after: float | None = None) -> tuple[dict[str, Any], BadArgument | None]:
        """The release a round's exit sends. A bad outcome, price, Retry-After or received count
        set on the round is an error for the caller, but never keeps the seat: the round is
        released without it."""
        cost, bad = handle.cost_usd, None
        try:
            _money(cost)
        except BadArgument as exc:
            bad, cost = exc, None
        if handle.retry_after is not None:
            retry_after = handle.retry_after
        try:
            _retry_after(retry_after)
        except BadArgument as exc:
            bad, retry_after = exc, None
        received = handle.received
        try:
            _received_total(received)
        except BadArgument as exc:
            bad, received = exc, None
        # what the provider counted, and a spent ceiling (the round's `usage`, `ceiling`, `reset_s`)
        usage, ceiling, reset_s = (getattr(handle, k, None) for k in ("usage", "ceiling", "reset_s"))
        try:
            usage = Usage.of(usage)
            if usage is not None:
                usage.args()
        except (BadArgument, TypeError) as exc:
            bad, usage = BadArgument(str(exc)), None
        if ceiling is not None:
            try:
                _ceiling_args("ceiling", ceiling, reset_s)
                if outcome in ("rate_limited", "ceiling"):  # a 429 that named the ceiling it spent
                    outcome = "ceiling"
                else:
                    ceiling = reset_s = None
            except BadArgument as exc:
                bad, ceiling, reset_s = exc, None, None
        reading = getattr(handle, "rate_reading", None)
        try:
            _reading(reading)
        except BadArgument as exc:
            bad, reading = exc, None
        if outcome not in OUTCOMES:
            bad = BadArgument(f"round outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
            outcome = "error"
        if bad is not None:
            log.error("release_bad_argument", round=handle.seat.id, error=str(bad))
        if outcome == "ceiling" and ceiling is None:
            outcome = "rate_limited"  # no limit named: an ordinary 429
        return release_record(handle.seat, outcome, seconds, cost, retry_after=retry_after, received=received,
                              usage=usage, ceiling=ceiling, reset_s=reset_s, reading=reading), bad

    def _server_time(self) -> float:
        """Now on the server's clock, as far as this pod's last heartbeat told it."""
        return time.time() + self._skew

    def _calls(self, record: dict[str, Any], core: Core, now: float | None = None) -> tuple[Call, Call | None]:
        return record_calls(record, core, self._server_time(), now)

    def _confirming(self) -> int:
        """How many replicas this ledger write must reach before its record is forgotten: none
        while earlier records still wait (no replica answered: the write is applied without the
        wait and its record queued behind them, so a missing replica stalls no round's end)."""
        return 0 if not self._confirm_replicas or len(self._pending) else self._confirm_replicas

    def _unconfirmed(self, acked: int) -> Unconfirmed:
        return Unconfirmed(f"unconfirmed: {acked} of {self._confirm_replicas} replica(s) within {self._confirm_ms} ms")

    def _queue(self, record: dict[str, Any], why: str) -> None:
        if record["at"] is None:  # its day is the day it ended, whenever it is replayed
            record = {**record, "at": self._server_time()}
        self._pending.keep(record, why)

    @staticmethod
    def _unapplied(record: dict[str, Any], exc: Exception, cost_booked: bool = False) -> None:
        """A release Redis refused for good (its seat is unknown there): recorded, never silent."""
        log.warning("release_unapplied", round=record["seat"][0], seat=record["seat"], outcome=record.get("outcome"),
                    seconds=record.get("seconds"), cost_usd=record.get("cost_usd"), cost_booked=cost_booked,
                    error=str(exc))
