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
    census = a.ops.census(now=t)
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
        await b.ops.apply_policy(policy(lanes(), seed_estimate=10), recovery_hold=False)
        akey = "adm:{u}:sized:" + POOL
        async with b.round(lane="a", model=POOL, round_id="s", timeout=5, tokens=4321):
            assert await b.redis.zscore(akey, "s") == 4321
        assert await b.redis.zcard(akey) == 0
        await b.close()

    asyncio.run(main())


# -- refinement 5: progress reports, a stall the line planned, no growth under the line ----------
def got_at(seconds: float, load: int) -> float:
    """Tokens one round receives in ``seconds`` at ``load`` rounds in flight (this test's provider)."""
    return seconds / (A + B * load)


def test_cap_line_running_rounds_report_progress_as_points_of_the_fit(redis_client):
    # a pool never measured, no round ended yet: the reports alone give it its line
    a = adm(redis_client, pol=policy(lanes(), seed_estimate=100))
    t = T0
    m = a.try_admit(lane="a", model=POOL, round_id="m", now=t, draw=0.0, tokens=200_000).seat
    other = a.try_admit(lane="a", model=POOL, round_id="o", now=t, draw=0.0).seat
    got, plan, extra = 0.0, [(2, 100.0), (6, 100.0), (4, 50.0)], []
    for load, dt in plan:  # the load held for dt seconds, then one report
        while 2 + len(extra) < load:
            extra.append(a.try_admit(lane="a", model=POOL, round_id=f"x{len(extra)}", now=t, draw=0.0).seat)
            assert extra[-1]
        while 2 + len(extra) > load:
            a.release(extra.pop(), outcome="error", now=t)
        t += dt
        got += got_at(dt, load)
        assert a.progress([(m, got), (other, 1.0)], now=t).points == 1  # the undeclared round adds nothing
    got_a, got_b = fitted(redis_client)
    assert got_a == pytest.approx(A, rel=1e-6) and got_b == pytest.approx(B, rel=1e-6)
    st = pool_state(redis_client)
    assert float(st["fitN"]) == 3 and float(st["fitLo"]) == pytest.approx(2) and float(st["fitHi"]) == pytest.approx(6)
    assert float(st["succ"]) == 0  # no round ended
    a.tick(now=t)
    assert float(pool_state(redis_client)["ceiling"]) > 0  # the line, while the first rounds run
    # a report with nothing new since the last one is no point
    assert a.progress([(m, got)], now=t + 10).points == 0
    assert float(pool_state(redis_client)["fitN"]) == 3


def test_cap_line_a_round_reported_in_pieces_weighs_one_round(redis_client):
    a = adm(redis_client, pol=policy(lanes(), seed_estimate=100))
    tokens, t = 10_000.0, T0
    m = a.try_admit(lane="a", model=POOL, round_id="m", now=t, draw=0.0, tokens=tokens).seat
    half = seconds_for(tokens / 2, 1)
    assert a.progress([(m, tokens / 2)], now=t + half).points == 1
    assert float(pool_state(redis_client)["fitW"]) == pytest.approx(0.5)
    a.release(m, outcome="clean", seconds=2 * half, now=t + 2 * half)  # its end is the other half
    st = pool_state(redis_client)
    assert float(st["fitN"]) == 2
    assert float(st["fitW"]) == pytest.approx(0.5 * 0.95 ** 0.5 + 0.5)  # about one round, not 1.5
    assert float(st["fitY"]) == pytest.approx((0.5 * 0.95 ** 0.5 + 0.5) * (A + B))


def test_cap_line_progress_reanchors_what_the_ceiling_counts_as_received(redis_client):
    a, t = trained(redis_client)
    tokens = 50_000.0
    big = a.try_admit(lane="a", model=POOL, round_id="big", now=t, draw=0.0, tokens=tokens).seat
    crowd = [a.try_admit(lane="a", model=POOL, round_id=f"c{i}", now=t, draw=0.0).seat for i in range(9)]
    assert all(crowd)
    # 600 s at 10 in flight; it reports more than the fit would credit it (a provider faster today)
    got = 1.5 * got_at(600, 10)
    a.progress([(big, got)], now=t + 600)
    a.tick(now=t + 600)
    fa, fb = fitted(redis_client)
    need = (tokens - got) / (SHARE * CAP - 600)
    assert float(pool_state(redis_client)["ceiling"]) == pytest.approx((1 / need - fa) / fb, rel=1e-6)


