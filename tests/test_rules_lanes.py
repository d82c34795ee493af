"""DESIGN §5 — deciding one round on one pool: floors, overdraft, reserved, fair share, the
probability, oldest first, idle lanes lending, reclaim, plan/allowance, starvation, urgency."""
from __future__ import annotations

import pytest

from admission import NotYourSeat, urgency

from helpers import POOL, T0, Rounds, adm, lane_row, policy, pool_row, pool_state

THREE = {"hi": {"floor": 0.25, "weight": 1, "priority": 3},
         "mid": {"floor": 0.25, "weight": 1, "priority": 2},
         "lo": {"floor": 0.25, "weight": 1, "priority": 1}}


def make_measured(a, r, n, lane="a"):
    """Measure the pool exhausted at n (K̂ = 0.7 n) with one lane, then free it: a stall with n
    running (a 429 would measure the load its round was admitted at)."""
    seats = r.fill(lane, n)
    a.release(seats[0], outcome="stall", seconds=1, now=r.now)
    for s in seats[1:]:
        a.release(s, outcome="clean", seconds=1, now=r.now)


def test_within_floor_a_lane_below_its_guaranteed_slots_is_admitted_while_a_slot_is_free(redis_client):
    a = adm(redis_client, pol=policy(seed_estimate=10))
    r = Rounds(a)
    r.fill("b", 9)                                   # b borrows almost everything
    d = r.ask("a", draw=0.999999)                    # a's floor: 5 of 10; the draw does not matter
    assert d.admitted and d.reason == "within-floor"


def test_floor_overdraft_on_a_pool_never_measured_exhausted(redis_client):
    a = adm(redis_client, pol=policy(seed_estimate=4))
    r = Rounds(a)
    r.fill("b", 4)                                   # full
    d = r.ask("a")
    assert d.admitted and d.reason == "overdraft" and d.running == 5 and d.slots == 4


def test_floor_overdraft_not_on_a_measured_pool(redis_client):
    a = adm(redis_client, pol=policy(seed_estimate=10))
    r = Rounds(a)
    make_measured(a, r, 10)                          # K̂ = 7
    r.fill("b", 7)
    d = r.ask("a")
    assert not d.admitted and d.reason == "full"


def test_floors_by_largest_remainder_ties_to_priority(redis_client):
    # C = 10, three lanes with work at 0.25: q = 2.5 each -> 2 each, floor(7.5) - 6 = 1 extra slot,
    # equal remainders: it goes to the highest priority.
    a = adm(redis_client, pol=policy(THREE, seed_estimate=10))
    r = Rounds(a)
    for lane in THREE:
        r.fill(lane, 1)
    c = a.ops.census(now=T0)
    assert [lane_row(c, l)["guaranteed"] for l in ("hi", "mid", "lo")] == [3, 2, 2]


def test_floors_by_largest_remainder_ties_to_priority_up_to_float_noise(redis_client):
    # C = 4: q = 0.7 x 4 = 2.8 and 0.2 x 4 = 0.8 -> 2 + 0, both remainders 0.8 (in floats
    # 0.7 x 4 - 2 is not 0.2 x 4): the one extra slot goes to the higher priority
    lanes = {"hi": {"floor": 0.7, "weight": 1, "priority": 2}, "lo": {"floor": 0.2, "weight": 1, "priority": 1}}
    a = adm(redis_client, pol=policy(lanes, seed_estimate=4))
    r = Rounds(a)
    r.fill("lo", 1)
    r.fill("hi", 2)
    c = a.ops.census(now=T0)
    assert (lane_row(c, "hi")["guaranteed"], lane_row(c, "lo")["guaranteed"]) == (3, 0)
    d = r.ask("hi", draw=0.999999)                   # its third guaranteed slot: the draw does not matter
    assert d.admitted and d.reason == "within-floor"


def test_floors_largest_remainder_goes_to_the_largest_remainder(redis_client):
    lanes = {"x": {"floor": 0.34, "weight": 1, "priority": 1}, "y": {"floor": 0.46, "weight": 1, "priority": 9}}
    a = adm(redis_client, pol=policy(lanes, seed_estimate=5))
    r = Rounds(a)
    r.fill("x", 1)
    r.fill("y", 1)
    c = a.ops.census(now=T0)   # q: x 1.7, y 2.3 -> 1 + 2 = 3; floor(4.0) - 3 = 1 extra to x (0.7 > 0.3)
    assert (lane_row(c, "x")["guaranteed"], lane_row(c, "y")["guaranteed"]) == (2, 2)


