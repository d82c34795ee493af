"""The provider's day (docs/design.md §5 steps 1, 2, 6; §6): closure with probes, the budget and its
reserve, committed spend, the exact ledger and the midnight roll-over. One test per rule, named
after it; each runs on fakeredis, Redis 7 and Valkey 8."""
from __future__ import annotations

import time

import pytest
import redis

from admission import Status
from types import SimpleNamespace
from admission.errors import BadArgument, NotYourSeat, UnknownProvider

from helpers import T0, adm, policy, pool_state, snapshot

P1, P2, Q1 = "m@p", "n@p", "m@q"
LANES = {"express": {"floor": 0, "weight": 1, "priority": 9},
         "triage": {"floor": 0, "weight": 1, "priority": 5},
         "bugfix": {"floor": 0, "weight": 1, "priority": 3},
         "reviews": {"floor": 0, "weight": 1, "priority": 1}}
MIDNIGHT = (T0 // 86400 + 1) * 86400          # the next 00:00 UTC after T0 (08:00 UTC)
DAY = "2027-01-15"


def day_policy(limit: float | None = None, **tunables):
    pol = policy(LANES, pools=(P1, P2, Q1), **{"seed_estimate": 4, **tunables})
    if limit is not None:
        pol["providers"]["p"]["daily_limit_usd"] = limit
    return pol


def ask(a, lane="reviews", pool=P1, rid=None, now=T0, wait=False):
    ask.n = getattr(ask, "n", 0) + 1
    return a.try_admit(lane=lane, model=pool, round_id=rid or f"r{ask.n}", now=now, draw=0.0, wait=wait)


def provider(client, name="p"):
    raw = client.hgetall(f"adm:{{t}}:provider:{name}")
    return {k.decode(): v.decode() for k, v in raw.items()}


def reading(provider="p", **kw):
    """A budget reading as a reader gives it (Reading checks its time against this host's clock,
    and these tests run at a fixed epoch in 2027)."""
    return SimpleNamespace(provider=provider, **kw)


def spend(a, usd, lane="express", pool=P2, now=T0, priced=False):
    """Book `usd` to the ledger through a round of its own: charged mid-round (the pool's mean
    round cost stays as it was), or priced at its release (it becomes the pool's mean cost)."""
    d = ask(a, lane, pool, now=now)
    assert d.admitted, d
    if priced:
        a.release(d.seat, outcome="clean", seconds=1, cost_usd=usd, now=now)
    else:
        a.charge(d.seat, cost_usd=usd, key="spend", now=now)
        a.release(d.seat, outcome="clean", seconds=1, now=now)


# -- closure --------------------------------------------------------------------------------------

def test_closure_is_provider_wide_one_call_closes_every_pool(redis_client):
    a = adm(redis_client, pol=day_policy())
    d = ask(a, pool=P1)
    a.release(d.seat, outcome="key_daily_limit", seconds=1, now=T0)
    assert ask(a, pool=P1, now=T0 + 1).reason == "provider-closed"
    assert ask(a, pool=P2, now=T0 + 1).reason == "provider-closed"              # every pool of p
    assert ask(a, pool=Q1, now=T0 + 1).admitted                                   # q stays open
    assert provider(redis_client)["why"] == "key_daily_limit"


def test_closed_until_midnight_for_the_daily_limit_and_closed_for_a_credit_refusal(redis_client):
    a = adm(redis_client, pol=day_policy(closed_for=2100))
    a.release(ask(a, pool=P1).seat, outcome="key_daily_limit", now=T0)
    assert float(provider(redis_client)["closedUntil"]) == MIDNIGHT
    a.release(ask(a, pool=Q1).seat, outcome="credit", now=T0)
    assert float(provider(redis_client, "q")["closedUntil"]) == T0 + 2100
    a.release(ask(a, pool=Q1, now=T0 + 2100).seat, outcome="key_rejected", now=T0 + 2100)
    assert float(provider(redis_client, "q")["closedUntil"]) == T0 + 4200


def test_probe_cadence_one_probe_every_probe_every_while_nothing_runs(redis_client):
    a = adm(redis_client, pol=day_policy(probe_every=10))
    keep = ask(a, pool=P2)                                   # a round that outlives the closure
    a.release(ask(a, pool=P1).seat, outcome="key_daily_limit", now=T0)
    assert ask(a, pool=P2, now=T0 + 20).reason == "provider-closed"     # something runs on n@p
    assert ask(a, pool=P1, now=T0 + 9).reason == "provider-closed"     # the closure was the last probe
    probe = ask(a, pool=P1, now=T0 + 10)
    assert (probe.admitted, probe.reason) == (True, "probe")
    assert redis_client.hget(f"adm:{{t}}:seat:{probe.round_id}", "probe") == b"1"
    assert ask(a, pool=P1, now=T0 + 11).reason == "provider-closed"    # one at a time
    a.release(probe.seat, outcome="error", now=T0 + 12)                 # not an answer: still closed
    assert ask(a, pool=P1, now=T0 + 15).reason == "provider-closed"    # 5 s after the last probe
    assert ask(a, pool=P1, now=T0 + 20).reason == "probe"              # probe_every later
    a.release(keep.seat, now=T0 + 21)


def test_a_probe_that_ends_clean_reopens_the_provider_and_wakes_its_waiters(redis_client):
    a = adm(redis_client, pol=day_policy())
    a.release(ask(a, pool=P1).seat, outcome="key_daily_limit", now=T0)
    probe = ask(a, pool=P1, now=T0 + 10)
    waiting = ask(a, pool=P2, now=T0 + 11, wait=True)
    assert waiting.reason == "provider-closed"
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("adm:{t}:wake")
    a.release(probe.seat, outcome="clean", now=T0 + 12)
    assert provider(redis_client)["closedUntil"] == "0"
    heard, deadline = set(), time.monotonic() + 1
    while time.monotonic() < deadline:
        msg = pubsub.get_message(timeout=0.05)
        if msg:
            heard.add(msg["data"].decode())
    pubsub.close()
    assert {P1, P2} <= heard                                        # every pool of p is woken
    assert ask(a, pool=P2, rid=waiting.round_id, now=T0 + 13, wait=True).admitted


def test_a_probe_refused_again_recloses_the_provider_for_its_reason(redis_client):
    a = adm(redis_client, pol=day_policy())
    a.release(ask(a, pool=P1).seat, outcome="credit", now=T0)
    probe = ask(a, pool=P1, now=T0 + 20)
    a.release(probe.seat, outcome="key_daily_limit", now=T0 + 21)
    pv = provider(redis_client)
    assert (pv["why"], float(pv["closedUntil"])) == ("key_daily_limit", MIDNIGHT)


def test_a_closure_expires_by_itself_at_closed_until(redis_client):
    a = adm(redis_client, pol=day_policy(probe_every=100_000))           # no probe in between
    a.release(ask(a, pool=P1).seat, outcome="key_daily_limit", now=T0)
    assert ask(a, pool=P1, now=MIDNIGHT - 1).reason == "provider-closed"
    assert ask(a, pool=P1, now=MIDNIGHT).admitted          # no cron needed


def test_a_closing_signal_reported_mid_round_closes_the_provider(redis_client):
    a = adm(redis_client, pol=day_policy())
    d = ask(a, pool=P1)
    assert a.report(d.seat, signal="stall", now=T0).status == Status.REPORTED
    assert a.report(d.seat, signal="key_daily_limit", now=T0 + 1).status == Status.REPORTED  # not held back
    assert provider(redis_client)["why"] == "key_daily_limit"
    assert pool_state(redis_client, P1)["running"] == "1"          # the round goes on
    a.release(d.seat, outcome="error", now=T0 + 2)


def test_an_operator_closes_and_reopens_a_provider_audited(redis_client):
    a = adm(redis_client, pol=day_policy())
    until = a.ops.close_provider("p", why="maintenance", seconds=600, now=T0)
    assert until == T0 + 600 and ask(a, pool=P2, now=T0 + 1).reason == "provider-closed"
    assert a.ops.close_provider("p", why="maintenance", now=T0) == MIDNIGHT
    a.ops.reopen_provider("p", why="done", now=T0 + 2)
    assert ask(a, pool=P2, now=T0 + 3).admitted
    kinds = [f[b"kind"] for _, f in redis_client.xrange("adm:{t}:events")]
    assert b"closed" in kinds and b"reopened" in kinds
    with pytest.raises(UnknownProvider):
        a.ops.close_provider("nope", why="x", now=T0)


# -- the budget -----------------------------------------------------------------------------------

def test_budget_reserve_stops_lanes_in_reserve_order_express_never(redis_client):
    a = adm(redis_client, pol=day_policy(limit=100))
    spend(a, 71)                                               # 29 % left
    assert ask(a, "triage", now=T0 + 1).reason == "budget-reserve"      # stops at 30 % left
    assert ask(a, "bugfix", now=T0 + 1).admitted                        # 20 %
    spend(a, 10, now=T0 + 2)                                   # 19 % left
    assert ask(a, "bugfix", now=T0 + 3).reason == "budget-reserve"
    assert ask(a, "reviews", now=T0 + 3).admitted                       # 10 %
    assert ask(a, "express", pool=Q1, now=T0 + 3).admitted              # another provider: no budget


def test_budget_reserve_keeps_to_its_day(redis_client):
    a = adm(redis_client, pol=day_policy(limit=100))
    spend(a, 90)
    assert ask(a, "triage", now=T0 + 1).reason == "budget-reserve"
    assert ask(a, "triage", now=MIDNIGHT + 1).admitted                  # a new day, a new budget


def test_the_days_budget_spent_closes_the_provider_until_midnight(redis_client):
    a = adm(redis_client, pol=day_policy(limit=100))
    spend(a, 100)
    d = ask(a, "express", pool=P2, now=T0 + 1)
    assert d.reason == "provider-closed"
    pv = provider(redis_client)
    assert (pv["why"], float(pv["closedUntil"])) == ("budget_reached", MIDNIGHT)


def test_committed_spend_counts_the_rounds_in_flight_at_their_mean_cost(redis_client):
    a = adm(redis_client, pol=day_policy(limit=100, seed_estimate=8))
    spend(a, 20, pool=P1, priced=True)                         # m@p's mean round cost: 20 USD
    running = [ask(a, "express", now=T0 + 1) for _ in range(3)]
    assert all(d.admitted for d in running)
    # spent 20 + committed 3 x 20 = 80 of 100: 20 % left
    assert ask(a, "triage", now=T0 + 2).reason == "budget-reserve"        # 30 %
    running.append(ask(a, "bugfix", now=T0 + 2))                           # 20 %: just
    assert running[-1].admitted
    doc = a.ops.census(now=T0 + 2)
    assert next(p for p in doc["pools"] if p["pool"] == P2)["committedUsd"] == pytest.approx(80.0)
    assert ask(a, "express", now=T0 + 3).reason == "budget-spent"         # 20 + 4 x 20: the limit
    for d in running:
        a.release(d.seat, now=T0 + 4)
    assert ask(a, "express", now=T0 + 5).admitted                          # what ran cost nothing more


def test_without_a_limit_today_no_budget_rule_applies(redis_client):
    a = adm(redis_client, pol=day_policy())
    spend(a, 10_000)
    assert ask(a, "triage", now=T0 + 1).admitted


def test_a_budget_reading_takes_the_smaller_limit_and_the_larger_spent_of_its_day(redis_client):
    a = adm(redis_client, pol=day_policy(limit=1000))
    spend(a, 10)
    a.ops.report_budget(reading(limit_usd=100.0, spent_usd=75.0, at=T0), now=T0)
    assert ask(a, "triage", now=T0 + 1).reason == "budget-reserve"      # 100 - 75 = 25 % left
    assert ask(a, "bugfix", now=T0 + 1).admitted
    # yesterday's reading stops nobody
    a.ops.report_budget(reading(limit_usd=1.0, spent_usd=1.0, at=T0 - 86400), now=T0)
    assert ask(a, "triage", now=T0 + 2).admitted
    assert float(provider(redis_client).get("closedUntil", 0)) == 0


def test_a_reading_whose_spent_reached_its_limit_closes_the_provider(redis_client):
    a = adm(redis_client, pol=day_policy())
    out = a.ops.report_budget(reading(limit_usd=50.0, spent_usd=50.0, at=T0), now=T0)
    assert out["closed_until"] == MIDNIGHT and provider(redis_client)["why"] == "budget_reached"


def test_bad_budget_readings_change_nothing(redis_client):
    a = adm(redis_client, pol=day_policy())
    before = snapshot(redis_client)
    with pytest.raises(UnknownProvider):
        a._exec(a.core.budget(provider="nope", limit_usd=1.0, spent_usd=0.0, at=T0, now=T0))
    with pytest.raises(BadArgument, match="future"):
        a._exec(a.core.budget(provider="p", limit_usd=1.0, spent_usd=0.0, at=T0 + 3600, now=T0))
    for bad in (float("nan"), -1.0, float("inf")):
        with pytest.raises(BadArgument):
            a.core.budget(provider="p", limit_usd=bad, spent_usd=0.0, at=T0, now=T0)
    with pytest.raises(redis.ResponseError, match="ADM_BAD_ARG"):
        from admission import scripts
        scripts.call(redis_client, "budget", ["adm:{t}:config"], ["p", "1.5", "", repr(T0), repr(T0)])
    assert snapshot(redis_client) == before


# -- the exact ledger -----------------------------------------------------------------------------

def test_a_charge_counts_once_per_key_also_after_its_seat_is_gone(redis_client):
    a = adm(redis_client, pol=day_policy(lease_ttl=30))
    d = ask(a, "bugfix", pool=P1)
    assert a.charge(d.seat, cost_usd=1.25, key="step-1", now=T0).booked
    assert not a.charge(d.seat, cost_usd=1.25, key="step-1", now=T0).booked        # a replay
    assert a.charge(d.seat, cost_usd=0.5, key="step-2", now=T0).booked
    a.tick(now=T0 + 31)                                                              # the lease lapsed
    assert not a.charge(d.seat, cost_usd=1.25, key="step-1", now=T0 + 32).booked
    assert a.charge(d.seat, cost_usd=0.25, key="step-3", now=T0 + 32).booked       # still booked
    assert a.ops.ledger(DAY) == {"bugfix": {"p": 2.0}, "*": {"p": 2.0}}


def test_a_release_cost_counts_once_whatever_is_replayed_after_it(redis_client):
    a = adm(redis_client, pol=day_policy())
    d = ask(a, "bugfix", pool=P2)
    a.release(d.seat, outcome="clean", seconds=3, cost_usd=0.75, now=T0)
    assert a.release(d.seat, outcome="clean", seconds=3, cost_usd=0.75, now=T0).status == Status.ALREADY_RELEASED
    assert not a.charge(d.seat, cost_usd=0.75, key="release", now=T0).booked       # the outbox's fallback
    redis_client.delete(f"adm:{{t}}:gone:{d.round_id}")                             # the tombstone's day passed
    assert not a.charge(d.seat, cost_usd=0.75, key="release", now=T0).booked
    assert a.ops.ledger(DAY) == {"bugfix": {"p": 0.75}, "*": {"p": 0.75}}


def test_a_cost_is_booked_to_the_day_it_was_incurred(redis_client):
    a = adm(redis_client, pol=day_policy())
    d = ask(a, "bugfix", pool=P1)
    a.release(d.seat, outcome="clean", cost_usd=2.0, now=MIDNIGHT + 60, at=MIDNIGHT - 60)   # replayed late
    assert a.ops.ledger(DAY) == {"bugfix": {"p": 2.0}, "*": {"p": 2.0}}
    assert a.ops.ledger("2027-01-16") == {}


def test_bad_charges_change_nothing(redis_client):
    a = adm(redis_client, pol=day_policy())
    d = ask(a, "bugfix", pool=P1)
    other = adm(redis_client, pod="pod-b", apply=False)
    before = snapshot(redis_client)
    with pytest.raises(BadArgument):
        a.charge(d.seat, cost_usd=-1, key="k", now=T0)
    with pytest.raises(BadArgument, match="future"):
        a.charge(d.seat, cost_usd=1, key="k", at=T0 + 3600, now=T0)
    with pytest.raises(BadArgument, match="older"):
        a.charge(d.seat, cost_usd=1, key="k", at=T0 - 30 * 86400, now=T0)
    with pytest.raises(NotYourSeat):
        other.charge(d.seat, cost_usd=1, key="k", now=T0)
    moved = type(d.seat)(d.seat.id, d.seat.seq, P2, d.seat.lane, d.seat.pod, d.seat.admitted_at)
    with pytest.raises(BadArgument, match="runs on"):
        a.charge(moved, cost_usd=1, key="k", now=T0)
    assert snapshot(redis_client) == before


# -- the midnight roll-over -----------------------------------------------------------------------

def _closed_at_night(a):
    a.release(ask(a, "express", pool=P1).seat, outcome="key_daily_limit", now=T0)
    a.release(ask(a, "express", pool=Q1).seat, outcome="credit", now=T0)   # 35 min: long over by midnight


def test_the_rollover_runs_once_per_day(redis_client):
    a = adm(redis_client, pol=day_policy())
    _closed_at_night(a)
    first = a.ops.rollover(now=MIDNIGHT)
    assert first.ran and first.day == "2027-01-16" and first.reopened == ["p", "q"]
    assert provider(redis_client)["closedUntil"] == "0"
    before = snapshot(redis_client)
    second = a.ops.rollover(now=MIDNIGHT + 60)
    assert not second.ran and second.at == MIDNIGHT and snapshot(redis_client) == before
    census = a.ops.census(now=MIDNIGHT + 61)
    assert census["at"] == MIDNIGHT + 61


def test_a_rollover_three_hours_late_leaves_what_the_rules_say(redis_client):
    a = adm(redis_client, pol=day_policy())
    _closed_at_night(a)
    assert ask(a, pool=P2, now=MIDNIGHT + 3 * 3600).admitted             # reopened by itself already
    late = a.ops.rollover(now=MIDNIGHT + 3 * 3600)
    assert late.ran and late.reopened == ["p", "q"]


def test_a_skipped_rollover_changes_nothing_the_rules_need(redis_client):
    a = adm(redis_client, pol=day_policy(limit=100))
    spend(a, 95)
    _closed_at_night(a)
    # no roll-over ran: the next day admits on every provider, with the next day's budget
    assert ask(a, "triage", pool=P1, now=MIDNIGHT + 1).admitted
    assert ask(a, "triage", pool=Q1, now=MIDNIGHT + 1).admitted


def test_a_closed_provider_with_work_waiting_is_starving_first(redis_client):
    a = adm(redis_client, pol=day_policy(starved_after=60, seed_estimate=1, max_estimate=1))
    held = ask(a, "reviews", pool=Q1)
    assert held.admitted
    ask(a, "triage", pool=Q1, wait=True)                           # q's floor-less lanes: nothing starves
    a.release(ask(a, "express", pool=P1).seat, outcome="key_daily_limit", now=T0)
    assert ask(a, "reviews", pool=P1, now=T0 + 1, wait=True).reason == "provider-closed"
    doc = a.ops.census(now=T0 + 2)
    first = doc["starving"][0]
    assert (first["kind"], first["provider"], first["pool"], first["why"]) == \
        ("provider-closed", "p", P1, "key_daily_limit")
    row = next(p for p in doc["pools"] if p["pool"] == P2)
    assert row["closedUntil"] == MIDNIGHT and row["closedWhy"] == "key_daily_limit"
    assert next(p for p in doc["pools"] if p["pool"] == Q1)["closedUntil"] == 0


# -- the cost guard, and plan / census with the day's money ------------------------------------------

FLOORED = {"reviews": {"floor": 0.5, "weight": 1, "priority": 1},
           "bugfix": {"floor": 0.2, "weight": 1, "priority": 3},
           "triage": {"floor": 0, "weight": 1, "priority": 5}}


def floored_policy(limit=100.0, **tunables):
    pol = policy(FLOORED, pools=(P1, P2, Q1), **{"seed_estimate": 10, **tunables})
    pol["providers"]["p"]["daily_limit_usd"] = limit
    return pol


def test_cost_guard_per_provider_a_lane_at_its_floor_share_borrows_nothing_more(redis_client):
    a = adm(redis_client, pol=floored_policy())
    spend(a, 20, lane="bugfix")                               # bugfix's floor share of p: 20 % of 100
    got = [ask(a, "bugfix", pool=P1, now=T0 + 1) for _ in range(3)]
    assert [d.reason for d in got] == ["within-floor", "within-floor", "cost-guard"]   # keeps its floor
    assert ask(a, "reviews", pool=P1, now=T0 + 1).admitted                              # others borrow
    assert all(ask(a, "bugfix", pool=Q1, now=T0 + 1).admitted for _ in range(4))       # q: no budget


def test_cost_guard_counts_the_lanes_rounds_in_flight(redis_client):
    a = adm(redis_client, pol=floored_policy())
    spend(a, 5, lane="reviews", pool=P1, priced=True)         # m@p's mean round cost: 5 USD
    got = [ask(a, "bugfix", pool=P1, now=T0 + 1) for _ in range(6)]
    # floor 2 within it, then borrowing while 0 spent + 5 x in flight < 20: 4 in flight, then stop
    assert [d.reason for d in got] == ["within-floor", "within-floor", "borrowed", "borrowed", "cost-guard",
                                       "cost-guard"]


@pytest.mark.parametrize("lane", ["triage", "bugfix", "reviews"])
def test_plan_and_the_census_bound_count_the_days_money_like_admit(redis_client, lane):
    a = adm(redis_client, pol=floored_policy(seed_estimate=40))
    spend(a, 5, lane="reviews", pool=P1, priced=True)         # ledger 5, m@p's mean round cost 5
    planned = a.plan(lane=lane, model=P1, wanted=100, now=T0 + 1)
    bound = next(l for l in a.ops.census(now=T0 + 1)["pools"][0]["lanes"] if l["lane"] == lane)["bound"] \
        if lane == "reviews" else planned
    admitted = 0
    while (d := ask(a, lane, pool=P1, now=T0 + 1)).admitted:
        admitted += 1
    assert planned == admitted > 0, (planned, admitted, d.reason)
    assert d.reason in ("budget-reserve", "budget-spent", "cost-guard")
    assert bound == planned


def test_plan_of_a_closed_provider_is_its_probe(redis_client):
    a = adm(redis_client, pol=floored_policy())
    a.release(ask(a, "triage", pool=P1).seat, outcome="key_daily_limit", now=T0)
    assert a.plan(lane="triage", model=P1, wanted=5, now=T0 + 1) == 0
    assert a.plan(lane="triage", model=P1, wanted=5, now=T0 + 10) == 1          # the probe
    assert a.plan(lane="triage", model=Q1, wanted=5, now=T0 + 10) == 5


def test_a_release_replayed_after_a_restart_lost_its_seat_books_its_cost_once(redis_client, tmp_path):
    from admission import Admission
    pol = day_policy()
    a = Admission(redis_client, mesh="t", pod="pod-a", background=False, outbox=tmp_path / "a.outbox")
    a.ops.apply_policy(pol, recovery_hold=False)
    with a.round(lane="bugfix", model=P1, round_id="lost") as r:
        redis_client.flushall()                    # a restart without persistence: seat, tombstone, policy
        r.cost_usd = 0.42
    assert len(a._pending) == 1                    # NoPolicy: kept in the outbox
    a.ops.apply_policy(pol, recovery_hold=False)
    assert a.flush() == 0 and a.flush() == 0       # UnknownSeat: the cost is booked by a charge, once
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert a.ops.ledger(today) == {"bugfix": {"p": 0.42}, "*": {"p": 0.42}}
    assert not a.charge(r.seat, cost_usd=0.42, key="release").booked   # any later replay counts nothing


def test_no_probe_while_our_own_count_says_the_days_budget_is_spent(redis_client):
    a = adm(redis_client, pol=day_policy(limit=100))
    spend(a, 100)
    assert ask(a, "express", pool=P1, now=T0 + 1).reason == "provider-closed"        # closes it
    assert ask(a, "express", pool=P1, now=T0 + 100).reason == "provider-closed"      # and no probe
    assert a.plan(lane="express", model=P1, wanted=3, now=T0 + 100) == 0
    # a reading of a topped-up key raises the limit: the probe goes, and a clean one reopens
    a.ops.report_budget(reading(limit_usd=500.0, spent_usd=100.0, at=T0 + 100), now=T0 + 100)
    pol = day_policy(limit=1000)
    a.ops.apply_policy(pol)
    probe = ask(a, "express", pool=P1, now=T0 + 200)
    assert probe.reason == "probe"
    a.release(probe.seat, outcome="clean", now=T0 + 201)
    assert ask(a, "express", pool=P1, now=T0 + 202).admitted


def test_a_round_starts_only_while_its_mean_cost_is_left(redis_client):
    a = adm(redis_client, pol=day_policy(limit=100))
    spend(a, 30, pool=P1, priced=True)                         # m@p's mean round cost: 30
    spend(a, 45, pool=P2, now=T0 + 1)                          # 75 spent: 25 left, less than 30
    assert ask(a, "express", pool=P1, now=T0 + 2).reason == "budget-spent"
    assert ask(a, "express", pool=Q1, now=T0 + 2).admitted
    assert a.plan(lane="express", model=P1, wanted=3, now=T0 + 2) == 0


def test_a_round_id_used_again_books_each_rounds_costs(redis_client):
    """The ledger's idempotency key carries the admission's seq: a later round with the same id
    (a worker that names its rounds by item, `use(round_id=...)`) books its release and charges
    too, while a replay of either round's records still counts once."""
    a = adm(redis_client, pol=day_policy())
    for i in range(3):
        d = a.try_admit(lane="reviews", model=P1, round_id="item-7", now=T0 + i, draw=0.0)
        assert d.admitted, d
        a.charge(d.seat, cost_usd=0.25, key="step-1", now=T0 + i)
        a.charge(d.seat, cost_usd=0.25, key="step-1", now=T0 + i)          # a replay: once
        a.release(d.seat, outcome="clean", seconds=1, cost_usd=1.0, now=T0 + i)
        a.release(d.seat, outcome="clean", seconds=1, cost_usd=1.0, now=T0 + i)  # retried: once
    assert a.ops.ledger(DAY)["reviews"]["p"] == pytest.approx(3 * 1.25)


def test_a_booking_from_before_the_seq_was_in_the_key_counts_once(redis_client):
    a = adm(redis_client, pol=day_policy())
    d = a.try_admit(lane="reviews", model=P1, round_id="old", now=T0, draw=0.0)
    redis_client.set("adm:{t}:charged:old:step", "250000")   # booked by the previous version
    a.charge(d.seat, cost_usd=0.25, key="step", now=T0)         # replayed from an outbox after the upgrade
    assert a.ops.ledger(DAY) == {}
