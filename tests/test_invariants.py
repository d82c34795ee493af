"""Stateful property test: the counts in Redis always match the seat and ticket records.

A hypothesis RuleBasedStateMachine drives three pods of one mesh (simulated clock, injected
draws) over two pools and three lanes: admits (try / wait), re-asks of waiters, releases with
every outcome, retried releases, mid-round load signals, heartbeats, and pool-clock ticks that
sometimes jump past the lease so the pods that did not heartbeat lose their seats and tickets.

After every step the doctor (lua/doctor.lua) must find nothing, and the state is read straight
from Redis and checked again in Python (docs/design.md §3, §5, §10):
  * per pool and lane: `lanes:<p>[<lane>]` == live `seat:<id>` records of that lane/pool,
    `lanes:<p>[<lane>|w]` == ZCARD `wait:<p>:<lane>` == `ticket:<id>` records of that lane/pool;
  * pool `running` / `waiting` == the sums over lanes; nothing negative; `seats`/`tickets`
    sorted sets hold exactly the ids that have records;
  * every admission is justified by its reason, recomputed in Python from the state read just
    before it (guaranteed slots of §5.4): within-floor/overdraft only below the lane's floor,
    borrowed only with a free slot, overdraft only on a never-exhausted full pool; so an
    admission leaving running above slots is an overdraft (or a same-intent repeat);
  * oldest first: an admitted newcomer never passes an older waiter of its lane, and a new
    waiter queues behind every waiter already there (its `since` is the newest);
  * after a tick no lease older than `now` survives; after every lease expired and one tick
    swept them, every count is back to zero (the counts heal); a retried release changes nothing.

Three example tests drive on purpose the paths the machine meets only by chance (a newcomer after
a release while a waiter waits, overdraft vs. an exhausted pool, a borrow on a fractional
estimate, a waiter that moves to another pool).
"""
from __future__ import annotations

import functools
import math

import fakeredis
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

from admission import Admission, Status, UnknownSeat, doctor
from admission.codes import ADMIT_REASONS, REFUSE_REASONS

MESH = "inv"
PREFIX = f"adm:{{{MESH}}}:"
POOLS = ("m1@sim", "m2@sim")
LANE_CFG = {  # name: (floor, weight, priority)
    "alpha": (0.5, 3, 30),
    "beta": (0.3, 1, 20),
    "gamma": (0.0, 2, 10),
}
LANES = tuple(LANE_CFG)
PODS = ("pod-a", "pod-b", "pod-c")
LEASE_TTL = 30.0
T0 = 1_700_000_000.0
POLICY = {
    "tunables": {"seed_estimate": 2, "grow_interval": 10, "lease_ttl": LEASE_TTL},
    "clock": "caller",
    "lanes": {n: {"floor": f, "weight": w, "priority": p} for n, (f, w, p) in LANE_CFG.items()},
    "providers": {"sim": {}},
    "pools": {p: {} for p in POOLS},
}
# most asks go to the first pool, so waiters, releases and newcomers of one lane meet often
HOT_POOL = st.sampled_from((POOLS[0], POOLS[0], POOLS[0], POOLS[1]))
OUTCOMES = ("clean", "rate_limited", "stall", "round_cap", "error")
SIGNALS = ("stall", "round_cap", "rate_limited")

SETTINGS = settings(max_examples=25, stateful_step_count=30, deadline=None, database=None,
                    print_blob=True, suppress_health_check=[HealthCheck.too_slow])


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _hash(client, key: str) -> dict[str, str]:
    return {_s(k): _s(v) for k, v in client.hgetall(key).items()}


# ---------------------------------------------------------------------------------------------
# docs/design.md §5.4 in Python, an independent oracle for lanes.lua `guaranteed`


def _sorted_lanes():
    return sorted(LANE_CFG, key=lambda n: (-LANE_CFG[n][2], n))


