"""Bookkeeping shared by the sync and asyncio clients: what a pod holds and who may re-ask.

To avoid a thundering herd, a pod re-asks only with its oldest waiter per lane and pool; the
others sleep until they become the oldest.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from .core import Seat

UNPLACED = float("inf")  # a waiter whose place the server has not confirmed queues last


@dataclass
class Held:
    """A seat this pod holds, with what its watchdog needs."""

    seat: Seat
    started: float = field(default_factory=time.monotonic)
    stall_reported: bool = False
    cap_reported: bool = False


class Book:
    """The pod's seats and waiters. Not thread-safe: the clients guard it with their lock."""

    def __init__(self) -> None:
        self.seats: dict[str, Held] = {}
        self.groups: dict[tuple[str, str], dict[str, float]] = {}

    def hold(self, seat: Seat) -> Held:
        held = self.seats[seat.id] = Held(seat)
        return held

    def drop(self, seat_id: str) -> None:
        self.seats.pop(seat_id, None)

    def enqueue(self, lane: str, pool: str, round_id: str, since: float | None = None) -> None:
        """Queue a waiter at its place: the server's enqueue time (unknown yet: last)."""
        queue = self.groups.setdefault((lane, pool), {})
        if since is not None or round_id not in queue:
            queue[round_id] = since if since is not None else UNPLACED

    def dequeue(self, lane: str, pool: str, round_id: str) -> None:
        queue = self.groups.get((lane, pool), {})
        queue.pop(round_id, None)
        if not queue:
            self.groups.pop((lane, pool), None)

    def forget_place(self, round_id: str) -> None:
        """The server lost this waiter's ticket: it queues last until it asks again."""
        for queue in self.groups.values():
            if round_id in queue:
                queue[round_id] = UNPLACED

    def is_oldest(self, lane: str, pool: str, round_id: str) -> bool:
        """The server's order: oldest enqueue time first, ties by id."""
        queue = self.groups.get((lane, pool))
        return bool(queue) and min(queue, key=lambda rid: (queue[rid], rid)) == round_id

    def tickets(self) -> list[str]:
        """Waiters whose ticket the server has confirmed (a first ask still in flight has none)."""
        return [rid for queue in self.groups.values() for rid, since in queue.items() if since != UNPLACED]

    def overdue(self, stall_after: float, round_cap: float) -> list[tuple[Held, str]]:
        """Seats past their stall threshold or round cap that have not reported it yet."""
        now, due = time.monotonic(), []
        for held in self.seats.values():
            age = now - held.started
            if age >= round_cap and not held.cap_reported:
                held.cap_reported = held.stall_reported = True
                due.append((held, "round_cap"))
            elif age >= stall_after and not held.stall_reported:
                held.stall_reported = True
                due.append((held, "stall"))
        return due
