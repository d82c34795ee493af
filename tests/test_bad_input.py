"""Bad input gets a clear error (one exception type per kind) and leaves the Redis state
byte-for-byte unchanged (DESIGN §3 "validate first, then write", §10)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from admission import (Admission, BadArgument, BadName, NoPolicy, NotYourSeat, PolicyError, Status, UnknownLane,
                       UnknownPool, UnknownSeat)

from helpers import POOL, T0, Rounds, adm, policy, pool_state, snapshot


@pytest.fixture
def busy(redis_client):
    """A mesh with a policy, a seat, a waiter and some history."""
    a = adm(redis_client, pol=policy({"a": {"floor": 0, "weight": 1, "priority": 1}}))
    r = Rounds(a)
    seats = r.fill("a", 2)
    r.ask("a", round_id="waiter", wait=True)
    a.release(seats[0], outcome="clean", seconds=1, cost_usd=0.01, now=T0 + 1)
    return a, seats[1]


def unchanged(client, fn, exc):
    before = snapshot(client)
    with pytest.raises(exc) as info:
        fn()
    assert snapshot(client) == before
    return str(info.value)


ADMIT_CASES = [
    ("unknown lane", dict(lane="nope"), UnknownLane, "lane nope is not in the policy"),
    ("pool not in the catalog", dict(model="x@p"), UnknownPool, "not in the catalog"),
    ("round id with braces", dict(round_id="a{b}"), BadName, "round id"),
    ("round id with a space", dict(round_id="a b"), BadName, "round id"),
    ("round id with a control character", dict(round_id="a\x07b"), BadName, "round id"),
    ("round id with a pipe", dict(round_id="a|b"), BadName, "round id"),
    ("empty round id", dict(round_id=""), BadName, "round id is empty"),
    ("agent with braces", dict(agent="{x}"), BadName, "agent"),
    ("lane with a space", dict(lane="re views"), BadName, "lane"),
    ("negative now", dict(now=-1.0), BadArgument, "now"),
    ("NaN now", dict(now=math.nan), BadArgument, "now"),
    ("draw of one", dict(draw=1.0), BadArgument, "draw"),
    ("negative draw", dict(draw=-0.1), BadArgument, "draw"),
]


@pytest.mark.parametrize("case, override, exc, message", ADMIT_CASES, ids=[c[0] for c in ADMIT_CASES])
def test_bad_admit_is_refused_and_changes_nothing(redis_client, busy, case, override, exc, message):
    a, _ = busy
    kwargs = dict(lane="a", model=POOL, round_id="fresh", now=T0 + 2, draw=0.5, wait=True) | override
    assert message in unchanged(redis_client, lambda: a.try_admit(**kwargs), exc)


RELEASE_CASES = [
    ("negative seconds", dict(seconds=-1.0), BadArgument),
    ("NaN seconds", dict(seconds=math.nan), BadArgument),
    ("infinite seconds", dict(seconds=math.inf), BadArgument),
    ("negative cost", dict(cost_usd=-0.01), BadArgument),
    ("NaN cost", dict(cost_usd=math.nan), BadArgument),
    ("unknown outcome", dict(outcome="meh"), BadArgument),
]


@pytest.mark.parametrize("case, override, exc", RELEASE_CASES, ids=[c[0] for c in RELEASE_CASES])
def test_bad_release_is_refused_and_changes_nothing(redis_client, busy, case, override, exc):
    a, seat = busy
    kwargs = dict(outcome="clean", seconds=1.0, cost_usd=0.01, now=T0 + 2) | override
    unchanged(redis_client, lambda: a.release(seat, **kwargs), exc)


def test_release_a_duration_past_round_cap_is_bounded_not_refused(redis_client, busy):
    """No round runs past round_cap (it is cut there): a longer duration (a client's bad clock) is
    counted as round_cap, and the round still ends (a refusal would hold its seat until its lease
    ran out). The client sends it as it is; the script bounds it (release.lua)."""
    a, seat = busy
    out = a.release(seat, outcome="clean", seconds=1.8e9, now=T0 + 2)
    assert out.status == Status.RELEASED and redis_client.zcard("adm:{t}:seats") == 0
    assert float(pool_state(redis_client)["meanSec"]) == 1 + 0.1 * (1800 - 1)   # 1 s, then 1,800 s


def test_release_of_a_seat_that_is_not_yours_changes_nothing(redis_client, busy):
    a, seat = busy
    other = Admission(redis_client, mesh="t", pod="pod-b", background=False)
    msg = unchanged(redis_client, lambda: other.release(seat, outcome="clean", now=T0 + 2), NotYourSeat)
    assert "held by pod pod-a" in msg
    stale = dataclasses.replace(seat, seq=seat.seq + 100)       # another admission of the same id
    unchanged(redis_client, lambda: a.release(stale, outcome="clean", now=T0 + 2), NotYourSeat)


def test_release_of_an_unknown_seat_changes_nothing(redis_client, busy):
    a, seat = busy
    ghost = dataclasses.replace(seat, id="never-admitted")
    unchanged(redis_client, lambda: a.release(ghost, outcome="clean", now=T0 + 2), UnknownSeat)


def test_report_with_a_bad_signal_or_foreign_seat_changes_nothing(redis_client, busy):
    a, seat = busy
    unchanged(redis_client, lambda: a.report(seat, signal="clean", now=T0 + 2), BadArgument)
    other = Admission(redis_client, mesh="t", pod="pod-b", background=False)
    unchanged(redis_client, lambda: other.report(seat, signal="stall", now=T0 + 2), NotYourSeat)


def test_bad_plan_changes_nothing(redis_client, busy):
    a, _ = busy
    unchanged(redis_client, lambda: a.plan(lane="a", model=POOL, wanted=-1), BadArgument)
    unchanged(redis_client, lambda: a.plan(lane="zz", model=POOL, wanted=1), UnknownLane)
    unchanged(redis_client, lambda: a.plan(lane="a", model="q@p", wanted=1), UnknownPool)


@pytest.mark.parametrize("mutate, message", [
    (lambda p: p["lanes"]["a"].update(floor=1.5), "floor"),
    (lambda p: p["lanes"]["a"].update(weight=0), "weight"),
    (lambda p: p["lanes"].update(b={"floor": 0.9, "weight": 1, "priority": 1}) or p["lanes"]["a"].update(floor=0.5), "sum"),
    (lambda p: p["tunables"].update(grow_interval=-1), "grow_interval"),
    (lambda p: p["tunables"].update(probe_after=2.5), "probe_after"),
    (lambda p: p["tunables"].update(grow_intervall=15), "unknown key"),
    (lambda p: p.update(maxConcurrentAgents=10), "retired"),
    (lambda p: p["lanes"]["a"].update(max_concurrency=3), "retired"),
    (lambda p: p["pools"].update({"nopool": {}}), "model@provider"),
    (lambda p: p["pools"].update({"m@undeclared": {}}), "not declared"),
    (lambda p: p["providers"]["p"].update(route="mars"), "route"),
], ids=["floor>1", "weight0", "floors-sum", "negative-tunable", "fractional-int", "typo", "maxConcurrentAgents",
        "lane-cap", "pool-name", "undeclared-provider", "bad-route"])
def test_malformed_policy_is_refused_and_changes_nothing(redis_client, busy, mutate, message):
    a, _ = busy
    pol = policy({"a": {"floor": 0, "weight": 1, "priority": 1}})
    mutate(pol)
    with pytest.warns(UserWarning) if message == "retired" else _null():
        msg = unchanged(redis_client, lambda: a.ops.apply_policy(pol), PolicyError)
    assert message in msg


def test_policy_with_a_key_breaking_lane_name_changes_nothing(redis_client, busy):
    a, _ = busy
    pol = policy({"a{x}": {"floor": 0, "weight": 1, "priority": 1}})
    unchanged(redis_client, lambda: a.ops.apply_policy(pol), BadName)


def test_no_policy_yet_is_a_clear_error(redis_client):
    a = adm(redis_client, apply=False)
    msg = unchanged(redis_client, lambda: a.try_admit(lane="a", model=POOL, round_id="r", now=T0), NoPolicy)
    assert "admission config apply" in msg


def test_bad_mesh_name_is_refused_before_any_call(redis_client):
    with pytest.raises(BadName):
        Admission(redis_client, mesh="a}b", pod="p", background=False)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
