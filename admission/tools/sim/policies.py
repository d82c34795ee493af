"""The admissions compared: ``step`` (the seed's old one), ``seed-and-grow`` (the shipped Lua,
driven through the public client), and ``oracle`` (knows the provider model: the floor).

A policy answers the engine: a round asks (``ask``), a round reports a load signal mid-round
(``report``), a round ends (``release``), a pod's 15-second clock fires (``clock``), a lane that
starts work asks how much it may submit (``allowance``). ``ask``, ``release``, ``clock`` and
``wake`` return the rounds that start now (the engine starts them at the provider).
"""
from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from typing import Any

from ... import Admission
from ...alternatives import alternatives as alternatives_of
from ...classify import outcome_of
from ...core import mesh_key
from ...policy import validate
from . import model
from .load import KEY_DAILY_LIMIT_USD

#: The seed's lanes that carry the measured load (deploy/policy.example.toml, same values).
LANES = {
    "babysitter": {"floor": 0.05, "weight": 2, "priority": 50},
    "reviews": {"floor": 0.30, "weight": 2, "priority": 40},
    "bugfix": {"floor": 0.25, "weight": 1, "priority": 30},
    "triage": {"floor": 0.10, "weight": 1, "priority": 20},
}
#: Defaults of DESIGN §4, except the lease: a simulated day outlives every run, so no heartbeats.
TUNABLES = {"lease_ttl": 86_400}
#: provider-day: the seed's lanes and express (deploy/policy.example.toml: floor, weight, priority).
#: No reserve is set: the rules' defaults by lane name apply (admission.policy.DEFAULT_RESERVE:
#: triage 30 %, bugfix 20 %, reviews 10 %, babysitter 5 %, express 0).
DAY_LANES = {"express": {"floor": 0.10, "weight": 4, "priority": 70}, **LANES}
LOAD = ("rate_limited", "stall", "round_cap")
STEP_FACTOR = 0.1        # step: a tenth of the measured load ...
STEP_FOR = 35 * 60.0     # ... for 35 minutes
PACED_LANE = "bugfix"    # the lane that starts work (the bug pool)


def can_call(pool: str) -> bool:
    """A simulated worker calls whatever pool its round runs on: it may move to every alternative
    (a round moves only where its caller can call, ``move_to``)."""
    return True


class Policy:
    name = "?"
    has_estimate = False  # True: an estimate K̂ bounds what it admits (the over-estimate figure)

    def setup(self, sim) -> None:
        self.sim = sim

    def ask(self, rnd, now: float) -> list:
        raise NotImplementedError

    def report(self, rnd, signal: str, now: float) -> None:
        pass

    def release(self, rnd, outcome: str, seconds: float, now: float) -> list:
        raise NotImplementedError

    def clock(self, pod: str, now: float) -> list:
        return []

    def allowance(self, pod: str, lane: str, pool: str, wanted: int, now: float) -> int:
        return wanted  # lanes that do not pace submit everything at once

    def wake_at(self, now: float) -> float | None:
        return None

    def wake(self, now: float) -> list:
        return []

    def listeners(self, pod: str) -> list[str]:
        """The pods that hear a release of ``pod`` (their lanes that start work look again)."""
        return self.sim.pods

    def woken(self, pool: str) -> list[str]:
        """The pools whose waiters (and paced lanes) a release on ``pool`` wakes."""
        return [pool]

    def estimates(self, pool: str) -> tuple[float, ...]:
        """What the policy believes the pool serves (one value per admission; empty: no bound)."""
        return ()

    def close(self) -> None:
        pass


