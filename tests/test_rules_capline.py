"""Design §4 "The cap line": a round that declares its size is planned to end before its cap,
from the seconds per token the pool measures at each load. One test per rule, named after it."""
from __future__ import annotations

import math

import pytest

from admission import BadArgument
from admission.view import render_census

from helpers import POOL, T0, Rounds, adm, policy, pool_state, snapshot

CAP = 1800.0  # round_cap's default
SHARE = 0.95  # capline.lua CAP_SHARE
A, B = 0.01, 0.002  # the "provider" of these tests: seconds per token = A + B * rounds in flight


def lanes():
    return {"a": {"floor": 1.0, "weight": 1, "priority": 1}}


def seconds_for(tokens: float, load: int) -> float:
    return tokens * (A + B * load)


def fitted(client):
    """The pool's fit (a, b) as capline.lua computes it from its sums."""
    p = {k: float(v) for k, v in pool_state(client).items() if k.startswith("fit")}
    d = p["fitW"] * p["fitXX"] - p["fitX"] ** 2
    b = (p["fitW"] * p["fitXY"] - p["fitX"] * p["fitY"]) / d
    return (p["fitY"] - b * p["fitX"]) / p["fitW"], b


def train(a, loads=(2, 4, 6), tokens=10_000.0, t=T0):
    """One declared round measured at each load: the other rounds held while it runs, all released
    before the next; returns the time after the last release."""
    n = 0
    for load in loads:
        others = [a.try_admit(lane="a", model=POOL, round_id=f"o{load}-{i}", now=t, draw=0.0).seat
                  for i in range(load - 1)]
        n += 1
        d = a.try_admit(lane="a", model=POOL, round_id=f"m{n}", now=t, draw=0.0, tokens=tokens)
        assert d.admitted, d
        took = seconds_for(tokens, load)
        t += took
        a.release(d.seat, outcome="clean", seconds=took, now=t)
        for s in others:
            a.release(s, outcome="clean", seconds=took, now=t)
        t += 1
    return t


def trained(client, **tunables):
    a = adm(client, pol=policy(lanes(), seed_estimate=100, **tunables))
    return a, train(a)


def test_cap_line_fits_seconds_per_token_against_the_load_of_clean_declared_rounds(redis_client):
    a, t = trained(redis_client)
    got_a, got_b = fitted(redis_client)
    assert got_a == pytest.approx(A, rel=1e-6) and got_b == pytest.approx(B, rel=1e-6)
    st = pool_state(redis_client)
    assert float(st["fitN"]) == 3 and float(st["fitLo"]) == pytest.approx(2) and float(st["fitHi"]) == pytest.approx(6)
    # a round that did not end clean, or declared no size, is no point of the fit
    before = float(st["fitN"])
    d = a.try_admit(lane="a", model=POOL, round_id="cut", now=t, draw=0.0, tokens=5_000)
    a.release(d.seat, outcome="round_cap", seconds=CAP, now=t + CAP)
    d = a.try_admit(lane="a", model=POOL, round_id="plain", now=t + CAP, draw=0.0)
    a.release(d.seat, outcome="clean", seconds=10, now=t + CAP + 10)
    assert float(pool_state(redis_client)["fitN"]) == before


def test_cap_line_keeps_out_a_round_that_would_not_end_before_its_cap(redis_client):
    a, t = trained(redis_client)
    held = [a.try_admit(lane="a", model=POOL, round_id=f"h{i}", now=t, draw=0.0).seat for i in range(9)]
    assert all(held)
    # at 10 rounds in flight a round gets 1 / (A + 10 B) = 33.3 tokens/s: 57,000 tokens by 95 % of the cap
    line = SHARE * CAP / (A + B * 10)
    refused = a.try_admit(lane="a", model=POOL, round_id="big", now=t, draw=0.0, tokens=line * 1.02)
    assert not refused.admitted and refused.reason == "cap-line"
    assert a.try_admit(lane="a", model=POOL, round_id="fits", now=t, draw=0.0, tokens=line * 0.98).admitted
    # a round that declares no size is not kept out by its size
    assert a.try_admit(lane="a", model=POOL, round_id="unsized", now=t, draw=0.0).admitted


