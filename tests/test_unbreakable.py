"""Nothing orphaned, nothing over-admitted: every way out of a wait, a round or a call leaves no
seat or ticket behind, a live policy change never lapses a live seat, and a restart or a clock
that steps back never lets a pool run more than its slots. Each test is named after its rule and
was written to fail before the fix."""
from __future__ import annotations

import asyncio
import datetime
import types
import json
import logging
import threading
import time

import pytest
import redis

from admission import Admission, AsyncAdmission, Status
from admission import base, scripts
from admission.tools.servers import LocalServer
from admission.errors import (BadArgument, NotYourSeat, PolicyError, RoundInProgress, ScriptError,
                              UnknownLane, UnknownSeat)

from helpers import POOL, T0, Rounds, adm, policy, pool_state, snapshot

ONE_LANE = {"x": {"floor": 0, "weight": 1, "priority": 1}}
TWO_LANES = {"x": {"floor": 0.5, "weight": 1, "priority": 2}, "y": {"floor": 0.5, "weight": 1, "priority": 1}}
LANES0 = {"x": {"floor": 0, "weight": 1, "priority": 2}, "y": {"floor": 0, "weight": 1, "priority": 1}}
XY = {"x": {"floor": 0, "weight": 1, "priority": 2}, "y": {"floor": 0.5, "weight": 1, "priority": 1}}
OTHER = "n@p"


def _wait_for(cond, seconds: float = 10.0, step: float = 0.01) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def _tickets(client, mesh: str = "t") -> list[bytes]:
    return client.zrange(f"adm:{{{mesh}}}:tickets", 0, -1)


def _queue(client, lane: str = "x", pool: str = POOL, mesh: str = "t") -> list[bytes]:
    return client.zrange(f"adm:{{{mesh}}}:wait:{pool}:{lane}", 0, -1)


# -- 1. an abandoned waiter -------------------------------------------------------------------

def test_a_cancelled_async_waiter_leaves_no_ticket_and_blocks_no_newcomer(async_client_factory):
    async def main():
        client = async_client_factory()
        a = AsyncAdmission(client, mesh="t", pod="a", background=False)
        await a.ops.apply_policy(policy(ONE_LANE, max_estimate=2, grow_interval=60), recovery_hold=False)
        seats = [(await a.try_admit(lane="x", model=POOL, round_id=f"h{i}")).seat for i in range(2)]
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.3):
                async with a.round(lane="x", model=POOL, round_id="w", timeout=60):
                    pass
        assert a._book.waiters == {} and await client.zcard("adm:{t}:tickets") == 0
        await a.heartbeat()                                       # renews nothing of the waiter
        await a.release(seats[0])
        b = AsyncAdmission(async_client_factory(), mesh="t", pod="b", background=False)
        d = await b.try_admit(lane="x", model=POOL, round_id="new")
        assert d.admitted, d                                      # not behind-older a phantom
        await a.close()
    asyncio.run(main())


def test_a_waiter_left_by_an_error_reply_withdraws_its_ticket(redis_client):
    pol = policy(XY, max_estimate=2, grow_interval=60)
    a = adm(redis_client, pol=pol)
    Rounds(a).fill("y", 2)
    errors = []

    def run():
        try:
            with a.round(lane="x", model=POOL, round_id="w", timeout=30):
                pass
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    assert _wait_for(lambda: len(_queue(redis_client)) == 1)
    a.ops.apply_policy(policy({"y": XY["y"]}, max_estimate=2, grow_interval=60))   # lane x removed
    a._wake(POOL)                                                 # it re-asks: UnknownLane
    t.join(10)
    a.close()
    assert errors and isinstance(errors[0], UnknownLane)
    assert a._book.waiters == {} and _tickets(redis_client) == [] and _queue(redis_client) == []