def test_cap_line_progress_of_a_seat_not_this_pods_live_one_is_lost_and_writes_nothing(redis_client):
    from admission import Seat

    a, t = trained(redis_client)
    mine = a.try_admit(lane="a", model=POOL, round_id="mine", now=t, draw=0.0, tokens=5_000).seat
    b = adm(redis_client, pod="pod-b", apply=False)
    theirs = b.try_admit(lane="a", model=POOL, round_id="theirs", now=t, draw=0.0, tokens=5_000).seat
    before = snapshot(redis_client)
    stale = Seat(mine.id, mine.seq + 1, mine.pool, mine.lane, mine.pod, mine.admitted_at)
    ghost = Seat("ghost", 1, POOL, "a", "pod-a", t)
    got = a.progress([(theirs, 100.0), (stale, 100.0), (ghost, 100.0)], now=t + 10)
    assert got.points == 0 and got.lost == ["theirs", "mine", "ghost"]
    assert snapshot(redis_client) == before


@pytest.mark.parametrize("call", ["progress", "release"])
@pytest.mark.parametrize("bad", [-1, math.nan, math.inf, 2e9, True, "100"])
def test_cap_line_a_bad_progress_or_received_count_is_refused_before_any_write(redis_client, bad, call):
    a, t = trained(redis_client)
    m = a.try_admit(lane="a", model=POOL, round_id="m", now=t, draw=0.0, tokens=5_000).seat
    before = snapshot(redis_client)
    with pytest.raises(BadArgument):
        if call == "progress":
            a.progress([(m, 10.0), (m, bad)], now=t + 10)
        else:
            a.release(m, outcome="clean", seconds=10, now=t + 10, received=bad)
    assert snapshot(redis_client) == before


@pytest.mark.parametrize("raw", [["-5"], ["abc"], ["nan"], ["1e10"], ["10", "extra"]])
def test_cap_line_the_script_refuses_a_bad_progress_and_writes_nothing(redis_client, raw):
    from admission import scripts

    a, t = trained(redis_client)
    m = a.try_admit(lane="a", model=POOL, round_id="m", now=t, draw=0.0, tokens=5_000).seat
    before = snapshot(redis_client)
    call = a.core.progress([(m, 10.0), (m, 20.0)], now=t + 10)
    call.args[-1:] = raw  # the second report's tokens (and a stray argument)
    with pytest.raises(Exception, match="ADM_BAD_ARG"):
        scripts.call(redis_client, call.script, call.keys, call.args)
    assert snapshot(redis_client) == before


def measured(a, t):
    """Make the trained pool measured: a 429 at 60 rounds in flight (K = 59, K̂ about 41)."""
    seats = [a.try_admit(lane="a", model=POOL, round_id=f"k{i}", now=t, draw=0.0).seat for i in range(60)]
    assert all(seats)
    a.release(seats[-1], outcome="rate_limited", now=t + 1)
    for s in seats[:-1]:
        a.release(s, outcome="clean", seconds=1, now=t + 1)
    return t + 2


def test_cap_line_a_stall_the_line_planned_does_not_lower_the_estimate(redis_client):
    a, t = trained(redis_client)
    t = measured(a, t)
    est = float(pool_state(redis_client)["est"])
    assert pool_state(redis_client)["exhausted"] == "1" and est > 35
    # 75,000 tokens at 5 rounds in flight (50 tokens/s) takes 1,500 s: it stalls at 1,200 s by
    # the watchdog's rule, and still ends by 95 % of its cap
    big = a.try_admit(lane="a", model=POOL, round_id="big", now=t, draw=0.0, tokens=75_000).seat
    crowd = [a.try_admit(lane="a", model=POOL, round_id=f"c{i}", now=t, draw=0.0).seat for i in range(4)]
    assert all(crowd)
    r = a.report(big, signal="stall", now=t + 1200)
    assert not r.decreased and float(pool_state(redis_client)["est"]) == est
    totals = {k.decode(): v for k, v in redis_client.hgetall("adm:{t}:totals").items()}
    assert totals.get(f"signal|{POOL}|stall-planned") == b"1" and f"signal|{POOL}|stall" not in totals
    # the same round behind its plan (30 more rounds in flight): the stall is a load signal
    for s in [big, *crowd]:  # no point of the fit (not clean)
        a.release(s, outcome="error", now=t + 1300)
    t += 1400
    slow = a.try_admit(lane="a", model=POOL, round_id="slow", now=t, draw=0.0, tokens=75_000).seat
    crowd = [a.try_admit(lane="a", model=POOL, round_id=f"d{i}", now=t, draw=0.0).seat for i in range(34)]
    assert all(crowd)
    r = a.report(slow, signal="stall", now=t + 1200)
    assert r.decreased and float(pool_state(redis_client)["est"]) == pytest.approx(0.7 * 35)