class Step(Policy):
    """The admission that ran until 2026-10-04: everything is admitted until a refusal (any load
    signal: 429, stall or cut), then a tenth of the rounds measured in flight at that refusal for
    35 minutes, one bound for everything the process runs (every lane, every pool). Each refusal
    measures again. Per process: with several pods each has its own bound."""

    name = "step"

    def setup(self, sim) -> None:
        super().setup(sim)
        self.queue = {pod: deque() for pod in sim.pods}
        self.flight = {pod: set() for pod in sim.pods}
        self.limit = {pod: 0 for pod in sim.pods}
        self.until = {pod: -math.inf for pod in sim.pods}

    def _allowed(self, pod: str, now: float) -> bool:
        return now >= self.until[pod] or len(self.flight[pod]) < self.limit[pod]

    def _drain(self, pod: str, now: float) -> list:
        out, q = [], self.queue[pod]
        while q and self._allowed(pod, now):
            rnd = q.popleft()
            self.flight[pod].add(rnd.id)
            out.append(rnd)
        return out

    def _refusal(self, pod: str, now: float) -> None:
        self.limit[pod] = max(1, math.floor(STEP_FACTOR * len(self.flight[pod])))
        self.until[pod] = now + STEP_FOR

    def ask(self, rnd, now):
        self.queue[rnd.pod].append(rnd)
        return self._drain(rnd.pod, now)

    def report(self, rnd, signal, now):
        self._refusal(rnd.pod, now)

    def release(self, rnd, outcome, seconds, now):
        if outcome in LOAD:
            self._refusal(rnd.pod, now)
        self.flight[rnd.pod].discard(rnd.id)
        return self._drain(rnd.pod, now)

    def clock(self, pod, now):
        return self._drain(pod, now)

    def wake_at(self, now):
        due = [u for pod, u in self.until.items() if u > now and self.queue[pod]]
        return min(due) if due else None

    def wake(self, now):
        return [r for pod in self.sim.pods for r in self._drain(pod, now)]

    def estimates(self, pool):
        now = self.sim.epoch()
        return tuple(float(self.limit[p]) for p in self.sim.pods if now < self.until[p])


class Oracle(Policy):
    """Knows the provider model. Keeps in flight the largest number at which no round is refused
    with a 429 (n <= K) and no round running is cut at the cap (every served round, the new one
    included, would finish before its cap if n stayed at that level), admitting by lane priority
    (then urgency, then arrival) and backfilling with a smaller round when a larger one does not
    fit. It ignores stalls. Centralized: it sees every pod."""

    name = "oracle"

    def setup(self, sim) -> None:
        super().setup(sim)
        self.queues: dict[str, dict[float, list]] = {p: {} for p in sim.pools}
        self._seq = itertools.count()

    def ask(self, rnd, now):
        urgent = rnd.item.urgency(self.sim.now) if rnd.lane == PACED_LANE else 0.0  # sim time, not epoch
        key = (-LANES[rnd.lane]["priority"], -urgent, next(self._seq))
        heapq.heappush(self.queues[rnd.pool].setdefault(rnd.tokens, []), (key, rnd))
        return self._fill(rnd.pool, now)

    def _limit(self, pool: str) -> float:
        """The largest n at which every served round still meets its cap."""
        prov, now = self.sim.pools[pool], self.sim.now
        m = math.inf
        for rid in prov.served:
            rnd = self.sim.rounds[rid]
            left = model.ROUND_CAP - (now - rnd.started_at)
            need = prov.remaining(rid) / left if left > 0 else math.inf
            m = min(m, math.floor(model.max_rounds_at_rate(need, prov.k) + 1e-9))
        return m

    def _fill(self, pool: str, now: float) -> list:
        prov = self.sim.pools[pool]
        prov.advance(self.sim.now)
        out, n, limit = [], prov.n, self._limit(pool)
        heaps = self.queues[pool]
        while True:
            m = n + 1
            if m > prov.k or m > limit:
                break
            # the best waiting round (by priority) that can finish before its cap at level m
            best = None
            for tokens, h in heaps.items():
                if h and tokens <= model.ROUND_CAP * model.rate(m, prov.k) + 1e-9:
                    if best is None or h[0][0] < heaps[best][0][0]:
                        best = tokens
            if best is None:
                break
            _, rnd = heapq.heappop(heaps[best])
            out.append(rnd)
            n = m
            limit = min(limit, math.floor(model.max_rounds_at_rate(rnd.tokens / model.ROUND_CAP, prov.k) + 1e-9))
        return out

    def release(self, rnd, outcome, seconds, now):
        return self._fill(rnd.pool, now)

    def clock(self, pod, now):
        return [r for p in self.sim.pools for r in self._fill(p, now)] if pod == self.sim.pods[0] else []

    def wake_at(self, now):
        """When a pool with work waiting becomes able to take one more round (its served rounds
        get ahead of their caps as time passes at constant n)."""
        best = None
        for pool, heaps in self.queues.items():
            if not any(heaps.values()):
                continue
            prov = self.sim.pools[pool]
            n, m = prov.n, prov.n + 1
            if m > prov.k or n == 0:
                continue
            prov.advance(self.sim.now)
            r_n, r_m = model.rate(n, prov.k), model.rate(m, prov.k)
            dt = 0.0
            for rid in prov.served:
                rnd = self.sim.rounds[rid]
                left = model.ROUND_CAP - (self.sim.now - rnd.started_at)
                dt = max(dt, (prov.remaining(rid) - r_m * left) / (r_n - r_m))
            if dt > 1e-6:
                best = now + dt + 1e-6 if best is None else min(best, now + dt + 1e-6)
        return best

    def wake(self, now):
        return [r for p in self.sim.pools for r in self._fill(p, now)]

    def estimates(self, pool):
        return (self.sim.pools[pool].k,)


