"""The provider's rate ceilings (docs/design.md §5.9, lua/include/ceilings.lua): one continuous token
bucket per limit of a scope, checked and debited in the same atomic admit as concurrency,
reserved at admit and reconciled at the round's end. One test per rule, named after it; each
runs on fakeredis, Redis 7 and Valkey 8 with clock = "caller", so time is exact."""
from __future__ import annotations

import dataclasses
import math

import pytest

from admission import Admission, BadArgument, PolicyError, Status, Usage
from admission import policy as policy_mod
from admission.codes import CEILING_REASONS, REFUSE_REASONS

from helpers import T0, adm, policy, pool_state, snapshot

P, Q = "m@p", "n@q"  # two pools of two providers (two keys: two scopes)
LANES = {"a": {"floor": 0, "weight": 1, "priority": 1}}
MIDNIGHT = (math.floor(T0 / 86400) + 1) * 86400


def ceil_policy(key=None, other=None, **tunables):
    """P on the scope `key` (its limits: `key`), Q on `other` (None: Q has no ceilings); Q is
    P's alternative."""
    pol = policy(LANES, pools=(P, Q), **{"seed_estimate": 8, **tunables})
    pol["ceilings"] = {"key": {"headroom": 1, "jitter_s": 0, **(key or {"rpm": 60})}}
    pol["pools"][P]["ceilings"] = "key"
    if other is not None:
        pol["ceilings"]["other"] = {"headroom": 1, "jitter_s": 0, **other}
        pol["pools"][Q]["ceilings"] = "other"
    pol["alternatives"] = {P: [Q]}
    return pol


class Ask:
    def __init__(self, a):
        self.a, self.n = a, 0

    def __call__(self, now, pool=P, alternatives=(), **kw):
        self.n += 1
        return self.a.try_admit(lane="a", model=pool, round_id=kw.pop("rid", f"r{self.n}"), now=now, draw=0.0,
                                alternatives=list(alternatives), **kw)


def level(client, limit, scope="key", mesh="t"):
    v = client.hget(f"adm:{{{mesh}}}:ceil:{scope}", limit)
    return None if v is None else float(v)


def scope_state(client, scope="key", mesh="t"):
    return {k.decode(): v.decode() for k, v in client.hgetall(f"adm:{{{mesh}}}:ceil:{scope}").items()}


def test_a_bucket_refills_continuously(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 6000}))    # 100 tokens a second, one minute held
    ask = Ask(a)
    assert ask(T0, input_tokens=6000, max_tokens=0).admitted
    assert level(redis_client, "tpm") == 0
    assert ask(T0 + 10, input_tokens=1000, max_tokens=0).admitted   # 10 s refilled 1,000 tokens
    d = ask(T0 + 12, input_tokens=201, max_tokens=0)
    assert not d.admitted and d.reason == "ceiling-tpm"              # 200 refilled, 1 short
    assert d.wait_s == pytest.approx(0.01)
    assert ask(T0 + 12.01, input_tokens=201, max_tokens=0).admitted


def test_a_request_bucket_holds_burst_s_of_rate(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 60, "burst_s": 2}))   # one a second, two held
    ask = Ask(a)
    assert ask(T0).admitted and ask(T0).admitted
    d = ask(T0)
    assert d.reason == "ceiling-rpm" and d.wait_s == pytest.approx(1)
    assert ask(T0 + 1).admitted


def test_the_request_bucket_keeps_jitter_s_of_its_burst_as_room(redis_client):
    # ten a second, one second held: a call may reach the provider 0.5 s off its admit's spacing,
    # so five of the ten are kept as room
    a = adm(redis_client, pol=ceil_policy({"rpm": 600, "jitter_s": 0.5}))
    ask = Ask(a)
    assert all(ask(T0).admitted for _ in range(5))
    d = ask(T0)
    assert d.reason == "ceiling-rpm" and d.wait_s == pytest.approx(0.1)   # the rate is untouched