def test_heartbeat_renews_only_tickets_whose_lane_and_pool_still_exist(redis_client):
    a = adm(redis_client, pol=policy(LANES0, pools=(POOL, OTHER), seed_estimate=1, max_estimate=1))
    r = Rounds(a)
    r.fill("y", 1)
    r.fill("y", 1, pool=OTHER)
    assert not r.ask("x", wait=True, round_id="gone-lane").admitted
    assert not r.ask("y", pool=OTHER, wait=True, round_id="gone-pool").admitted
    assert not r.ask("y", wait=True, round_id="stays").admitted
    a.ops.apply_policy(policy({"y": LANES0["y"]}, pools=(POOL,), seed_estimate=1, max_estimate=1))
    hb = a.heartbeat(now=T0 + 1)
    assert sorted(hb.lost_tickets) == ["gone-lane", "gone-pool"]
    assert _tickets(redis_client) == [b"stays"]
    assert _queue(redis_client) == [] and _queue(redis_client, "y", OTHER) == []
    assert pool_state(redis_client)["waiting"] == "1" and pool_state(redis_client, OTHER)["waiting"] == "0"


# -- 2. a live policy change ------------------------------------------------------------------

def test_a_live_policy_change_never_lapses_a_live_seat(redis_client):
    a = adm(redis_client, pol=policy(TWO_LANES, pools=(POOL, OTHER), lease_ttl=30))
    r = Rounds(a)
    on_lane = r.fill("x", 1)[0]
    on_pool = r.fill("y", 1, pool=OTHER)[0]
    a.ops.apply_policy(policy({"y": TWO_LANES["y"]}, pools=(POOL,), lease_ttl=30))   # x and n@p removed
    hb = a.heartbeat(now=T0 + 20)
    assert hb.lost == [] and hb.reasserted == []
    seats = dict(redis_client.zrange("adm:{t}:seats", 0, -1, withscores=True))
    assert seats == {on_lane.id.encode(): T0 + 50, on_pool.id.encode(): T0 + 50}
    a.tick(now=T0 + 40)                                           # past the first lease: nothing swept
    assert pool_state(redis_client)["running"] == "1" and pool_state(redis_client, OTHER)["running"] == "1"
    assert a.release(on_lane, now=T0 + 41).status == Status.RELEASED
    assert a.release(on_pool, now=T0 + 41, cost_usd=0.5).status == Status.RELEASED
    assert pool_state(redis_client, OTHER)["running"] == "0"
    assert redis_client.hget("adm:{t}:spend:2027-01-15", "y|p") == b"500000"   # booked to the pool's provider


def test_a_failing_heartbeat_never_stops_the_tick_or_the_watchdog(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, grow_interval=0.2, lease_ttl=3))
    a.background = True
    calls = {"tick": 0, "watchdog": 0, "heartbeat": 0}

    def broken_heartbeat(now=None):
        calls["heartbeat"] += 1
        raise UnknownLane("lane x is not in the policy")

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    a.heartbeat = broken_heartbeat
    a.tick = counting("tick", a.tick)
    a._watchdog = counting("watchdog", a._watchdog)
    a._ensure_clock()
    assert _wait_for(lambda: calls["tick"] >= 2 and calls["watchdog"] >= 2, 10)
    assert calls["heartbeat"] >= 2                                # retried on the next turn, not a period later
    a.close()


# -- 3. a release that gets an error reply ----------------------------------------------------

def test_a_round_that_ended_is_never_re_asserted_whatever_its_release_answered(redis_client, caplog):
    pol = policy(ONE_LANE)
    a = adm(redis_client, pol=pol)
    with a.round(lane="x", model=POOL, round_id="r1") as r:
        redis_client.flushall()                                   # a restart without persistence
    assert a._book.seats == {}                                    # forgotten: NoPolicy on release
    assert [r["seat"][0] for r in a._pending.memory] == ["r1"]    # kept for a retry, not dropped
    a.ops.apply_policy(pol, recovery_hold=False)
    hb = a.heartbeat()
    assert hb.reasserted == [] and pool_state(redis_client).get("running", "0") == "0"
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="admission"):
        a.flush()                                                 # UnknownSeat now: recorded
    assert len(a._pending) == 0
    logs = [r.admission for r in caplog.records]
    assert [e["event"] for e in logs] == ["release_unapplied"] and logs[0]["round"] == "r1"
    assert r.seat.id == "r1"


