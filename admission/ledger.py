"""The spend ledger's records on the pod's side: what a release or a charge is as a record (plain
values, what the outbox stores), the queue of records Redis has not applied yet (``Pending``:
the durable outbox, else memory), and the script calls a record makes when it is applied or
replayed. Every record carries its idempotency key (the seat, and the charge key or `release`),
so a replay counts once."""
from __future__ import annotations

from collections import deque
from dataclasses import asdict
from typing import Any, Callable

from ._log import get_logger
from .core import Call, Core, Seat, Usage, _reading
from .errors import AdmissionError
from .outbox import Outbox, OutboxFull, Retry, Unconfirmed

log = get_logger("admission")

#: Records kept in memory at most when the pod has no outbox (the oldest is dropped, loudly).
MAX_PENDING = 10_000


def _seat(seat: Seat) -> list[Any]:
    """A seat as a record holds it, in its fields' order (``Seat(*record["seat"])`` reads it back):
    a plain list, built on every round's end (``dataclasses.astuple`` deep-copies: 30 µs)."""
    return [seat.id, seat.seq, seat.pool, seat.lane, seat.pod, seat.admitted_at]


def release_record(seat: Seat, outcome: str, seconds: float, cost_usd: float | None,
                   at: float | None = None, retry_after: float | None = None,
                   received: float | None = None, *, usage: Any = None, ceiling: str | None = None,
                   reset_s: float | None = None, reading: Any = None) -> dict[str, Any]:
    """A release as a ledger record (plain values: what the outbox stores). ``at``: when the
    round ended (its cost's UTC day); None while it is tried at once. ``retry_after``: the
    provider's Retry-After (s) the round ended with; ``received``: the tokens it received in all;
    ``usage``: what the provider counted (``Usage``: the ceilings' reconciliation, once);
    ``ceiling``, ``reset_s``: the rate ceiling a ``ceiling`` outcome spent and its reset;
    ``reading``: the provider's rate-limit headers (kept encoded, ``ratelimits.encode``)."""
    record = {"op": "release", "seat": _seat(seat), "outcome": outcome, "seconds": seconds,
              "cost_usd": cost_usd, "at": at, "retry_after": retry_after, "received": received}
    u = Usage.of(usage)
    if u is not None or ceiling is not None:  # a record without them stays as it was
        record.update(usage=None if u is None else asdict(u), ceiling=ceiling, reset_s=reset_s)
    if text := _reading(reading):  # likewise: a record without one stays as it was
        record["reading"] = text
    return record


def charge_record(seat: Seat, cost_usd: float, key: str, at: float | None) -> dict[str, Any]:
    return {"op": "charge", "seat": _seat(seat), "cost_usd": cost_usd, "key": key, "at": at}


class Pending:
    """Ledger records Redis has not applied yet (releases and charges that met an unreachable
    Redis, or no policy after a restart): in the pod's durable outbox when it has one, else in
    memory (bounded; lost with the process). Replayed in order by the clock; every record carries
    its idempotency key (the seat, and the charge key or `release`), so a replay counts once.
    Thread-safe without the book's lock: the outbox locks itself, and the deque is appended at
    one end and consumed at the other."""

    def __init__(self, outbox: Outbox | None) -> None:
        self.outbox = outbox
        self.memory: deque[dict[str, Any]] = deque()

    def keep(self, record: dict[str, Any], why: str) -> None:
        seat_id = record["seat"][0]
        if self.outbox is not None:
            try:
                self.outbox.append(record)
                log.warning("ledger_record_queued", round=seat_id, op=record["op"], why=why, outbox=self.outbox.path)
                return
            except OutboxFull as exc:  # never silent: kept in memory, loudly
                log.error("outbox_full", round=seat_id, error=str(exc))
        if len(self.memory) >= MAX_PENDING:
            dropped = self.memory.popleft()
            log.error("pending_full_record_dropped", dropped=dropped, limit=MAX_PENDING)
        self.memory.append(record)
        log.warning("ledger_record_pending", round=seat_id, op=record["op"], why=why, pending=len(self.memory))

    def __len__(self) -> int:
        return len(self.memory) + (len(self.outbox) if self.outbox is not None else 0)

    def replay(self, apply: Callable[[dict[str, Any]], Any]) -> None:
        """Apply what is pending, in order; ``apply`` raises ``Retry`` to stop (kept for later).
        A record that meets a lost reply is tried once more at once (it counts once either way):
        one blip does not hold a backlog back until the next turn of the clock."""
        def again(record: dict[str, Any]) -> Any:
            try:
                return apply(record)
            except Unconfirmed:
                raise  # no replica answered within the timeout: not a blip, wait for the next turn
            except Retry:
                return apply(record)

        while self.memory:
            try:
                again(self.memory[0])
            except Retry:
                return
            except AdmissionError:
                pass  # refused for good: ``apply`` recorded it
            self.memory.popleft()
        if self.outbox is not None and len(self.outbox):
            report = self.outbox.replay(again, transient=(Retry,))
            if report.applied or report.dead:
                log.info("outbox_replayed", applied=report.applied, kept=report.kept, dead=report.dead)


def record_calls(record: dict[str, Any], core: Core, server_time: float,
                 now: float | None = None) -> tuple[Call, Call | None]:
    """The script call a ledger record makes, and the charge that books a release's cost when
    Redis no longer knows its seat (a restart lost it, or its tombstone's day passed; ``now``: a
    direct release's). ``server_time``: now on the server's clock, as the pod last heard it."""
    seat = Seat(*record["seat"])
    if record["op"] == "charge":
        return core.charge(seat, cost_usd=record["cost_usd"], key=record["key"], at=record["at"]), None
    # a record queued while Redis was unreachable keeps its Retry-After, but a pause is about
    # the provider's present: one that has passed by the replay pauses nothing
    retry_after = record.get("retry_after")
    if retry_after is not None and record["at"] is not None:
        retry_after = max(0.0, record["at"] + retry_after - server_time) or None
    reset_s = record.get("reset_s")  # a ceiling's reset, like a pause, is about the present
    if reset_s is not None and record["at"] is not None:
        reset_s = max(0.0, record["at"] + reset_s - server_time)
    call = core.release(seat, outcome=record["outcome"], seconds=record["seconds"],
                        cost_usd=record["cost_usd"], at=record["at"], retry_after=retry_after,
                        received=record.get("received"), usage=record.get("usage"),
                        ceiling=record.get("ceiling"), reset_s=reset_s, reading=record.get("reading"))
    lost = None if record["cost_usd"] is None else core.charge(seat, cost_usd=record["cost_usd"],
                                                               key="release", at=record["at"], now=now)
    return call, lost