class SeedAndGrow(Policy):
    """The shipped Lua, through the public client, one ``Admission`` per pod. ``private``: each
    pod has its own mesh (per-process admission, four meshes that cannot see each other);
    otherwise every pod shares one mesh. Refused rounds keep a waiter ticket and re-ask as the
    client does: only a pod's oldest waiter per lane and pool, on a release wake-up of that pool
    (heard by every pod of the mesh), on a growth wake-up and on the pod's 15-second clock."""

    has_estimate = True

    def __init__(self, client, *, private: bool = False, mesh_prefix: str = "sim"):
        self.client = client
        self.private = private
        self.mesh_prefix = mesh_prefix
        self.name = "seed-and-grow-private" if private else "seed-and-grow"

    lanes = LANES
    provider = "sim"

    def providers(self) -> dict:
        return {self.provider: {}}

    def moves(self) -> dict:
        """The policy's tables for moving between pools (none: the policy's defaults)."""
        return {}

    def setup(self, sim) -> None:
        super().setup(sim)
        policy = {"tunables": TUNABLES, "lanes": self.lanes, "providers": self.providers(),
                  "pools": {p: {} for p in sim.pools}, "clock": "caller", **self.moves()}
        self.validated = validate(policy)
        # pool -> the pools that list it as an alternative: a release there wakes their waiters
        # too, as the client's does (a waiter re-asks across its pool's alternatives)
        self.movers: dict[str, list[str]] = {}
        for pool, alts in alternatives_of(self.validated).items():
            for alt in alts:
                self.movers.setdefault(alt, []).append(pool)
        self.mesh = {pod: f"{self.mesh_prefix}-{i if self.private else 0}" for i, pod in enumerate(sim.pods)}
        self.adm = {pod: Admission(self.client, mesh=self.mesh[pod], pod=pod, background=False) for pod in sim.pods}
        self.pods_of: dict[str, list[str]] = {}
        for pod, mesh in self.mesh.items():
            if mesh not in self.pods_of:
                self.adm[pod].ops.apply_policy(policy, recovery_hold=False)
            self.pods_of.setdefault(mesh, []).append(pod)
        seed = float(policy["tunables"].get("seed_estimate", 2))
        self.est = {(m, p): seed for m in self.pods_of for p in sim.pools}
        self.waiting: dict[str, dict[tuple[str, str], deque]] = {pod: {} for pod in sim.pods}

    def _ask(self, rnd, now):
        # the round's size, as the worker knows it (the seed gives each kind's): the cap line
        d = self.adm[rnd.pod].try_admit(lane=rnd.lane, model=rnd.pool, round_id=rnd.id, now=now,
                                        draw=self.sim.draw(), wait=True, tokens=rnd.tokens, move_to=can_call)
        self.est[(self.mesh[rnd.pod], d.pool)] = d.estimate  # the pool it runs or waits on
        self.sim.on_decision(rnd, d)
        if d.admitted:
            rnd.seat = d.seat
            rnd.pool = d.pool  # moved: it runs on the alternative (its item still asks its own pool)
        return d.admitted

    def ask(self, rnd, now):
        if self._ask(rnd, now):
            return [rnd]
        self.waiting[rnd.pod].setdefault((rnd.lane, rnd.pool), deque()).append(rnd)
        return []

    def _reask(self, pod: str, pool: str | None, now: float) -> list:
        out, groups = [], self.waiting[pod]
        for key in list(groups):
            if pool is not None and key[1] != pool:
                continue
            q = groups[key]
            while q and self._ask(q[0], now):  # the oldest; when admitted the next may ask
                out.append(q.popleft())
            if not q:
                del groups[key]
        return out

    def reask(self, pod: str, pool: str, now: float) -> list:
        """The pod's oldest waiters on ``pool`` ask again (a waiter's own retry timer)."""
        return self._reask(pod, pool, now)

    def woken(self, pool: str) -> list[str]:
        return [pool, *sorted(self.movers.get(pool, ()))]

    def routes(self) -> dict[str, dict]:
        """Each provider's route and kind, as the policy declares them (normalized)."""
        return self.validated["providers"]

    def report(self, rnd, signal, now):
        r = self.adm[rnd.pod].report(rnd.seat, signal=signal, now=now)
        self.est[(self.mesh[rnd.pod], rnd.pool)] = r.estimate

    def release(self, rnd, outcome, seconds, now):
        r = self.adm[rnd.pod].release(rnd.seat, outcome=outcome, seconds=seconds, cost_usd=self.cost(rnd), now=now)
        mesh = self.mesh[rnd.pod]
        if r.estimate is not None:
            self.est[(mesh, rnd.pool)] = r.estimate
        return [x for pool in self.woken(rnd.pool) for pod in self.pods_of[mesh] for x in self._reask(pod, pool, now)]

    def clock(self, pod, now):
        mesh = self.mesh[pod]
        # the tokens each of this pod's declared rounds has received so far, as a streaming worker
        # counts them: the cap line's fit gets its points while the rounds run
        received = self.sim.received(pod)
        if received:
            self.adm[pod].progress(received, now=now)
        tick = self.adm[pod].tick(now=now)
        out = []
        for pool, est in tick.grew.items():
            self.est[(mesh, pool)] = est
            for other in self.pods_of[mesh]:  # the growth wakes the mesh's waiters
                if other != pod:
                    for woken in self.woken(pool):
                        out += self._reask(other, woken, now)
        return out + self._reask(pod, None, now)

    def allowance(self, pod, lane, pool, wanted, now):
        if self.waiting[pod].get((lane, pool)):
            return 0  # what plan answers while the lane has waiters there (saves the round trip)
        n = self.adm[pod].plan(lane=lane, model=pool, wanted=wanted, now=now, move_to=can_call)
        # A lane with more work than admission lets start keeps one round asking as a waiter (the
        # README's pacing contract): that waiter is the lane's demand, so the estimate can grow,
        # and its claim to its floor, so reserved and fair share make borrowers yield to it.
        return n + 1 if wanted > n else n

    def listeners(self, pod):
        return self.pods_of[self.mesh[pod]]

    def cost(self, rnd) -> float | None:
        """The cost a release reports (None: not priced, as in the seed's scenarios)."""
        return None

    def estimates(self, pool):
        return tuple(self.est[(m, pool)] for m in self.pods_of)

    def close(self):
        for adm in self.adm.values():
            adm.close()