def test_a_release_redis_cannot_reach_waits_in_the_outbox_and_counts_once(redis_client, tmp_path):
    path = tmp_path / "pod-a.outbox"
    a = Admission(redis_client, mesh="t", pod="pod-a", background=False, outbox=path)
    a.ops.apply_policy(policy(ONE_LANE), recovery_hold=False)
    real = scripts.call
    try:
        with a.round(lane="x", model=POOL, round_id="r1") as r:
            r.cost_usd = 0.25
            scripts.call = lambda *a_, **k: (_ for _ in ()).throw(redis.ConnectionError("down"))
    finally:
        scripts.call = real
    assert len(a._pending) == 1 and a._book.seats == {} and a._pending.memory == type(a._pending.memory)()
    a._pending.outbox.close()                                     # the pod dies here
    b = Admission(redis_client, mesh="t", pod="pod-a", background=False, outbox=path)   # and restarts
    assert b.flush() == 0
    assert b.flush() == 0                                         # nothing twice
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert pool_state(redis_client)["running"] == "0"
    assert b.ops.ledger(today) == {"x": {"p": 0.25}, "*": {"p": 0.25}}


def test_a_bad_price_on_a_round_still_releases_its_seat(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE))
    with pytest.raises(BadArgument):
        with a.round(lane="x", model=POOL, round_id="r1") as r:
            r.cost_usd = float("nan")
    assert a._book.seats == {} and pool_state(redis_client)["running"] == "0"


# -- 4. and 5. one round id, one holder -------------------------------------------------------

def test_same_intent_drops_the_askers_ticket_one_id_one_holder(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=30, seed_estimate=1, max_estimate=1))
    b = adm(redis_client, pod="pod-b", apply=False)
    x = a.try_admit(lane="x", model=POOL, round_id="X", now=T0, draw=0.0).seat
    a.tick(now=T0 + 31)                                          # A's lease lapsed: swept
    filler = a.try_admit(lane="x", model=POOL, round_id="f", now=T0 + 31, draw=0.0)
    assert filler.admitted
    assert not b.try_admit(lane="x", model=POOL, round_id="X", now=T0 + 32, draw=0.0, wait=True).admitted
    assert _tickets(redis_client) == [b"X"]
    hb = a.heartbeat(now=T0 + 33)                                # A's round still runs: re-asserted
    assert hb.reasserted == ["X"] and x.id == "X"
    assert _tickets(redis_client) == [] and _queue(redis_client) == []   # never a seat and a ticket
    d = b.try_admit(lane="x", model=POOL, round_id="X", now=T0 + 34, draw=0.0, wait=True)
    assert d.reason == "same-intent" and d.seat.pod == "pod-a"
    assert b._book.waiters == {} and b._book.seats == {}         # no phantom in B's book
    with pytest.raises(NotYourSeat):
        with b.round(lane="x", model=POOL, round_id="X", timeout=1):
            pass
    assert b._book.waiters == {} and _tickets(redis_client) == []


def test_same_intent_clears_a_ticket_left_beside_a_seat_one_id_one_holder(redis_client):
    """A seat and a ticket of one id (a state an older version could leave): asking again keeps
    the seat's decision and drops the ticket, counts and queue included."""
    a = adm(redis_client, pol=policy(ONE_LANE))
    x = Rounds(a).fill("x", 1)[0]
    redis_client.hset(f"adm:{{t}}:ticket:{x.id}", mapping={"lane": "x", "pool": POOL, "pod": "pod-b",
                                                          "agent": "", "since": repr(T0)})
    redis_client.zadd("adm:{t}:tickets", {x.id: T0 + 100})
    redis_client.zadd(f"adm:{{t}}:wait:{POOL}:x", {x.id: T0})
    redis_client.hincrby(f"adm:{{t}}:lanes:{POOL}", "x|w", 1)
    redis_client.hincrby(f"adm:{{t}}:pool:{POOL}", "waiting", 1)
    d = a.try_admit(lane="x", model=POOL, round_id=x.id, now=T0 + 1, wait=True)
    assert d.reason == "same-intent" and d.seat.pod == "pod-a"
    assert _tickets(redis_client) == [] and _queue(redis_client) == []
    assert pool_state(redis_client)["waiting"] == "0"


def test_the_same_round_id_twice_in_one_pod_runs_once(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, seed_estimate=4))
    with a.round(lane="x", model=POOL, round_id="r1"):
        with pytest.raises(RoundInProgress):
            with a.round(lane="x", model=POOL, round_id="r1"):
                pass
        assert pool_state(redis_client)["running"] == "1"
    with a.round(lane="x", model=POOL, round_id="r1"):          # after it ended: runs again
        assert pool_state(redis_client)["running"] == "1"
    assert pool_state(redis_client)["running"] == "0"


