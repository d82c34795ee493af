"""provider-day: one working day on a provider key with a daily limit (the seed's incident of
2026-10-04, "the provider's day").

``DaySim`` is the engine of ``engine.Sim`` with the provider's key of ``model.ProviderKey``: every
request of a round is checked against the key when it starts and billed when it ends; once the
day's count has reached the key's limit every request is refused with the 403 within a second,
until 00:00 UTC. It counts what the report needs: the 403s and the rounds that ended within a
second on one (the storm), the rules' closures and probes, when each lane first stopped and why,
the spend per lane on the provider's own count, and what was in flight when the count reached the
limit.

Simulated t = 0 is 08:00 UTC (``engine.EPOCH``); the window ends at 00:30 UTC
(``load.DAY_HOURS``), half an hour after the key's reset. The day's figures are taken at
midnight.

Several providers (``provider-day-fallback``): each provider of the scenario's pools has its own
key; the first pool's provider holds the key of ``limit_usd``, the one whose day and closure the
figures follow. A round the admission moved runs, and is billed, on the pool it was seated on.
The moving figures (``fallback_figures``) count from the first closure of that key.
"""
from __future__ import annotations

import datetime as _dt
from bisect import bisect_left
from typing import Any

from ...policy import TUNABLES as _DEFAULTS
from ...policy import may_move_to
from . import load as L
from . import model
from .engine import EPOCH, Round, Sim, Trace
from .policies import PACED_LANE, TUNABLES

DEFAULT_PROBE_EVERY = _DEFAULTS["probe_every"][0]  # 10 s

