"""A round of several calls takes one request and its tokens per call (docs/design.md §5.9,
lua/take.lua): the admit reserves the first call, each later call takes its own before it is
sent, all buckets or none, once per call key; a refused call waits with its seat; the release
reconciles every call at once and the mean is learned per call. On fakeredis, Redis 7 and
Valkey 8 with clock = "caller", so time is exact."""
from __future__ import annotations

import time

import pytest
import redis as redis_mod

from admission import BadArgument, Status, Taken, Unavailable, Usage, WaitTimeout
from admission.codes import UNAVAILABLE
from admission.scripts import function_name

from helpers import T0, adm, snapshot
from test_rules_ceilings import P, Q, Ask, ceil_policy, level, scope_state


def test_each_later_call_of_a_round_takes_its_own_request_and_tokens(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpd": 100, "tpd": 10000}))
    d = Ask(a)(T0, input_tokens=1000, max_tokens=500)              # the admit: the first call
    assert level(redis_client, "rpd") == 99 and level(redis_client, "tpd") == 8500
    t = a.take(d.seat, key="call-2", input_tokens=2000, max_tokens=500, now=T0)
    assert t.taken and not t.already and t.reason == ""
    assert level(redis_client, "rpd") == 98 and level(redis_client, "tpd") == 6000
    seat = {k.decode(): v.decode() for k, v in redis_client.hgetall(f"adm:{{t}}:seat:{d.seat.id}").items()}
    assert (float(seat["cIn"]), float(seat["cOut"]), float(seat["cBudget"]), seat["cCalls"]) == (3000, 1000, 1000, "2")


def test_a_take_is_every_bucket_or_none(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 60, "tpd": 10000}))   # one request a second, one held
    d = Ask(a)(T0, input_tokens=100, max_tokens=0)
    before = level(redis_client, "tpd")
    t = a.take(d.seat, key="call-2", input_tokens=100, max_tokens=0, now=T0)
    assert not t.taken and t.reason == "ceiling-rpm" and t.wait_s == pytest.approx(1)
    assert level(redis_client, "tpd") == before                     # the token bucket was not debited
    assert a.take(d.seat, key="call-2", input_tokens=100, max_tokens=0, now=T0 + 1).taken
    assert level(redis_client, "tpd") == before - 100


def test_a_take_retried_takes_once(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000}))
    d = Ask(a)(T0, input_tokens=100, max_tokens=0)
    assert a.take(d.seat, key="call-2", input_tokens=100, max_tokens=0, now=T0).taken
    state = snapshot(redis_client)
    again = a.take(d.seat, key="call-2", input_tokens=100, max_tokens=0, now=T0)   # a lost reply's retry
    assert again.taken and again.already
    assert snapshot(redis_client) == state


def test_the_release_reconciles_every_call_at_once(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000, "output_charge": "received"}))
    d = Ask(a)(T0, input_tokens=1000, max_tokens=500)
    a.take(d.seat, key="call-2", input_tokens=1000, max_tokens=500, now=T0)
    assert level(redis_client, "tpd") == 7000
    a.release(d.seat, now=T0, usage=Usage(input_tokens=1200, output_tokens=300))   # both calls' usage
    assert level(redis_client, "tpd") == 10000 - 1500


def test_the_mean_is_learned_per_call(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpd": 100000}))
    d = Ask(a)(T0)                                                 # nothing declared, nothing learned
    a.take(d.seat, key="call-2", now=T0)
    a.release(d.seat, now=T0, usage=Usage(input_tokens=2000, output_tokens=400))
    state = scope_state(redis_client)
    assert float(state["meanIn"]) == 1000 and float(state["meanOut"]) == 200
    d = Ask(a)(T0 + 1)
    assert a.take(d.seat, key="call-2", now=T0 + 1).taken            # each call reserves the mean
    assert level(redis_client, "tpd") == 100000 - 2400 - 2 * 1200


def test_a_take_on_a_lost_seat_writes_nothing(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000}))
    d = Ask(a)(T0, input_tokens=100, max_tokens=0)
    a.release(d.seat, now=T0)
    state = snapshot(redis_client)
    t = a.take(d.seat, key="call-2", input_tokens=100, max_tokens=0, now=T0)
    assert t.lost and not t.taken
    assert snapshot(redis_client) == state