def test_cap_line_a_round_alone_on_its_pool_always_starts(redis_client):
    a, t = trained(redis_client)
    d = a.try_admit(lane="a", model=POOL, round_id="huge", now=t, draw=0.0, tokens=1e9)
    assert d.admitted and d.reason != "cap-line"


def test_cap_line_ceiling_holds_the_pool_under_the_line_of_its_running_rounds(redis_client):
    a, t = trained(redis_client)
    tokens = 50_000.0
    big = a.try_admit(lane="a", model=POOL, round_id="big", now=t, draw=0.0, tokens=tokens)
    assert big.admitted
    # it needs tokens / (95 % of the cap) per second: at most (1 / need - A) / B rounds in flight
    need = tokens / (SHARE * CAP)
    line = (1 / need - A) / B
    a.tick(now=t)
    assert float(pool_state(redis_client)["ceiling"]) == pytest.approx(line, rel=1e-6)
    room = math.floor(line) - 1
    assert a.plan(lane="a", model=POOL, wanted=100, now=t) == room  # plan and allowance count it
    seats = [a.try_admit(lane="a", model=POOL, round_id=f"s{i}", now=t, draw=0.0) for i in range(room)]
    assert all(d.admitted for d in seats)
    over = a.try_admit(lane="a", model=POOL, round_id="over", now=t, draw=0.0)
    assert not over.admitted and over.reason == "cap-line"  # within its floor, still kept out
    census = a.census(now=t)
    assert census["pools"][0]["capLine"] == pytest.approx(line, rel=1e-6)
    assert f"cap line at {line:.1f} rounds" in render_census(census)  # what an operator reads


def test_cap_line_operators_read_it_in_the_metrics(redis_client):
    from test_serve import get, samples, serving, value

    a, t = trained(redis_client)
    assert a.try_admit(lane="a", model=POOL, round_id="big", now=t, draw=0.0, tokens=50_000).admitted
    a.tick(now=t)
    line = float(pool_state(redis_client)["ceiling"])
    refused = [a.try_admit(lane="a", model=POOL, round_id=f"s{i}", now=t, draw=0.0) for i in range(int(line) + 1)]
    assert refused[-1].reason == "cap-line"
    with serving(redis_client) as (base, _srv):
        found = samples(get(base + "/metrics")[2])
    pool = {"mesh": "t", "pool": POOL, "provider": "p"}
    assert value(found, "admission_pool_cap_line", **pool) == pytest.approx(line)
    kept_out = sum(d.reason == "cap-line" for d in refused)
    assert kept_out == 2  # one round running, floor(line) - 1 more started, the last two kept out
    assert value(found, "admission_refused_total", mesh="t", pool=POOL, lane="a", reason="cap-line") == kept_out


def test_cap_line_a_round_behind_lowers_the_ceiling_and_one_past_its_share_of_the_cap_frees_it(redis_client):
    a, t = trained(redis_client)
    tokens = 50_000.0
    big = a.try_admit(lane="a", model=POOL, round_id="big", now=t, draw=0.0, tokens=tokens)
    crowd = [a.try_admit(lane="a", model=POOL, round_id=f"c{i}", now=t, draw=0.0).seat for i in range(29)]
    assert big.admitted and all(crowd)
    a.tick(now=t)
    at_start = float(pool_state(redis_client)["ceiling"])
    # 600 s at 30 rounds in flight: it received 600 / (A + 30 B) tokens, less than it needed by now
    a.tick(now=t + 600)
    got = 600 / (A + B * 30)
    need = (tokens - got) / (SHARE * CAP - 600)
    assert float(pool_state(redis_client)["ceiling"]) == pytest.approx((1 / need - A) / B, rel=1e-6)
    assert float(pool_state(redis_client)["ceiling"]) < at_start
    a.tick(now=t + SHARE * CAP + 1)
    assert float(pool_state(redis_client)["ceiling"]) == 0  # no line: it ends or is cut either way


