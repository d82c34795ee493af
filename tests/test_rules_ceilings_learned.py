"""The ceilings learned from the providers' own rate-limit headers (docs/design.md §5.9, "Learned
from the headers"; lua/include/readings.lua): a round's release or progress carries the reading of
its last response, the scope keeps the provider's limits, and a fresh reading lowers the buckets
to what the provider says remains. One test per rule, named after it; each runs on fakeredis,
Redis 7 and Valkey 8 with clock = "caller", so time is exact."""
from __future__ import annotations

import dataclasses
import math
import time

import pytest

from admission import BadArgument, Status, Usage
from admission import ratelimits
from admission.ratelimits import Limit, Reading

from helpers import T0, adm, policy, snapshot

P, Q = "m@p", "n@q"  # P on the configured scope `key`; Q configures none
LANES = {"a": {"floor": 0, "weight": 1, "priority": 1}}


def ceil_policy(key=None, **tunables):
    pol = policy(LANES, pools=(P, Q), **{"seed_estimate": 8, **tunables})
    pol["ceilings"] = {"key": {"headroom": 1, "jitter_s": 0, **(key or {"tpm": 100_000})}}
    pol["pools"][P]["ceilings"] = "key"
    return pol


def reading(at=T0, **limits):
    """A reading at `at`: limits as kind=(limit, remaining[, rounding]) (None: not said)."""
    out = {}
    for kind, v in limits.items():
        limit, remaining, *rounding = v
        out[kind] = Limit(kind, limit, remaining, 1.0, rounding[0] if rounding else 0.0)
    return Reading(at, out)


class Ask:
    def __init__(self, a):
        self.a, self.n = a, 0

    def __call__(self, now, pool=P, **kw):
        self.n += 1
        return self.a.try_admit(lane="a", model=pool, round_id=kw.pop("rid", f"r{self.n}"), now=now, draw=0.0,
                                alternatives=[], **kw)


def scope_state(client, scope="key", mesh="t"):
    return {k.decode(): v.decode() for k, v in client.hgetall(f"adm:{{{mesh}}}:ceil:{scope}").items()}


def level(client, limit, scope="key"):
    v = scope_state(client, scope).get(limit)
    return None if v is None else float(v)


def test_the_effective_ceiling_is_the_lower_of_configured_and_learned_times_headroom(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 100_000, "headroom": 0.9}))
    ask = Ask(a)
    d = ask(T0, input_tokens=0, max_tokens=0)
    a.release(d.seat, now=T0, reading=reading(at=T0 - 10, tpm=(50_000, None), rpm=(60, None)))
    state = scope_state(redis_client)
    assert state["learned:tpm"] == "50000" and state["learned:rpm"] == "60"   # kept per kind
    assert ask(T0, input_tokens=1000, max_tokens=0).admitted
    assert level(redis_client, "tpm") == pytest.approx(50_000 * 0.9 - 1000)     # min(100k, 50k) x 0.9
    assert level(redis_client, "rpm") == pytest.approx(0)                       # learned alone: a bucket of its own
    d = ask(T0 + 60, input_tokens=0, max_tokens=0)
    a.release(d.seat, now=T0 + 60, reading=reading(at=T0 + 50, tpm=(500_000, None)))
    assert ask(T0 + 120, input_tokens=1000, max_tokens=0).admitted
    assert level(redis_client, "tpm") == pytest.approx(100_000 * 0.9 - 1000)    # the configured one binds


def test_a_fresh_reading_lowers_a_bucket_to_what_remains_never_raises_it(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 100_000, "itpm": 100_000}))
    ask = Ask(a)
    d = ask(T0, input_tokens=1000, max_tokens=0)
    assert level(redis_client, "tpm") == 99_000
    # remaining is the provider's count: 30 % spent from outside the mesh; rounded to the thousand
    a.release(d.seat, now=T0 + 1.5, reading=reading(at=T0, tpm=(100_000, 60_000), itpm=(100_000, 60_000, 1000)))
    assert level(redis_client, "tpm") == 60_000 and level(redis_client, "itpm") == 59_000
    d = ask(T0 + 1.5, input_tokens=0, max_tokens=0)
    a.release(d.seat, now=T0 + 1.5, reading=reading(at=T0 + 1.5, tpm=(100_000, 99_000)))
    assert level(redis_client, "tpm") == 60_000                                 # never raised
    d = ask(T0 + 1.5, input_tokens=0, max_tokens=0)
    a.release(d.seat, now=T0 + 4, reading=reading(at=T0 + 1.5, tpm=(100_000, 0)))
    d = ask(T0 + 4, input_tokens=0, max_tokens=0)
    assert level(redis_client, "tpm") == pytest.approx(60_000 + 2.5 * 100_000 / 60)  # 2.5 s old: not fresh
    a.progress([(d.seat, 10, reading(at=T0 + 4, tpm=(100_000, 5000)))], now=T0 + 4)
    assert level(redis_client, "tpm") == 5000                                   # progress carries one too
    refused = ask(T0 + 4, input_tokens=6000, max_tokens=0)
    assert refused.reason == "ceiling-tpm"