def test_a_one_request_bucket_spaces_its_calls_jitter_s_further_apart(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 60, "jitter_s": 0.05}))   # one a second, one held
    ask = Ask(a)
    assert ask(T0).admitted
    d = ask(T0 + 1)
    assert d.reason == "ceiling-rpm" and d.wait_s == pytest.approx(0.05)
    assert ask(T0 + 1.05).admitted


def test_a_round_larger_than_a_bucket_passes_when_it_is_full(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 600}))     # 10 a second, 600 held
    ask = Ask(a)
    assert ask(T0, input_tokens=1000, max_tokens=1000).admitted   # never waits for room it cannot have
    assert level(redis_client, "tpm") == -1400                     # its debt refills
    d = ask(T0 + 1, input_tokens=1000, max_tokens=0)
    assert d.reason == "ceiling-tpm" and d.wait_s == pytest.approx(199)   # until the bucket is full


def test_every_bucket_is_debited_together_or_none(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 120, "tpm": 6000}))   # 2 requests held, 6,000 tokens
    ask = Ask(a)
    assert ask(T0, input_tokens=5000, max_tokens=0).admitted
    assert (level(redis_client, "rpm"), level(redis_client, "tpm")) == (1, 1000)
    d = ask(T0, input_tokens=2000, max_tokens=0)
    assert d.reason == "ceiling-tpm"
    assert (level(redis_client, "rpm"), level(redis_client, "tpm")) == (1, 1000)   # none debited
    assert ask(T0, input_tokens=500, max_tokens=0).admitted
    assert (level(redis_client, "rpm"), level(redis_client, "tpm")) == (0, 500)


def test_a_refusal_names_the_ceiling_and_the_wait_and_a_waiter_sleeps_it(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 6000, "rpm": 6000}))
    ask = Ask(a)
    assert ask(T0, input_tokens=6000, max_tokens=0).admitted
    d = ask(T0, input_tokens=1000, max_tokens=700)
    assert not d.admitted and d.reason == "ceiling-tpm" and d.ceiling == "tpm"
    assert d.wait_s == pytest.approx(17)                 # 1,700 short at 100 a second
    assert a._retry_after(d) == d.wait_s                  # the waiter sleeps exactly that long
    assert "ceiling-tpm" in CEILING_REASONS and set(CEILING_REASONS) <= set(REFUSE_REASONS)


def test_a_round_refused_on_a_ceiling_moves_to_another_scope(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 60}, other={"rpm": 60}))
    ask = Ask(a)
    assert ask(T0).admitted
    d = ask(T0, alternatives=[Q])
    assert d.admitted and d.pool == Q and d.moved_from == P
    assert level(redis_client, "rpm", "other") == 0 and level(redis_client, "rpm") == 0
    d = ask(T0, alternatives=[Q])                           # both scopes spent: it waits on P
    assert not d.admitted and d.pool == P and d.reason == "ceiling-rpm"


