"""What operators read (lua/include/events.lua): the `events` stream keeps transitions (an
`expired` event per swept seat, `probe`, `grew`, `exhausted`, `closed`, `reopened`), refusals and
a borrow's sheds are counted per pool x lane x reason in a hash per minute (kept a day) instead of
streamed, and `totals` keeps the cumulative counts. One test per rule, named after it; each runs
on fakeredis, Redis 7 and Valkey 8. Also: the CLI's readers of them (filters, the refusal
window), the census key's lists, and error messages without the Lua location."""
from __future__ import annotations

import json

import pytest
import redis

from admission import Admission
from admission.cli import EventFilter, latest_events, refusal_counts
from admission.errors import NoPolicy, from_reply, without_location
from admission.view import event_time, render_event

from helpers import POOL, T0, adm, policy

MINUTE = int(T0 // 60 * 60)
ONE_LANE = {"a": {"floor": 0.5, "weight": 1, "priority": 2}, "b": {"floor": 0.3, "weight": 1, "priority": 1}}
NO_FLOORS = {"a": {"floor": 0, "weight": 1, "priority": 2}, "b": {"floor": 0, "weight": 1, "priority": 1}}


def stream(client, mesh="t") -> list[dict[str, str]]:
    return [{k.decode(): v.decode() for k, v in f.items()} for _, f in client.xrange(f"adm:{{{mesh}}}:events")]


def kinds(client) -> list[str]:
    return [e["kind"] for e in stream(client)]


def totals(client) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall("adm:{t}:totals").items()}


def minute_counts(client, minute=MINUTE) -> dict[str, int]:
    return {k.decode(): int(v) for k, v in client.hgetall(f"adm:{{t}}:refusals:{minute}").items()}


def ask(a, lane="a", pool=POOL, rid=None, now=T0, **kw):
    ask.n = getattr(ask, "n", 0) + 1
    return a.try_admit(lane=lane, model=pool, round_id=rid or f"q{ask.n}", now=now, draw=0.0, **kw)


def full_pool(client, **tunables):
    """A pool of 2 slots held by lane a; lanes without floors: every other ask is refused `full`."""
    a = adm(client, pol=policy(NO_FLOORS, **{"seed_estimate": 2, "max_estimate": 2, **tunables}))
    seats = [ask(a).seat, ask(a).seat]
    return a, seats


# -- refusals are counted, not streamed ------------------------------------------------------------------


def test_refusals_are_counted_not_streamed(redis_client):
    a, _ = full_pool(redis_client)
    before = len(stream(redis_client))
    for i in range(5):
        assert not ask(a, now=T0 + i).admitted
    assert ask(a, "b", now=T0 + 5, wait=True).reason == "full"
    assert "refused" not in kinds(redis_client) and len(stream(redis_client)) == before
    assert minute_counts(redis_client) == {"m@p|a|full": 5, "m@p|b|full": 1}
    t = totals(redis_client)
    assert (t["refused|m@p|a|full"], t["refused|m@p|b|full"]) == (5, 1)


def test_refusals_minute_hash_per_minute_kept_a_day(redis_client):
    a, _ = full_pool(redis_client)
    ask(a, now=T0 + 1)
    ask(a, now=T0 + 61)
    ask(a, now=T0 + 62)
    assert minute_counts(redis_client) == {"m@p|a|full": 1}
    assert minute_counts(redis_client, MINUTE + 60) == {"m@p|a|full": 2}
    for m in (MINUTE, MINUTE + 60):
        assert 86000 < redis_client.ttl(f"adm:{{t}}:refusals:{m}") <= 86400
    assert totals(redis_client)["refused|m@p|a|full"] == 3
    assert redis_client.ttl("adm:{t}:totals") == -1                           # never expires


def test_refusals_a_busy_mesh_keeps_its_transitions_in_the_stream(redis_client):
    a, seats = full_pool(redis_client)
    for i in range(300):
        ask(a, rid=f"busy{i % 7}", now=T0 + i / 10)
    a.release(seats[0], outcome="clean", seconds=1, now=T0 + 31)
    assert kinds(redis_client) == ["config", "admitted", "admitted", "released"]
    assert sum(minute_counts(redis_client).values()) == 300


def test_refusals_a_borrows_shed_is_counted_not_streamed(redis_client):
    P, Q = "m@p", "m@q"
    pol = policy({"a": {"floor": 0, "weight": 1, "priority": 1}}, pools=(P, Q))
    pol["pools"][Q] = {"health_required": True}
    a = adm(redis_client, pol=pol)
    d = a.try_admit(lane="a", model=P, round_id="I1", borrow=Q, now=T0, draw=0.0)
    assert d.reason == "reject_stale_borrowed_health"
    a.try_admit(lane="a", model=P, round_id="I1", borrow=Q, now=T0 + 1, draw=0.0)   # the same decision again
    assert "shed" not in kinds(redis_client)
    assert minute_counts(redis_client) == {"m@q|a|reject_stale_borrowed_health": 1}   # counted once
    assert totals(redis_client) == {"refused|m@q|a|reject_stale_borrowed_health": 1}