def test_a_reading_teaches_the_request_bucket_the_provider_s_burst(redis_client):
    a = adm(redis_client, pol=ceil_policy({"rpm": 600}))        # ten a second, burst_s 1: ten held
    ask = Ask(a)
    d = ask(T0)
    # the provider's bucket: nothing left (a whole count: under one), full again in 0.1 s, so it
    # holds at most 0.2 s of its rate
    said = Reading(T0, {"rpm": Limit("rpm", 600, 0, 0.1, 0.0)})
    a.release(d.seat, now=T0, reading=said)
    assert float(scope_state(redis_client)["learnedBurst"]) == pytest.approx(0.2)
    d = ask(T0 + 10)
    assert d.admitted and level(redis_client, "rpm") == pytest.approx(1)    # two held, not ten
    a.release(d.seat, now=T0 + 10, reading=Reading(T0 + 10, {"rpm": Limit("rpm", 600, 5, 1.0, 0.0)}))
    assert float(scope_state(redis_client)["learnedBurst"]) == pytest.approx(0.2)  # the least shown


def test_a_pool_without_configured_ceilings_learns_a_scope_of_its_own(redis_client):
    a = adm(redis_client, pol=ceil_policy())
    ask = Ask(a)
    d = ask(T0, pool=Q)
    assert not redis_client.keys("adm:{t}:ceil:n@q")                           # nothing before a reading
    a.release(d.seat, now=T0, reading=reading(rpm=(60, 0), tpm=(100_000, 50_000)))
    state = scope_state(redis_client, Q)                                        # the scope is the pool's name
    # lowered to what remains less the headroom's share of the provider's bucket (3 % of 100k)
    assert state["learned:rpm"] == "60" and float(state["rpm"]) == 0 and float(state["tpm"]) == 47_000
    d = ask(T0, pool=Q)
    # the default headroom and jitter_s: one request, spaced 1 / 0.97 s and 0.05 s more
    assert d.reason == "ceiling-rpm" and d.wait_s == pytest.approx(1 / 0.97 + 0.05)
    d = ask(T0 + 1 / 0.97 + 0.05, pool=Q, input_tokens=1000, max_tokens=0)
    assert d.admitted and redis_client.hget(f"adm:{{t}}:seat:{d.seat.id}", "cScope") == Q.encode()
    a.release(d.seat, now=T0 + 2, usage=Usage(input_tokens=400))
    assert float(scope_state(redis_client, Q)["meanIn"]) == 400                # reconciled like a configured one
    assert scope_state(redis_client, "key").keys() <= {"at", "day", "tpm"}     # P's scope learned nothing of Q's


def test_a_lowered_limit_is_in_force_from_the_next_admit(redis_client):
    a = adm(redis_client, pol=ceil_policy())
    ask = Ask(a)
    d = ask(T0, pool=Q)
    a.release(d.seat, now=T0, reading=reading(at=T0 - 5, tpm=(100_000, None)))
    d = ask(T0, pool=Q, input_tokens=40_000, max_tokens=0)
    assert level(redis_client, "tpm", Q) == pytest.approx(97_000 - 40_000)
    a.release(d.seat, now=T0, reading=reading(at=T0 - 4, tpm=(50_000, None)))  # the provider halved it
    assert ask(T0, pool=Q, input_tokens=10_000, max_tokens=0).admitted
    assert level(redis_client, "tpm", Q) == pytest.approx(48_500 - 10_000)     # capped at 50k x 0.97
    d = ask(T0, pool=Q, input_tokens=0, max_tokens=0)
    a.release(d.seat, now=T0, reading=reading(at=T0 - 100, tpm=(100_000, None)))  # an older reading (a replay)
    assert scope_state(redis_client, Q)["learned:tpm"] == "50000"                # learns no limit


