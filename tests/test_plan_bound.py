"""plan and the census bound in closed form (decide.lua in_a_row): the same answers as running the
decision once per newcomer, at a cost flat in the estimate.

`plan(lane, wanted)` must be exactly the number of successive `try_admit`s of new rounds of that
lane that are admitted before the first refusal (capped by `wanted`), with a draw just below 0.5:
plan counts a marginal admission when p(φ) >= 0.5, an admit takes it when draw < p(φ). The census
`bound` of a lane must be its running + plan(lane, max_estimate).

The states are built through the scripts (real seats and tickets: the doctor agrees with them);
only the pool's estimate and its exhausted flag are set straight in the pool hash.
"""
from __future__ import annotations

import json
import math
import time

import fakeredis
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from admission.tools import bench
from admission.tools.servers import available_engines

from helpers import POOL, T0, adm, lane_row, policy

#: The largest float below 0.5: admitted (draw < p) exactly when plan counts it (p >= 0.5).
DRAW = math.nextafter(0.5, 0.0)
MAX_EST = 1000


def pool_key(mesh: str) -> str:
    return f"adm:{{{mesh}}}:pool:{POOL}"


def build(a, client, mesh: str, running: dict[str, int], waiting: dict[str, int], est: float,
          exhausted: bool) -> None:
    """Seats and waiter tickets per lane, then the pool's estimate and exhausted flag."""
    key = pool_key(mesh)
    client.hset(key, mapping={"est": 100_000, "exhausted": 0})  # room: every seat is admitted
    n = 0
    for lane, count in running.items():
        for _ in range(count):
            n += 1
            d = a.try_admit(lane=lane, model=POOL, round_id=f"s{n}", now=T0, draw=0.0)
            assert d.admitted, d
    if any(waiting.values()):
        # one slot, measured and taken: every ask is refused and queues (a throw-away seat
        # takes the slot when nothing runs; it is released afterwards)
        ghost = None
        if not sum(running.values()):
            ghost = a.try_admit(lane=next(iter(running)), model=POOL, round_id="ghost", now=T0, draw=0.0).seat
        client.hset(key, mapping={"est": 1, "exhausted": 1})
        for lane, count in waiting.items():
            for _ in range(count):
                n += 1
                d = a.try_admit(lane=lane, model=POOL, round_id=f"w{n}", now=T0, draw=0.0, wait=True)
                assert not d.admitted, d
        if ghost:
            a.release(ghost, outcome="clean", seconds=1, now=T0)
    client.hset(key, mapping={"est": repr(float(est)), "cap": repr(float(est)) if exhausted else 0,
                              "exhausted": int(exhausted)})


def admissions_that_follow(a, lane: str, wanted: int) -> int:
    """Successive new rounds of `lane` admitted before the first refusal, at most `wanted`."""
    n = 0
    while n < wanted:
        d = a.try_admit(lane=lane, model=POOL, round_id=f"new-{lane}-{n}", now=T0, draw=DRAW)
        if not d.admitted:
            break
        n += 1
    return n


def check_census_bounds(a, lanes) -> None:
    c = a.ops.census(now=T0)
    for lane in lanes:
        row = lane_row(c, lane)
        if row:
            assert row["bound"] == row["running"] + a.plan(lane=lane, model=POOL, wanted=MAX_EST, now=T0), (lane, row)


# --------------------------------------------------------------------------------------------
# The property: plan equals the admissions that follow

FLOORS = (0, 0, 0.05, 0.1, 0.25, 0.3, 0.5, 1 / 3, 1)


