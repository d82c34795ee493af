"""Bookkeeping shared by the sync and asyncio clients: what a pod holds and who may re-ask.

To avoid a thundering herd, a pod re-asks only with its oldest waiter per lane and pool; the
others sleep until they become the oldest. The book is only ever a copy of what the server
holds: a waiter enters when its round starts waiting and leaves on every way out of the wait
(admitted, given up, an error, a cancellation); a seat leaves the moment its round ends, before
the release is sent, so a finished round is never renewed or re-asserted by the heartbeat.
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


@dataclass
class Waiter:
    """A round of this pod that waits for a seat."""

    lane: str
    pool: str
    since: float = UNPLACED  # the server's enqueue time (its place in the queue)
    asks: int = 0  # asks started: a heartbeat's answer about an older ask is stale
    asking: bool = False  # an ask is in flight (it renews the ticket itself)


@dataclass(frozen=True)
class Snapshot:
    """What a heartbeat was sent with, to tell a real loss from a race with its reply."""

    seats: dict[str, Held]
    tickets: dict[str, int]  # round id -> asks when the heartbeat was built

    def seats_list(self) -> list[Seat]:
        return [h.seat for h in self.seats.values()]


class Book:
    """The pod's seats and waiters. Not thread-safe: the clients guard it with their lock."""

    def __init__(self) -> None:
        self.seats: dict[str, Held] = {}
        self.waiters: dict[str, Waiter] = {}
        self.groups: dict[tuple[str, str], dict[str, Waiter]] = {}

    # -- seats -----------------------------------------------------------------------------
    def hold(self, seat: Seat) -> Held:
        held = self.seats[seat.id] = Held(seat)
        return held

    def drop(self, seat_id: str) -> Held | None:
        """The round ended (or the server gave its seat to someone else): stop renewing it."""
        return self.seats.pop(seat_id, None)

    # -- waiters ---------------------------------------------------------------------------
    def busy(self, round_id: str) -> bool:
        """This pod already runs or waits with this round id."""
        return round_id in self.seats or round_id in self.waiters

    def wait(self, lane: str, pool: str, round_id: str) -> Waiter:
        """A round starts waiting (its place unknown until the server answers)."""
        self.leave(round_id)
        w = self.waiters[round_id] = Waiter(lane, pool)
        self.groups.setdefault((lane, pool), {})[round_id] = w
        return w

    def leave(self, round_id: str) -> None:
        """The waiter is gone from this pod, whatever the reason."""
        w = self.waiters.pop(round_id, None)
        if w is None:
            return
        group = self.groups.get((w.lane, w.pool), {})
        group.pop(round_id, None)
        if not group:
            self.groups.pop((w.lane, w.pool), None)

    def asking(self, round_id: str) -> None:
        w = self.waiters.get(round_id)
        if w is not None:
            w.asks += 1
            w.asking = True

    def placed(self, round_id: str, since: float | None) -> None:
        """The ask came back refused: the server's place for it (None: unknown, e.g. unreachable)."""
        w = self.waiters.get(round_id)
        if w is not None:
            w.asking = False
            w.since = UNPLACED if since is None else since

    def is_oldest(self, lane: str, pool: str, round_id: str) -> bool:
        """The server's order: oldest enqueue time first, ties by id."""
        group = self.groups.get((lane, pool))
        return bool(group) and min(group, key=lambda rid: (group[rid].since, rid)) == round_id

    def may_ask(self, round_id: str) -> bool:
        """Only the oldest re-asks; a waiter the server has no place for asks to get one."""
        w = self.waiters.get(round_id)
        return w is not None and (w.since == UNPLACED or self.is_oldest(w.lane, w.pool, round_id))

    def tickets(self) -> list[str]:
        """Waiters whose ticket the server has confirmed and that are not asking right now."""
        return [rid for rid, w in self.waiters.items() if w.since != UNPLACED and not w.asking]

    # -- the heartbeat ---------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return Snapshot(dict(self.seats), {rid: self.waiters[rid].asks for rid in self.tickets()})

    def real_losses(self, snap: Snapshot, lost_seats: list[str], lost_tickets: list[str]) -> tuple[list[str], list[str]]:
        """Of what a heartbeat called lost, what really was: still in the book exactly as it was
        sent (a seat released, or a waiter admitted or re-asked, since then is not news)."""
        seats = [sid for sid in lost_seats if sid in snap.seats and self.seats.get(sid) is snap.seats[sid]]
        tickets = [rid for rid in lost_tickets
                   if rid in snap.tickets and rid in self.waiters
                   and self.waiters[rid].asks == snap.tickets[rid] and not self.waiters[rid].asking]
        return seats, tickets

    def forget_place(self, round_id: str) -> None:
        """The server lost this waiter's ticket: it has no place until it asks again."""
        w = self.waiters.get(round_id)
        if w is not None:
            w.since = UNPLACED

    # -- the watchdog ----------------------------------------------------------------------
    def overdue(self, stall_after: float, round_cap: float) -> list[tuple[Held, str]]:
        """Seats past their stall threshold or round cap whose signal Redis has not applied yet
        (marked by ``signalled`` only once the report succeeded, so a failed one is retried)."""
        now, due = time.monotonic(), []
        for held in self.seats.values():
            age = now - held.started
            if age >= round_cap and not held.cap_reported:
                due.append((held, "round_cap"))
            elif age >= stall_after and not held.stall_reported:
                due.append((held, "stall"))
        return due

    @staticmethod
    def signalled(held: Held, signal: str) -> None:
        if signal == "round_cap":
            held.cap_reported = held.stall_reported = True
        else:
            held.stall_reported = True
