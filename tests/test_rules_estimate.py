"""DESIGN §4 — the estimate of one pool (seed-and-grow). One test per rule, named after it."""
from __future__ import annotations

import json

import pytest

from admission import Status

from admission.view import render_census

from helpers import POOL, T0, Rounds, adm, policy, pool_row, pool_state


def est(client) -> float:
    return float(pool_state(client).get("est", "nan"))


def measured(client, n: int, **tunables):
    """A pool measured exhausted at n: the round admitted as the (n+1)th got a 429, so K = n and
    K̂ = 0.7·n; the n rounds before it are held."""
    a = adm(client, pol=policy({"a": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=n + 1, **tunables))
    r = Rounds(a)
    seats = r.fill("a", n + 1)
    out = a.release(seats[-1], outcome="rate_limited", seconds=1, now=T0 + 1)
    assert out.decreased
    return a, r, seats[:-1]


def test_seed_estimate_of_a_pool_never_measured(redis_client):
    a = adm(redis_client, pol=policy(seed_estimate=3))
    row = a.ops.census(now=T0)["pools"][0]
    assert row["capacity"] == 3 and row["slots"] == 3 and row["slowStart"] and not row["exhausted"]


def test_growth_needs_demand_idle_pool_keeps_its_estimate(redis_client):
    a = adm(redis_client)
    a.tick(now=T0)
    a.tick(now=T0 + 100)
    assert a.ops.census(now=T0 + 100)["pools"][0]["capacity"] == 2  # idle: unchanged
    r = Rounds(a, T0 + 100)
    r.fill("a", 2)                       # running >= slots: demand
    assert a.tick(now=T0 + 200).grew == {POOL: 4.0}


def test_growth_needs_demand_a_waiter_counts(redis_client):
    a = adm(redis_client, pol=policy({"a": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=4))
    r = Rounds(a)
    r.fill("a", 1)
    assert a.tick(now=T0 + 20).grew == {}  # one of four running, nobody waiting: no demand
    r.fill("a", 3)
    assert not r.ask("a", wait=True).admitted
    assert a.tick(now=T0 + 40).grew == {POOL: 8.0}


def test_slow_start_doubles_once_per_grow_interval_up_to_max(redis_client):
    a = adm(redis_client, pol=policy(max_estimate=10))
    r = Rounds(a)
    r.fill("a", 2)                                  # full: demand
    assert a.tick(now=T0 + 15).grew == {POOL: 4.0}
    r.fill("a", 2)                                  # full again at 4: demand
    assert a.tick(now=T0 + 20).grew == {}           # but within the interval
    assert a.tick(now=T0 + 30).grew == {POOL: 8.0}
    r.fill("a", 4)
    assert a.tick(now=T0 + 45).grew == {POOL: 10.0}  # capped by max_estimate


def test_at_most_one_growth_step_per_interval_whatever_order_the_ticks_come_in(redis_client):
    """Ticks a moment apart that reach Redis out of order (caller clocks: tests, the simulator)
    are one interval: a tick before the last step is not due and does not move it back."""
    a = adm(redis_client)
    r = Rounds(a)
    r.fill("a", 2)
    assert a.tick(now=T0 + 15).grew == {POOL: 4.0}
    r.fill("a", 2)                                  # full again at 4: demand
    assert a.tick(now=T0 + 30.005).grew == {POOL: 8.0}
    r.fill("a", 4)                                  # full again at 8: demand
    assert a.tick(now=T0 + 30.000).grew == {}       # before the step: not due
    assert a.tick(now=T0 + 29.999).grew == {}
    assert est(redis_client) == 8 and float(pool_state(redis_client)["lastGrow"]) == T0 + 30.005
    assert a.tick(now=T0 + 45.004).grew == {}       # one interval after the step, not after the ticks
    assert a.tick(now=T0 + 45.005).grew == {POOL: 16.0}


def test_limited_slow_start_a_step_adds_at_most_slow_start_step_rounds(redis_client):
    """Doubling until a step would add more than slow_start_step rounds, then that many a step: a
    step past K admits at most slow_start_step rounds too many before the first 429 comes back."""
    a = adm(redis_client, pol=policy(slow_start_step=3))
    r = Rounds(a)
    grew = []
    for i, more in enumerate((2, 2, 3, 3), start=1):
        r.fill("a", more)                                          # full again: demand
        grew.append(a.tick(now=T0 + 15 * i).grew[POOL])
    assert grew == [4.0, 7.0, 10.0, 13.0]                          # x2, then +3 a step
    adm(redis_client, mesh="d")                                     # the default (design §4)
    assert json.loads(redis_client.hget("adm:{d}:config", "tunables"))["slow_start_step"] == 8


def test_limited_slow_start_a_policy_stored_without_the_step_doubles(redis_client):
    """A policy stored before slow_start_step existed keeps doubling until it is applied again."""
    a = adm(redis_client, pol=policy(slow_start_step=1))
    tunables = json.loads(redis_client.hget("adm:{t}:config", "tunables"))
    del tunables["slow_start_step"]
    redis_client.hset("adm:{t}:config", mapping={"tunables": json.dumps(tunables), "token": "older"})
    r = Rounds(a)
    r.fill("a", 2)
    assert a.tick(now=T0 + 15).grew == {POOL: 4.0}


def test_logistic_growth_once_measured(redis_client):
    a, r, seats = measured(redis_client, 10)        # K = 10, K̂ = 7
    assert est(redis_client) == pytest.approx(7.0)
    a.release(seats[0], outcome="clean", seconds=1, now=T0 + 2)   # evidence
    r.now = T0 + 3
    r.ask("a", wait=True, round_id="w1")           # a waiter: demand
    grew = a.tick(now=T0 + 20).grew
    assert grew[POOL] == pytest.approx(7 + 0.5 * 7 * (1 - 7 / 10))  # r·K̂·(1 − K̂/K)


def test_logistic_growth_at_least_a_quarter_below_K(redis_client):
    a, r, seats = measured(redis_client, 10, growth_rate=0.01)
    a.release(seats[0], outcome="clean", seconds=1, now=T0 + 2)
    r.now = T0 + 3
    r.ask("a", wait=True, round_id="w1")
    assert a.tick(now=T0 + 20).grew[POOL] == pytest.approx(7.25)


def test_growth_waits_for_its_evidence_a_clean_round_since_the_last_step(redis_client):
    a, r, seats = measured(redis_client, 10)
    r.now = T0 + 3
    r.ask("a", wait=True, round_id="w1")
    assert a.tick(now=T0 + 20).grew == {}          # no clean round since the decrease
    a.release(seats[0], outcome="clean", seconds=1, now=T0 + 21)
    assert POOL in a.tick(now=T0 + 40).grew
    assert a.tick(now=T0 + 60).grew == {}          # the step consumed the evidence


def test_growth_waits_for_its_evidence_half_the_mean_round_time(redis_client):
    a, r, seats = measured(redis_client, 10)
    a.release(seats[0], outcome="clean", seconds=100, now=T0 + 2)   # mean round 100 s -> 50 s
    a.release(seats[1], outcome="clean", seconds=100, now=T0 + 2)
    r.now = T0 + 3
    r.ask("a", wait=True, round_id="w1")
    assert a.tick(now=T0 + 1 + 30).grew == {}      # 30 s after the decrease: < 50 s
    assert POOL in a.tick(now=T0 + 1 + 50).grew


def test_growth_waits_for_its_evidence_a_round_counts_at_most_round_cap(redis_client):
    """A round runs at most round_cap (it is cut there): a release that says it ran longer (a
    client's bad clock) counts round_cap, so one such release cannot hold growth off for years."""
    a, r, seats = measured(redis_client, 10)
    a.release(seats[0], outcome="clean", seconds=1.8e9, now=T0 + 2)   # counted 1,800 s (round_cap)
    assert pool_row(a.ops.census(now=T0 + 2))["meanSeconds"] == 1800
    r.now = T0 + 3
    r.ask("a", wait=True, round_id="w1")
    assert a.tick(now=T0 + 1 + 899).grew == {}     # half the mean round time: 900 s
    assert POOL in a.tick(now=T0 + 1 + 900).grew


def steps_at_capacity(a, r, held, now, steps):
    """Growth steps with evidence and demand: each releases one held round clean, refills the
    pool (one waiter left over) and ticks 16 s later. Returns K after each step, and the clock."""
    caps = []
    for _ in range(steps):
        a.release(held.pop(0), outcome="clean", seconds=1, now=now)     # the evidence
        while True:                                                     # refill; one waiter left: demand
            d = r.ask("a", round_id=f"w{r.n}", wait=True, now=now)     # the same waiter until admitted
            if not d.admitted:
                break
            r.n += 1
            held.append(d.seat)
        now += 16
        a.tick(now=now)
        caps.append(float(pool_state(a.redis)["cap"]))
    return caps, now


def test_upward_probing_grows_K_by_one_after_probe_after_steps_at_K(redis_client):
    a, r, held = measured(redis_client, 4, probe_after=3, growth_rate=2)   # K = 4, K̂ = 2.8
    caps, _ = steps_at_capacity(a, r, held, T0 + 10, 6)
    # step 1 brings K̂ to K; the next three steps at K grow K by one (probe_after = 3)
    assert caps == [4, 4, 4, 5, 5, 5]


def test_a_refused_probe_returns_to_the_K_it_probed_from(redis_client):
    a, r, held = measured(redis_client, 4, probe_after=3, growth_rate=2)
    caps, now = steps_at_capacity(a, r, held, T0 + 10, 5)
    assert caps[-1] == 5 and est(redis_client) == 5                      # probing K = 5
    out = a.release(held[-1], outcome="rate_limited", seconds=1, now=now)  # admitted at load 5
    s = pool_state(redis_client)
    assert out.decreased and float(s["cap"]) == 4 and float(s["est"]) == 4   # not 0.7 x 4
    assert s["probeFails"] == "1"


def test_a_refused_probe_doubles_the_wait_before_the_next_probe(redis_client):
    a, r, held = measured(redis_client, 4, probe_after=3, growth_rate=2)
    caps, now = steps_at_capacity(a, r, held, T0 + 10, 5)
    a.release(held.pop(), outcome="rate_limited", seconds=1, now=now)   # the probe of 5 refused
    caps, now = steps_at_capacity(a, r, held, now + 1, 7)
    assert caps == [4, 4, 4, 4, 4, 5, 5]                                # 2 x 3 steps at K, then 5
    # the probe of 5 holds its whole wait (still 2 x 3 steps, and 4 rounds ran at load 5): K = 6 and
    # the back-off ends; the probe after it waits 3 steps, and for 5 rounds at load 6 (one a step)
    caps, _ = steps_at_capacity(a, r, held, now, 10)
    assert caps == [5, 5, 5, 5, 6, 6, 6, 6, 6, 7] and pool_state(redis_client)["probeFails"] == "0"


def test_a_probe_holds_only_once_as_many_rounds_as_K_ran_at_its_level(redis_client):
    # probe_after = 1: the wait in steps is one, so the rounds at the probed level set the pace;
    # each step admits one round at the new level, and K = 4 wants 4 of them before probing 6
    a, r, held = measured(redis_client, 4, probe_after=1, growth_rate=2)
    caps, _ = steps_at_capacity(a, r, held, T0 + 10, 10)
    assert caps == [4, 5, 5, 5, 5, 6, 6, 6, 6, 6]
    assert pool_state(redis_client)["probeRuns"] == "4"                  # 4 of the 5 the probe of 6 wants


def test_a_429_measures_K_at_the_load_before_the_refused_round(redis_client):
    a = adm(redis_client, pol=policy({"a": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=6))
    seats = Rounds(a).fill("a", 6)
    a.release(seats[3], outcome="rate_limited", seconds=1, now=T0 + 1)  # admitted 4th, 6 running now
    s = pool_state(redis_client)
    assert float(s["cap"]) == 3 and float(s["est"]) == pytest.approx(2.1)


def test_a_429_a_little_below_K_refines_K_and_the_estimate_to_it(redis_client):
    a, r, held = measured(redis_client, 4, growth_rate=2)               # K = 4, K̂ = 2.8
    steps_at_capacity(a, r, held, T0 + 10, 1)
    assert est(redis_client) == 4
    load4 = next(s for s in held if s.id == "r4")                        # admitted at load 4
    out = a.release(load4, outcome="rate_limited", seconds=1, now=T0 + 40)
    s = pool_state(redis_client)
    assert out.decreased and float(s["cap"]) == 3 and float(s["est"]) == 3   # 3 >= 0.7 x 4: not 2.1
    # far below K (n = 1 < 0.7 x 3), in the same burst: once per burst holds
    load2 = next(s for s in held if s.id == "r2")
    assert not a.release(load2, outcome="rate_limited", seconds=1, now=T0 + 41).decreased
    assert float(pool_state(redis_client)["cap"]) == 3


def test_decrease_on_a_load_signal(redis_client):
    a, r, seats = measured(redis_client, 10)
    s = pool_state(redis_client)
    assert float(s["cap"]) == 10 and float(s["est"]) == pytest.approx(7.0)
    assert s["exhausted"] == "1" and s["why"] == "rate_limited" and float(s["exhaustedAt"]) == T0 + 1
    assert s["slow"] == "0"


def test_decrease_never_below_one(redis_client):
    a = adm(redis_client, pol=policy({"a": {"floor": 0, "weight": 1, "priority": 1}}))
    seat = Rounds(a).fill("a", 1)[0]
    a.release(seat, outcome="round_cap", seconds=1, now=T0 + 1)
    assert float(pool_state(redis_client)["est"]) == 1.0


def test_once_per_burst_a_round_admitted_before_the_decrease_does_not_decrease_again(redis_client):
    a, r, seats = measured(redis_client, 10)
    out = a.release(seats[0], outcome="stall", seconds=1, now=T0 + 2)
    assert not out.decreased and est(redis_client) == pytest.approx(7.0)
    # a round admitted after the decrease does decrease again
    for s in seats[1:4]:
        a.release(s, outcome="clean", seconds=1, now=T0 + 3)
    fresh = r.ask("a", now=T0 + 4)
    assert fresh.admitted
    out = a.release(fresh.seat, outcome="rate_limited", seconds=1, now=T0 + 5)
    assert out.decreased


def test_stall_reported_mid_round_decreases_and_the_seat_stays(redis_client):
    a = adm(redis_client, pol=policy({"a": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=6))
    seats = Rounds(a).fill("a", 6)
    rep = a.report(seats[0], signal="stall", now=T0 + 1200)
    assert rep.status == Status.REPORTED and rep.decreased
    s = pool_state(redis_client)
    assert s["why"] == "stall" and float(s["cap"]) == 6 and s["running"] == "6"   # seat stays
    assert a.report(seats[0], signal="round_cap", now=T0 + 1800).status == Status.ALREADY_REPORTED
    out = a.release(seats[0], outcome="stall", seconds=1900, now=T0 + 1900)
    assert not out.decreased                       # reported once, counted once


def test_a_stall_on_a_measured_pool_lowers_the_estimate_not_K(redis_client):
    """A stall says a round is long for the load it ran at, not that the provider refused one:
    K̂ comes down to factor·n to make room, K stays what the 429 measured, and growth goes back
    to it. In slow start a stall still measures K (the test above)."""
    a, r, seats = measured(redis_client, 10)                       # K = 10, K̂ = 7
    for s in seats[:4]:
        a.release(s, outcome="clean", seconds=1, now=T0 + 2)
    r.now = T0 + 2
    later = r.fill("a", 1)                                          # after the decrease: a new burst
    assert a.report(later[0], signal="stall", now=T0 + 1200).decreased
    s = pool_state(redis_client)
    assert float(s["cap"]) == 10 and s["why"] == "stall"            # K stays
    assert float(s["est"]) == pytest.approx(0.7 * 7)                # n = the 7 running


@pytest.mark.parametrize("outcome", ["rate_limited", "stall", "round_cap"])
def test_load_signals_rate_limit_stall_round_cap_decrease(redis_client, outcome):
    a = adm(redis_client, pol=policy({"a": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=5))
    seats = Rounds(a).fill("a", 5)
    assert a.release(seats[0], outcome=outcome, seconds=1, now=T0 + 1).decreased


def test_other_errors_count_a_failure_only(redis_client):
    a = adm(redis_client, pol=policy({"a": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=5))
    seats = Rounds(a).fill("a", 5)
    out = a.release(seats[0], outcome="error", seconds=1, now=T0 + 1)
    s = pool_state(redis_client)
    assert not out.decreased and float(s["fail"]) == 1 and s.get("exhausted", "0") == "0"


def test_signals_success_failure_counts_halve_past_200(redis_client):
    a = adm(redis_client, pol=policy({"a": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=1, max_estimate=1))
    for i in range(201):
        d = a.try_admit(lane="a", model=POOL, round_id=f"x{i}", now=T0, draw=0.0)
        a.release(d.seat, outcome="clean" if i % 4 else "error", seconds=1, now=T0)
    s = pool_state(redis_client)
    total = float(s["succ"]) + float(s["fail"])
    assert total <= 200 and total == pytest.approx(201 / 2, abs=1)


def test_signals_mean_seconds_and_mean_cost_are_ewma(redis_client):
    a = adm(redis_client, pol=policy({"a": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=1))
    for secs, cost in ((10, 0.10), (20, 0.20)):
        d = a.try_admit(lane="a", model=POOL, round_id=f"x{secs}", now=T0, draw=0.0)
        a.release(d.seat, outcome="clean", seconds=secs, cost_usd=cost, now=T0)
    row = a.ops.census(now=T0)["pools"][0]
    assert row["meanSeconds"] == pytest.approx(10 + 0.1 * (20 - 10))
    assert row["meanCostUsd"] == pytest.approx(0.10 + 0.1 * (0.20 - 0.10))


def test_the_census_shows_a_probe_in_progress_and_its_back_off(redis_client):
    a, r, held = measured(redis_client, 4, probe_after=3, growth_rate=2)
    _, now = steps_at_capacity(a, r, held, T0 + 10, 5)                   # probing K = 5 from 4
    row = pool_row(a.ops.census(now=now))
    assert row["probingFrom"] == 4 and row["carryingCapacity"] == 5 and row["probeBackoff"] == 1
    a.release(held.pop(), outcome="rate_limited", seconds=1, now=now)   # refused: back to 4, back-off
    doc = a.ops.census(now=now + 1)
    row = pool_row(doc)
    assert row["probingFrom"] == 0 and row["probeBackoff"] == 2
    assert "probes back off x2" in render_census(doc)