def test_floors_only_for_lanes_that_have_work(redis_client):
    a = adm(redis_client, pol=policy(THREE, seed_estimate=10))
    r = Rounds(a)
    r.fill("hi", 1)
    c = a.ops.census(now=T0)
    assert lane_row(c, "hi")["guaranteed"] == 2     # q = 2.5 -> 2; floor(Σq) - Σfloor(q) = 0
    assert lane_row(c, "mid") == {}                  # no work: not listed, no slots


def test_floors_a_waiting_lane_with_a_nonzero_floor_gets_at_least_one(redis_client):
    lanes = {"big": {"floor": 0.9, "weight": 1, "priority": 2}, "small": {"floor": 0.05, "weight": 1, "priority": 1}}
    a = adm(redis_client, pol=policy(lanes, seed_estimate=4))
    r = Rounds(a)
    make_measured(a, r, 4, lane="big")               # measured: no overdraft; K̂ = 2.8 -> 2 slots
    r.fill("big", 2)
    d = r.ask("small", wait=True)                    # q = 0.1 -> 0, but waiting with a floor: 1
    assert not d.admitted
    c = a.ops.census(now=T0)
    assert lane_row(c, "small")["guaranteed"] == 1


def measured_ten(redis_client, lanes=None):
    """A pool measured exhausted at 15 (K̂ = 10.5: 10 slots), free again."""
    lanes = lanes or {"a": {"floor": 0.5, "weight": 1, "priority": 2},
                      "b": {"floor": 0.3, "weight": 1, "priority": 1}}
    a = adm(redis_client, pol=policy({**lanes, "m": {"floor": 0, "weight": 1, "priority": 0}}, seed_estimate=15))
    r = Rounds(a)
    seats = r.fill("m", 15)
    a.release(seats[0], outcome="stall", seconds=1, now=T0)
    for s in seats[1:]:
        a.release(s, outcome="clean", seconds=1, now=T0)
    assert pool_row(a.ops.census(now=T0))["slots"] == 10
    return a, r


def test_reserved_a_borrower_is_refused_while_free_slots_are_owed(redis_client):
    a, r = measured_ten(redis_client)
    b_seats = r.fill("b", 10)                        # b borrows the whole pool
    assert not r.ask("a", round_id="a-1", wait=True).admitted   # a below floor, pool full: waits
    a.release(b_seats.pop(), outcome="clean", seconds=1, now=T0)   # one slot frees
    d = r.ask("b")                                   # a b newcomer may not take it
    assert not d.admitted and d.reason == "reserved"
    d = r.ask("a", round_id="a-1", wait=True)        # the owed lane takes it
    assert d.admitted and d.reason == "within-floor"


def test_reclaim_at_round_boundaries_borrowers_yield_and_are_listed(redis_client):
    a, r = measured_ten(redis_client)
    b_seats = r.fill("b", 10)
    r.ask("a", round_id="a-1", wait=True)
    row = pool_row(a.ops.census(now=T0))
    assert row["mustYield"] == [{"lane": "b", "borrowed": 7}] and row["owed"] == 5
    # b's next round boundary: its round ends and asks again -- refused while a is owed
    a.release(b_seats.pop(), outcome="clean", seconds=1, now=T0)
    assert r.ask("b", round_id="b-next").reason == "reserved"
    assert r.ask("a", round_id="a-1", wait=True).admitted        # a starts within one round


def test_fair_share_goes_to_the_lane_with_least_borrowed_per_weight(redis_client):
    lanes = {"x": {"floor": 0, "weight": 2, "priority": 1}, "y": {"floor": 0, "weight": 1, "priority": 1}}
    a = adm(redis_client, pol=policy(lanes, seed_estimate=10))
    r = Rounds(a)
    r.fill("x", 6)                                   # x: 6 borrowed / weight 2 = 3
    r.fill("y", 2)                                   # y: 2 / 1 = 2; φ = 0.2
    assert not r.ask("y", round_id="y-w", wait=True, draw=0.99).admitted   # y waits (draw)
    d = r.ask("x", draw=0.0)
    assert not d.admitted and d.reason == "fair-share"