# -- transitions in the stream ------------------------------------------------------------------------------


def test_expired_seat_is_an_event_with_its_pool_lane_and_pod(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=30))
    d = ask(a, "b", rid="dead-pod-round")
    a.tick(now=T0 + 31)                                                      # the clock sweeps it
    expired = [e for e in stream(redis_client) if e["kind"] == "expired"]
    assert expired == [{"kind": "expired", "round": "dead-pod-round", "pool": POOL, "lane": "b", "pod": "pod-a"}]
    assert d.seat and a.ops.census(now=T0 + 31)["pools"][0]["running"] == 0


def test_expired_seat_swept_by_an_admit_is_an_event_too(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=30))
    ask(a, rid="gone")
    ask(a, rid="next", now=T0 + 40)
    assert [e["round"] for e in stream(redis_client) if e["kind"] == "expired"] == ["gone"]


def test_growth_and_decrease_are_events(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, grow_interval=10))
    seats = [ask(a).seat, ask(a).seat]                                      # full: demand
    a.tick(now=T0 + 10)
    grew = [e for e in stream(redis_client) if e["kind"] == "grew"]
    assert grew == [{"kind": "grew", "pool": POOL, "est": "4", "cap": "0"}]
    a.release(seats[0], outcome="rate_limited", seconds=1, now=T0 + 11)
    exhausted = [e for e in stream(redis_client) if e["kind"] == "exhausted"]
    # seats[0] was admitted first (load 1): its 429 measures K = 1; 2 rounds ran when it came
    assert [(e["pool"], e["why"], e["running"], e["cap"]) for e in exhausted] == [(POOL, "rate_limited", "2", "1")]
    a.release(seats[1], outcome="clean", seconds=1, now=T0 + 11)


def test_probe_is_an_event_and_closure_and_reopen_are_counted(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, probe_every=10))
    a.release(ask(a).seat, outcome="key_daily_limit", seconds=1, now=T0)
    probe = ask(a, now=T0 + 10)
    assert probe.reason == "probe"
    a.release(probe.seat, outcome="clean", seconds=1, now=T0 + 11)
    events = stream(redis_client)
    assert [e["kind"] for e in events if e["kind"] in ("closed", "probe", "reopened")] == ["closed", "probe", "reopened"]
    p = next(e for e in events if e["kind"] == "probe")
    assert (p["provider"], p["pool"], p["round"], p["lane"], p["pod"]) == ("p", POOL, probe.round_id, "a", "pod-a")
    t = totals(redis_client)
    assert t["closed|p|key_daily_limit"] == 1 and t["reopened|p|probe"] == 1
    assert t["probe|m@p"] == 1 and t["admitted|m@p|a|probe"] == 1


# -- totals -------------------------------------------------------------------------------------------------


def test_totals_count_admissions_per_pool_lane_and_reason(redis_client):
    a, seats = full_pool(redis_client)
    ask(a, rid=seats[0].id)                                                  # same intent: no new admission
    assert {k: v for k, v in totals(redis_client).items() if k.startswith("admitted|")} == {
        "admitted|m@p|a|borrowed": 2}


def test_totals_count_signals_not_clean_or_error(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, seed_estimate=8))
    s = [ask(a).seat for _ in range(5)]
    a.release(s[0], outcome="clean", seconds=1, now=T0)
    a.release(s[1], outcome="error", seconds=1, now=T0)
    a.report(s[2], signal="stall", now=T0)
    a.report(s[2], signal="stall", now=T0 + 1)                               # ALREADY_REPORTED: not counted
    a.release(s[3], outcome="rate_limited", seconds=1, now=T0 + 2)
    a.release(s[4], outcome="credit", seconds=1, now=T0 + 3)
    signals = {k: v for k, v in totals(redis_client).items() if k.startswith(("signal|", "closed|"))}
    assert signals == {"signal|m@p|stall": 1, "signal|m@p|rate_limited": 1, "signal|m@p|credit": 1,
                       "closed|p|credit": 1}
    a.release(s[2], outcome="stall", seconds=1, now=T0 + 4)                  # the stall it reported: once
    assert totals(redis_client)["signal|m@p|stall"] == 1