def test_a_pool_without_ceilings_takes_nothing(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000}))
    d = Ask(a)(T0, pool=Q)                                         # Q has no scope
    t = a.take(d.seat, key="call-2", input_tokens=100, max_tokens=0, now=T0)
    assert t.taken and not redis_client.exists("adm:{t}:ceil:n@q")


def test_a_bad_take_is_refused_and_changes_nothing(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000}))
    d = Ask(a)(T0, input_tokens=100, max_tokens=0)
    state = snapshot(redis_client)
    for bad in (-1, float("nan"), float("inf"), 2e9, "12", True):
        with pytest.raises(BadArgument):
            a.take(d.seat, key="call-2", input_tokens=bad, now=T0)
    name = function_name("take")
    for argv in ([d.seat.id, str(d.seat.seq), "pod-a", "call-2", "-5", "", repr(T0)],
                 [d.seat.id, str(d.seat.seq), "pod-a", "call-2", "", "nan", repr(T0)],
                 [d.seat.id, str(d.seat.seq), "pod-a", "a key", "", "", repr(T0)],
                 [d.seat.id, "x", "pod-a", "call-2", "", "", repr(T0)]):
        with pytest.raises(redis_mod.ResponseError, match="^ADM_BAD_(ARG|NAME)"):
            redis_client.fcall(name, 1, "adm:{t}:config", *argv)
    assert snapshot(redis_client) == state


def test_a_round_reserves_each_call_and_a_refused_call_waits_with_its_seat(redis_client):
    pol = ceil_policy({"rpm": 600, "burst_s": 0.1, "tpd": 10000})   # ten a second, one held
    pol["clock"] = "server"
    a = adm(redis_client, pol=pol)
    with a.round(lane="a", model=P, round_id="w1", input_tokens=100, max_tokens=0) as r:
        assert r.reserve_call(input_tokens=100, max_tokens=0).taken    # the first: the admit's own
        assert level(redis_client, "tpd") == 9900
        started = time.monotonic()
        t = r.reserve_call(input_tokens=200, max_tokens=0)              # waits ~0.1 s for the rpm bucket
        assert t.taken and time.monotonic() - started >= 0.05
        assert level(redis_client, "tpd") == 9700
        assert redis_client.exists(f"adm:{{t}}:seat:{r.seat.id}")       # the seat was kept throughout
        with pytest.raises(WaitTimeout):
            r.reserve_call(input_tokens=20000, max_tokens=0, timeout=0.05)  # a call larger than the day
        r.usage = Usage(input_tokens=300)


def test_a_call_goes_ahead_when_redis_cannot_be_reached(redis_client, monkeypatch):
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000}))
    d = Ask(a)(T0, input_tokens=100, max_tokens=0)

    def down(*args, **kw):
        raise Unavailable("admission unavailable: connection refused")

    from admission.client import Round
    r = Round(a, d)
    r.reserve_call()
    monkeypatch.setattr(a, "take", down)
    t = r.reserve_call(input_tokens=100)
    assert t == Taken(True, reason=UNAVAILABLE)


def test_the_asyncio_round_reserves_each_call(async_client_factory):
    import asyncio

    from admission import AsyncAdmission

    async def main():
        client = async_client_factory()
        a = AsyncAdmission(client, mesh="t", pod="pod-a", background=False)
        await a.ops.apply_policy(ceil_policy({"tpd": 10000}), recovery_hold=False)
        d = await a.try_admit(lane="a", model=P, round_id="x1", draw=0.0, alternatives=[],
                              input_tokens=1000, max_tokens=0)   # the real clock, as reserve_call's
        from admission.aio import AsyncRound
        r = AsyncRound(a, d)
        assert (await r.reserve_call()).taken
        assert (await r.reserve_call(input_tokens=500, max_tokens=0)).taken
        assert float(await client.hget("adm:{t}:ceil:key", "tpd")) == 8500
        t = await a.take(d.seat, key="call-2", input_tokens=500, max_tokens=0)
        assert t.already and t.taken
        assert (await a.take(d.seat, key="call-3", input_tokens=9000, max_tokens=0)).reason == "ceiling-tpd"
    asyncio.run(main())