class Day(SeedAndGrow):
    """provider-day: the shipped Lua on one shared mesh with the seed's lanes and express.

    ``rules=True`` (``with-rules``): the policy declares the key's daily limit
    (``daily_limit_usd``), every release reports the round's cost (what the provider billed; a
    round refused at its first request reports none) and the provider's 403 is classified by
    ``admission.classify`` (``key_daily_limit``: a closure until midnight).
    ``rules=False`` (``without-rules``, the seed's baseline): admission knows no budget, no cost is
    reported, and the 403 is a plain ``error`` (no closure).
    ``budget=False`` with the rules (``closure-only``, not in the scenario's table): the key's limit
    is set only at the provider, so the policy declares none; costs are reported and the 403 closes
    the provider, but nothing stops a lane before it (the seed: "learned from its first refusal")."""

    lanes = DAY_LANES

    def __init__(self, client, *, rules: bool, limit_usd: float, budget: bool = True, mesh_prefix: str = "sim"):
        super().__init__(client, mesh_prefix=mesh_prefix)
        self.rules = rules
        self.budget = rules and budget
        self.limit_usd = limit_usd
        self.name = ("with-rules" if self.budget else "closure-only") if rules else "without-rules"

    def providers(self) -> dict:
        return {self.provider: {"daily_limit_usd": self.limit_usd} if self.budget else {}}

    def outcome(self, error: Exception) -> str:
        return outcome_of(error) if self.rules else "error"

    def cost(self, rnd) -> float | None:
        return rnd.cost_usd if self.rules and rnd.cost_usd > 0 else None

    def provider_state(self) -> dict[str, float | str]:
        """The provider's closure as the rules hold it (closedUntil, why, closedAt)."""
        mesh = next(iter(self.pods_of))
        raw = self.client.hmget(mesh_key(mesh, "provider", self.provider), "closedUntil", "why", "closedAt")
        until, why, at = (v.decode() if v is not None else "" for v in raw)
        return {"closedUntil": float(until or 0), "why": why, "closedAt": float(at or 0)}

    def ledger(self, day: str) -> dict[str, dict[str, float]]:
        return next(iter(self.adm.values())).ops.ledger(day)

    def census(self, now: float) -> dict:
        """The mesh's read model now (the census)."""
        return next(iter(self.adm.values())).ops.census(now=now)