def test_totals_count_moves_from_the_pool_asked_for(redis_client):
    A, B = "m@pa", "m@pb"
    pol = policy(NO_FLOORS, pools=(A, B), seed_estimate=1, max_estimate=1)
    pol["tiers"], pol["alternatives"] = {}, {A: [B]}
    a = adm(redis_client, pol=pol)
    assert ask(a, pool=A).pool == A
    assert ask(a, pool=A, alternatives=[B]).pool == B                       # moved
    t = totals(redis_client)
    assert t["moved|m@pa|m@pb"] == 1 and t["admitted|m@pb|a|borrowed"] == 1 and "moved|m@pa|m@pa" not in t


# -- the read model's lists, error messages ----------------------------------------------------------------


def test_raw_census_key_writes_empty_lists_as_lists(redis_client):
    """Redis' and Valkey's cjson write an empty table as {} (fakeredis writes [] by itself)."""
    a = adm(redis_client, pol=policy(ONE_LANE))
    a.ops.census(now=T0)
    raw = redis_client.get("adm:{t}:census").decode()
    assert '"starving":[]' in raw and '"lanes":[]' in raw and '"mustYield":[]' in raw and "{}" not in raw
    assert json.loads(raw)["starving"] == []


def test_error_messages_carry_no_lua_location(redis_client):
    a = Admission(redis_client, mesh="nothing", pod="p", background=False)
    with pytest.raises(NoPolicy) as err:
        a.ops.census()
    assert "script:" not in str(err.value) and "@user_function" not in str(err.value)
    assert str(err.value).startswith("no policy applied to this mesh")
    # what Redis 7 and Valkey 8 append to a function's error reply, as the issue saw it
    raw = "ADM_NO_CONFIG no policy applied to this mesh script: adm_census_9cb594839e76, on @user_function:129."
    assert str(from_reply(raw)) == "no policy applied to this mesh"
    assert without_location("OOM command not allowed script: adm_admit_0a, on @user_function:12.") == \
        "OOM command not allowed"


# -- the CLI's readers ---------------------------------------------------------------------------------------


def test_events_cli_filters_and_the_latest_matching(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=30, seed_estimate=8))
    b = Admission(redis_client, mesh="t", pod="pod-b", background=False)
    ask(a, "a", rid="a1")
    ask(b, "b", rid="b1")
    ask(a, "b", rid="a2")
    a.tick(now=T0 + 31)                                                      # all three expire
    key = "adm:{t}:events"
    got, top = latest_events(redis_client, key, 2, EventFilter(kinds=["expired"]))
    assert [f["round"] for _, f in got] == ["a2", "b1"] and top == got[-1][0]   # swept in id order
    got, _ = latest_events(redis_client, key, 10, EventFilter(kinds=["admitted,expired"], pods=["pod-b"]))
    assert [(f["kind"], f["round"]) for _, f in got] == [("admitted", "b1"), ("expired", "b1")]
    got, _ = latest_events(redis_client, key, 10, EventFilter(lanes=["b"], pools=[POOL]))
    assert [(f["kind"], f["round"]) for _, f in got] == [("admitted", "b1"), ("admitted", "a2"),
                                                          ("expired", "a2"), ("expired", "b1")]
    got, _ = latest_events(redis_client, key, 10, EventFilter(pools=["other@q"]))
    assert got == []
    eid, f = latest_events(redis_client, key, 1, EventFilter())[0][0]
    assert render_event(eid, f).startswith(event_time(eid) + " kind=expired ")
    assert event_time("1800000000123-0") == "2027-01-15T08:00:00.123Z"


def test_events_cli_a_pool_filter_keeps_its_providers_closures(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, pools=("m@p", "n@q")))
    a.ops.close_provider("p", why="maintenance", seconds=60, now=T0)
    a.ops.close_provider("q", why="maintenance", seconds=60, now=T0)
    got, _ = latest_events(redis_client, "adm:{t}:events", 10, EventFilter(pools=["m@p"]))
    assert [(f["kind"], f["provider"]) for _, f in got] == [("closed", "p")]


def test_events_cli_refusal_counts_sum_the_minutes_of_the_window(redis_client):
    a, _ = full_pool(redis_client)
    ask(a, now=T0 - 120)                                                     # 2 minutes before
    ask(a, now=T0 + 1)
    ask(a, "b", now=T0 + 2)
    ask(a, "b", now=T0 + 3)
    rows, start, end = refusal_counts(redis_client, "t", T0 + 5, 1)
    assert rows == [("m@p", "a", "full", 1), ("m@p", "b", "full", 2)] and (start, end) == (MINUTE, MINUTE + 60)
    rows, start, _ = refusal_counts(redis_client, "t", T0 + 5, 3)
    assert rows[0] == ("m@p", "a", "full", 2) and start == MINUTE - 120