def test_fair_share_not_refused_when_the_other_lane_borrowed_more(redis_client):
    lanes = {"x": {"floor": 0, "weight": 2, "priority": 1}, "y": {"floor": 0, "weight": 1, "priority": 1}}
    a = adm(redis_client, pol=policy(lanes, seed_estimate=10))
    r = Rounds(a)
    r.fill("x", 4)                                   # x: 4 / 2 = 2
    r.fill("y", 4)                                   # y: 4 / 1 = 4; φ = 0.2
    assert not r.ask("y", round_id="y-w", wait=True, draw=0.99).admitted
    assert r.ask("x", draw=0.0).admitted


@pytest.mark.parametrize("y_priority, refused", [(2, True), (0, False)])
def test_fair_share_ties_go_to_the_higher_priority(redis_client, y_priority, refused):
    lanes = {"x": {"floor": 0, "weight": 2, "priority": 1}, "y": {"floor": 0, "weight": 1, "priority": y_priority}}
    a = adm(redis_client, pol=policy(lanes, seed_estimate=10))
    r = Rounds(a)
    r.fill("x", 6)                                   # 6 / 2 = 3
    r.fill("y", 3)                                   # 3 / 1 = 3: a tie; φ = 0.1
    assert not r.ask("y", round_id="y-w", wait=True, draw=0.99).admitted
    d = r.ask("x", draw=0.0)
    assert (d.reason == "fair-share") is refused