# event kinds after the engine's seven (ties: after everything else at the same instant)
TURN, KEY403, RETRY, MIDNIGHT, REASK, CENSUS = 7, 8, 9, 10, 11, 12
#: the refusals that say a lane stopped for the provider's day
STOPS = ("budget-reserve", "budget-spent", "provider-closed")
START_HOUR = (EPOCH % model.DAY) / 3600.0   # 8.0: t = 0 is 08:00 UTC
MIDNIGHT_T = (EPOCH // model.DAY + 1) * model.DAY - EPOCH  # t of the next 00:00 UTC (57,600 s)
FAST = 1.0  # s: "ended within a second on that 403"
PROBE_EVERY = float(TUNABLES.get("probe_every", DEFAULT_PROBE_EVERY))
REASK_LATENCY = 0.01  # s: the waiter's sleep ends a little after probe_every (a round trip)
CENSUS_EVERY = 300.0  # s: several providers: how often the census is read after the first closure


def hour(t: float | None) -> float | None:
    """Simulated t -> hour of the UTC day of the start (8.0 = 08:00; 24.25 = 00:15 the next day)."""
    return None if t is None else START_HOUR + t / 3600.0


def utc_day(t: float) -> str:
    return _dt.datetime.fromtimestamp(EPOCH + t, _dt.timezone.utc).strftime("%Y-%m-%d")


def provider_of(pool: str) -> str:
    return pool.rpartition("@")[2]


def minutes(a: float | None, b: float | None) -> float | None:
    """From ``a`` to ``b`` in minutes (None when either is missing)."""
    return None if a is None or b is None else (b - a) / 60.0


def first_at_or_after(times: list[float], t: float, before: float = float("inf")) -> float | None:
    """The first of the (sorted) ``times`` in [t, before), or None."""
    i = bisect_left(times, t)
    return times[i] if i < len(times) and times[i] < before else None


class DaySim(Sim):
    def __init__(self, *, limit_usd: float, price_per_1k: float, turn_tokens: float,
                 other_keys: dict[str, float | None] | None = None, **kw: Any):
        super().__init__(**kw)
        for pool in self.pools.values():
            pool.turn = turn_tokens
        # one key per provider; the first pool's provider holds the day's limit (``self.key``)
        providers = list(dict.fromkeys(provider_of(p) for p in self.pools))
        self.primary = providers[0]
        self.keys = {p: model.ProviderKey(limit_usd if p == self.primary else (other_keys or {}).get(p), price_per_1k)
                     for p in providers}
        self.key = self.keys[self.primary]
        self.lanes = list(getattr(self.policy, "lanes", {}) or sorted({i.lane for i in self.items}))
        self.midnight = MIDNIGHT_T
        self.n403 = self.fast403 = self.fast403_probes = self.probes = self.probes_clean = 0
        self.cut403, self.cut403_usd = 0, 0.0  # rounds the 403 cut while they ran, and what they cost
        self.refusals: dict[str, int] = {}
        self.probes_by_lane: dict[str, int] = {}  # whose rounds the probes were
        self.stopped: dict[str, tuple[float, str]] = {}
        self.closures: list[tuple[float, str]] = []
        self.closed_until = 0.0              # epoch; what the rules hold (read after a closing event)
        self._reopened = False               # a probe ended clean since the last read (it reopened)
        self._run, self._run_from = 0, 0.0   # the current stretch of fast 403s (probes set aside)
        self.storm = (0, 0.0, 0.0)           # longest stretch: rounds, first end, last end
        # when the count reached the limit: the rounds in flight (the one whose request reached it
        # included) and the most they could still be billed
        self.at_limit: tuple[int, float] | None = None
        self.at_closure: tuple[float, float] | None = None  # (key's count, in flight USD) at the first closure
        self.resumed: float | None = None    # first round served after midnight
        self._reasks: dict[tuple[str, str], float] = {}  # (pod, pool) -> when its waiters ask again
        # moving between providers: per lane, when it asked, moved, was admitted other than as a
        # probe (sorted: time only goes on); what ran where; the clean rounds' time ("one round")
        self.asked_at: dict[str, list[float]] = {}
        self.moved_at: dict[str, list[float]] = {}
        self.admitted_at: dict[str, list[float]] = {}
        self.moved = 0
        self.eu_rounds = self.eu_on_router = 0
        self.clean_rounds, self.clean_seconds = 0, 0.0
        self.elsewhere_at_closure: dict[str, int] = {}  # lane -> its rounds running on another key
        # what the census says of the pinned lane's waiters after the closure (read every
        # CENSUS_EVERY): when it first listed one as starving, and the most listed waiting
        self.pinned_starving: float | None = None
        self.pinned_waiting_peak = 0
        if self.trace is not None:
            self.trace = Trace({"bills": [], "bills_other": [], "r403": [], "closures": [], "stops": {},
                                "moves": {}, "limit": limit_usd, "reached": None, "midnight": MIDNIGHT_T})

    # -- the providers' keys ---------------------------------------------------------------------
    def key_of(self, pool: str) -> model.ProviderKey:
        return self.keys[provider_of(pool)]

    def _billable_usd(self, rounds: list[Round]) -> float:
        """The most the day's key can still bill these rounds: their tokens not billed yet."""
        return sum(self.key.cost(r.tokens - r.billed) for r in rounds)

    def _bill(self, rnd: Round, tokens: float) -> None:
        if tokens <= model._EPS:
            return
        key, now = self.key_of(rnd.pool), self.epoch()
        if (key is self.key and key.open(now) and key.limit is not None and self.now < self.midnight
                and key.spent + key.cost(tokens) >= key.limit):
            # this request takes the day's count to the limit: what is in flight now on the key
            # (this round included, from the request that reaches the limit) is all that can
            # still be billed
            running = [rnd] + [r for r in self.rounds.values() if r is not rnd and self.key_of(r.pool) is key]
            self.at_limit = (len(running), self._billable_usd(running))
            if self.trace is not None:
                self.trace.points["reached"] = self.now
        usd = key.bill(tokens, rnd.lane, now)
        rnd.billed += tokens
        rnd.cost_usd += usd
        if self.trace is not None:
            self.trace.points["bills" if key is self.key else "bills_other"].append((self.now, rnd.lane, usd))

    def _off_route(self, rnd: Round) -> bool:
        """Did ``rnd`` start on a provider its own pool's route forbids (an EU-routed round on a
        non-EU router: the policy's MayMoveTo)? The figures count what ran; the Lua decided."""
        routes = self.policy.routes()
        return not may_move_to(routes[provider_of(rnd.item.pool)], routes[provider_of(rnd.pool)])

    def _reach_provider(self, rnd: Round, pool: model.ProviderPool) -> None:
        if self.policy.routes()[provider_of(rnd.item.pool)]["route"] == "eu":
            self.eu_rounds += 1
            self.eu_on_router += self._off_route(rnd)
        if not self.key_of(pool.name).open(self.epoch()):  # the first request of the round is refused
            rnd.state = "refused"
            self._push(self.now + self.rng.uniform(0.0, model.KEY_REFUSAL_WITHIN), KEY403, rnd)
            return
        super()._reach_provider(rnd, pool)
        if rnd.state == "served" and self.now >= self.midnight and self.resumed is None:
            self.resumed = self.now

    def _schedule_finish(self, pool: model.ProviderPool) -> None:
        super()._schedule_finish(pool)
        self._schedule_turn(pool)

    def _schedule_turn(self, pool: model.ProviderPool) -> None:
        pool.turn_seq += 1  # only the latest request-end event of a pool is valid
        t = pool.next_turn_end()
        if t is not None:
            self._push(t, TURN, (pool.name, pool.turn_seq))

    def _turn_ends(self, name: str, seq: int) -> None:
        pool = self.pools[name]
        if seq != pool.turn_seq:
            return
        changed = False
        key = self.key_of(name)
        for rid in pool.pop_turn_ends(self.now):
            rnd = self.rounds[rid]
            self._bill(rnd, pool.turn)              # the request that ended is billed ...
            if not key.open(self.epoch()):          # ... and the next one is refused
                self._served_changed(pool)
                pool.remove(rid, self.now)
                del self.rounds[rid]
                rnd.state = "refused"
                self._push(self.now + self.rng.uniform(0.0, model.KEY_REFUSAL_WITHIN), KEY403, rnd)
                changed = True
        if changed:
            self._schedule_finish(pool)
        else:
            self._schedule_turn(pool)

    # -- rounds ---------------------------------------------------------------------------------
    def _end(self, rnd: Round, outcome: str) -> None:
        if outcome == "clean":
            self._bill(rnd, rnd.tokens - rnd.billed)           # its last request
        elif outcome == "round_cap":
            self._bill(rnd, rnd.tokens - rnd.left - rnd.billed)  # the request cut short
        on403 = rnd.state == "refused"
        if outcome == "clean" and self.now < self.midnight:  # what "one round" takes today
            self.clean_rounds += 1
            self.clean_seconds += self.now - rnd.started_at
        if self.now < self.midnight:
            fast = on403 and self.now - rnd.started_at <= FAST
            if on403:
                self.n403 += 1
                self._stop(rnd.lane, "403")
                if self.trace is not None:
                    self.trace.points["r403"].append((self.now, fast, rnd.probe))
            if fast:
                self.fast403 += 1
                self.fast403_probes += rnd.probe
            elif on403:
                self.cut403 += 1
                self.cut403_usd += rnd.cost_usd
            if rnd.probe:
                self.probes_clean += outcome == "clean"
                # a clean probe reopens the provider inside its release, and the waiters that
                # release wakes may close it again before we read it: count that as a closure
                self._reopened |= outcome == "clean"
            else:  # the storm: consecutive ends of the lanes' rounds, all fast 403s
                if fast:
                    self._run += 1
                    if self._run == 1:
                        self._run_from = self.now
                    if self._run > self.storm[0]:
                        self.storm = (self._run, self._run_from, self.now)
                else:
                    self._run = 0
        super()._end(rnd, outcome)
        if self.policy.rules and (on403 or rnd.probe):
            self._check_closure()

    def _again(self, rnd: Round, outcome: str) -> None:
        if outcome == "error":  # a failed round: the worker asks again later
            self._push(self.now + L.ERROR_RETRY_AFTER, RETRY, rnd)
        else:                   # a refusal the admission judges (load, closure): at once, waiting
            super()._again(rnd, outcome)

    def _retry(self, rnd: Round) -> None:
        if rnd.item.lane == PACED_LANE:
            self.backlog[(rnd.pod, rnd.item.pool)].append(rnd.item)
            self._pace(rnd.pod, rnd.item.pool)
        else:
            self._ask(rnd.item)

    def _stop(self, lane: str, why: str) -> None:
        if lane not in self.stopped and self.now < self.midnight:
            self.stopped[lane] = (self.now, why)

    def on_decision(self, rnd: Round, d: Any) -> None:
        self._note_move(rnd, d)
        if not d.admitted and d.reason == "provider-closed":
            # the client's waiter refused on a closed provider asks again probe_every after its
            # last refusal (base.ClientBase._retry_after), not at the pool clock
            t = self.now + PROBE_EVERY + REASK_LATENCY
            self._reasks[(rnd.pod, rnd.pool)] = t
            self._push(t, REASK, (rnd.pod, rnd.pool, t))
        if self.now >= self.midnight:
            return
        if d.admitted:
            if d.reason == "probe":
                rnd.probe = True
                self.probes += 1
                self.probes_by_lane[rnd.lane] = self.probes_by_lane.get(rnd.lane, 0) + 1
        else:
            self.refusals[d.reason] = self.refusals.get(d.reason, 0) + 1
            if d.reason in STOPS:
                self._stop(rnd.lane, d.reason)
        if d.reason in ("provider-closed", "probe") and self.closed_until <= self.epoch():
            self._check_closure()

    def _note_move(self, rnd: Round, d: Any) -> None:
        """Per lane, when it asked, when a round of it moved (ran on an alternative of its pool)
        and when one was admitted other than as a probe. The closure is read after the release
        that wrote it, whose wake-ups ask first, so the figures pick these up afterwards."""
        self.asked_at.setdefault(rnd.lane, []).append(self.now)
        if not d.admitted:
            return
        if d.moved_from:
            self.moved += self.now < self.midnight
            self.moved_at.setdefault(rnd.lane, []).append(self.now)
        if d.reason != "probe":
            self.admitted_at.setdefault(rnd.lane, []).append(self.now)

    def _check_closure(self) -> None:
        """Read the provider's closure from the rules (after a 403, a probe, or a refusal that
        says closed while we last saw it open): count each time it goes from open to closed."""
        st = self.policy.provider_state()
        now = self.epoch()
        reopened, self._reopened = self._reopened, False
        if st["closedUntil"] > now:
            if (self.closed_until <= now or reopened) and self.now < self.midnight:
                if not self.closures and len(self.keys) > 1:
                    # what already ran on the other providers when it first closed
                    for r in self.rounds.values():
                        if self.key_of(r.pool) is not self.key:
                            self.elsewhere_at_closure[r.lane] = self.elsewhere_at_closure.get(r.lane, 0) + 1
                    self._push(self.now + CENSUS_EVERY, CENSUS, None)
                if not self.closures:
                    # the key's count then, and what the rounds in flight on it can still bill:
                    # past this, the day's spend can only grow by rounds started after the closure
                    running = [r for r in self.rounds.values() if self.key_of(r.pool) is self.key]
                    self.at_closure = (self.key.totals(int(EPOCH // model.DAY))["spent"], self._billable_usd(running))
                self.closures.append((self.now, st["why"]))
                if self.trace is not None:
                    self.trace.points["closures"].append((self.now, st["why"]))
            self.closed_until = st["closedUntil"]
        else:
            self.closed_until = 0.0

    # -- the loop -------------------------------------------------------------------------------
    def run(self) -> "DaySim":
        self._push(self.midnight, MIDNIGHT, None)
        super().run()
        if self.trace is not None:
            self.trace.points["stops"] = dict(self.stopped)
            if len(self.keys) > 1 and self.closures:
                moved = self.fallback_figures()["moved_minutes"]
                self.trace.points["moves"] = {lane: self.closures[0][0] + m * 60.0
                                              for lane, m in moved.items() if m is not None}
        return self

    def _handle(self, kind: int, payload: Any) -> None:
        if kind == TURN:
            self._turn_ends(*payload)
        elif kind == KEY403:
            self._end(payload, self.policy.outcome(model.key_limit_error()))
        elif kind == RETRY:
            self._retry(payload)
        elif kind == REASK:
            pod, pool, t = payload
            if self._reasks.get((pod, pool)) == t:  # not asked again since
                del self._reasks[(pod, pool)]
                self._start(self.policy.reask(pod, pool, self.epoch()))
        elif kind == CENSUS:
            self._read_census()
        elif kind == MIDNIGHT:
            for key in self.keys.values():
                key.open(self.epoch())  # the keys' counts start again
            if self._run:
                self._run = 0
        else:
            super()._handle(kind, payload)

    def _read_census(self) -> None:
        """The census's word on the pinned waiters (``hardPinned``, ``starving`` of kind
        ``pinned``) until midnight: a read model, it changes no decision."""
        if self.now >= self.midnight:
            return
        census = self.policy.census(self.epoch())
        waiting = [p["hardPinned"]["waiting"] for p in census["pools"] if p.get("hardPinned")]
        self.pinned_waiting_peak = max([self.pinned_waiting_peak, *waiting])
        if self.pinned_starving is None and any(s["kind"] == "pinned" for s in census["starving"]):
            self.pinned_starving = self.now
        self._push(self.now + CENSUS_EVERY, CENSUS, None)

    def _record(self, pool: str) -> None:
        pass  # the day's trace is the bills, the 403s and the closures

    # -- figures --------------------------------------------------------------------------------
    def figures(self) -> dict[str, Any]:
        day = self.key.totals(int(EPOCH // model.DAY))
        limit = self.key.limit
        spent = day["spent"]
        reached = None if day["reached_at"] is None else day["reached_at"] - EPOCH
        storm_n, storm_a, storm_b = self.storm
        first_closure = self.closures[0] if self.closures else (None, None)
        ledger = None
        if self.policy.rules:
            ledger = sum(v for lane, row in self.policy.ledger(utc_day(0.0)).items() if lane != "*"
                         for v in row.values())
        done = {lane: sum(1 for i in self.items
                          if i.lane == lane and i.done_at is not None and i.done_at < self.midnight)
                for lane in self.lanes}
        budget = getattr(self.policy, "limit_usd", None) if getattr(self.policy, "budget", False) else None
        return {
            "limit_usd": limit,
            "policy_limit_usd": budget,
            "over_policy_limit_usd": None if budget is None else max(0.0, spent - budget),
            "spend_usd": {lane: day["by_lane"].get(lane, 0.0) for lane in self.lanes},
            "spend_total_usd": spent,
            "overshoot_usd": max(0.0, spent - limit),
            "left_usd": max(0.0, limit - spent),
            "ledger_usd": ledger,
            "limit_reached_hour": hour(reached),
            "in_flight_at_limit": None if self.at_limit is None else self.at_limit[0],
            "in_flight_usd_at_limit": None if self.at_limit is None else self.at_limit[1],
            "spent_usd_at_closure": None if self.at_closure is None else self.at_closure[0],
            "in_flight_usd_at_closure": None if self.at_closure is None else self.at_closure[1],
            "provider_403": self.n403,
            "fast_403": self.fast403,
            "fast_403_probes": self.fast403_probes,
            "cut_by_403": self.cut403,
            "cut_by_403_usd": self.cut403_usd,
            "storm_rounds": storm_n,
            "storm_hours": (storm_b - storm_a) / 3600.0 if storm_n else 0.0,
            "storm_from_hour": hour(storm_a) if storm_n else None,
            "closures": len(self.closures),
            "closed_hour": hour(first_closure[0]),
            "closed_by": first_closure[1],
            "probes": self.probes,
            "probes_clean": self.probes_clean,
            "stopped_hour": {lane: hour(self.stopped[lane][0]) if lane in self.stopped else None
                             for lane in self.lanes},
            "stopped_by": {lane: self.stopped[lane][1] if lane in self.stopped else None for lane in self.lanes},
            "refusals": dict(sorted(self.refusals.items())),
            "done": done,
            "resumed_minutes": None if self.resumed is None else (self.resumed - self.midnight) / 60.0,
            "rate_limited": self.rate_limited,
            "cut": self.cut,
            "stalled": self.stalled,
            "capacity": {p: pool.k for p, pool in self.pools.items()},
            "drained": self.left == 0,
            "sim_minutes": (min(self.now, self.end) - self.window_start) / 60.0,
            **(self.fallback_figures() if len(self.keys) > 1 else {}),
        }

    def _role(self, lane: str, ours: bool, pinned: bool) -> str:
        """What a lane does when the key closes: waits (pinned), moves, or is elsewhere (its
        rounds ask another provider's pool: EU-routed or not)."""
        if ours:
            return "pinned" if pinned else "unpinned"
        pool = next(i.pool for i in self.items if i.lane == lane)
        return "EU-routed" if self.policy.routes()[provider_of(pool)]["route"] == "eu" else "other key"

    def fallback_figures(self) -> dict[str, Any]:
        """Several providers: how the lanes of the key with the day's limit fared from its first
        closure (minutes; None where it did not happen), where the EU-routed rounds ran, and the
        spend on the other keys. A lane's move is its first round admitted on an alternative of
        its pool before midnight; its wait for the move is counted from its first ask after the
        closure (a lane with no work pending does not need to move)."""
        closed = self.closures[0][0] if self.closures else None
        pins = set(getattr(self.policy, "pins", ()))
        ours = [lane for lane in self.lanes
                if any(i.lane == lane and provider_of(i.pool) == self.primary for i in self.items)]
        movers = [lane for lane in ours if lane not in pins]

        def after(times: dict[str, list[float]], lane: str, before: float = float("inf")) -> float | None:
            return None if closed is None else first_at_or_after(times.get(lane, []), closed, before)

        def count(times: list[float], a: float, b: float) -> int:
            return bisect_left(times, b) - bisect_left(times, a)

        asks = {lane: 0 if closed is None else count(self.asked_at.get(lane, []), closed, self.midnight)
                for lane in ours}
        moved = {lane: minutes(closed, after(self.moved_at, lane, self.midnight)) for lane in movers}
        move_wait = {lane: minutes(after(self.asked_at, lane, self.midnight), after(self.moved_at, lane, self.midnight))
                     for lane in movers}
        back = {lane: minutes(closed, after(self.admitted_at, lane)) for lane in ours}
        moved_after = 0 if closed is None else sum(count(t, closed, self.midnight) for t in self.moved_at.values())
        # a pinned lane not admitted again within the window waited at least until its end
        pinned = [back[lane] if back[lane] is not None else minutes(closed, self.end)
                  for lane in ours if lane in pins]
        others = {p: k.totals(int(EPOCH // model.DAY)) for p, k in self.keys.items() if k is not self.key}

        def worst(xs: dict[str, float | None]) -> float | None:
            """The longest over the lanes that had work after the closure; None if one of them
            never moved (or none had work)."""
            got = [v for lane, v in xs.items() if asks[lane]]
            return None if not got or None in got else max(got)

        return {
            "lane_role": {lane: self._role(lane, lane in ours, lane in pins) for lane in self.lanes},
            "elsewhere_at_closure": {lane: self.elsewhere_at_closure.get(lane, 0) for lane in ours},
            "moved_minutes": moved,
            "moved_max_minutes": worst(moved),
            "move_wait_minutes": move_wait,
            "move_wait_max_minutes": worst(move_wait),
            "asks_after_closure": asks,
            "back_minutes": back,
            "round_minutes": self.clean_seconds / self.clean_rounds / 60.0 if self.clean_rounds else None,
            "moved_rounds": self.moved,
            "moved_after_closure": moved_after,
            "eu_rounds": self.eu_rounds,
            "eu_on_router": self.eu_on_router,
            "pinned_wait_minutes": max(pinned) if pinned and closed is not None else None,
            "pinned_waited_to_end": closed is not None and any(back[l] is None for l in ours if l in pins),
            "pinned_starving_minutes": minutes(closed, self.pinned_starving),
            "pinned_waiting_peak": self.pinned_waiting_peak,
            "probes_by_lane": {lane: self.probes_by_lane.get(lane, 0) for lane in self.lanes},
            "other_spend_usd": {lane: sum(t["by_lane"].get(lane, 0.0) for t in others.values())
                                for lane in self.lanes},
            "other_spend_total_usd": sum(t["spent"] for t in others.values()),
        }