def guaranteed(run: dict[str, int], wait: dict[str, int], C: int, asking: str | None) -> dict[str, int]:
    order = _sorted_lanes()
    g = {n: 0 for n in order}
    rem, with_work, sum_q, sum_g = {}, [], 0.0, 0
    for n in order:
        if run[n] > 0 or wait[n] > 0 or n == asking:
            q = LANE_CFG[n][0] * C + 1e-9
            g[n] = math.floor(q)
            rem[n] = q - g[n]
            sum_q += q
            sum_g += g[n]
            with_work.append(n)
    left = math.floor(sum_q) - sum_g
    if left > 0:
        rank = {n: i for i, n in enumerate(with_work)}

        def cmp(a, b):
            if abs(rem[a] - rem[b]) > 1e-9:
                return -1 if rem[a] > rem[b] else 1
            return rank[a] - rank[b]

        ordered = sorted(with_work, key=functools.cmp_to_key(cmp))
        for n in ordered[:min(left, len(ordered))]:
            g[n] += 1
    for n in with_work:
        if (wait[n] > 0 or n == asking) and LANE_CFG[n][0] > 0 and g[n] == 0:
            g[n] = 1
    return g


# ---------------------------------------------------------------------------------------------
# Reading the state


def read_state(client) -> dict:
    """Everything the invariants need, read straight from Redis (the records found by SCAN, then
    every read in one pipeline: a few round trips, not one per record)."""
    seat_keys = list(client.scan_iter(match=PREFIX + "seat:*", count=500))
    ticket_keys = list(client.scan_iter(match=PREFIX + "ticket:*", count=500))
    waits = [(p, l) for p in POOLS for l in LANES]
    pipe = client.pipeline(transaction=False)
    for k in seat_keys + ticket_keys:
        pipe.hgetall(k)
    pipe.zrange(PREFIX + "seats", 0, -1, withscores=True)
    pipe.zrange(PREFIX + "tickets", 0, -1, withscores=True)
    for p in POOLS:
        pipe.hgetall(PREFIX + "pool:" + p)
    for p in POOLS:
        pipe.hgetall(PREFIX + "lanes:" + p)
    for p, l in waits:
        pipe.zrange(PREFIX + f"wait:{p}:{l}", 0, -1)
    replies = iter(pipe.execute())

    def h(raw) -> dict[str, str]:
        return {_s(k): _s(v) for k, v in raw.items()}

    seats = {_s(k)[len(PREFIX) + 5:]: h(next(replies)) for k in seat_keys}
    tickets = {_s(k)[len(PREFIX) + 7:]: h(next(replies)) for k in ticket_keys}
    return {
        "seats": seats,
        "tickets": tickets,
        "seat_leases": {_s(m): s for m, s in next(replies)},
        "ticket_leases": {_s(m): s for m, s in next(replies)},
        "pools": {p: h(next(replies)) for p in POOLS},
        "lanes": {p: h(next(replies)) for p in POOLS},
        "wait": {w: [_s(m) for m in next(replies)] for w in waits},
    }


def _int(h: dict, f: str) -> int:
    v = h.get(f)
    return 0 if v is None else int(float(v))


def check_counts(client) -> dict:
    # the doctor (lua/doctor.lua) must agree with the checks below, which read the records by SCAN
    report = doctor.check(client, MESH)
    st_ = read_state(client)
    seats, tickets = st_["seats"], st_["tickets"]
    assert report.ok, doctor.render(report, MESH)
    assert (report.seats, report.tickets) == (len(seats), len(tickets)), (report, sorted(seats), sorted(tickets))
    assert set(st_["seat_leases"]) == set(seats), "`seats` zset and seat records disagree"
    assert set(st_["ticket_leases"]) == set(tickets), "`tickets` zset and ticket records disagree"
    # one decision per intent: a seated round is not also waiting (the machine never re-asks a
    # round it holds a seat for, so a ticket left next to a seat is a leak)
    assert not set(seats) & set(tickets), f"rounds both seated and waiting: {set(seats) & set(tickets)}"
    for p in POOLS:
        lanes, pool = st_["lanes"][p], st_["pools"][p]
        for f, v in lanes.items():
            assert int(v) >= 0, f"negative lanes:{p}[{f}] = {v}"
        for f in ("running", "waiting"):
            assert _int(pool, f) >= 0, f"negative pool:{p}.{f}"
        for l in LANES:
            live = sorted(i for i, s in seats.items() if s["pool"] == p and s["lane"] == l)
            waiting = sorted(i for i, t in tickets.items() if t["pool"] == p and t["lane"] == l)
            assert _int(lanes, l) == len(live), f"lanes:{p}[{l}]={_int(lanes, l)} but seats {live}"
            assert _int(lanes, l + "|w") == len(waiting), \
                f"lanes:{p}[{l}|w]={_int(lanes, l + '|w')} but tickets {waiting}"
            assert sorted(st_["wait"][(p, l)]) == waiting, f"wait:{p}:{l} {st_['wait'][(p, l)]} != {waiting}"
            assert _int(lanes, l + "|d") == 0
        assert _int(pool, "running") == sum(_int(lanes, l) for l in LANES), f"pool {p} running != sum of lanes"
        assert _int(pool, "waiting") == sum(_int(lanes, l + "|w") for l in LANES), f"pool {p} waiting != sum"
    return st_


