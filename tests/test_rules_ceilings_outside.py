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


def test_a_window_measures_the_change_of_ours_less_the_provider_s(redis_client):
    """Ours 20,000 below the provider's at the window's start is no outside traffic at its end: the
    window counts what changed, 50,000 taken from outside in 10 s (not the 30,000 lowered)."""
    a = adm(redis_client, pol=ceil_policy({"tpm": 600_000}))
    ask = Ask(a)
    d = ask(T0, input_tokens=500_000, max_tokens=0)                   # ours 100,000
    a.release(d.seat, now=T0, reading=reading(at=T0, tpm=(600_000, 120_000)))   # the provider's 120,000
    d = ask(T0 + 10, input_tokens=0, max_tokens=0)                    # ours 200,000
    a.release(d.seat, now=T0 + 10, reading=reading(at=T0 + 10, tpm=(600_000, 170_000)))
    assert level(redis_client, "tpm") == 170_000
    assert float(scope_state(redis_client)["net:tpm"]) == 0.5 * 50_000 / 10


def test_the_outside_traffic_is_measured_against_the_provider_s_refill_not_ours(redis_client):
    """At headroom 0.5 ours refills 5,000 a second, the provider's 10,000: a provider that keeps
    pace with ours has lost 5,000 a second to another client."""
    a = adm(redis_client, pol=ceil_policy({"tpm": 600_000, "headroom": 0.5}))
    ask = Ask(a)
    d = ask(T0, input_tokens=250_000, max_tokens=0)                   # ours 50,000 of 300,000
    a.release(d.seat, now=T0, reading=reading(at=T0, tpm=(600_000, 50_000)))
    d = ask(T0 + 10, input_tokens=0, max_tokens=0)
    a.release(d.seat, now=T0 + 10, reading=reading(at=T0 + 10, tpm=(600_000, 100_000)))
    assert float(scope_state(redis_client)["net:tpm"]) == 0.5 * 5_000


def test_a_reading_of_a_full_provider_bucket_decays_the_drain(redis_client):
    """The provider's bucket full: it lost refill, so no one took what the drain says; the
    estimate halves and the window starts again."""
    a, ask = drained(redis_client)
    d = ask(T0 + 20, input_tokens=0, max_tokens=0)
    a.release(d.seat, now=T0 + 20, reading=reading(at=T0 + 20, tpm=(600_000, 600_000)))
    state = scope_state(redis_client)
    assert float(state["net:tpm"]) == 2_500 / 2 and float(state["from:tpm"]) == T0 + 20


def test_a_window_that_ends_with_ours_full_measures_nothing(redis_client):
    """Ours full lost its refill at its capacity: the gap is not another client's use."""
    a = adm(redis_client, pol=ceil_policy({"tpm": 600_000}))
    ask = Ask(a)
    d = ask(T0, input_tokens=500_000, max_tokens=0)
    a.release(d.seat, now=T0, reading=reading(at=T0, tpm=(600_000, 100_000)))
    d = ask(T0 + 55, input_tokens=0, max_tokens=0)                    # ours full at 600,000
    a.release(d.seat, now=T0 + 55, reading=reading(at=T0 + 55, tpm=(600_000, 400_000)))
    state = scope_state(redis_client)
    assert "net:tpm" not in state and level(redis_client, "tpm") == 400_000 and float(state["from:tpm"]) == T0 + 55


def test_an_output_counted_as_produced_learns_no_drain(redis_client):
    """Anthropic's output is counted at the end: ours holds the reservations in flight, the
    provider's does not, so the gap measures no one's use. The reading still lowers ours."""
    a = adm(redis_client, pol=ceil_policy({"otpm": 600_000, "output_charge": "received"}))
    ask = Ask(a)
    d = ask(T0, input_tokens=0, max_tokens=500_000)
    a.release(d.seat, now=T0, reading=reading(at=T0, otpm=(600_000, 100_000)))
    d = ask(T0 + 10, input_tokens=0, max_tokens=0)
    a.release(d.seat, now=T0 + 10, reading=reading(at=T0 + 10, otpm=(600_000, 150_000)))
    state = scope_state(redis_client)
    assert level(redis_client, "otpm") == 150_000 and "net:otpm" not in state and "from:otpm" not in state


def test_a_window_holds_twenty_of_a_reading_s_units_of_refill(redis_client):
    """Remainings rounded to the thousand on a 1,000-a-second bucket: the window lasts 20 s, not
    5 (one rounding in 5 s of refill is a fifth of it)."""
    a = adm(redis_client, pol=ceil_policy({"tpm": 60_000}))
    ask = Ask(a)
    d = ask(T0, input_tokens=50_000, max_tokens=0)                    # ours 10,000
    a.release(d.seat, now=T0, reading=reading(at=T0, tpm=(60_000, 10_000, 1000)))   # lowered to 9,000
    d = ask(T0 + 10, input_tokens=0, max_tokens=0)                    # ours 19,000
    a.release(d.seat, now=T0 + 10, reading=reading(at=T0 + 10, tpm=(60_000, 15_000, 1000)))
    assert "net:tpm" not in scope_state(redis_client) and level(redis_client, "tpm") == 14_000
    d = ask(T0 + 20, input_tokens=0, max_tokens=0)                    # ours 24,000
    a.release(d.seat, now=T0 + 20, reading=reading(at=T0 + 20, tpm=(60_000, 20_000, 1000)))
    assert float(scope_state(redis_client)["net:tpm"]) == 0.5 * 10_000 / 20   # 500 a second taken


def test_a_configured_limit_below_the_provider_s_leaves_the_outside_traffic_its_room(redis_client):
    """tpm 300,000 configured on a key of 600,000: of 8,000 a second taken from outside, the
    provider's 5,000 a second above ours absorb 5,000; ours refills 3,000 less."""
    a = adm(redis_client, pol=ceil_policy({"tpm": 300_000}))
    ask = Ask(a)
    ask(T0, input_tokens=0, max_tokens=0)
    redis_client.hset("adm:{t}:ceil:key", mapping={"learned:tpm": 600_000, "net:tpm": 8_000, "netAt": T0})
    row = census_row(a, T0 + 1)
    assert row["outsidePerSecond"] == 3_000 and row["refillPerSecond"] == 5_000 - 3_000
