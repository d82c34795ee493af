"""The provider's Retry-After (docs/design.md §6 "Retry-After"): a rate limit that says when to
come back pauses new admissions on its pool until then, for every pod, bounded by the tunable
``retry_after_max``. One test per rule, named after it; each runs on fakeredis, Redis 7 and
Valkey 8."""
from __future__ import annotations

import dataclasses
import math

import pytest

from admission import Admission, BadArgument
from admission.base import PAUSE_MARGIN, release_record
from admission.core import Decision
from admission.view import render_census

from helpers import T0, adm, policy, pool_state, snapshot

P, Q = "m@p", "n@p"  # two pools of one provider
LANES = {"a": {"floor": 0, "weight": 1, "priority": 2}, "b": {"floor": 0, "weight": 1, "priority": 1}}


def pause_policy(**tunables):
    return policy(LANES, pools=(P, Q), **{"seed_estimate": 4, **tunables})


class Ask:
    def __init__(self, a):
        self.a, self.n = a, 0

    def __call__(self, now, pool=P, lane="a", rid=None, **kw):
        self.n += 1
        return self.a.try_admit(lane=lane, model=pool, round_id=rid or f"r{self.n}", now=now, draw=0.0, **kw)


def limited(a, ask, retry_after, now=T0, pool=P, outcome="rate_limited"):
    """A round that ends with a 429 carrying ``retry_after``."""
    d = ask(now, pool=pool)
    assert d.admitted, d
    a.release(d.seat, outcome=outcome, seconds=1, now=now, retry_after=retry_after)


def totals(client, mesh="t"):
    return {k.decode(): int(v) for k, v in client.hgetall(f"adm:{{{mesh}}}:totals").items()}


def test_retry_after_pauses_the_pool_for_every_pod(redis_client):
    a = adm(redis_client, pol=pause_policy())
    b = Admission(redis_client, mesh="t", pod="pod-b", background=False)
    ask_a, ask_b = Ask(a), Ask(b)
    limited(a, ask_a, retry_after=5)
    d = ask_b(T0 + 1)                                    # another pod, within the pause
    assert not d.admitted and d.reason == "paused" and d.paused_for == pytest.approx(4)
    assert not ask_a(T0 + 4.9).admitted
    assert ask_b(T0 + 5).admitted                          # the pause has ended


def test_a_pause_is_the_pools_alone(redis_client):
    a = adm(redis_client, pol=pause_policy())
    ask = Ask(a)
    limited(a, ask, retry_after=30)
    assert ask(T0 + 1, pool=P).reason == "paused"
    assert ask(T0 + 1, pool=Q).admitted                    # the provider's other pool runs on


def test_retry_after_is_bounded_by_retry_after_max(redis_client):
    a = adm(redis_client, pol=pause_policy(retry_after_max=60))
    ask = Ask(a)
    limited(a, ask, retry_after=3600)
    assert float(pool_state(redis_client, P)["pausedUntil"]) == T0 + 60
    assert ask(T0 + 59, lane="b").reason == "paused"
    assert ask(T0 + 60, lane="b").admitted


def test_retry_after_max_zero_ignores_retry_after(redis_client):
    a = adm(redis_client, pol=pause_policy(retry_after_max=0))
    ask = Ask(a)
    limited(a, ask, retry_after=30)
    assert "pausedUntil" not in pool_state(redis_client, P)
    assert ask(T0 + 1).admitted


def test_only_a_rate_limit_pauses(redis_client):
    a = adm(redis_client, pol=pause_policy())
    ask = Ask(a)
    for outcome in ("error", "stall", "round_cap", "clean"):
        limited(a, ask, retry_after=30, outcome=outcome)   # a 503 with Retry-After is an error
    assert "pausedUntil" not in pool_state(redis_client, P)
    assert ask(T0 + 1).admitted


def test_a_later_retry_after_extends_a_pause_and_an_earlier_one_does_not(redis_client):
    a = adm(redis_client, pol=pause_policy())
    ask = Ask(a)
    seats = [ask(T0).seat for _ in range(3)]               # three rounds running
    a.release(seats[0], outcome="rate_limited", seconds=1, now=T0, retry_after=20)
    assert float(pool_state(redis_client, P)["pausedUntil"]) == T0 + 20
    a.release(seats[1], outcome="rate_limited", seconds=1, now=T0 + 2, retry_after=1)
    assert float(pool_state(redis_client, P)["pausedUntil"]) == T0 + 20   # not shortened
    a.release(seats[2], outcome="rate_limited", seconds=1, now=T0 + 5, retry_after=30)
    assert float(pool_state(redis_client, P)["pausedUntil"]) == T0 + 35   # extended
    assert totals(redis_client)["paused|" + P] == 2


def test_a_report_mid_round_pauses_also_after_an_earlier_report(redis_client):
    a = adm(redis_client, pol=pause_policy())
    ask = Ask(a)
    seat = ask(T0).seat
    a.report(seat, signal="rate_limited", now=T0, retry_after=10)
    assert ask(T0 + 1).reason == "paused"
    a.report(seat, signal="rate_limited", now=T0 + 2, retry_after=30)  # the one load signal was spent
    assert float(pool_state(redis_client, P)["pausedUntil"]) == T0 + 32
    a.report(seat, signal="stall", now=T0 + 3, retry_after=300)          # only a rate limit pauses
    assert float(pool_state(redis_client, P)["pausedUntil"]) == T0 + 32


def test_a_delegated_round_passes_a_pause(redis_client):
    a = adm(redis_client, pol=pause_policy())
    ask = Ask(a)
    parent = ask(T0, rid="parent")
    limited(a, ask, retry_after=30)
    assert ask(T0 + 1).reason == "paused"
    d = ask(T0 + 1, rid="parent/1", parent="parent")
    assert d.admitted and d.reason == "delegated"
    assert parent.admitted