def check_zero(client) -> None:
    st_ = check_counts(client)
    assert not st_["seats"] and not st_["tickets"], (st_["seats"], st_["tickets"])
    for p in POOLS:
        assert _int(st_["pools"][p], "running") == 0 and _int(st_["pools"][p], "waiting") == 0
        assert all(int(v) == 0 for v in st_["lanes"][p].values()), st_["lanes"][p]


def check_rule(before: dict, d, pool: str, lane: str, rid: str) -> None:
    """The admission's reason, recomputed from the state just before it (docs/design.md §5)."""
    lanes, p = before["lanes"][pool], before["pools"][pool]
    run = {l: _int(lanes, l) for l in LANES}
    wait = {l: _int(lanes, l + "|w") for l in LANES}
    est = float(p.get("est") or 2)
    C = max(1, math.floor(est))
    running = _int(p, "running")
    g = guaranteed(run, wait, C, lane)
    queue = before["wait"][(pool, lane)]
    assert not queue or queue[0] == rid, f"{rid} admitted past older waiter {queue[0]} ({d.reason})"
    assert d.running == running + 1 and d.slots == C, (d, running, C)
    if d.reason == "within-floor":
        assert run[lane] < g[lane] and running < C, (run, g, running, C)
    elif d.reason == "overdraft":
        assert run[lane] < g[lane] and running >= C and p.get("exhausted", "0") != "1", (run, g, running, C)
    elif d.reason == "borrowed":
        assert run[lane] >= g[lane] and running < C, (run, g, running, C)


# ---------------------------------------------------------------------------------------------
# The machine