# -- 6. partial writes ------------------------------------------------------------------------

def _raw(client, command: str, args: list) -> None:
    scripts.call(client, command, ["adm:{t}:config"], args)


def test_money_out_of_range_is_refused_before_any_write(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE))
    seat = Rounds(a).fill("x", 1)[0]
    with pytest.raises(BadArgument):
        a.release(seat, cost_usd=1e11)
    a._book.hold(seat)
    before = snapshot(redis_client)
    with pytest.raises(redis.ResponseError, match="ADM_BAD_ARG"):
        _raw(redis_client, "release", [seat.id, str(seat.seq), "pod-a", "clean", "1", "100000000000000000", repr(T0)])
    assert snapshot(redis_client) == before
    with pytest.raises(redis.ResponseError, match="ADM_BAD_ARG"):     # 1e7 USD: exact, but past one charge's bound
        _raw(redis_client, "release", [seat.id, str(seat.seq), "pod-a", "clean", "1", "10000000000000", repr(T0)])
    assert snapshot(redis_client) == before
    redis_client.hset("adm:{t}:spend:2027-01-15", "x|p", 2 ** 53 - 10)
    before = snapshot(redis_client)
    with pytest.raises(redis.ResponseError, match="2\\^53"):
        _raw(redis_client, "release", [seat.id, str(seat.seq), "pod-a", "clean", "1", "11", repr(T0)])
    assert snapshot(redis_client) == before
    assert a.release(seat, cost_usd=0.000001, now=T0).status == Status.RELEASED


def test_policy_size_is_bounded_before_the_catalog_is_touched(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE))
    big = policy(ONE_LANE, pools=tuple(f"m{i}@p" for i in range(4000)))
    with pytest.raises(PolicyError, match="at most 1000"):
        a.ops.apply_policy(big)
    doc = {"lanes": [{"name": "x", "floor": 0, "weight": 1, "priority": 1}],
           "tunables": json.loads(redis_client.hget("adm:{t}:config", "tunables")),
           "pools": [{"name": f"m{i}@p", "provider": "p"} for i in range(1001)]}
    before = snapshot(redis_client)
    with pytest.raises(redis.ResponseError, match="ADM_BAD_POLICY"):
        _raw(redis_client, "apply_config", ["", json.dumps(doc), "tok", "", "0"])
    assert snapshot(redis_client) == before
    doc["pools"] = doc["pools"][:1000]
    _raw(redis_client, "apply_config", ["", json.dumps(doc), "tok", "", "0"])     # at the bound: whole
    assert len(json.loads(redis_client.hget("adm:{t}:config", "pools"))) == 1000


def test_no_raw_response_error_leaves_the_client(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE))
    redis_client.delete(f"adm:{{t}}:pool:{POOL}")
    redis_client.set(f"adm:{{t}}:pool:{POOL}", "not a hash")     # a server-side error in the script
    with pytest.raises(ScriptError):
        a.try_admit(lane="x", model=POOL, round_id="r", now=T0)
    redis_client.delete(f"adm:{{t}}:pool:{POOL}")


# -- 7. a try elsewhere -----------------------------------------------------------------------

def test_a_refused_try_on_another_pool_keeps_the_waiters_place(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, pools=(POOL, OTHER), seed_estimate=1, max_estimate=1))
    r = Rounds(a)
    r.fill("x", 1)
    other = r.fill("x", 1, pool=OTHER)[0]
    w = r.ask("x", wait=True, round_id="w")
    assert not w.admitted
    before = redis_client.zrange(f"adm:{{t}}:wait:{POOL}:x", 0, -1, withscores=True)
    assert not r.ask("x", pool=OTHER, round_id="w").admitted          # a try: refused
    assert redis_client.zrange(f"adm:{{t}}:wait:{POOL}:x", 0, -1, withscores=True) == before
    assert pool_state(redis_client)["waiting"] == "1" and a._book.waiters["w"].pool == POOL
    a.release(other, now=T0)
    assert r.ask("x", pool=OTHER, round_id="w").admitted               # the move: admitted elsewhere
    assert _queue(redis_client) == [] and pool_state(redis_client)["waiting"] == "0"
    assert a._book.waiters == {} and "w" in a._book.seats