def test_cap_line_in_slow_start_a_stall_still_measures_k(redis_client):
    a, t = trained(redis_client)
    assert pool_state(redis_client).get("exhausted", "0") != "1"  # never measured
    big = a.try_admit(lane="a", model=POOL, round_id="big", now=t, draw=0.0, tokens=75_000).seat
    crowd = [a.try_admit(lane="a", model=POOL, round_id=f"c{i}", now=t, draw=0.0).seat for i in range(4)]
    assert all(crowd)
    r = a.report(big, signal="stall", now=t + 1200)  # on its plan, as above: in slow start it still measures K
    st = pool_state(redis_client)
    assert r.decreased and st["exhausted"] == "1" and float(st["cap"]) == 5


def test_cap_line_no_growth_while_the_line_holds_the_load_below_the_estimate(redis_client):
    a, t = trained(redis_client)
    est = 100.0  # the seed (slow start: each step adds up to 8)
    big = a.try_admit(lane="a", model=POOL, round_id="big", now=t, draw=0.0, tokens=50_000).seat
    a.tick(now=t)
    line = math.floor(float(pool_state(redis_client)["ceiling"]))
    assert line < est
    for i in range(line):  # up to the line, then one waits: demand
        a.try_admit(lane="a", model=POOL, round_id=f"s{i}", now=t, draw=0.0)
    assert not a.try_admit(lane="a", model=POOL, round_id="w", now=t, draw=0.0, wait=True).admitted
    a.tick(now=t + 20)
    assert float(pool_state(redis_client).get("est", est)) == est  # the rounds never reached K̂: no step
    a.release(big, outcome="clean", seconds=30, now=t + 30)
    a.tick(now=t + 50)
    assert float(pool_state(redis_client)["est"]) == est + 8  # no line: growth goes on


def test_cap_line_round_reports_progress_sync_and_async(redis_client, async_client_factory):
    import asyncio

    from admission import AsyncAdmission

    a = adm(redis_client, pol=policy(lanes(), seed_estimate=10))
    with a.round(lane="a", model=POOL, round_id="r", timeout=5, tokens=1234) as r:
        assert r.progress(100).points == 1
        assert redis_client.hget("adm:{t}:seat:r", "pTok") == b"100"

    async def main():
        b = AsyncAdmission(async_client_factory(), mesh="u", pod="q", background=False)
        await b.ops.apply_policy(policy(lanes(), seed_estimate=10), recovery_hold=False)
        async with b.round(lane="a", model=POOL, round_id="s", timeout=5, tokens=4321) as r:
            assert (await r.progress(200)).points == 1
            assert await b.redis.hget("adm:{u}:seat:s", "pTok") == b"200"
        await b.close()

    asyncio.run(main())