class AdmissionMachine(RuleBasedStateMachine):
    make_client = None  # set by the test: a callable giving an empty Redis

    def __init__(self):
        super().__init__()
        self.client = type(self).make_client()
        self.pods = {name: Admission(self.client, mesh=MESH, pod=name, background=False, seed=i)
                     for i, name in enumerate(PODS)}
        self.pods[PODS[0]].ops.apply_policy(POLICY, recovery_hold=False)
        self.now = T0
        self.n = 0
        self.asked: dict[str, tuple[str, str, str]] = {}  # round id -> (pod, lane, pool) of wait=True asks
        self.released: dict[str, object] = {}  # pod -> last released seat (for retries)
        self.admissions = 0

    # -- helpers -----------------------------------------------------------------------------
    def _expired_exists(self) -> bool:
        return bool(self.client.zcount(PREFIX + "seats", "-inf", self.now)
                    or self.client.zcount(PREFIX + "tickets", "-inf", self.now))

    def _admit(self, pod: str, lane: str, pool: str, rid: str, wait: bool, draw: float):
        adm = self.pods[pod]
        exact = not self._expired_exists()  # the admit's own sweep cannot change what it reads
        before = read_state(self.client)
        seat_before = before["seats"].get(rid)
        d = adm.try_admit(lane=lane, model=pool, round_id=rid, now=self.now, draw=draw, wait=wait)
        assert d.reason in ADMIT_REASONS + REFUSE_REASONS, d
        if d.admitted:
            assert d.reason in ADMIT_REASONS
            if d.reason == "same-intent":
                assert seat_before is not None, f"same-intent for {rid} without a live seat"
                assert (d.pool, d.lane, d.seat.seq) == (seat_before["pool"], seat_before["lane"],
                                                        int(seat_before["seq"]))
                return d
            self.admissions += 1
            assert seat_before is None or not exact, f"{rid} admitted twice: live seat {seat_before}"
            seat = _hash(self.client, PREFIX + "seat:" + rid)
            assert (seat["pool"], seat["lane"], seat["pod"], int(seat["seq"])) == (pool, lane, pod, d.seat.seq)
            assert self.client.zscore(PREFIX + "seats", rid) == pytest.approx(self.now + LEASE_TTL)
            # running above slots only by the floor overdraft on a never-exhausted pool
            if d.running > d.slots:
                assert d.reason == "overdraft", f"running {d.running} > slots {d.slots} by {d.reason}"
            if d.reason == "overdraft":
                assert before["pools"][pool].get("exhausted", "0") != "1", "overdraft on an exhausted pool"
            if exact:
                self._check_rule(before, d, pool, lane, rid)
        else:
            assert d.reason in REFUSE_REASONS and d.seat is None
            if exact:
                assert seat_before is None, f"refused {rid} although its seat is live"
            if wait:
                t = _hash(self.client, PREFIX + "ticket:" + rid)
                assert (t["pool"], t["lane"], t["pod"]) == (pool, lane, pod)
                assert self.client.zscore(PREFIX + "tickets", rid) == pytest.approx(self.now + LEASE_TTL)
                since = self.client.zscore(PREFIX + f"wait:{pool}:{lane}", rid)
                assert float(t["since"]) == pytest.approx(since, abs=1e-6)
                if getattr(d, "waiting_since", None) is not None:
                    assert d.waiting_since == pytest.approx(since, abs=1e-6), (d, since)
                old = before["tickets"].get(rid)
                if old is None or (old["pool"], old["lane"]) != (pool, lane):
                    # a new waiter queues behind every waiter already there (first come, first served)
                    queue = self.client.zrange(PREFIX + f"wait:{pool}:{lane}", 0, -1)
                    assert _s(queue[-1]) == rid, (rid, queue)
        return d

    def _check_rule(self, before: dict, d, pool: str, lane: str, rid: str) -> None:
        check_rule(before, d, pool, lane, rid)

    def _live_seats(self):
        return [(pod, h.seat) for pod, adm in self.pods.items() for h in adm._book.seats.values()]

    # -- rules -------------------------------------------------------------------------------
    @rule(pod=st.sampled_from(PODS), lane=st.sampled_from(LANES), pool=HOT_POOL,
          wait=st.booleans(), draw=st.floats(0, 1, exclude_max=True), dt=st.floats(0, 5))
    def try_admit(self, pod, lane, pool, wait, draw, dt):
        self.now += dt
        self.n += 1
        rid = f"{pod}/r{self.n}"
        d = self._admit(pod, lane, pool, rid, wait, draw)
        if wait and not d.admitted:
            self.asked[rid] = (pod, lane, pool)

    @precondition(lambda self: self.asked)
    @rule(data=st.data(), draw=st.floats(0, 1, exclude_max=True), dt=st.floats(0, 5), move=st.booleans())
    def reask_waiter(self, data, draw, dt, move):
        rid = data.draw(st.sampled_from(sorted(self.asked)), label="waiter")
        pod, lane, pool = self.asked[rid]
        if move:  # a waiter that moves to another pool or lane gives up its old place
            lane = data.draw(st.sampled_from(LANES), label="lane")
            pool = data.draw(HOT_POOL, label="pool")
            self.asked[rid] = (pod, lane, pool)
        self.now += dt
        d = self._admit(pod, lane, pool, rid, True, draw)
        if d.admitted:
            self.asked.pop(rid)

    @precondition(lambda self: self._live_seats())
    @rule(data=st.data(), outcome=st.sampled_from(OUTCOMES), seconds=st.floats(0, 3000),
          cost=st.one_of(st.none(), st.floats(0, 5)), dt=st.floats(0, 5))
    def release(self, data, outcome, seconds, cost, dt):
        pod, seat = data.draw(st.sampled_from(sorted(self._live_seats(), key=lambda x: x[1].id)), label="seat")
        self.now += dt
        live = self.client.exists(PREFIX + "seat:" + seat.id)
        r = self.pods[pod].release(seat, outcome=outcome, seconds=seconds, cost_usd=cost, now=self.now)
        assert r.status == (Status.RELEASED if live else Status.EXPIRED), (r, live)
        assert not self.client.exists(PREFIX + "seat:" + seat.id)
        assert _s(self.client.get(PREFIX + "gone:" + seat.id)).startswith("released|")
        self.released[pod] = seat

    @precondition(lambda self: self.released)
    @rule(data=st.data())
    def retry_release(self, data):
        """A release retried after a lost reply counts once and changes nothing."""
        pod = data.draw(st.sampled_from(sorted(self.released)), label="pod")
        seat = self.released[pod]
        if self.client.exists(PREFIX + "seat:" + seat.id):
            return  # the round id was admitted again since
        before = read_state(self.client)
        r = self.pods[pod].release(seat, outcome="clean", seconds=1.0, now=self.now)
        assert r.status == Status.ALREADY_RELEASED, r
        after = read_state(self.client)
        assert (after["pools"], after["lanes"]) == (before["pools"], before["lanes"])

    @precondition(lambda self: self._live_seats())
    @rule(data=st.data(), signal=st.sampled_from(SIGNALS), dt=st.floats(0, 5))
    def report(self, data, signal, dt):
        pod, seat = data.draw(st.sampled_from(sorted(self._live_seats(), key=lambda x: x[1].id)), label="seat")
        self.now += dt
        live = _hash(self.client, PREFIX + "seat:" + seat.id)
        if not live:
            with pytest.raises(UnknownSeat):
                self.pods[pod].report(seat, signal=signal, now=self.now)
            return
        r = self.pods[pod].report(seat, signal=signal, now=self.now)
        assert r.status == (Status.ALREADY_REPORTED if live["signalled"] else Status.REPORTED), (r, live)
        if r.decreased:
            p = _hash(self.client, PREFIX + "pool:" + seat.pool)
            assert p["exhausted"] == "1" and p["why"] == signal

    @rule(pod=st.sampled_from(PODS), dt=st.floats(0, 10))
    def heartbeat(self, pod, dt):
        self.now += dt
        adm = self.pods[pod]
        hb = adm.heartbeat(now=self.now)
        for h in adm._book.seats.values():  # every seat the pod still holds is live and renewed
            s = _hash(self.client, PREFIX + "seat:" + h.seat.id)
            assert s and s["pod"] == pod and int(s["seq"]) == h.seat.seq, (h.seat, s, hb)
            assert self.client.zscore(PREFIX + "seats", h.seat.id) == pytest.approx(self.now + LEASE_TTL)

    @rule(dt=st.one_of(st.floats(0, 10), st.floats(LEASE_TTL, 2 * LEASE_TTL)),
          alive=st.sets(st.sampled_from(PODS)))
    def tick(self, dt, alive):
        """The pool clock; the pods not in `alive` are dead (no heartbeat) for this interval."""
        self.now += dt
        for pod in sorted(alive):
            self.pods[pod].heartbeat(now=self.now)
        self.pods[PODS[0]].tick(now=self.now)
        # nothing expired survives a tick (fewer than 100 leases here, the sweep limit)
        assert self.client.zcount(PREFIX + "seats", "-inf", self.now) == 0
        assert self.client.zcount(PREFIX + "tickets", "-inf", self.now) == 0

    @rule()
    def census_agrees(self):
        doc = self.pods[PODS[1]].ops.census(now=self.now)
        st_ = read_state(self.client)
        for row in doc["pools"]:
            p = row["pool"]
            assert row["running"] == _int(st_["pools"][p], "running")
            assert row["waiting"] == _int(st_["pools"][p], "waiting")
            by_lane = {r["lane"]: r for r in row["lanes"]}
            for l in LANES:
                r = by_lane.get(l, {"running": 0, "waiting": 0})
                assert r["running"] == _int(st_["lanes"][p], l), (p, l, r)
                assert r["waiting"] == _int(st_["lanes"][p], l + "|w"), (p, l, r)
        for l in LANES:
            for p in POOLS:
                assert self.pods[PODS[2]].plan(lane=l, model=p, wanted=5, now=self.now) >= 0

    @rule()
    def expire_all(self):
        """Every lease runs out and one tick sweeps them: the counts are back to zero."""
        self.now += LEASE_TTL + 1
        self.pods[PODS[1]].tick(now=self.now)
        check_zero(self.client)

    # -- invariants --------------------------------------------------------------------------
    @invariant()
    def counts_match_records(self):
        check_counts(self.client)

    def teardown(self):
        try:
            self.now += LEASE_TTL + 1
            self.pods[PODS[0]].tick(now=self.now)
            check_zero(self.client)
            assert _int(_hash(self.client, PREFIX + "pool:" + POOLS[0]), "seq") + \
                _int(_hash(self.client, PREFIX + "pool:" + POOLS[1]), "seq") == self.admissions
        finally:
            for adm in self.pods.values():
                adm.close()