# -- 8. wake-ups across pods ------------------------------------------------------------------

def test_an_admission_wakes_the_next_waiters_of_every_pod(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, max_estimate=4, seed_estimate=4))
    seats = Rounds(a).fill("x", 4)
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe("adm:{t}:wake")
    for i in range(3):
        assert not a.try_admit(lane="x", model=POOL, round_id=f"w{i}", now=T0 + 1 + i, draw=0.0, wait=True).admitted
    for s in seats[:2]:
        a.release(s, now=T0 + 5)
    _drain(pubsub)
    assert a.try_admit(lane="x", model=POOL, round_id="w0", now=T0 + 6, draw=0.0, wait=True).admitted
    assert _drain(pubsub) == [POOL]                       # one slot left, waiters left: wake them now
    assert a.try_admit(lane="x", model=POOL, round_id="w1", now=T0 + 6, draw=0.0, wait=True).admitted
    assert _drain(pubsub) == []                           # full: nothing to wake
    pubsub.close()


def _drain(pubsub) -> list[str]:
    out, deadline = [], time.monotonic() + 0.3
    while time.monotonic() < deadline:
        msg = pubsub.get_message(timeout=0.05)
        if msg:
            out.append(msg["data"].decode())
    return out


def test_a_freed_slot_is_taken_within_100ms_by_a_waiter_on_any_pod(real_engine, server_pool):
    """Waiters of one lane on two pods; several seats released at once. The latency from the
    release to the last of the freed slots being taken, over many trials: p50 and p99."""
    url = server_pool.get(real_engine).url
    client = redis.Redis.from_url(url)
    client.flushall()
    pol = policy(ONE_LANE, max_estimate=4, seed_estimate=4, grow_interval=60, high_free=0.01)   # no draws
    pol.pop("clock")
    holder = Admission(client, mesh="t", pod="holder", background=False)
    holder.ops.apply_policy(pol, recovery_hold=False)
    pods = [Admission(redis.Redis.from_url(url), mesh="t", pod=f"p{i}") for i in range(2)]
    latencies, trials, freed = [], 25, 3
    admitted: list[tuple[float, object]] = []
    lock = threading.Lock()

    def waiter(pod, rid):
        d = pod.admit_waiting(lane="x", model=POOL, round_id=rid, timeout=30)
        with lock:
            admitted.append((time.monotonic(), (pod, d.seat)))

    for trial in range(trials):
        seats = [holder.try_admit(lane="x", model=POOL, round_id=f"h{trial}-{i}", draw=0.0).seat for i in range(4)]
        admitted.clear()
        threads = [threading.Thread(target=waiter, args=(pods[i % 2], f"w{trial}-{i}")) for i in range(2 * freed)]
        for t in threads:
            t.start()
        assert _wait_for(lambda: client.hget(f"adm:{{t}}:pool:{POOL}", "waiting") == str(2 * freed).encode(), 10)
        time.sleep(0.6 if trial == 0 else 0.05)                   # the pods' clocks subscribe once
        start = time.monotonic()
        for s in seats[:freed]:
            holder.release(s)
        assert _wait_for(lambda: len(admitted) >= freed, 10, 0.001)
        latencies.append(sorted(t for t, _ in admitted)[freed - 1] - start)
        for s in seats[freed:]:
            holder.release(s)
        released = 0
        while released < 2 * freed:                               # let the rest in, then empty the pool
            assert _wait_for(lambda: len(admitted) > released, 10, 0.001)
            with lock:
                _, (pod, seat) = admitted[released]
            pod.release(seat)
            released += 1
        for t in threads:
            t.join(5)
    for p in pods:
        p.close()
    latencies.sort()
    p50, p96, worst = latencies[len(latencies) // 2], latencies[-2], latencies[-1]
    print(f"\nrelease -> last freed slot taken ({real_engine}, {trials} trials): "
          f"p50 {p50 * 1000:.1f} ms, p96 {p96 * 1000:.1f} ms, max {worst * 1000:.1f} ms")
    # one trial in 25 may meet a busy 2-core machine (a scheduling stall, not the rule); without
    # the wake-up every trial would wait for the pool clock (60 s here)
    assert p96 < 0.1 and worst < 1.0, latencies


# -- 10. clocks -------------------------------------------------------------------------------

def test_a_callers_now_is_refused_on_a_server_clock_mesh(redis_client):
    pol = policy(ONE_LANE, lease_ttl=30)
    pol["clock"] = "server"
    a = adm(redis_client, pol=pol)
    seat = a.try_admit(lane="x", model=POOL, round_id="r1").seat
    before = snapshot(redis_client)
    with pytest.raises(BadArgument, match="clock"):
        a.try_admit(lane="x", model=POOL, round_id="r2", now=time.time() + 3600)   # would sweep r1
    with pytest.raises(BadArgument, match="clock"):
        a.tick(now=time.time() + 3600)
    assert snapshot(redis_client) == before
    assert pool_state(redis_client)["running"] == "1" and seat.id == "r1"


def test_growth_survives_a_clock_that_steps_back(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, grow_interval=15, lease_ttl=100))
    r = Rounds(a)
    r.fill("x", 2)
    assert a.tick(now=T0 + 15).grew == {POOL: 4.0}
    r.now = T0 + 16
    r.fill("x", 2)                                         # demand: the pool is full
    assert a.tick(now=T0 + 20).grew == {}                  # within the interval
    assert a.tick(now=T0 - 3600).grew == {}                # a clock an hour back: growth restarts
    assert a.tick(now=T0 - 3586).grew == {}                # from it: one interval on the new clock,
    assert a.tick(now=T0 - 3585).grew == {POOL: 8.0}       # not frozen until the old clock returns
    assert a.tick(now=T0 - 3580).grew == {}                # then one step per interval again
    assert pool_state(redis_client)["running"] == "4"      # and no live seat was swept