def test_a_daily_cap_admits_exactly_n_then_closes_the_scope_until_midnight(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpd": 5}))
    ask = Ask(a)
    for i in range(5):
        d = ask(T0 + i)
        assert d.admitted, (i, d)
        a.release(d.seat, now=T0 + i)
    assert float(scope_state(redis_client)["closedUntil"]) == MIDNIGHT   # closed by the fifth
    d = ask(T0 + 10)
    assert not d.admitted and d.reason == "ceiling-rpd" and d.wait_s == pytest.approx(MIDNIGHT - T0 - 10)
    assert ask(MIDNIGHT - 1).reason == "ceiling-rpd"
    closed = [e for _, e in redis_client.xrange("adm:{t}:events")
              if e.get(b"kind") == b"closed" and e.get(b"scope") == b"key"]
    assert closed and closed[0][b"why"] == b"ceiling-rpd"
    assert ask(MIDNIGHT).admitted                                        # a new UTC day: reopened
    assert scope_state(redis_client)["closedUntil"] == "0" and level(redis_client, "rpd") == 4


def test_reconcile_refunds_and_charges_the_difference_once_under_replay(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000, "itpm": 100000, "output_charge": "received"}))
    ask = Ask(a)
    d = ask(T0, input_tokens=1000, max_tokens=1000)               # reserves 2,000
    assert level(redis_client, "tpd") == 8000 and level(redis_client, "itpm") == 99000
    usage = Usage(input_tokens=400, cache_creation_tokens=100, cache_read_tokens=5000, output_tokens=100)
    r = a.release(d.seat, now=T0, usage=usage)
    assert r.status == Status.RELEASED
    assert level(redis_client, "tpd") == 9400                    # counted 600: 1,400 refunded
    assert level(redis_client, "itpm") == 99500                  # cache reads do not count
    again = a.release(d.seat, now=T0, usage=usage)               # sent twice: counted once
    assert again.status == Status.ALREADY_RELEASED and level(redis_client, "tpd") == 9400
    d = ask(T0, input_tokens=100, max_tokens=100)                # reserves 200
    a.release(d.seat, now=T0, usage={"input_tokens": 1000, "output_tokens": 500})
    assert level(redis_client, "tpd") == 9400 - 1500             # 1,300 more charged


def test_max_tokens_charge_keeps_the_answer_budget_counted(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000}))     # output_charge = max_tokens
    ask = Ask(a)
    d = ask(T0, input_tokens=1000, max_tokens=1000)
    a.release(d.seat, now=T0, usage=Usage(input_tokens=500, output_tokens=10))
    assert level(redis_client, "tpd") == 10000 - 1500            # input reconciled, the budget stays


def test_a_lapsed_lease_keeps_its_reservation_charged(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000}, lease_ttl=10))
    ask = Ask(a)
    d = ask(T0, input_tokens=2000, max_tokens=1000)
    assert level(redis_client, "tpd") == 7000
    a.tick(now=T0 + 20)                                          # the sweep takes the seat
    assert not redis_client.exists(f"adm:{{t}}:seat:{d.seat.id}")
    assert level(redis_client, "tpd") == 7000                    # not refunded
    r = a.release(d.seat, now=T0 + 21, usage=Usage(input_tokens=10))
    assert r.status == Status.EXPIRED and level(redis_client, "tpd") == 7000


def test_an_undeclared_round_reserves_the_learned_mean(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 10, "tpd": 100000}))   # a small cap: 10 a minute
    ask = Ask(a)
    d = ask(T0)                                                  # nothing learned: no tokens reserved
    assert d.admitted and level(redis_client, "tpd") == 100000
    a.release(d.seat, now=T0, usage=Usage(input_tokens=1000, output_tokens=200))
    assert level(redis_client, "tpd") == 100000 - 1200
    assert float(scope_state(redis_client)["meanIn"]) == 1000
    d = ask(T0 + 8000)                                           # the mean of what was counted
    assert d.admitted and level(redis_client, "tpd") == 100000 - 2400


def test_a_ceiling_429_empties_its_bucket_and_leaves_the_estimate_alone(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 600, "burst_s": 10}))   # 10 a second, 100 held
    ask = Ask(a)
    d = ask(T0)
    r = a.release(d.seat, outcome="ceiling", ceiling="rpm", reset_s=30, now=T0)
    assert not r.decreased and r.estimate == d.estimate
    d = ask(T0 + 29)
    assert d.reason == "ceiling-rpm" and d.wait_s == pytest.approx(1.1)   # held, then 1 at 10/s
    assert ask(T0 + 30.1).admitted
    # the same 429 as load: the estimate comes down
    d = ask(T0 + 40)
    assert a.release(d.seat, outcome="rate_limited", now=T0 + 40).decreased