def test_cap_line_no_declared_round_running_no_line(redis_client):
    a, t = trained(redis_client)
    big = a.try_admit(lane="a", model=POOL, round_id="big", now=t, draw=0.0, tokens=50_000)
    a.tick(now=t)
    line = math.floor(float(pool_state(redis_client)["ceiling"]))
    seats = [a.try_admit(lane="a", model=POOL, round_id=f"s{i}", now=t, draw=0.0) for i in range(line - 1)]
    assert all(d.admitted for d in seats)
    assert a.try_admit(lane="a", model=POOL, round_id="over", now=t, draw=0.0).reason == "cap-line"
    a.release(big.seat, outcome="clean", seconds=10, now=t + 10)
    # the ceiling is the tick's, but with no declared round running it binds nothing, even before the next tick
    assert float(pool_state(redis_client)["ceiling"]) > 0
    assert a.plan(lane="a", model=POOL, wanted=5, now=t + 10) == 5  # plan agrees with admit
    assert a.try_admit(lane="a", model=POOL, round_id="over", now=t + 10, draw=0.0).admitted
    assert a.try_admit(lane="a", model=POOL, round_id="past", now=t + 10, draw=0.0).admitted  # past the old line
    a.tick(now=t + 20)
    assert float(pool_state(redis_client)["ceiling"]) == 0 and float(pool_state(redis_client)["sized"]) == 0


def test_cap_line_sized_rounds_are_indexed_while_they_run(redis_client):
    a, t = trained(redis_client)
    key = "adm:{t}:sized:" + POOL
    d = a.try_admit(lane="a", model=POOL, round_id="x", now=t, draw=0.0, tokens=7_000)
    lapsed = a.try_admit(lane="a", model=POOL, round_id="y", now=t, draw=0.0, tokens=8_000)
    assert redis_client.zrange(key, 0, -1, withscores=True) == [(b"x", 7000.0), (b"y", 8000.0)]
    a.release(d.seat, outcome="clean", seconds=5, now=t + 5)
    a.tick(now=t + 10_000)  # y's lease ran out: the sweep drops it
    assert redis_client.zcard(key) == 0 and lapsed.admitted


@pytest.mark.parametrize("bad", [0, -1, 0.5, math.nan, math.inf, 2e9, True, "100"])
def test_cap_line_a_bad_size_is_refused_before_any_write(redis_client, bad):
    a, t = trained(redis_client)
    before = snapshot(redis_client)
    with pytest.raises(BadArgument):
        a.try_admit(lane="a", model=POOL, round_id="bad", now=t, draw=0.0, tokens=bad)
    assert snapshot(redis_client) == before


@pytest.mark.parametrize("raw", ["0", "-5", "abc", "nan", "inf", "1e10"])
def test_cap_line_the_script_refuses_a_bad_size_and_writes_nothing(redis_client, raw):
    from admission import scripts

    a, t = trained(redis_client)
    before = snapshot(redis_client)
    call = a.core.admit(lane="a", model=POOL, round_id="bad", now=t, draw=0.0)
    call.args[11] = raw
    with pytest.raises(Exception, match="ADM_BAD_ARG"):
        scripts.call(redis_client, call.script, call.keys, call.args)
    assert snapshot(redis_client) == before


def test_cap_line_round_declares_its_size_sync_and_async(redis_client, async_client_factory):
    import asyncio

    from admission import AsyncAdmission

    key, seat = "adm:{t}:sized:" + POOL, "adm:{t}:seat:"
    a = adm(redis_client, pol=policy(lanes(), seed_estimate=10))
    with a.round(lane="a", model=POOL, round_id="r", timeout=5, tokens=1234):
        assert redis_client.hget(seat + "r", "tokens") == b"1234" and redis_client.zscore(key, "r") == 1234
        assert pool_state(redis_client)["sized"] == "1"

    assert redis_client.zcard(key) == 0 and pool_state(redis_client)["sized"] == "0"

    async def main():
        b = AsyncAdmission(async_client_factory(), mesh="u", pod="q", background=False)
        await b.apply_policy(policy(lanes(), seed_estimate=10), recovery_hold=False)
        akey = "adm:{u}:sized:" + POOL
        async with b.round(lane="a", model=POOL, round_id="s", timeout=5, tokens=4321):
            assert await b.redis.zscore(akey, "s") == 4321
        assert await b.redis.zcard(akey) == 0
        await b.close()

    asyncio.run(main())