def test_a_kept_shape_follows_every_change_of_the_scope_s_fields(redis_client):
    # the library keeps each scope's rates and capacities across calls (ceilings.lua shape_of): a
    # field they derive from, changed by any writer (here by hand, as an older library would), is
    # in force at the next admit
    a = adm(redis_client, pol=ceil_policy({"tpm": 100_000, "rpm": 600}))
    ask = Ask(a)
    assert ask(T0, input_tokens=1_000, max_tokens=0).admitted
    key = "adm:{t}:ceil:key"
    redis_client.hset(key, mapping={"tpm": "1000", "learned:tpm": "6000"})      # 100 tokens a second
    assert ask(T0 + 1, input_tokens=0, max_tokens=0).admitted
    assert level(redis_client, "tpm") == pytest.approx(1_100)
    redis_client.hset(key, mapping={"tpm": "1000", "hold:tpm": str(T0 + 10)})   # held: no refill before
    assert ask(T0 + 2, input_tokens=0, max_tokens=0).admitted
    assert level(redis_client, "tpm") == pytest.approx(1_000)
    redis_client.hdel(key, "learned:tpm", "hold:tpm")                            # the configured one again
    assert ask(T0 + 3, input_tokens=0, max_tokens=0).admitted
    assert level(redis_client, "tpm") == pytest.approx(1_000 + 100_000 / 60)
    a.ops.apply_policy(ceil_policy({"tpm": 60_000, "rpm": 600}), recovery_hold=False)  # and the policy's
    assert ask(T0 + 1_000, input_tokens=0, max_tokens=0).admitted
    assert level(redis_client, "tpm") == pytest.approx(60_000)


@pytest.mark.parametrize("text", [
    "v=2;at=1", "at=1", "v=1", "v=1;at=abc", "v=1;at=nan", "v=1;at=-1", "v=1;at=1;tpm=1,2,3",
    "v=1;at=1;tpm=-5,,,0", "v=1;at=1;tpm=nan,,,0", "v=1;at=1;tpm=1e13,,,0", "v=1;at=1;tpm=1,,-1,0",
    "v=1;at=1;tpm=1,,1e9,0", "v=1;at=1;xyz=1", "v=1;at=1;sp=zzz", "v=1;at=1;tpm=1,,,0;tpm=1,,,0",
    "v=1;at=1;tpm", "v=1;at=1;" + "x" * 1000])
def test_a_bad_reading_is_refused_before_any_write(redis_client, text):
    a = adm(redis_client, pol=ceil_policy())
    ask = Ask(a)
    d, e = ask(T0, input_tokens=10, max_tokens=0), ask(T0, pool=Q)
    before = snapshot(redis_client)
    call = a.core.release(d.seat, now=T0, reading=reading(tpm=(1000, 10)))
    with pytest.raises(BadArgument, match="reading"):                          # past the client's check
        a._exec(dataclasses.replace(call, args=[*call.args[:-1], text]))
    call = a.core.progress([(e.seat, 1, reading(tpm=(1000, 10)))], now=T0)
    with pytest.raises(BadArgument, match="reading"):
        a._exec(dataclasses.replace(call, args=[*call.args[:-1], text]))
    assert snapshot(redis_client) == before


def test_a_bad_reading_is_an_error_for_the_caller_and_changes_nothing(redis_client):
    a = adm(redis_client, pol=ceil_policy())
    d = Ask(a)(T0)
    before = snapshot(redis_client)
    for bad in (Reading(T0, {"tpm": Limit("tpm", math.nan)}), Reading(T0, {"tpm": Limit("tpm", 1e13)}),
                Reading(T0, {"tpm": Limit("tpm", 10, reset_s=1e7)}), "v=1;at=x", 42):
        with pytest.raises(BadArgument):
            a.release(d.seat, now=T0, reading=bad)
    # a header the reader cannot read is ignored: the reading says nothing, nothing is learned
    assert ratelimits.read({"x-ratelimit-limit-tokens": "lots", "x-ratelimit-remaining-tokens": "-1"}).empty
    assert snapshot(redis_client) == before
    with pytest.raises(BadArgument):                                            # the round's exit: released without it
        with a.round(lane="a", model=Q, round_id="w1") as h:
            h.rate_reading = Reading(time.time(), {"rpm": Limit("rpm", -1.0)})
    assert not redis_client.exists("adm:{t}:seat:w1") and not redis_client.keys("adm:{t}:ceil:n@q")


