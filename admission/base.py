"""What the sync and asyncio clients share besides the core: construction, the pod's book of
seats and waiters, and the live tunables. Only I/O and waiting primitives differ between them."""
from __future__ import annotations

import json
from typing import Any

from . import policy as policy_mod
from .core import Core, Decision, Heartbeat
from .errors import NotYourSeat
from .waiting import Book


class ClientBase:
    def __init__(self, client: Any, *, mesh: str, pod: str, background: bool = True, seed: int | None = None):
        self.redis = client
        self.core = Core(mesh, pod, seed)
        self.mesh, self.pod = mesh, pod
        self.background = background
        self._book = Book()
        self._tunables: dict[str, float] = {k: v[0] for k, v in policy_mod.TUNABLES.items()}
        self._tunables_version = -1

    def _note_tunables(self, version: Any, raw: Any) -> dict[str, float]:
        """Keep the live tunables; re-decoded only when the policy version changed."""
        if raw and int(version) != self._tunables_version:
            self._tunables, self._tunables_version = json.loads(raw), int(version)
        return self._tunables

    def _note_decision(self, d: Decision, lane: str, wait: bool) -> bool:
        """Book an answer: a seat to keep alive, or a waiter to renew. True when the clock must run."""
        if d.admitted and d.seat.pod == self.pod:
            self._book.hold(d.seat)
            self._book.dequeue(lane, d.pool, d.round_id)
        elif wait:
            self._book.enqueue(lane, d.pool, d.round_id, d.waiting_since)
        return self.background and (d.admitted or wait)

    def _own(self, d: Decision) -> Decision:
        """A round held by another pod (same intent id) must not run here too."""
        if d.seat is not None and d.seat.pod != self.pod:
            raise NotYourSeat(f"round {d.round_id} is already admitted and held by pod {d.seat.pod}")
        return d

    def _note_heartbeat(self, hb: Heartbeat) -> list[str]:
        """Drop the seats the server no longer has for this pod; returns those still held here
        (a seat released while the heartbeat was in flight is not news)."""
        lost = [seat_id for seat_id in hb.lost if seat_id in self._book.seats]
        for seat_id in lost:
            self._book.drop(seat_id)
        for ticket_id in hb.lost_tickets:  # expired under a slow pod: it asks again when oldest
            self._book.forget_place(ticket_id)
        return lost

    @staticmethod
    def _policy_of(raw: Any) -> dict[str, Any]:
        version, doc = raw
        return {"version": int(version or 0), **(json.loads(doc) if doc else {})}
