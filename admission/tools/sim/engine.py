"""The event loop: a heap of events on a simulated clock, the provider model per pool, the
measured load's items, and the admission under test (a policy from ``policies``).

Every random draw of a run comes from the one Generator the engine is given, in event order, so
a run is reproducible exactly (same seed, same scenario, same policy: same figures).
"""
from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from . import model
from .load import Item
from .policies import PACED_LANE, Policy

EPOCH = 1_800_000_000.0  # simulated t = 0, in epoch seconds (what the Lua sees as `now`)
CLOCK = 15.0             # the pool clock (grow_interval) and the client's re-ask period

# event kinds; at equal times the smaller kind runs first (ends free capacity before arrivals)
FINISH, RATE429, CUT, STALL, ARRIVE, CLOCK_EV, WAKE = range(7)


@dataclass(eq=False)
class Round:
    id: str
    item: Item
    pod: str
    lane: str
    pool: str                # where it runs: its item's pool, or the alternative it moved to
    tokens: float
    asked_at: float
    state: str = "asking"  # asking | doomed (will hear a 429) | refused (will hear a 403) | served | ended
    started_at: float = math.nan
    seat: Any = None
    left: float = 0.0        # tokens it still needed when it was cut
    # provider-day: what the provider billed it, and whether the admission let it through as a probe
    billed: float = 0.0      # tokens
    cost_usd: float = 0.0
    probe: bool = False


@dataclass
class Trace:
    """Time series for the plots (run 0 only): per pool (t, served, estimates)."""

    points: dict[str, list[tuple[float, int, tuple[float, ...]]]] = field(default_factory=dict)