def test_counts_invariants(engine, redis_client):
    if engine == "fakeredis":
        def make_client():
            return fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=False)
    else:
        def make_client():
            redis_client.flushall()
            return redis_client

    machine = type(f"AdmissionMachine_{engine}", (AdmissionMachine,), {"make_client": staticmethod(make_client)})
    run_state_machine_as_test(machine, settings=SETTINGS)


def test_guaranteed_oracle_examples():
    """The Python oracle itself, on docs/design.md §5.4's rules."""
    zero = {l: 0 for l in LANES}
    # only the asking lane has work: floor(0.5 * 2) = 1
    assert guaranteed(zero, zero, 2, "alpha") == {"alpha": 1, "beta": 0, "gamma": 0}
    # beta waits with floor share 0.3 of 2 = 0.6 -> 0, then the remainder slot (floor(1.6)-1 = 0)
    # gives nothing; a waiting lane with a non-zero floor that got none gets one
    assert guaranteed({**zero, "alpha": 1}, {**zero, "beta": 1}, 2, None)["beta"] == 1
    # C=10: alpha 5, beta 3
    assert guaranteed({**zero, "alpha": 1, "beta": 1}, zero, 10, None) == {"alpha": 5, "beta": 3, "gamma": 0}


# ---------------------------------------------------------------------------------------------
# The rare paths of the rules above, driven on purpose (the machine meets them only by chance)