# -- 11. a restart ----------------------------------------------------------------------------

def test_after_a_restart_admissions_wait_for_the_recovery_hold(redis_client):
    pol = policy(ONE_LANE, lease_ttl=30, seed_estimate=4, max_estimate=4)
    a = adm(redis_client, pol=pol)
    b = adm(redis_client, pod="pod-b", apply=False)
    running = Rounds(a).fill("x", 3)
    redis_client.flushall()                                # a restart without persistence
    b.ops.apply_policy(pol, now=T0 + 1)                        # re-applied: hold for a heartbeat period
    d = b.try_admit(lane="x", model=POOL, round_id="new", now=T0 + 2, draw=0.0, wait=True)
    assert (d.admitted, d.reason) == (False, "recovering")
    assert a.heartbeat(now=T0 + 5).reasserted == [s.id for s in running]
    assert not b.try_admit(lane="x", model=POOL, round_id="new", now=T0 + 1 + 10, draw=0.0, wait=True).admitted
    d = b.try_admit(lane="x", model=POOL, round_id="new", now=T0 + 1 + 11, draw=0.0, wait=True)
    assert d.admitted and d.running == 4                   # on top of the 3 re-asserted, within 4 slots
    assert not b.try_admit(lane="x", model=POOL, round_id="more", now=T0 + 13, draw=0.0).admitted