def test_probability_certain_while_at_least_high_free_is_free(redis_client):
    a = adm(redis_client, pol=policy({"x": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=10))
    r = Rounds(a)
    r.fill("x", 5)                                   # φ = 0.5
    assert r.ask("x", draw=0.999999).admitted
    r.fill("x", 1)                                   # φ = 0.3
    assert r.ask("x", draw=0.999999).admitted


def test_probability_smoothstep_below_high_free(redis_client):
    a = adm(redis_client, pol=policy({"x": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=10))
    r = Rounds(a)
    r.fill("x", 8)                                   # φ = 0.2: p = s(2/3) = 20/27 = 0.7407
    d = r.ask("x", draw=0.7408)
    assert not d.admitted and d.reason == "draw"
    assert r.ask("x", draw=0.7406).admitted


def test_probability_zero_at_a_full_pool(redis_client):
    a = adm(redis_client, pol=policy({"x": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=10))
    r = Rounds(a)
    r.fill("x", 10)
    d = r.ask("x", draw=0.0)
    assert not d.admitted and d.reason == "full"


def test_probability_raised_to_the_weight_exponent(redis_client):
    lanes = {"x": {"floor": 0, "weight": 1, "priority": 1}, "heavy": {"floor": 0, "weight": 3, "priority": 2}}
    a = adm(redis_client, pol=policy(lanes, seed_estimate=10))
    r = Rounds(a)
    r.fill("x", 8)                                   # p = (20/27)^3 = 0.4064 for x; 0.7407 for heavy
    assert not r.ask("x", draw=0.41).admitted
    assert r.ask("x", draw=0.40).admitted            # running 9 now: heavy at φ = 0.1
    assert not r.ask("heavy", draw=0.26).admitted    # s(1/3) = 0.259, exponent 1
    assert r.ask("heavy", draw=0.25).admitted


def test_probability_weight_exponent_is_clamped_to_four(redis_client):
    lanes = {"x": {"floor": 0, "weight": 1, "priority": 1}, "heavy": {"floor": 0, "weight": 100, "priority": 2}}
    a = adm(redis_client, pol=policy(lanes, seed_estimate=10))
    r = Rounds(a)
    r.fill("x", 8)                                   # (20/27)^4 = 0.3011, not ^100
    assert r.ask("x", draw=0.30).admitted


def test_oldest_first_a_newcomer_does_not_pass_the_older_waiters_of_its_lane(redis_client):
    a = adm(redis_client, pol=policy({"x": {"floor": 0, "weight": 1, "priority": 1}}))
    r = Rounds(a)
    seats = r.fill("x", 2)
    assert not r.ask("x", round_id="old", wait=True).admitted
    a.release(seats[0], outcome="clean", seconds=1, now=T0)
    d = r.ask("x", round_id="new", wait=True, now=T0 + 1)
    assert not d.admitted and d.reason == "behind-older"
    assert r.ask("x", round_id="old", wait=True, now=T0 + 2).admitted


def test_oldest_first_waiters_asking_at_the_same_moment_keep_their_order(redis_client):
    a = adm(redis_client, pol=policy({"x": {"floor": 0, "weight": 1, "priority": 1}}))
    r = Rounds(a)
    seats = r.fill("x", 2)
    first = r.ask("x", round_id="w-b", wait=True)          # same `now`, ids in reverse order
    second = r.ask("x", round_id="w-a", wait=True)
    assert first.waiting_since < second.waiting_since
    assert a._book.is_oldest("x", POOL, "w-b")              # the pod agrees with the server
    a.release(seats[0], outcome="clean", seconds=1, now=T0)
    assert r.ask("x", round_id="w-a", wait=True).reason == "behind-older"
    assert r.ask("x", round_id="w-b", wait=True).admitted


def test_idle_lanes_lend_everything_a_single_lane_fills_the_pool(redis_client):
    a = adm(redis_client, pol=policy(seed_estimate=10))
    r = Rounds(a)
    r.fill("b", 10)                                  # b's floor is 0.3; a is idle and lends
    row = pool_row(a.ops.census(now=T0))
    assert row["running"] == 10 and row["free"] == 0


def test_plan_counts_rounds_that_would_start_and_seats_nothing(redis_client):
    a = adm(redis_client, pol=policy({"x": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=10))
    # p(φ) >= 0.5 while φ >= 0.15: running 0..8 -> 9 rounds
    assert a.plan(lane="x", model=POOL, wanted=20, now=T0) == 9
    assert a.plan(lane="x", model=POOL, wanted=3, now=T0) == 3
    assert pool_state(redis_client).get("running", "0") == "0"
    assert redis_client.zcard("adm:{t}:seats") == 0


def test_plan_newcomers_wait_behind_the_lanes_waiters(redis_client):
    a = adm(redis_client, pol=policy({"x": {"floor": 0, "weight": 1, "priority": 1}}))
    r = Rounds(a)
    r.fill("x", 2)
    r.ask("x", round_id="w", wait=True)
    assert a.plan(lane="x", model=POOL, wanted=5, now=T0) == 0


def test_allowance_sums_plan_over_the_lanes_pools(redis_client):
    lanes = {"x": {"floor": 0, "weight": 1, "priority": 1, "pools": ["m@p", "n@p"]}}
    a = adm(redis_client, pol=policy(lanes, pools=("m@p", "n@p", "o@p"), seed_estimate=10))
    assert a.allowance(lane="x", now=T0) == 18       # 9 + 9, not o@p


def test_starvation_a_lane_below_floor_waiting_past_starved_after(redis_client):
    a, r = measured_ten(redis_client)
    r.fill("b", 10)
    r.ask("a", round_id="a-1", wait=True)
    assert a.ops.census(now=T0 + 899)["starving"] == []
    starving = a.ops.census(now=T0 + 901)["starving"]
    assert starving == [{"kind": "below-floor", "lane": "a", "pool": POOL, "waitingSince": T0}]


def test_same_intent_one_decision_per_round_id(redis_client):
    a = adm(redis_client)
    r = Rounds(a)
    d1 = r.ask("a", round_id="intent-1")
    d2 = r.ask("a", round_id="intent-1")
    assert d2.admitted and d2.reason == "same-intent" and d2.seat == d1.seat
    assert pool_state(redis_client)["running"] == "1"


def test_same_intent_from_another_pod_names_the_holder_and_seats_nothing(redis_client):
    a = adm(redis_client)
    b = adm(redis_client, pod="pod-b", apply=False)
    d1 = Rounds(a).ask("a", round_id="intent-1")
    d2 = b.try_admit(lane="a", model=POOL, round_id="intent-1", now=T0, draw=0.0)
    assert d2.admitted and d2.reason == "same-intent" and d2.seat.pod == "pod-a" == d1.seat.pod
    assert pool_state(redis_client)["running"] == "1" and b._book.seats == {}
    with pytest.raises(NotYourSeat, match="held by pod pod-a"):
        with b.round(lane="a", model=POOL, round_id="intent-1"):
            pass


def test_urgency_weights_and_aging():
    day = 86_400
    assert urgency("red-main", 0) == 33 and urgency("B", 0) == 17 and urgency(None, 0) == 2
    assert urgency("L", 8 * day) > urgency("B", 0)   # an eight-day-old low bug first
    assert urgency("L", 4 * day) < urgency("B", 0)
    with pytest.raises(ValueError):
        urgency("Z", 0)