# -- the tokens received in all: a size declared as an upper bound -------------------------------
def test_cap_line_a_release_measures_the_tokens_received_not_the_declared_budget(redis_client):
    # a round declared with an answer budget of 10,000 tokens that received 2,000: its point is
    # its seconds over the 2,000 (the provider's true pace), not over the budget (5x too fast)
    a = adm(redis_client, pol=policy(lanes(), seed_estimate=100))
    t = T0
    m = a.try_admit(lane="a", model=POOL, round_id="m", now=t, draw=0.0, tokens=10_000).seat
    took = seconds_for(2_000, 1)
    a.release(m, outcome="clean", seconds=took, now=t + took, received=2_000)
    st = pool_state(redis_client)
    assert float(st["fitN"]) == 1 and float(st["fitW"]) == pytest.approx(1.0)
    assert float(st["fitY"]) == pytest.approx(A + B)
    # reported in part first: the release adds only the tail since the report, over what came
    t += took + 1
    m = a.try_admit(lane="a", model=POOL, round_id="m2", now=t, draw=0.0, tokens=10_000).seat
    a.progress([(m, 1_000.0)], now=t + seconds_for(1_000, 1))
    before = {k: float(v) for k, v in pool_state(redis_client).items() if k in ("fitW", "fitY")}
    a.release(m, outcome="clean", seconds=seconds_for(3_000, 1), now=t + seconds_for(3_000, 1), received=3_000)
    st = pool_state(redis_client)
    w_tail = 2_000 / 3_000
    assert float(st["fitN"]) == 3
    assert float(st["fitW"]) == pytest.approx(before["fitW"] * 0.95 ** w_tail + w_tail)
    assert float(st["fitY"]) == pytest.approx(before["fitY"] * 0.95 ** w_tail + w_tail * (A + B))
    # nothing past its last report, or nothing at all: no point
    t += 100
    m = a.try_admit(lane="a", model=POOL, round_id="m3", now=t, draw=0.0, tokens=10_000).seat
    a.progress([(m, 500.0)], now=t + 5)
    n = float(pool_state(redis_client)["fitN"])
    a.release(m, outcome="clean", seconds=9, now=t + 9, received=500)
    m = a.try_admit(lane="a", model=POOL, round_id="m4", now=t + 9, draw=0.0, tokens=10_000).seat
    a.release(m, outcome="clean", seconds=3, now=t + 12, received=0)
    assert float(pool_state(redis_client)["fitN"]) == n


@pytest.mark.parametrize("raw", ["-5", "abc", "nan", "1e10"])
def test_cap_line_the_script_refuses_a_bad_received_count_and_writes_nothing(redis_client, raw):
    from admission import scripts

    a, t = trained(redis_client)
    m = a.try_admit(lane="a", model=POOL, round_id="m", now=t, draw=0.0, tokens=5_000).seat
    before = snapshot(redis_client)
    call = a.core.release(m, outcome="clean", seconds=10, now=t + 10, received=100)
    call.args[9] = raw
    with pytest.raises(Exception, match="ADM_BAD_ARG"):
        scripts.call(redis_client, call.script, call.keys, call.args)
    assert snapshot(redis_client) == before


def test_cap_line_round_sends_what_it_received_sync_and_async(redis_client, async_client_factory):
    import asyncio

    from admission import AsyncAdmission

    # a round that received nothing is no point of the fit; the same round with nothing set is one
    a = adm(redis_client, pol=policy(lanes(), seed_estimate=10))
    with a.round(lane="a", model=POOL, round_id="r", timeout=5, tokens=10_000) as r:
        r.received = 0
    assert float(pool_state(redis_client).get("fitN", 0)) == 0
    with a.round(lane="a", model=POOL, round_id="r1", timeout=5, tokens=10_000):
        pass
    assert float(pool_state(redis_client)["fitN"]) == 1
    # a bad count set on the round is an error for the caller, and the seat is released all the same
    with pytest.raises(BadArgument):
        with a.round(lane="a", model=POOL, round_id="r2", timeout=5, tokens=10_000) as r:
            r.received = -3
    assert redis_client.exists("adm:{t}:seat:r2") == 0

    async def main():
        b = AsyncAdmission(async_client_factory(), mesh="u", pod="q", background=False)
        await b.ops.apply_policy(policy(lanes(), seed_estimate=10), recovery_hold=False)

        async def fit_n():
            return float(await b.redis.hget("adm:{u}:pool:" + POOL, "fitN") or 0)

        async with b.round(lane="a", model=POOL, round_id="s", timeout=5, tokens=10_000) as r:
            r.received = 0
        zero = await fit_n()
        async with b.round(lane="a", model=POOL, round_id="s1", timeout=5, tokens=10_000):
            pass
        one = await fit_n()
        await b.close()
        return zero, one

    assert asyncio.run(main()) == (0, 1)