def test_a_real_restart_never_runs_the_pool_past_its_slots(real_engine):
    """A server restarted without persistence while 3 rounds run on a 4-slot pool: the policy is
    re-applied at once and another pod asks at once; the running count never passes 4."""
    pol = policy(ONE_LANE, seed_estimate=4, max_estimate=4, lease_ttl=3, high_free=0.01, grow_interval=60)
    pol.pop("clock")
    with LocalServer(real_engine) as srv:
        op = Admission.from_url(srv.url, mesh="t", pod="operator", background=False)
        op.ops.apply_policy(pol, recovery_hold=False)
        a = Admission.from_url(srv.url, mesh="t", pod="a")
        b = Admission.from_url(srv.url, mesh="t", pod="b")
        release_a, a_in, b_in = threading.Event(), [], []

        def run(pod, rid, into, until=None):
            with pod.round(lane="x", model=POOL, round_id=rid, timeout=30):
                into.append(time.monotonic())
                if until is not None:
                    until.wait(30)

        threads = [threading.Thread(target=run, args=(a, f"a{i}", a_in, release_a)) for i in range(3)]
        for t in threads:
            t.start()
        assert _wait_for(lambda: len(a_in) == 3)
        srv.restart()                                         # every key gone, the rounds still run
        applied = time.monotonic()
        op.ops.apply_policy(pol)                                  # re-applied at once: the hold starts
        threads += [threading.Thread(target=run, args=(b, f"b{i}", b_in, release_a)) for i in range(4)]
        for t in threads[3:]:
            t.start()
        watch, peak, reasserted = srv.client(), 0, None
        while time.monotonic() - applied < 6:
            running = int(watch.hget(f"adm:{{t}}:pool:{POOL}", "running") or 0)
            peak = max(peak, running)
            if reasserted is None and watch.hget("adm:{t}:seat:a0", "pod") == b"a":
                reasserted = time.monotonic() - applied
            time.sleep(0.01)
        b_during = [round(x - applied, 2) for x in b_in]
        release_a.set()
        for t in threads:
            t.join(30)
        for pod in (a, b):
            pod.close()
        print(f"\nrestart ({real_engine}): rounds re-asserted {reasserted * 1000:.0f} ms after the re-apply, "
              f"hold {pol['tunables']['lease_ttl'] / 3 + 1:.1f} s, peak running {peak} of 4 slots")
        assert peak == 4 and reasserted is not None and reasserted < 2
        assert len(b_during) == 1 and b_during[0] >= 2.0        # one slot left, and only after the hold
        assert len(b_in) == 4


def test_a_second_apply_holds_nothing(redis_client):
    pol = policy(ONE_LANE)
    a = adm(redis_client, pol=pol)
    a.ops.apply_policy(pol, now=T0)                             # a live change of a mesh with a policy
    assert a.try_admit(lane="x", model=POOL, round_id="r", now=T0, draw=0.0).admitted


# -- 12. stall signals ------------------------------------------------------------------------

def test_a_stall_signal_is_marked_sent_only_once_redis_applied_it(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, stall_after=1, seed_estimate=3))
    r = Rounds(a)
    s1, s2 = r.fill("x", 2)
    a._book.hold(s1).started -= 2
    a._book.hold(s2).started -= 2
    a.tunables()
    real, failures = a.report, {"n": 0}

    def flaky(seat, **kw):
        if seat.id == s1.id and failures["n"] == 0:
            failures["n"] += 1
            raise UnknownSeat("lost by a restart; the heartbeat re-asserts it")
        return real(seat, now=T0 + 1, **kw)

    a.report = flaky
    a._watchdog()
    assert not a._book.seats[s1.id].stall_reported          # not applied: kept for the next beat
    assert a._book.seats[s2.id].stall_reported              # the rest of the batch went out
    a._watchdog()
    assert a._book.seats[s1.id].stall_reported
    assert redis_client.hget(f"adm:{{t}}:seat:{s1.id}", "signalled") == b"stall"


# -- 13. repair warnings ----------------------------------------------------------------------

def test_heartbeat_repair_warns_only_for_a_real_loss(redis_client, caplog):
    a = adm(redis_client, pol=policy(ONE_LANE, seed_estimate=1, max_estimate=1))
    b = adm(redis_client, pod="pod-b", apply=False)
    r = Rounds(a)
    seat = r.fill("x", 1)[0]
    assert not r.ask("x", wait=True, round_id="w").admitted
    snap = a._book.snapshot()                               # a heartbeat leaves...
    a.release(seat, now=T0 + 1)                             # ...the seat is released meanwhile
    a._book.asking("w")
    assert r.ask("x", wait=True, round_id="w", now=T0 + 1).admitted   # ...and the waiter admitted
    hb = a._exec(a.core.heartbeat(snap.seats_list(), list(snap.tickets), T0 + 2))
    assert hb.lost == [seat.id] and hb.lost_tickets == ["w"]          # what the server says
    assert a._note_heartbeat(snap, hb)[:2] == ([], [])                # neither is news
    # a real loss: another pod holds the seat now
    a.tick(now=T0 + 20_000)
    taken = b.try_admit(lane="x", model=POOL, round_id="w", now=T0 + 20_001, draw=0.0)
    assert taken.admitted
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="admission"):
        a.heartbeat(now=T0 + 20_002)
    logs = [r.admission for r in caplog.records]
    assert [e["event"] for e in logs] == ["heartbeat_repair"] and logs[0]["lost"] == ["w"]


