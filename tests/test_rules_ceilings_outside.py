"""Traffic on the same key from outside the mesh, learned from the providers' fresh readings
(docs/design.md §5.9; lua/include/readings.lua, ceilings.lua): over a window of at least 5 s
the gaps the readings lowered are what the drain estimate missed; it moves by half of that, and
the bucket refills at its rate less the drain, so the next admits leave the outside traffic its
share. A drain not refreshed within 60 s lapses. On fakeredis, Redis 7 and Valkey 8 with
clock = "caller", so time is exact."""
from __future__ import annotations

import pytest

from helpers import T0, adm
from test_rules_ceilings_learned import Ask, ceil_policy, level, reading, scope_state

RATE = 10_000  # tokens a second: tpm 600,000 at headroom 1


def census_row(a, now, limit="tpm"):
    doc = a.ops.census(now=now)
    scope = next(c for c in doc["ceilings"] if c["scope"] == "key")
    return next(r for r in scope["limits"] if r["limit"] == limit)


def drained(redis_client):
    """A bucket whose first window measured 5,000 tokens a second taken from outside."""
    a = adm(redis_client, pol=ceil_policy({"tpm": 600_000}))
    ask = Ask(a)
    d = ask(T0, input_tokens=500_000, max_tokens=0)                   # level 100,000
    a.release(d.seat, now=T0, reading=reading(at=T0, tpm=(600_000, 100_000)))   # the window starts
    d = ask(T0 + 10, input_tokens=0, max_tokens=0)
    assert level(redis_client, "tpm") == 100_000 + 10 * RATE          # ours: 200,000
    # the provider: 150,000 left, 5,000 a second went to a client outside the mesh
    a.release(d.seat, now=T0 + 10, reading=reading(at=T0 + 10, tpm=(600_000, 150_000)))
    assert level(redis_client, "tpm") == 150_000
    return a, ask


def test_traffic_from_outside_the_mesh_is_learned_as_a_drain_on_the_refill(redis_client):
    a, ask = drained(redis_client)
    assert float(scope_state(redis_client)["net:tpm"]) == 2_500        # half of the 5,000 missed
    ask(T0 + 20, input_tokens=0, max_tokens=0)
    assert level(redis_client, "tpm") == 150_000 + 10 * (RATE - 2_500)  # refilled at the net rate
    row = census_row(a, T0 + 20)
    assert row["outsidePerSecond"] == 2_500 and row["refillPerSecond"] == RATE - 2_500


def test_the_drain_follows_the_next_windows(redis_client):
    a, ask = drained(redis_client)
    d = ask(T0 + 20, input_tokens=0, max_tokens=0)                    # ours: 225,000
    # the provider's true net refill is 5,000 a second: 200,000 left
    a.release(d.seat, now=T0 + 20, reading=reading(at=T0 + 20, tpm=(600_000, 200_000)))
    assert float(scope_state(redis_client)["net:tpm"]) == 2_500 + 0.5 * 25_000 / 10
    d = ask(T0 + 30, input_tokens=0, max_tokens=0)
    # ours below the provider's now (the drain overshot): the estimate comes back down
    a.release(d.seat, now=T0 + 30, reading=reading(at=T0 + 30, tpm=(600_000, 300_000)))
    assert float(scope_state(redis_client)["net:tpm"]) == pytest.approx(3_750 - 0.5 * 37_500 / 10)


def test_a_window_shorter_than_five_seconds_measures_nothing_yet(redis_client):
    a = adm(redis_client, pol=ceil_policy({"tpm": 600_000}))
    ask = Ask(a)
    d = ask(T0, input_tokens=500_000, max_tokens=0)
    a.release(d.seat, now=T0, reading=reading(at=T0, tpm=(600_000, 100_000)))
    d = ask(T0 + 2, input_tokens=0, max_tokens=0)
    a.release(d.seat, now=T0 + 2, reading=reading(at=T0 + 2, tpm=(600_000, 110_000)))   # 10,000 lowered
    state = scope_state(redis_client)
    assert "net:tpm" not in state and float(state["low:tpm"]) == 10_000 and level(redis_client, "tpm") == 110_000
    d = ask(T0 + 6, input_tokens=0, max_tokens=0)                      # ours 150,000; 20,000 more lowered
    a.release(d.seat, now=T0 + 6, reading=reading(at=T0 + 6, tpm=(600_000, 130_000)))
    assert float(scope_state(redis_client)["net:tpm"]) == 0.5 * 30_000 / 6


def test_a_learned_drain_lapses_without_fresh_readings(redis_client):
    a, ask = drained(redis_client)
    assert census_row(a, T0 + 69)["outsidePerSecond"] == 2_500        # the window began at T0 + 10
    row = census_row(a, T0 + 71)
    assert row.get("outsidePerSecond") is None and row["refillPerSecond"] == RATE


def test_the_drain_leaves_a_bucket_a_tenth_of_its_rate(redis_client):
    """A key spent from outside as fast as it refills: the estimate goes 5,000, 7,500, 8,750,
    then stops at nine tenths of the rate; the bucket still refills a tenth."""
    a = adm(redis_client, pol=ceil_policy({"tpm": 600_000}))
    ask = Ask(a)
    d = ask(T0, input_tokens=600_000, max_tokens=0)
    a.release(d.seat, now=T0, reading=reading(at=T0, tpm=(600_000, 0)))
    for i, want in enumerate((5_000, 7_500, 8_750, 9_000), start=1):
        d = ask(T0 + 10 * i, input_tokens=0, max_tokens=0)
        a.release(d.seat, now=T0 + 10 * i, reading=reading(at=T0 + 10 * i, tpm=(600_000, 0)))   # always 0 left
        assert float(scope_state(redis_client)["net:tpm"]) == want
    ask(T0 + 50, input_tokens=0, max_tokens=0)
    assert level(redis_client, "tpm") == 10 * 0.1 * RATE


def test_a_readings_age_is_no_outside_traffic(redis_client):
    """The provider counted its remaining at the reading's time: what our bucket refilled since
    is lowered (the level follows the provider) but is not taken for another client's use."""
    a = adm(redis_client, pol=ceil_policy({"tpm": 600_000}))
    ask = Ask(a)
    d = ask(T0, input_tokens=500_000, max_tokens=0)
    a.release(d.seat, now=T0, reading=reading(at=T0, tpm=(600_000, 100_000)))
    d = ask(T0 + 10, input_tokens=0, max_tokens=0)                    # ours: 200,000
    # counted 1.5 s ago, when ours held 185,000: the provider agrees with us
    a.release(d.seat, now=T0 + 10, reading=reading(at=T0 + 8.5, tpm=(600_000, 185_000)))
    assert level(redis_client, "tpm") == 185_000 and float(scope_state(redis_client)["net:tpm"]) == 0