def test_a_paused_pool_moves_a_round_to_an_alternative(redis_client):
    pol = pause_policy()
    pol["tiers"] = {}
    pol["alternatives"] = {P: [Q]}
    a = adm(redis_client, pol=pol)
    ask = Ask(a)
    limited(a, ask, retry_after=30)
    d = a.try_admit(lane="a", model=P, round_id="mover", now=T0 + 1, draw=0.0, alternatives=[Q])
    assert d.admitted and d.pool == Q and d.moved_from == P


def test_a_closed_provider_sends_no_probe_into_a_pause(redis_client):
    a = adm(redis_client, pol=pause_policy(probe_every=1))
    ask = Ask(a)
    limited(a, ask, retry_after=30)
    a.release(ask(T0, pool=Q).seat, outcome="key_rejected", seconds=1, now=T0)  # closes provider p
    assert ask(T0 + 5, pool=P).reason == "provider-closed"    # no probe while P is paused
    assert ask(T0 + 5, pool=Q).reason == "probe"              # Q is not paused: its probe goes


def test_the_census_shows_the_pause_and_counts_it(redis_client):
    a = adm(redis_client, pol=pause_policy())
    ask = Ask(a)
    limited(a, ask, retry_after=12)
    census = a.ops.census(now=T0 + 2)
    row = next(p for p in census["pools"] if p["pool"] == P)
    assert row["pausedUntil"] == T0 + 12
    assert "PAUSED 10s" in render_census(census)
    assert next(p for p in a.ops.census(now=T0 + 12)["pools"] if p["pool"] == P)["pausedUntil"] == 0
    assert totals(redis_client)["paused|" + P] == 1
    events = [{k.decode(): v.decode() for k, v in f.items()} for _, f in redis_client.xrange("adm:{t}:events")]
    paused = [e for e in events if e["kind"] == "paused"]
    assert paused and paused[0]["pool"] == P and float(paused[0]["seconds"]) == 12
    refused = {k: v for k, v in totals(redis_client).items() if k.startswith("refused|")}
    assert not refused
    ask(T0 + 1)
    assert totals(redis_client)[f"refused|{P}|a|paused"] == 1


def test_a_waiter_refused_by_a_pause_asks_again_when_it_ends(redis_client):
    a = adm(redis_client, pol=pause_policy(grow_interval=600))
    ask = Ask(a)
    limited(a, ask, retry_after=7)
    d = ask(T0 + 2)
    assert a._retry_after(d) == pytest.approx(5 + PAUSE_MARGIN)       # not the pool clock (600 s)
    other = dataclasses.replace(d, reason="fair-share", paused_for=0.0)
    assert a._retry_after(other) == 600


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf, True, "5"])
def test_a_bad_retry_after_is_refused_and_changes_nothing(redis_client, bad):
    a = adm(redis_client, pol=pause_policy())
    seat = Ask(a)(T0).seat
    before = snapshot(redis_client)
    with pytest.raises(BadArgument, match="retry_after"):
        a.release(seat, outcome="rate_limited", seconds=1, now=T0, retry_after=bad)
    with pytest.raises(BadArgument, match="retry_after"):
        a.report(seat, signal="rate_limited", now=T0, retry_after=bad)
    assert snapshot(redis_client) == before


@pytest.mark.parametrize("script, index", [("release", 8), ("report", 5)])
def test_a_bad_retry_after_is_refused_by_the_script_too(redis_client, script, index):
    a = adm(redis_client, pol=pause_policy())
    seat = Ask(a)(T0).seat
    call = (a.core.release(seat, outcome="rate_limited", seconds=1, now=T0) if script == "release"
            else a.core.report(seat, signal="rate_limited", now=T0))
    before = snapshot(redis_client)
    for raw in ("soon", "-3", "inf"):
        args = list(call.args)
        args[index] = raw
        with pytest.raises(BadArgument, match="retry after"):
            a._exec_or_raise(dataclasses.replace(call, args=args))
    assert snapshot(redis_client) == before


def test_round_reads_retry_after_from_the_error_it_ends_with(redis_client):
    pol = pause_policy()
    del pol["clock"]  # round() runs on the server's clock
    a = adm(redis_client, pol=pol)

    class RateLimited(Exception):
        status_code = 429
        headers = {"retry-after": "9"}

    with pytest.raises(RateLimited):
        with a.round(lane="a", model=P, round_id="r-429", timeout=1):
            raise RateLimited("slow down")
    until = float(pool_state(redis_client, P)["pausedUntil"])
    assert until > 0
    d = a.try_admit(lane="a", model=P, round_id="next", draw=0.0)
    assert d.reason == "paused" and 8 < d.paused_for <= 9


def test_a_replayed_release_pauses_only_for_what_is_left(redis_client):
    a = adm(redis_client, pol=pause_policy())
    seat = Ask(a)(T0).seat
    import time
    old = release_record(seat, "rate_limited", 1.0, None, at=time.time() - 100, retry_after=30)
    call, _ = a._calls(old, a.core)
    assert call.args[8] == ""                                # the pause has passed: none
    fresh = release_record(seat, "rate_limited", 1.0, None, at=time.time() - 10, retry_after=30)
    call, _ = a._calls(fresh, a.core)
    assert 19 < float(call.args[8]) <= 20
    legacy = {k: v for k, v in old.items() if k != "retry_after"}  # an outbox record of an older version
    call, _ = a._calls(legacy, a.core)
    assert call.args[8] == ""


def test_a_decision_without_a_pause_field_decodes(redis_client):
    assert Decision(False, "fair-share", "r", "a", P).paused_for == 0.0