# -- 14. a wait across an outage --------------------------------------------------------------

def test_rounds_asking_across_an_outage_are_admitted_soon_after_it(real_engine, server_pool):
    url = server_pool.get(real_engine).url
    client = redis.Redis.from_url(url)
    client.flushall()
    pol = policy(ONE_LANE, seed_estimate=8, grow_interval=15)
    pol.pop("clock")
    Admission(client, mesh="t", pod="setup", background=False).ops.apply_policy(pol, recovery_hold=False)
    pod = Admission.from_url(url, mesh="t", pod="p", connect_timeout=0.2, socket_timeout=0.2)
    done: list[float] = []

    def run(i):
        with pod.round(lane="x", model=POOL, round_id=f"r{i}", timeout=30):
            done.append(time.monotonic())

    client.execute_command("CLIENT", "PAUSE", "2300", "ALL")     # the primary is gone for 2.3 s
    threads = [threading.Thread(target=run, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    back = time.monotonic() + 2.3
    for t in threads:
        t.join(20)
    pod.close()
    assert len(done) == 5
    assert max(done) - back < 3.0                                # within a few seconds, not the 15 s clock
    assert pod._book.waiters == {} and pod._book.seats == {}


def test_bad_clock_and_hold_arguments_change_nothing(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE))
    bad = policy(ONE_LANE)
    bad["clock"] = "wall"
    with pytest.raises(PolicyError, match="clock"):
        a.ops.apply_policy(bad)
    doc = json.loads(redis_client.hget("adm:{t}:config", "policy"))
    before = snapshot(redis_client)
    for args, word in [(["", json.dumps({**doc, "clock": "wall"}), "tok", "", "0"], "ADM_BAD_POLICY"),
                       (["", json.dumps({**doc, "clock": "server"}), "tok", repr(T0), "0"], "ADM_BAD_ARG"),
                       (["", json.dumps(doc), "tok", "", "maybe"], "ADM_BAD_ARG"),
                       (["", json.dumps(doc), "tok", "-1", "1"], "ADM_BAD_ARG")]:
        with pytest.raises(redis.ResponseError, match=word):
            _raw(redis_client, "apply_config", args)
        assert snapshot(redis_client) == before


# -- a pod whose clock is off ------------------------------------------------------------------

@pytest.mark.parametrize("skew", [3600.0, -3600.0])
def test_a_queued_release_is_stamped_on_the_servers_clock_not_the_pods(redis_client, tmp_path, monkeypatch, skew):
    """A pod whose wall clock is an hour off holds a round when Redis becomes unreachable: the
    release waits in its outbox. Replayed, it is booked in full on the server's day; stamped on
    the pod's own clock it was refused as 'in the future' (dead-lettered: a lost dollar) or
    booked on another day near midnight. The pod learns the server's clock from its heartbeat."""
    pol = policy(ONE_LANE)
    pol.pop("clock")
    adm(redis_client, pod="op", pol=pol)
    # the pod's wall clock is off (the server's, fakeredis's too, is not)
    monkeypatch.setattr(base, "time", types.SimpleNamespace(time=lambda: time.time() + skew, monotonic=time.monotonic))
    a = Admission(redis_client, mesh="t", pod="a", background=False, outbox=str(tmp_path / "a.outbox"))
    held = a.round(lane="x", model=POOL, round_id="r1", timeout=5)
    r = held.__enter__()
    a.heartbeat()
    r.charge(0.25, key="step")
    r.cost_usd = 0.5

    def unreachable(*args, **kwargs):
        raise redis.ConnectionError("Redis is down")

    with monkeypatch.context() as m:
        m.setattr(scripts, "call", unreachable)
        held.__exit__(None, None, None)
    assert len(a._pending) == 1                               # the release waits in the outbox
    assert a.flush() == 0
    day = datetime.datetime.fromtimestamp(redis_client.time()[0], datetime.timezone.utc).strftime("%Y-%m-%d")
    assert a.ops.ledger(day)["*"] == {"p": 0.75}
    assert not (tmp_path / "a.outbox.dead").exists()