@st.composite
def states(draw):
    n = draw(st.integers(1, 4))
    floors, left = [], 1.0
    for _ in range(n):
        f = draw(st.sampled_from(FLOORS))
        f = f if f <= left + 1e-9 else 0
        left -= f
        floors.append(f)
    lanes = {f"l{i}": {"floor": floors[i], "weight": draw(st.sampled_from((1, 2, 3, 0.5, 1.5, 0.3))),
                       "priority": draw(st.integers(0, 2))} for i in range(n)}
    est = draw(st.one_of(st.integers(1, 30).map(float), st.floats(1, 30)))
    slots = max(1, math.floor(est))
    lane = draw(st.sampled_from(sorted(lanes)))  # the one that plans
    # mostly room left (a full pool plans 0); or the other lanes crowd it (floors still admit)
    crowded = n > 1 and draw(st.integers(0, 2)) == 0
    running = {l: draw(st.integers(0, max(1, slots // n) + 3 * (not crowded)))
               + (slots // (n - 1) - draw(st.integers(0, 2)) if crowded and l != lane else 0) for l in lanes}
    running = {l: max(0, r) for l, r in running.items()}
    # the planning lane seldom waits (then it plans 0)
    waiting = {l: draw(st.sampled_from((0, 0, 1, 2) if l != lane else (0,) * 9 + (1,))) for l in lanes}
    return dict(lanes=lanes, est=est, exhausted=draw(st.booleans()), running=running, waiting=waiting,
                high_free=draw(st.sampled_from((0.3, 0.3, 0.5, 1.0, 0.1))), lane=lane,
                wanted=draw(st.sampled_from((MAX_EST, MAX_EST, MAX_EST, 0, 1, 3, 7))))


_meshes = iter(range(10**9))
_SERVER = fakeredis.FakeServer()  # one server for every example (the library loads once), a mesh each


@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(s=states())
def test_plan_equals_the_admissions_that_follow_and_the_census_bound_is_running_plus_plan(s):
    client = fakeredis.FakeRedis(server=_SERVER, decode_responses=False)
    mesh = f"h{next(_meshes)}"
    a = adm(client, mesh=mesh, pol=policy(s["lanes"], max_estimate=MAX_EST, high_free=s["high_free"]))
    build(a, client, mesh, s["running"], s["waiting"], s["est"], s["exhausted"])
    check_census_bounds(a, s["lanes"])
    planned = a.plan(lane=s["lane"], model=POOL, wanted=s["wanted"], now=T0)
    assert planned == admissions_that_follow(a, s["lane"], s["wanted"])


# --------------------------------------------------------------------------------------------
# Examples on every engine: each check of the decision ends a run of newcomers

# weights 1: the exponent of p(φ) is 1 unless a heavier lane is in the policy
LANES3 = {"hi": {"floor": 0.3, "weight": 1, "priority": 3},
          "mid": {"floor": 0.2, "weight": 1, "priority": 2},
          "lo": {"floor": 0, "weight": 1, "priority": 1}}
LONE = {"lo": {"floor": 0, "weight": 1, "priority": 1}}
HEAVY = {**LONE, "heavy": {"floor": 0, "weight": 2, "priority": 2}}
NO_FLOORS = {name: {**cfg, "floor": 0} for name, cfg in LANES3.items()}
SAME = {"a": {"floor": 0, "weight": 1, "priority": 1}, "b": {"floor": 0, "weight": 1, "priority": 1}}
ROUNDING = {"hi": {"floor": 0, "weight": 1.4, "priority": 3}, "lo": {"floor": 0, "weight": 1, "priority": 1}}


@pytest.mark.parametrize("lanes, running, waiting, est, exhausted, lane, expected, tunables", [
    # within floor (hi: 3 of 10), then overdraft on a never-exhausted full pool; then full
    pytest.param(LANES3, {"lo": 10}, {}, 10, False, "hi", 3, {}, id="overdraft"),
    # the same pool measured: no overdraft, the floor meets a full pool
    pytest.param(LANES3, {"lo": 10}, {}, 10, True, "hi", 0, {}, id="floor_meets_full"),
    # hi: 12 within its floor (12 of 40); then free 7 <= 8 owed to mid (floor 8, waiting)
    pytest.param(LANES3, {"lo": 21}, {"mid": 1}, 40, True, "hi", 12, {}, id="reserved"),
    # hi borrows while mine <= mid's 2 borrowed (ties go to hi, the higher): 0, 1, 2
    pytest.param(LANES3, {"hi": 12, "mid": 10}, {"mid": 1}, 40, True, "hi", 3, {}, id="fair_share"),
    # two lanes wait: hi compares with the least borrowed of them (lo's 1, not mid's 5)
    pytest.param(NO_FLOORS, {"mid": 5, "lo": 1}, {"mid": 1, "lo": 1}, 40, True, "hi", 2, {}, id="fair_share_least_of_two"),
    # b ties a's 3 borrowed at its third newcomer: the same priority, so the tie goes to b
    pytest.param(SAME, {"a": 3, "b": 1}, {"a": 1}, 40, True, "b", 3, {}, id="tie_same_priority"),
    # lo (borrowing 1) ties hi's 2 borrowed at its second newcomer: the tie goes to hi
    pytest.param(LANES3, {"hi": 14, "lo": 1}, {"hi": 1}, 40, True, "lo", 1, {}, id="tie_to_the_higher"),
    # hi's 21 borrowed / weight 1.4 is 15.000000000000002: lo's 15 ties it within 1e-12, where
    # inverting the test (ceil(theirs · weight) = 16) is one off: decide settles the boundary
    pytest.param(ROUNDING, {"hi": 21}, {"hi": 1}, 100, True, "lo", 15, {}, id="tie_after_rounding"),
    # p(φ) >= 0.5 while φ >= 0.15 (high_free 0.3): running 3 .. 850 of 1000
    pytest.param(LONE, {"lo": 3}, {}, 1000, True, "lo", 848, {}, id="probability"),
    # high_free 0.1: p(φ) >= 0.5 while φ >= 0.05, running up to 950
    pytest.param(LONE, {"lo": 3}, {}, 1000, True, "lo", 948, {"high_free": 0.1}, id="probability_high_free"),
    # heavy weighs 2: lo's p(φ) is squared, p >= 0.7071 while running <= 807.4
    pytest.param(HEAVY, {"lo": 3}, {}, 1000, True, "lo", 805, {}, id="weight_exponent"),
    # K̂ 7.7: 7 slots, φ on 7.7: running 6 has φ 0.22 (on 7 slots it would be 0.14: refused)
    pytest.param(LONE, {"lo": 1}, {}, 7.7, True, "lo", 6, {}, id="fractional"),
    # newcomers wait behind the lane's own waiters
    pytest.param(LONE, {"lo": 2}, {"lo": 1}, 40, True, "lo", 0, {}, id="oldest_first"),
])
def test_plan_examples(redis_client, lanes, running, waiting, est, exhausted, lane, expected, tunables):
    a = adm(redis_client, pol=policy(lanes, max_estimate=MAX_EST, **tunables))
    build(a, redis_client, "t", {l: running.get(l, 0) for l in lanes}, waiting, est, exhausted)
    check_census_bounds(a, lanes)
    assert a.plan(lane=lane, model=POOL, wanted=MAX_EST, now=T0) == expected
    assert admissions_that_follow(a, lane, MAX_EST) == expected


def test_census_bound_uses_the_lanes_own_guaranteed_as_the_asker(redis_client):
    # C = 4, floors 0.05: no lane gets a guaranteed slot in the census (q = 0.2), but a lane that
    # asks counts as waiting and gets one. x runs 1: as the asker it borrows nothing yet, so it
    # ties y's 0 borrowed (same priority: admitted) and its second newcomer is refused.
    lanes = {"x": {"floor": 0.05, "weight": 1, "priority": 1}, "y": {"floor": 0.05, "weight": 1, "priority": 1}}
    a = adm(redis_client, pol=policy(lanes, max_estimate=MAX_EST))
    build(a, redis_client, "t", {"x": 1, "y": 0}, {"y": 1}, 4, True)
    row = lane_row(a.ops.census(now=T0), "x")
    assert (row["guaranteed"], row["bound"]) == (0, 2)
    assert a.plan(lane="x", model=POOL, wanted=MAX_EST, now=T0) == 1 == admissions_that_follow(a, "x", MAX_EST)


def test_census_bound_of_a_lane_listed_for_its_spend_only(redis_client):
    # z has no work, only spend today: when it asks it joins the lanes with work and gets its
    # floor (10 of 20), which the guaranteed slots of the census do not give it.
    lanes = {"z": {"floor": 0.5, "weight": 1, "priority": 1}, "y": {"floor": 0, "weight": 1, "priority": 1}}
    a = adm(redis_client, pol=policy(lanes, max_estimate=MAX_EST))
    d = a.try_admit(lane="z", model=POOL, round_id="spent", now=T0, draw=0.0)
    a.release(d.seat, outcome="clean", seconds=1, cost_usd=0.01, now=T0)
    build(a, redis_client, "t", {"z": 0, "y": 16}, {}, 20, True)
    row = lane_row(a.ops.census(now=T0), "z")
    assert (row["running"], row["spentTodayUsd"], row["guaranteed"]) == (0, 0.01, 0)
    assert row["bound"] == 4 == a.plan(lane="z", model=POOL, wanted=MAX_EST, now=T0)
    assert admissions_that_follow(a, "z", MAX_EST) == 4


def test_fair_share_tie_one_float_past_the_least_higher_lane(redis_client):
    # x borrows 2 (mine = 2). h0, h1 and h2 (higher priority) wait: h0's and h1's
    # 2 / 1.0000000000005 are the float just below 2 - 1e-12 (neither less than mine - 1e-12 nor
    # within 1e-12 of it), h2's 2 / 1 ties x exactly: refused. The least higher value alone
    # would miss the tie, and so would the two least if they were not distinct. e (x's own
    # priority) waits within the tie window below h2: it must not take h2's place.
    near, nearer = 1.0000000000005, 1.0000000000004
    lanes = {"x": {"floor": 0, "weight": 1, "priority": 1},
             "e": {"floor": 0, "weight": nearer, "priority": 1},
             "h0": {"floor": 0, "weight": near, "priority": 2},
             "h1": {"floor": 0, "weight": near, "priority": 2},
             "h2": {"floor": 0, "weight": 1, "priority": 2}}
    assert 2 / near == 2 - 1e-12 and abs(2 / near - 2) > 1e-12
    assert 2 / near < 2 / nearer < 2 and abs(2 / nearer - 2) <= 1e-12
    a = adm(redis_client, pol=policy(lanes, max_estimate=MAX_EST))
    waiting = {"e": 1, "h0": 1, "h1": 1, "h2": 1}
    build(a, redis_client, "t", {"x": 2, "e": 2, "h0": 2, "h1": 2, "h2": 2}, waiting, 100, True)
    assert lane_row(a.ops.census(now=T0), "x")["bound"] == 2
    assert a.plan(lane="x", model=POOL, wanted=MAX_EST, now=T0) == 0
    assert a.try_admit(lane="x", model=POOL, round_id="x-new", now=T0, draw=0.0).reason == "fair-share"


# --------------------------------------------------------------------------------------------
# Flat in the estimate: the census, the tick and plan cost O(lanes) per pool, not O(estimate)

BIG = 50_000
FLAT_LANES = {f"l{i}": {"floor": 0.1, "weight": 1 + i % 3, "priority": i % 4} for i in range(8)}
FLAT_LIMIT_USEC = 50_000


def server_usec(client, engine: str, call) -> tuple[object, float]:
    """The call's result and its cost: the server's µs in FCALL (real engines), else wall µs."""
    if engine == "fakeredis":
        t = time.perf_counter()
        out = call()
        return out, (time.perf_counter() - t) * 1e6
    client.config_resetstat()
    out = call()
    return out, float(client.info("commandstats")["cmdstat_fcall"]["usec"])


def test_census_and_plan_bound_figures_at_a_large_estimate(redis_client):
    # one lane with work on a measured pool of 50,000: it borrows while p(φ) >= 0.5, i.e. up to
    # 0.85 · 50,000 = 42,500 running; a lane with floor 1 fills all 50,000 slots within its floor
    lanes = {"lo": {"floor": 0, "weight": 1, "priority": 1}, "all": {"floor": 1, "weight": 1, "priority": 2}}
    a = adm(redis_client, pol=policy(lanes, max_estimate=100_000))
    build(a, redis_client, "t", {"lo": 1, "all": 0}, {}, BIG, True)
    assert lane_row(a.ops.census(now=T0), "lo")["bound"] == 42_501
    assert a.plan(lane="lo", model=POOL, wanted=100_000, now=T0) == 42_500
    assert a.plan(lane="all", model=POOL, wanted=100_000, now=T0) == 49_999
    assert a.plan(lane="all", model=POOL, wanted=7, now=T0) == 7


def test_census_tick_and_plan_are_flat_in_the_estimate(redis_client, engine):
    a = adm(redis_client, pol=policy(FLAT_LANES, max_estimate=100_000))
    build(a, redis_client, "t", {l: 2 for l in FLAT_LANES}, {"l3": 1, "l6": 1}, BIG, True)
    c, census_usec = server_usec(redis_client, engine, lambda: a.ops.census(now=T0))
    plans = {}
    plan_usec = 0.0
    for lane in FLAT_LANES:
        plans[lane], usec = server_usec(redis_client, engine,
                                        lambda: a.plan(lane=lane, model=POOL, wanted=100_000, now=T0))
        plan_usec = max(plan_usec, usec)
    redis_client.delete("adm:{t}:census:at")  # the tick rebuilds the census
    tick, tick_usec = server_usec(redis_client, engine, lambda: a.tick(now=T0))
    assert tick.census_refreshed
    # the figures: lanes with waiters plan 0, the others borrow thousands
    for lane in FLAT_LANES:
        row = lane_row(c, lane)
        assert row["bound"] == row["running"] + plans[lane]
    assert plans["l3"] == plans["l6"] == 0 and min(v for k, v in plans.items() if k not in ("l3", "l6")) > 1000
    limit = FLAT_LIMIT_USEC if engine != "fakeredis" else 20 * FLAT_LIMIT_USEC  # wall clock, Python in the way
    assert census_usec < limit and plan_usec < limit and tick_usec < limit, (census_usec, plan_usec, tick_usec)


@pytest.mark.real
def test_bench_census_prints_the_figures(tmp_path, capsys):
    engine = next(iter(available_engines()), None)
    if engine is None:
        pytest.skip("no redis-server / valkey-server available")
    out_json = tmp_path / "census.json"
    assert bench.main(["--census", "--engine", engine, "--estimates", "10,2000", "--iterations", "3",
                       "--no-progress", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "census server µs/call" in out and "tick server µs/call" in out
    cases = json.loads(out_json.read_text())["census_cases"]
    assert [(c["lanes"], c["estimate"]) for c in cases] == [(8, 10), (8, 2000)]
    assert all(c["census_usec"] > 0 and c["tick_usec"] > 0 and c["iterations"] == 3 for c in cases)
    assert cases[1]["bounds"] > cases[0]["bounds"]