class Sim:
    def __init__(self, *, pools: dict[str, float], pods: int, items: list[Item], policy: Policy,
                 rng: np.random.Generator, window_start: float = 0.0, hours: float = 10.0,
                 record: bool = False):
        self.pools = {name: model.ProviderPool(name, k) for name, k in pools.items()}
        self.pods = [f"pod-{i}" for i in range(pods)]
        self.items = items
        self.policy = policy
        self.rng = rng
        self.window_start = window_start
        self.end = window_start + hours * 3600.0
        self.now = 0.0
        self.rounds: dict[str, Round] = {}  # served rounds by id (the oracle reads them)
        self._heap: list = []
        self._seq = itertools.count()
        self._round_seq = itertools.count()
        self._wakes: set[float] = set()
        self.backlog: dict[tuple[str, str], list[Item]] = {}
        self.left = len(items)
        # figures
        self.rate_limited = self.cut = self.stalled = 0
        self.tokens_done = 0.0
        self.seats = {p: 0 for p in pools}
        self.peak = {p: 0 for p in pools}
        self.peak_over = {p: -math.inf for p in pools}
        self.above_k = {p: 0.0 for p in pools}
        self.busy = {p: 0.0 for p in pools}  # ∫ min(n, K) dt over the window: the provider's use
        self._last_change = {p: 0.0 for p in pools}
        # the policy's estimates, sampled on the pods' clocks within the window: samples, and those
        # where every estimate was within one of K
        self.est_samples = {p: 0 for p in pools}
        self.est_within_one = {p: 0 for p in pools}
        self.trace = Trace({p: [] for p in pools}) if record else None

    # -- plumbing -----------------------------------------------------------------------------
    def draw(self) -> float:
        return float(self.rng.random())

    def epoch(self, t: float | None = None) -> float:
        return EPOCH + (self.now if t is None else t)

    def _push(self, t: float, kind: int, payload: Any = None) -> None:
        heapq.heappush(self._heap, (t, kind, next(self._seq), payload))

    def _schedule_finish(self, pool: model.ProviderPool) -> None:
        t = pool.next_finish()
        if t is not None:
            self._push(t, FINISH, (pool.name, pool.version))

    def _in_window(self) -> bool:
        return self.now >= self.window_start

    def _served_changed(self, pool: model.ProviderPool) -> None:
        """Before n changes: integrate the time spent above K, and the provider's use."""
        if self._in_window():
            dt = self.now - max(self._last_change[pool.name], self.window_start)
            if pool.n > pool.k:
                self.above_k[pool.name] += dt
            self.busy[pool.name] += min(pool.n, pool.k) * dt
        self._last_change[pool.name] = self.now

    def _sample_estimates(self) -> None:
        if not self._in_window():
            return
        for name, pool in self.pools.items():
            est = self.policy.estimates(name)
            self.est_samples[name] += 1
            if est and all(abs(e - pool.k) <= 1.0 for e in est):
                self.est_within_one[name] += 1

    def _record(self, pool: str) -> None:
        if self.trace is not None:
            self.trace.points[pool].append((self.now, self.pools[pool].n, self.policy.estimates(pool)))

    # -- rounds -------------------------------------------------------------------------------
    def _new_round(self, item: Item, pod: str) -> Round:
        item.attempts += 1
        # the sequence prefix makes ids sort in ask order (waiters enqueued at the same `now`)
        rid = f"r{next(self._round_seq):07d}.{item.id}.{item.attempts}"
        return Round(rid, item, pod, item.lane, item.pool, item.tokens, self.now)

    def _ask(self, item: Item) -> None:
        rnd = self._new_round(item, self.pods[item.pod])
        self._start(self.policy.ask(rnd, self.epoch()))

    def _start(self, rounds: list[Round]) -> None:
        for rnd in rounds:
            self._start_one(rnd)

    def _start_one(self, rnd: Round) -> None:
        """The admission let ``rnd`` start: it reaches the provider now."""
        pool = self.pools[rnd.pool]
        pool.advance(self.now)
        rnd.started_at = self.now
        self.seats[rnd.pool] += 1
        self._reach_provider(rnd, pool)
        est = self.policy.estimates(rnd.pool) if self.policy.has_estimate else ()
        if est and self._in_window():
            self.peak_over[rnd.pool] = max(self.peak_over[rnd.pool],
                                           self.seats[rnd.pool] - max(1, math.floor(max(est))))
        self._record(rnd.pool)

    def _reach_provider(self, rnd: Round, pool: model.ProviderPool) -> None:
        """The provider refuses ``rnd`` with a 429 (it hears it later) or serves it."""
        n = pool.n + 1
        p = model.p_rate_limited(n, pool.k)
        if p > 0 and self.draw() < p:
            rnd.state = "doomed"
            self._push(self.now + self.rng.uniform(0.0, model.RATE_LIMIT_WITHIN), RATE429, rnd)
        else:
            rnd.state = "served"
            self._served_changed(pool)
            pool.add(rnd.id, rnd.tokens, self.now)
            self.rounds[rnd.id] = rnd
            if rnd.item.first_start is None:
                rnd.item.first_start = self.now
            self._push(self.now + model.STALL_AFTER, STALL, rnd)
            self._push(self.now + model.ROUND_CAP, CUT, rnd)
            self._schedule_finish(pool)
            if self._in_window():
                self.peak[rnd.pool] = max(self.peak[rnd.pool], pool.n)

    def _end(self, rnd: Round, outcome: str) -> None:
        rnd.state = "ended"
        self.seats[rnd.pool] -= 1
        started = self.policy.release(rnd, outcome, self.now - rnd.started_at, self.epoch())
        self._start(started)
        item = rnd.item
        if outcome == "clean":
            item.done_at = self.now
            self.left -= 1
            if self._in_window():
                self.tokens_done += rnd.tokens
        else:
            self._again(rnd, outcome)
        # the paced lanes of the pools the release wakes (a round that moved frees a seat its
        # own pool's backlog may move to as well)
        for pool in self.policy.woken(rnd.pool):
            for pod in self.policy.listeners(rnd.pod):
                self._pace(pod, pool)
        self._record(rnd.pool)

    def _again(self, rnd: Round, outcome: str) -> None:
        """A round that did no useful work: its item is asked again."""
        if rnd.item.lane == PACED_LANE:
            self.backlog[(rnd.pod, rnd.item.pool)].append(rnd.item)  # back to the bug pool
        else:
            self._ask(rnd.item)  # the worker asks again at once (and waits)

    def received(self, pod: str) -> list[tuple[Any, float]]:
        """(seat, tokens received so far) of every round of ``pod`` the provider is serving now."""
        out = []
        for rnd in self.rounds.values():
            if rnd.pod == pod and rnd.seat is not None:
                pool = self.pools[rnd.pool]
                pool.advance(self.now)
                out.append((rnd.seat, rnd.tokens - pool.remaining(rnd.id)))
        return out

    def on_decision(self, rnd: Round, decision: Any) -> None:
        """The admission's answer to one ask (the provider-day scenario reads the reasons)."""

    # -- the lane that starts work (the bug pool) ---------------------------------------------
    def _pace(self, pod: str, pool: str) -> None:
        backlog = self.backlog.get((pod, pool))
        if not backlog:
            return
        now = self.epoch()
        n = self.policy.allowance(pod, PACED_LANE, pool, len(backlog), now)
        if n <= 0:
            return
        backlog.sort(key=lambda it: (-it.urgency(self.now), it.id))  # the most urgent first
        chosen, backlog[:] = backlog[:n], backlog[n:]
        for item in chosen:
            self._ask(item)

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> "Sim":
        self.policy.setup(self)
        by_time: dict[float, list[Item]] = {}
        for item in self.items:
            by_time.setdefault(item.arrival, []).append(item)
            if item.lane == PACED_LANE:
                self.backlog.setdefault((self.pods[item.pod], item.pool), [])
        for t in sorted(by_time):
            self._push(t, ARRIVE, by_time[t])
        for pod in self.pods:
            self._push(float(self.rng.uniform(0.0, CLOCK)), CLOCK_EV, pod)
        while self._heap and self.left > 0:
            t, kind, _, payload = heapq.heappop(self._heap)
            if t > self.end:
                break
            self.now = t
            self._handle(kind, payload)
            self._maybe_wake()
        if self.left > 0:
            self.now = max(self.now, self.end)
        for pool in self.pools.values():
            self._served_changed(pool)
        self.policy.close()
        return self

    def _handle(self, kind: int, payload: Any) -> None:
        if kind == FINISH:
            name, version = payload
            pool = self.pools[name]
            if version != pool.version:
                return
            self._served_changed(pool)
            done = pool.pop_finished(self.now)
            for rid in done:
                self._end(self.rounds.pop(rid), "clean")
            self._schedule_finish(pool)
        elif kind == RATE429:
            if self._in_window():
                self.rate_limited += 1
            self._end(payload, "rate_limited")
        elif kind == CUT:
            rnd = payload
            if rnd.state == "served":
                pool = self.pools[rnd.pool]
                self._served_changed(pool)
                rnd.left = pool.remove(rnd.id, self.now)
                del self.rounds[rnd.id]
                if self._in_window():
                    self.cut += 1
                self._schedule_finish(pool)
                self._end(rnd, "round_cap")
        elif kind == STALL:
            rnd = payload
            if rnd.state == "served":
                if self._in_window():
                    self.stalled += 1
                self.policy.report(rnd, "stall", self.epoch())
                self._record(rnd.pool)
        elif kind == ARRIVE:
            paced = set()
            for item in payload:
                if item.lane == PACED_LANE:
                    self.backlog[(self.pods[item.pod], item.pool)].append(item)
                    paced.add((self.pods[item.pod], item.pool))
                else:
                    self._ask(item)
            for pod, pool in sorted(paced):
                self._pace(pod, pool)
        elif kind == CLOCK_EV:
            pod = payload
            self._start(self.policy.clock(pod, self.epoch()))
            for (p, pool) in list(self.backlog):
                if p == pod:
                    self._pace(p, pool)
            for pool in self.pools:
                self._record(pool)
            self._sample_estimates()
            self._push(self.now + CLOCK, CLOCK_EV, pod)
        elif kind == WAKE:
            self._wakes.discard(payload)
            self._start(self.policy.wake(self.epoch()))

    def _maybe_wake(self) -> None:
        w = self.policy.wake_at(self.epoch())
        if w is not None:
            t = w - EPOCH
            if t not in self._wakes and t <= self.end:
                self._wakes.add(t)
                self._push(t, WAKE, t)

    # -- figures ------------------------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        """The run's figures, in the names of the report (minutes from the window start)."""
        w = self.window_start
        groups: dict[str, list[Item]] = {}
        for item in self.items:
            if not item.group.startswith("_"):
                groups.setdefault(item.group, []).append(item)

        def minutes(t: float | None) -> float | None:
            return None if t is None else (t - w) / 60.0

        drain = {g: (minutes(max(it.done_at for it in its)) if all(it.done_at is not None for it in its) else None)
                 for g, its in groups.items()}
        ramp = {g: (max(it.first_start - it.arrival for it in its) / 60.0
                    if all(it.first_start is not None for it in its) else None) for g, its in groups.items()}
        reds = [it for it in self.items if it.meta.get("red_main")]
        red = (max(it.first_start - it.arrival for it in reds) / 60.0
               if reds and all(it.first_start is not None for it in reds) else None)
        # backlog items that the seed's urgency puts before a fresh red main (same pod and pool)
        behind = max((sum(1 for it in self.items if it.lane == PACED_LANE and not it.meta.get("red_main")
                          and it.pod == r.pod and it.pool == r.pool and it.arrival <= r.arrival
                          and it.urgency(r.arrival) > r.urgency(r.arrival)) for r in reds), default=None)
        finished = self.left == 0
        span = (self.now if finished else self.end) - w
        return {
            "drain_minutes": drain,
            "rate_limited": self.rate_limited,
            "cut": self.cut,
            "stalled": self.stalled,
            "red_main_start_minutes": red,
            "red_main_behind": behind,
            "peak_in_flight": dict(self.peak),
            "capacity": {p: pool.k for p, pool in self.pools.items()},
            "tokens_per_s": self.tokens_done / span if span > 0 else 0.0,
            "start_minutes": ramp,
            "minutes_above_k": {p: v / 60.0 for p, v in self.above_k.items()},
            # the provider's use: mean min(n, K) / K over the window
            "utilisation": {p: (self.busy[p] / (pool.k * span) if span > 0 else 0.0) for p, pool in self.pools.items()},
            "estimate_within_one": {p: (self.est_within_one[p] / self.est_samples[p] if self.est_samples[p] else None)
                                    for p in self.pools},
            "rate_limited_per_10min": self.rate_limited / (span / 600.0) if span > 0 else 0.0,
            "peak_over_estimate": {p: (None if v == -math.inf else v) for p, v in self.peak_over.items()},
            "drained": finished,
            "sim_minutes": span / 60.0,
        }