#: provider-day-fallback: one model on two providers. The key with the daily limit is reached
#: through a global router; the other provider is an EU-routed direct one (DESIGN §7: an EU-routed
#: pool may never move to a non-EU router, so the EU pool has no alternative).
ROUTER, EU = "openrouter", "azure-eu"
FALLBACK_PROVIDERS = {ROUTER: {"route": "global", "kind": "router"}, EU: {"route": "eu", "kind": "direct"}}
#: the lane hard-pinned to its pool (it waits for its provider, never moves)
PINNED_LANES = ("babysitter",)


class DayFallback(Day):
    """provider-day-fallback: the shipped Lua with the provider's-day rules on two providers of
    one model, the router's key limit known only to the provider (as ``closure-only``: the first
    403 closes the router until midnight; every release reports its cost).

    ``fallback=True`` (``fallback``): the policy's default tiers give the router's pool the EU
    pool as its alternative, so a round refused on the closed router moves there in the same
    call. ``fallback=False`` (``no-fallback``): ``tiers = {}`` and no ``[alternatives]``: nothing
    moves. In both, the lanes of ``PINNED_LANES`` are hard-pinned (``[pins]``)."""

    provider = ROUTER  # the key that closes (DaySim reads its closure)
    pins = PINNED_LANES

    def __init__(self, client, *, fallback: bool, limit_usd: float, mesh_prefix: str = "sim"):
        super().__init__(client, rules=True, budget=False, limit_usd=limit_usd, mesh_prefix=mesh_prefix)
        self.fallback = fallback
        self.name = "fallback" if fallback else "no-fallback"

    def providers(self) -> dict:
        return {name: dict(p) for name, p in FALLBACK_PROVIDERS.items()}

    def moves(self) -> dict:
        pins = {"pins": {"lanes": list(self.pins)}}
        return pins if self.fallback else {**pins, "tiers": {}, "alternatives": {}}


def day_reserves() -> dict[str, float]:
    """Each provider-day lane's budget reserve, as the rules read it from the policy."""
    pol = validate({"lanes": DAY_LANES, "providers": {"sim": {}}, "pools": {"main@sim": {}}})
    return {lane["name"]: lane["reserve"] for lane in pol["lanes"]}


NAMES = ("step", "seed-and-grow", "seed-and-grow-private", "oracle", "with-rules", "without-rules", "closure-only",
         "fallback", "no-fallback")
#: The policies that run the shipped Lua (they need a server).
REDIS_BACKED = ("seed-and-grow", "seed-and-grow-private", "with-rules", "without-rules", "closure-only",
                "fallback", "no-fallback")


def make(name: str, client: Any = None, mesh_prefix: str = "sim", limit_usd: float | None = None) -> Policy:
    if name == "step":
        return Step()
    if name == "oracle":
        return Oracle()
    if name in ("seed-and-grow", "seed-and-grow-private"):
        if client is None:
            raise ValueError(f"{name} needs a Redis client")
        return SeedAndGrow(client, private=name.endswith("private"), mesh_prefix=mesh_prefix)
    if name in ("with-rules", "without-rules", "closure-only"):
        if client is None:
            raise ValueError(f"{name} needs a Redis client")
        return Day(client, rules=name != "without-rules", budget=name == "with-rules",
                   limit_usd=limit_usd or KEY_DAILY_LIMIT_USD, mesh_prefix=mesh_prefix)
    if name in ("fallback", "no-fallback"):
        if client is None:
            raise ValueError(f"{name} needs a Redis client")
        return DayFallback(client, fallback=name == "fallback", limit_usd=limit_usd or KEY_DAILY_LIMIT_USD,
                           mesh_prefix=mesh_prefix)
    raise ValueError(f"unknown policy {name!r}; known: {', '.join(NAMES)}")