def test_a_ceiling_reported_mid_round_is_no_load_signal(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 6000}))
    ask = Ask(a)
    d = ask(T0, input_tokens=0, max_tokens=0)
    r = a.report(d.seat, signal="ceiling", ceiling="tpm", reset_s=5, now=T0)
    assert r.status == Status.REPORTED and not r.decreased
    assert level(redis_client, "tpm") == 0
    assert ask(T0 + 4, input_tokens=1, max_tokens=0).reason == "ceiling-tpm"
    assert ask(T0 + 5.01, input_tokens=1, max_tokens=0).admitted


def test_rounds_held_by_a_ceiling_are_no_demand_for_concurrency(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 60}, grow_interval=1))
    ask = Ask(a)
    assert ask(T0).admitted
    d = ask(T0 + 0.5, wait=True)                                 # a waiter, held by the ceiling
    assert d.reason == "ceiling-rpm"
    state = pool_state(redis_client, P)
    assert "lastDemand" not in state and float(state["ceilingAt"]) == T0 + 0.5
    a.tick(now=T0 + 5)
    assert ask(T0 + 5).estimate == d.estimate                    # no growth from it


def test_a_pool_without_ceilings_keeps_no_ceiling_state(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 60}))
    ask = Ask(a)
    d = ask(T0, pool=Q, input_tokens=100, max_tokens=100)
    assert d.admitted
    assert not redis_client.hexists(f"adm:{{t}}:seat:{d.seat.id}", "cScope")
    a.release(d.seat, now=T0, usage=Usage(input_tokens=10))
    assert not redis_client.keys("adm:{t}:ceil:*")


def test_bad_ceilings_in_a_policy_are_all_reported_and_change_nothing(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 60}))
    bad = ceil_policy({"rpm": -1, "tpm": math.nan, "headroom": 1.5, "output_charge": "later", "jitter_s": -0.1})
    bad["pools"][Q]["ceilings"] = "nowhere"
    found = policy_mod.problems(bad)
    text = " ".join(found)
    for word in ("ceilings.key.rpm", "ceilings.key.tpm", "ceilings.key.headroom", "ceilings.key.output_charge",
                 "ceilings.key.jitter_s", "nowhere"):
        assert word in text, (word, found)
    before = snapshot(redis_client)
    with pytest.raises(PolicyError):
        a.ops.apply_policy(bad)
    assert snapshot(redis_client) == before
    # past the client's check, the script refuses it too, before its first write
    good = policy_mod.validate(ceil_policy({"rpm": 60}))
    for limit in (-1, float("nan"), 0):
        raw = {**good, "ceilings": {"key": {**good["ceilings"]["key"], "rpm": limit}}}
        with pytest.raises(PolicyError, match="rpm"):
            a._exec(a.core.apply(raw, now=T0))
        assert snapshot(redis_client) == before
    for jitter in (-1, float("inf"), 61):
        raw = {**good, "ceilings": {"key": {**good["ceilings"]["key"], "jitter_s": jitter}}}
        with pytest.raises(PolicyError, match="jitter_s"):
            a._exec(a.core.apply(raw, now=T0))
        assert snapshot(redis_client) == before


def test_a_usage_beyond_the_bound_is_an_error_and_changes_nothing(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000}))
    d = Ask(a)(T0, input_tokens=10, max_tokens=10)
    before = snapshot(redis_client)
    with pytest.raises(BadArgument):
        a.release(d.seat, now=T0, usage=Usage(input_tokens=1e9 + 20))
    call = a.core.release(d.seat, now=T0, usage=Usage(input_tokens=1))
    args = list(call.args)
    args[10] = "1000000020"                                      # past the client's check
    with pytest.raises(BadArgument, match="at most 1e9"):
        a._exec(dataclasses.replace(call, args=args))
    with pytest.raises(BadArgument):
        a.release(d.seat, now=T0, outcome="ceiling", ceiling="tpm", reset_s=86400 * 365)
    assert snapshot(redis_client) == before


