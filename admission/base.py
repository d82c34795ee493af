"""What the sync and asyncio clients share besides the core: construction, the pod's book of
seats and waiters, the live tunables, and what to make of every answer (a decision, a
heartbeat, a release that could not be applied). Only I/O and waiting primitives differ
between them."""
from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass
from typing import Any

from ._log import get_logger

from . import policy as policy_mod
from .codes import OUTCOMES, UNAVAILABLE
from .core import Core, Decision, Heartbeat, Seat, _money
from .errors import BadArgument, NotYourSeat, RoundInProgress
from .waiting import Book, Snapshot

log = get_logger("admission")

#: A waiter whose last ask met an unreachable Redis asks again this soon (not on the pool
#: clock): rounds asking across a failover are admitted within about this of the promotion.
RETRY_UNAVAILABLE = 0.5
RECOVERING = "recovering"
#: Releases kept in memory for a retry while Redis cannot apply them (unreachable, or no
#: policy after a restart). Past this the oldest is dropped with an error in the log.
MAX_PENDING = 10_000


@dataclass(frozen=True)
class PendingRelease:
    """A round that ended but whose release Redis has not applied yet."""

    seat: Seat
    outcome: str
    seconds: float
    cost_usd: float | None
    now: float | None


class ClientBase:
    def __init__(self, client: Any, *, mesh: str, pod: str, background: bool = True, seed: int | None = None):
        self.redis = client
        self.core = Core(mesh, pod, seed)
        self.mesh, self.pod = mesh, pod
        self.background = background
        self._book = Book()
        self._pending: deque[PendingRelease] = deque()
        self._gens: dict[str, int] = {}  # per pool: wake-ups so far (a waiter compares before/after its ask)
        self._tunables: dict[str, float] = {k: v[0] for k, v in policy_mod.TUNABLES.items()}
        self._tunables_version = -1

    def _note_tunables(self, version: Any, raw: Any) -> dict[str, float]:
        """Keep the live tunables; re-decoded only when the policy version changed."""
        if raw and int(version) != self._tunables_version:
            self._tunables, self._tunables_version = json.loads(raw), int(version)
        return self._tunables

    def _stale_tunables(self, d: Decision) -> bool:
        """The answer came under another policy version than the tunables this pod holds."""
        return d.reason != UNAVAILABLE and d.config_version != self._tunables_version

    def _retry_after(self, d: Decision) -> float:
        """How long a refused waiter sleeps before it asks again without a wake-up: the pool
        clock, or soon when Redis was unreachable or held new admissions after a restart (its
        end wakes nobody)."""
        if d.reason in (UNAVAILABLE, RECOVERING):
            return RETRY_UNAVAILABLE
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
            if d.round_id not in self._book.waiters:
                self._book.wait(lane, d.pool, d.round_id)
            self._book.placed(d.round_id, None if d.reason == UNAVAILABLE else d.waiting_since)
        return self.background and ((d.admitted and d.seat.pod == self.pod) or wait)

    def _own(self, d: Decision) -> Decision:
        """A round held by another pod (same intent id) must not run here too."""
        if d.seat is not None and d.seat.pod != self.pod:
            raise NotYourSeat(f"round {d.round_id} is already admitted and held by pod {d.seat.pod}")
        return d

    def _note_heartbeat(self, snap: Snapshot, hb: Heartbeat) -> tuple[list[str], list[str], set[str]]:
        """Drop the seats the server no longer has for this pod; forget the places of lost
        tickets. Only real losses count: what was released, admitted or re-asked while the
        heartbeat was in flight is not news. Returns (lost seats, lost tickets, pools to wake)."""
        lost, lost_tickets = self._book.real_losses(snap, hb.lost, hb.lost_tickets)
        for seat_id in lost:
            self._book.drop(seat_id)
        pools = set()
        for round_id in lost_tickets:  # it asks again for a place
            self._book.forget_place(round_id)
            pools.add(self._book.waiters[round_id].pool)
        return lost, lost_tickets, pools

    def _keep_pending(self, rel: PendingRelease, why: str) -> None:
        if len(self._pending) >= MAX_PENDING:
            dropped = self._pending.popleft()
            log.error("release_pending_full", dropped=dropped.seat.id, limit=MAX_PENDING)
        self._pending.append(rel)
        log.warning("release_pending", round=rel.seat.id, why=why, pending=len(self._pending))

    @staticmethod
    def _pending_release(handle: Any, outcome: str, seconds: float) -> tuple[PendingRelease, BadArgument | None]:
        """The release a round's exit sends. A bad outcome or price set on the round is an error
        for the caller, but never keeps the seat: the round is released without it."""
        cost, bad = handle.cost_usd, None
        try:
            _money(cost)
        except BadArgument as exc:
            bad, cost = exc, None
        if outcome not in OUTCOMES:
            bad = BadArgument(f"round outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
            outcome = "error"
        if bad is not None:
            log.error("release_bad_argument", round=handle.seat.id, error=str(bad))
        return PendingRelease(handle.seat, outcome, seconds, cost, None), bad

    @staticmethod
    def _unapplied(rel: PendingRelease, exc: Exception) -> None:
        """A release Redis refused for good (its seat is unknown there): recorded, never silent."""
        log.warning("release_unapplied", round=rel.seat.id, pool=rel.seat.pool, lane=rel.seat.lane,
                    seq=rel.seat.seq, outcome=rel.outcome, seconds=rel.seconds, cost_usd=rel.cost_usd,
                    error=str(exc))

    @staticmethod
    def _policy_of(raw: Any) -> dict[str, Any]:
        version, doc = raw
        return {"version": int(version or 0), **(json.loads(doc) if doc else {})}