def _pods(client):
    a = Admission(client, mesh=MESH, pod="pod-a", background=False, seed=1)
    b = Admission(client, mesh=MESH, pod="pod-b", background=False, seed=2)
    a.ops.apply_policy(POLICY, recovery_hold=False)
    return a, b


def test_oldest_first_after_a_release(redis_client):
    a, b = _pods(redis_client)
    pool, t = POOLS[0], T0
    g1 = a.try_admit(lane="gamma", model=pool, round_id="g1", now=t, draw=0.0)
    g2 = a.try_admit(lane="gamma", model=pool, round_id="g2", now=t, draw=0.0)
    assert (g1.reason, g2.reason) == ("borrowed", "borrowed")
    w = b.try_admit(lane="gamma", model=pool, round_id="w", now=t + 1, draw=0.0, wait=True)
    assert (w.admitted, w.reason) == (False, "full")
    a.release(g1.seat, now=t + 2)
    # a slot is free, but the newcomer does not pass the older waiter of its lane
    n = a.try_admit(lane="gamma", model=pool, round_id="n", now=t + 3, draw=0.0, wait=True)
    assert (n.admitted, n.reason) == (False, "behind-older")
    w = b.try_admit(lane="gamma", model=pool, round_id="w", now=t + 4, draw=0.0, wait=True)
    assert (w.admitted, w.reason) == (True, "borrowed")
    check_counts(redis_client)


def test_overdraft_only_on_a_never_exhausted_pool(redis_client):
    a, _ = _pods(redis_client)
    pool, t = POOLS[0], T0
    seats = [a.try_admit(lane="gamma", model=pool, round_id=f"g{i}", now=t, draw=0.0).seat for i in range(2)]
    # full, never exhausted: a lane below its floor overdraws
    d = a.try_admit(lane="alpha", model=pool, round_id="a1", now=t, draw=0.0)
    assert (d.admitted, d.reason, d.running, d.slots) == (True, "overdraft", 3, 2)
    a.release(d.seat, now=t + 1)
    # a load signal at 2 running: K = 2, K̂ = 1.4, one slot, exhausted
    r = a.report(seats[0], signal="stall", now=t + 2)
    assert r.decreased and r.estimate == pytest.approx(1.4)
    d = a.try_admit(lane="alpha", model=pool, round_id="a2", now=t + 3, draw=0.0)
    assert (d.admitted, d.reason) == (False, "full")
    # one running on one slot of a fractional estimate: phi > 0, yet a borrow never passes slots
    a.release(seats[1], now=t + 4)
    d = a.try_admit(lane="gamma", model=pool, round_id="g9", now=t + 5, draw=0.0)
    assert (d.admitted, d.reason) == (False, "full"), d
    check_counts(redis_client)


def test_moved_waiter_leaves_no_ticket_behind(redis_client):
    a, _ = _pods(redis_client)
    t = T0
    for i in range(2):
        a.try_admit(lane="gamma", model=POOLS[0], round_id=f"g{i}", now=t, draw=0.0)
    w = a.try_admit(lane="gamma", model=POOLS[0], round_id="w", now=t, draw=0.0, wait=True)
    assert not w.admitted
    w = a.try_admit(lane="beta", model=POOLS[1], round_id="w", now=t + 1, draw=0.0, wait=True)
    assert w.admitted
    st_ = check_counts(redis_client)
    assert "w" not in st_["tickets"] and st_["wait"][(POOLS[0], "gamma")] == []