def test_a_round_carries_its_rate_reading_to_progress_and_release(redis_client):
    a = adm(redis_client, pol=ceil_policy())
    headers = {"x-ratelimit-limit-requests": "600", "x-ratelimit-remaining-requests": "0",
               "x-ratelimit-reset-requests": "6s", "x-ratelimit-limit-tokens": "100000",
               "x-ratelimit-remaining-tokens": "70000", "x-ratelimit-reset-tokens": "18s"}
    with a.round(lane="a", model=Q, round_id="w1") as h:                       # the server's clock
        h.rate_reading = ratelimits.read({**headers, "x-ratelimit-limit-tokens": "90000"})
        h.progress(5)                                                           # carries the round's reading
        assert scope_state(redis_client, Q)["learned:tpm"] == "90000"
        h.rate_reading = ratelimits.read(headers)
    state = scope_state(redis_client, Q)                                        # the exit's release carried the last
    assert state["learned:tpm"] == "100000" and state["learned:rpm"] == "600"
    assert float(state["tpm"]) == 67_000 and float(state["rpm"]) == 0  # less 3 % of the 100k bucket


def test_the_asyncio_client_carries_a_reading_to_progress_and_release(async_client_factory):
    import asyncio

    from admission import AsyncAdmission

    async def main():
        client = async_client_factory()

        async def state(scope=Q):
            return {k.decode(): v.decode() for k, v in (await client.hgetall(f"adm:{{t}}:ceil:{scope}")).items()}

        a = AsyncAdmission(client, mesh="t", pod="pod-a", background=False)
        await a.ops.apply_policy(ceil_policy(), recovery_hold=False)
        d = await a.try_admit(lane="a", model=Q, round_id="x1", now=T0, draw=0.0, alternatives=[])
        await a.progress([(d.seat, 5, reading(tpm=(80_000, None)))], now=T0)
        assert (await state())["learned:tpm"] == "80000"
        r = await a.release(d.seat, now=T0, reading=reading(tpm=(80_000, 10_000)))
        assert r.status == Status.RELEASED and float((await state())["tpm"]) == pytest.approx(10_000 - 0.03 * 80_000)
        async with a.round(lane="a", model=P, round_id="x2") as h:                # the server's clock
            h.rate_reading = ratelimits.read({"anthropic-ratelimit-output-tokens-limit": "8000",
                                              "anthropic-ratelimit-output-tokens-remaining": "5000"})
            await h.progress(1)                                                 # carries the round's reading
            got = await state("key")
            assert got["learned:otpm"] == "8000" and float(got["otpm"]) == 4000  # minus the thousand's rounding
            h.rate_reading = ratelimits.read({"anthropic-ratelimit-output-tokens-limit": "9000"})
        assert (await state("key"))["learned:otpm"] == "9000"                   # the exit's release carried it
    asyncio.run(main())


def test_a_reading_replayed_from_the_outbox_learns_its_limits_and_lowers_nothing(redis_client):
    from admission.base import release_record
    a = adm(redis_client, pol=ceil_policy())
    d = a.try_admit(lane="a", model=P, round_id="o1", input_tokens=1000, max_tokens=0)  # the server's clock
    now = time.time()
    record = release_record(d.seat, "clean", 1.0, None, at=now - 60,
                            reading=reading(at=now - 60, tpm=(50_000, 0)))
    assert record["reading"] == ratelimits.encode(reading(at=now - 60, tpm=(50_000, 0)))   # kept encoded
    assert "reading" not in release_record(d.seat, "clean", 1.0, None)          # an old record's shape
    a._apply_record(record)                                                     # replayed a minute late
    state = scope_state(redis_client)
    assert state["learned:tpm"] == "50000" and float(state["tpm"]) > 0         # limit learned, stale remaining not
    a._apply_record(record)                                                     # the replay of a lost reply
    assert scope_state(redis_client)["learned:tpm"] == "50000"


def test_a_ceiling_429_on_a_pool_that_configures_none_holds_the_scope_it_learns(redis_client):
    """The reading of the 429 is learned first, so its spent ceiling holds a bucket of the scope
    learned in the same release: the next admit waits for the reset instead of meeting the same
    429 (a ceiling 429 pauses no pool: the hold is what paces it)."""
    a = adm(redis_client, pol=ceil_policy())
    ask = Ask(a)
    d = ask(T0, pool=Q)
    a.release(d.seat, outcome="ceiling", ceiling="tpm", reset_s=20, now=T0,
              reading=reading(tpm=(100_000, 0)))
    assert float(scope_state(redis_client, Q)["hold:tpm"]) == pytest.approx(T0 + 20)
    d = ask(T0 + 1, pool=Q, input_tokens=1000, max_tokens=0)
    assert d.reason == "ceiling-tpm" and d.wait_s > 0