def test_config_show_lists_the_ceilings(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 60, "tpm": 1000}))
    shown = a.policy()
    assert shown["ceilings"]["key"] == {"rpm": 60.0, "tpm": 1000.0, "burst_s": 1.0, "jitter_s": 0.0,
                                        "headroom": 1.0, "output_charge": "max_tokens", "cache_reads_count": False}
    assert next(p for p in shown["pools"] if p["name"] == P)["ceilings"] == "key"


@pytest.mark.corrupts_state
def test_the_doctor_checks_the_reservations_and_the_levels(redis_client):
    from admission import doctor
    a = adm(redis_client, pol=ceil_policy({"tpm": 6000}))
    d = Ask(a)(T0, input_tokens=10, max_tokens=10)
    assert doctor.check(redis_client, "t").ok
    redis_client.hset(f"adm:{{t}}:seat:{d.seat.id}", "cIn", "x")
    redis_client.hset("adm:{t}:ceil:key", "tpm", "abc")
    kinds = {p["kind"] for p in doctor.check(redis_client, "t").problems}
    assert kinds == {"bad-reservation", "not-a-number"}


def test_a_round_declares_its_call_and_its_end_reconciles_it(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000, "output_charge": "received"}))
    with a.round(lane="a", model=P, round_id="w1", input_tokens=1000, max_tokens=1000) as h:
        assert level(redis_client, "tpd") == 8000
        h.usage = Usage(input_tokens=300, output_tokens=200)
    assert level(redis_client, "tpd") == 9500
    with a.round(lane="a", model=P, round_id="w2", input_tokens=0, max_tokens=0) as h:
        h.outcome, h.ceiling, h.reset_s = "rate_limited", "tpd", 0   # a 429 that named its ceiling
    closed = float(scope_state(redis_client)["closedUntil"])     # the round ran on the server's clock
    assert level(redis_client, "tpd") == 0 and closed % 86400 == 0 and closed > 0
    assert "exhausted" not in pool_state(redis_client, P)          # the estimate was not cut


def test_a_release_replayed_from_the_outbox_reconciles_once(redis_client):
    from admission.base import release_record
    a = adm(redis_client, pol=ceil_policy({"tpd": 10000}))
    d = a.try_admit(lane="a", model=P, round_id="o1", input_tokens=1000, max_tokens=0)   # the server's clock
    record = release_record(d.seat, "clean", 1.0, None, usage=Usage(input_tokens=100))
    a._apply_record(record)
    a._apply_record(record)                                       # the replay of a lost reply
    assert level(redis_client, "tpd") == 9900


def test_the_asyncio_client_declares_reconciles_and_reports_a_ceiling(async_client_factory):
    import asyncio

    from admission import AsyncAdmission

    async def main():
        client = async_client_factory()

        async def level_of(limit):
            return float(await client.hget("adm:{t}:ceil:key", limit))

        a = AsyncAdmission(client, mesh="t", pod="pod-a", background=False)
        await a.ops.apply_policy(ceil_policy({"tpd": 10000, "tpm": 60000}), recovery_hold=False)
        d = await a.try_admit(lane="a", model=P, round_id="x1", now=T0, draw=0.0, alternatives=[],
                              input_tokens=1000, max_tokens=1000)
        assert d.admitted and await level_of("tpd") == 8000
        r = await a.report(d.seat, signal="ceiling", ceiling="tpm", reset_s=10, now=T0)
        assert not r.decreased and await level_of("tpm") == 0
        await a.release(d.seat, now=T0, usage=Usage(input_tokens=500))
        assert await level_of("tpd") == 8500                      # the budget stays counted (max_tokens)
        d = await a.try_admit(lane="a", model=P, round_id="x2", now=T0 + 5, draw=0.0, alternatives=[],
                              input_tokens=1, max_tokens=0)
        assert d.reason == "ceiling-tpm" and d.wait_s > 5
    asyncio.run(main())
