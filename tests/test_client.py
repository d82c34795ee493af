"""The client a pod's worker calls: round(), waiting and wake-ups, leases, idempotency, fail-fast."""
from __future__ import annotations

import threading
import time

import pytest

from admission import Admission, Status, UNAVAILABLE, WaitTimeout
from admission.tools.servers import free_port

from helpers import POOL, T0, Rounds, adm, policy, pool_state, snapshot

ONE_LANE = {"x": {"floor": 0, "weight": 1, "priority": 1}}


class RateLimited(Exception):
    status_code = 429


def test_round_admits_and_releases_clean_on_exit(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE))
    with a.round(lane="x", model=POOL, round_id="r1") as r:
        assert r.seat.pool == POOL and pool_state(redis_client)["running"] == "1"
        r.cost_usd = 0.25
    s = pool_state(redis_client)
    assert s["running"] == "0" and float(s["succ"]) == 1 and float(s["meanCost"]) == 250_000


def test_round_classifies_the_exception_a_429_is_load(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, seed_estimate=4))
    with pytest.raises(RateLimited):
        with a.round(lane="x", model=POOL, round_id="r1"):
            raise RateLimited("429 Too Many Requests")
    s = pool_state(redis_client)
    assert s["running"] == "0" and s["why"] == "rate_limited" and s["exhausted"] == "1"


def test_round_other_exceptions_count_a_failure(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE))
    with pytest.raises(KeyError):
        with a.round(lane="x", model=POOL, round_id="r1"):
            raise KeyError("boom")
    s = pool_state(redis_client)
    assert float(s["fail"]) == 1 and s.get("exhausted", "0") == "0"


def test_a_refused_round_waits_and_is_woken_by_a_release(redis_client):
    pol = policy(ONE_LANE, grow_interval=60, max_estimate=2)   # no growth; the clock alone: a minute
    holder = adm(redis_client, pod="pod-a", pol=pol)
    seats = [holder.try_admit(lane="x", model=POOL, round_id=f"h{i}").seat for i in range(2)]
    waiter = Admission(redis_client, mesh="t", pod="pod-b")
    got = {}

    def run():
        with waiter.round(lane="x", model=POOL, round_id="w1", timeout=30) as r:
            got["at"] = time.monotonic()
            got["pool"] = r.pool

    t = threading.Thread(target=run)
    t.start()
    deadline = time.monotonic() + 10
    while redis_client.zcard("adm:{t}:wait:m@p:x") == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert redis_client.zcard("adm:{t}:wait:m@p:x") == 1   # it waits as a waiter
    time.sleep(0.6)                                         # let the pod subscribe
    released = time.monotonic()
    holder.release(seats[0], outcome="clean", seconds=1)
    t.join(timeout=20)
    waiter.close()
    assert got.get("pool") == POOL
    assert 0 <= got["at"] - released < 5                    # woken by the release, not the 60 s clock


def _wake_ups(client, release) -> list[str]:
    """The pools a release published on the mesh's wake channel."""
    sub = client.pubsub(ignore_subscribe_messages=True)
    sub.subscribe("adm:{t}:wake")
    sub.get_message(timeout=1.0)  # the subscription's confirmation
    release()
    got = []
    while (msg := sub.get_message(timeout=0.3)) is not None:
        got.append(msg["data"].decode())
    sub.close()
    return got


def test_a_release_publishes_a_wake_up_only_when_a_waiter_can_use_the_slot(redis_client):
    """No waiter: nothing published (a wake-up costs every pod a re-ask check). A waiter of the
    pool, or of a pool that lists it as an alternative: the pool's wake-up."""
    pol = policy(ONE_LANE, pools=("m@p", "n@p", "o@p"), max_estimate=1, seed_estimate=1)
    pol["alternatives"] = {"n@p": ["m@p"]}  # n@p's waiters re-ask m@p
    a = adm(redis_client, pol=pol)
    r = Rounds(a)
    lone = r.fill("x", 1, pool="o@p")[0]
    assert _wake_ups(redis_client, lambda: a.release(lone, outcome="clean", seconds=1, now=T0)) == []
    seat = r.fill("x", 1)[0]
    assert not r.ask("x", wait=True, round_id="w-m").admitted                       # a waiter of m@p
    assert _wake_ups(redis_client, lambda: a.release(seat, outcome="clean", seconds=1, now=T0)) == ["m@p"]
    a._give_up("m@p", "w-m")                                                        # the waiter gives up
    seat = r.fill("x", 1)[0]
    held_n = r.fill("x", 1, pool="n@p")[0]
    d = a.try_admit(lane="x", model="n@p", round_id="w-n", now=T0, draw=0.0, wait=True, alternatives=[])
    assert not d.admitted and d.pool == "n@p"                                      # a waiter of n@p only
    assert _wake_ups(redis_client, lambda: a.release(seat, outcome="clean", seconds=1, now=T0)) == ["m@p"]
    a._give_up("n@p", "w-n")
    a.release(held_n, outcome="clean", seconds=1, now=T0)


def test_a_release_on_another_pool_does_not_wake_the_waiters(redis_client):
    pol = policy(ONE_LANE, pools=("m@p", "n@p"), grow_interval=60, max_estimate=2)
    holder = adm(redis_client, pod="pod-a", pol=pol)
    here = [holder.try_admit(lane="x", model="m@p", round_id=f"m{i}").seat for i in range(2)]
    there = holder.try_admit(lane="x", model="n@p", round_id="n0").seat
    waiter = Admission(redis_client, mesh="t", pod="pod-b")
    t = threading.Thread(target=lambda: waiter.admit_waiting(lane="x", model="m@p", round_id="w1", timeout=30))
    t.start()

    def asks() -> int:   # w1 is the only round of lane x refused on m@p: its refusals are counted, not streamed
        refused = sum(int(n) for k, n in redis_client.hgetall("adm:{t}:totals").items()
                      if k.startswith(b"refused|m@p|x|"))
        return refused + sum(1 for _, f in redis_client.xrange("adm:{t}:events") if f.get(b"round") == b"w1")

    deadline = time.monotonic() + 10
    while asks() == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(1.0)                                  # subscribed, first clock tick done
    before = asks()
    holder.release(there, outcome="clean", seconds=1)          # a wake-up for n@p only
    time.sleep(1.0)
    assert asks() == before                          # the m@p waiter did not re-ask
    holder.release(here[0], outcome="clean", seconds=1)        # a wake-up for m@p
    t.join(timeout=20)
    waiter.close()
    assert asks() == before + 1 and not t.is_alive()


def test_only_the_pods_oldest_waiter_per_lane_and_pool_re_asks(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE))
    Rounds(a).fill("x", 2)
    assert not a.try_admit(lane="x", model=POOL, round_id="w1", wait=True).admitted
    assert not a.try_admit(lane="x", model=POOL, round_id="w2", wait=True).admitted
    book = a._book
    assert book.is_oldest("x", POOL, "w1") and not book.is_oldest("x", POOL, "w2")
    assert book.tickets() == ["w1", "w2"]


def test_wait_timeout_raises_and_removes_the_ticket(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, grow_interval=0.2))
    Rounds(a).fill("x", 2)
    with pytest.raises(WaitTimeout, match="waited 0.5s"):
        with a.round(lane="x", model=POOL, round_id="w1", timeout=0.5):
            pass
    assert redis_client.zcard("adm:{t}:wait:m@p:x") == 0
    assert pool_state(redis_client)["waiting"] == "0"
    a.close()


def test_unreachable_redis_gives_a_shed_decision_fast():
    a = Admission.from_url(f"redis://127.0.0.1:{free_port()}/0", mesh="t", pod="p", background=False)
    started = time.monotonic()
    d = a.try_admit(lane="x", model=POOL, round_id="r1")
    assert not d.admitted and d.reason == UNAVAILABLE and d.seat is None
    assert time.monotonic() - started < 1.5


def test_a_server_that_accepts_but_never_answers_sheds_within_the_configured_timeouts():
    import socket
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)                                 # accepts connections, never replies
    try:
        a = Admission.from_url(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", mesh="t", pod="p",
                               background=False, connect_timeout=0.1, socket_timeout=0.2)
        started = time.monotonic()
        d = a.try_admit(lane="x", model=POOL, round_id="r1")
        assert d.reason == UNAVAILABLE and not d.admitted
        assert time.monotonic() - started < 1.0     # two tries of 0.2 s, not redis-py's default seconds
    finally:
        silent.close()


def test_a_killed_pods_seats_and_waiters_expire_and_the_counts_heal(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=30))
    Rounds(a).fill("x", 2)
    a.try_admit(lane="x", model=POOL, round_id="w", now=T0, wait=True)
    assert a.tick(now=T0 + 29).swept == 0
    assert a.tick(now=T0 + 31).swept == 3
    s = pool_state(redis_client)
    assert (s["running"], s["waiting"]) == ("0", "0")
    assert redis_client.zcard("adm:{t}:seats") == redis_client.zcard("adm:{t}:tickets") == 0


def test_admit_sweeps_expired_leases_before_deciding(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=30, max_estimate=2))
    Rounds(a).fill("x", 2)                          # pod-a dies holding the whole pool
    b = adm(redis_client, pod="pod-b", apply=False)
    d = b.try_admit(lane="x", model=POOL, round_id="b1", now=T0 + 31, draw=0.0)
    assert d.admitted and d.running == 1            # no tick yet: the admit swept pod-a's leases


def _sweep_at(client) -> float | None:
    v = client.hget("adm:{t}:config", "sweepAt")
    return float(v) if v not in (None, b"") else None


def test_an_admit_skips_the_sweep_until_a_lease_can_have_run_out(redis_client, engine):
    """The sweep's marker: no lease ends before it, so an admit before it reads no range."""
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=30, seed_estimate=50))
    Rounds(a).fill("x", 3)                                        # leases end at T0 + 30
    assert _sweep_at(redis_client) == T0 + 30
    real = engine != "fakeredis"                                  # INFO commandstats
    if real:
        redis_client.config_resetstat()
    for i in range(3):
        assert a.try_admit(lane="x", model=POOL, round_id=f"n{i}", now=T0 + 29).admitted
    if real:
        assert "cmdstat_zrangebyscore" not in redis_client.info("commandstats")  # no sweep before it
    assert a.tick(now=T0 + 31).swept == 3
    assert _sweep_at(redis_client) == T0 + 29 + 30                # the earliest lease left
    assert a.try_admit(lane="x", model=POOL, round_id="late", now=T0 + 60, draw=0.0).admitted
    assert pool_state(redis_client)["running"] == "1"             # the admit swept the three
    if real:
        assert redis_client.info("commandstats")["cmdstat_zrangebyscore"]["calls"] >= 2


def test_every_lease_written_keeps_the_sweep_marker_before_it(redis_client):
    """A lease shorter than every earlier one (a policy with a shorter lease_ttl) lowers the marker,
    so the admit after it ends sweeps it: from an admit, a waiter's ticket and a heartbeat."""
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=100, max_estimate=3))
    Rounds(a).fill("x", 1)                                        # lease ends at T0 + 100
    assert _sweep_at(redis_client) == T0 + 100
    a.ops.apply_policy(policy(ONE_LANE, lease_ttl=10, max_estimate=3), recovery_hold=False)
    b = adm(redis_client, pod="pod-b", apply=False)
    assert b.try_admit(lane="x", model=POOL, round_id="short", now=T0 + 1, draw=0.0).admitted
    assert _sweep_at(redis_client) == T0 + 11                     # an admit's seat
    c = adm(redis_client, pod="pod-c", apply=False)
    c.try_admit(lane="x", model=POOL, round_id="c1", now=T0 + 2, draw=0.0)
    c.try_admit(lane="x", model=POOL, round_id="wait", now=T0 + 2, wait=True)
    redis_client.hset("adm:{t}:config", "sweepAt", repr(T0 + 11))  # as it was before the ticket
    c.try_admit(lane="x", model=POOL, round_id="wait", now=T0 + 0.5, wait=True)  # renewed earlier
    assert _sweep_at(redis_client) == T0 + 10.5                   # a waiter's ticket
    redis_client.hset("adm:{t}:config", "sweepAt", repr(T0 + 11))
    a.heartbeat(now=T0 + 0.25)                                    # renews pod-a's seat to T0 + 10.25
    assert _sweep_at(redis_client) == T0 + 10.25                  # a heartbeat's leases
    d = b.try_admit(lane="x", model=POOL, round_id="after", now=T0 + 12, draw=0.0)
    assert d.admitted and pool_state(redis_client)["running"] == "1"  # the admit swept them all


def test_one_heartbeat_renews_every_lease_of_the_pod(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=30))
    Rounds(a).fill("x", 2)
    a.try_admit(lane="x", model=POOL, round_id="w", now=T0, wait=True)
    hb = a.heartbeat(now=T0 + 20)
    assert hb.lease_until == T0 + 50 and hb.lost == [] and hb.reasserted == []
    assert a.tick(now=T0 + 31).swept == 0
    assert a.tick(now=T0 + 51).swept == 3


def test_a_waiter_whose_ticket_expired_is_reported_once_and_asks_again(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=30, max_estimate=2))
    Rounds(a).fill("x", 2)
    a.try_admit(lane="x", model=POOL, round_id="w", now=T0, wait=True)
    a.heartbeat(now=T0)            # renews the seats and the ticket
    redis_client.zadd("adm:{t}:tickets", {"w": T0})   # the ticket's lease ran out (a slow pod)
    a.tick(now=T0 + 1)
    assert a.heartbeat(now=T0 + 2).lost_tickets == ["w"]
    assert a.heartbeat(now=T0 + 3).lost_tickets == []  # not sent again until it has a place
    d = a.try_admit(lane="x", model=POOL, round_id="w", now=T0 + 4, wait=True)
    assert not d.admitted and a._book.tickets() == ["w"]


def test_the_sweep_is_bounded_per_call(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=30, seed_estimate=300))
    Rounds(a).fill("x", 250)
    assert a.tick(now=T0 + 31).swept == 100
    assert a.tick(now=T0 + 32).swept == 100
    assert a.tick(now=T0 + 33).swept == 50
    assert pool_state(redis_client)["running"] == "0"


def test_heartbeat_re_asserts_seats_the_server_lost(redis_client):
    pol = policy(ONE_LANE)
    a = adm(redis_client, pol=pol)
    seat = Rounds(a).fill("x", 1)[0]
    redis_client.flushall()                         # a restart without persistence
    a.ops.apply_policy(pol, recovery_hold=False)
    hb = a.heartbeat(now=T0 + 5)
    assert hb.reasserted == [seat.id]
    assert pool_state(redis_client)["running"] == "1"
    assert a.release(seat, outcome="clean", seconds=1, now=T0 + 6).status == Status.RELEASED


def test_release_retried_after_a_lost_reply_counts_once(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE))
    seat = Rounds(a).fill("x", 1)[0]
    assert a.release(seat, outcome="clean", seconds=1, cost_usd=0.1, now=T0).status == Status.RELEASED
    before = snapshot(redis_client)
    assert a.release(seat, outcome="clean", seconds=1, cost_usd=0.1, now=T0).status == Status.ALREADY_RELEASED
    assert snapshot(redis_client) == before


def test_release_after_the_lease_expired_counts_the_outcome_once(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, lease_ttl=30))
    seat = Rounds(a).fill("x", 1)[0]
    a.tick(now=T0 + 31)                            # swept: the pod looked dead
    out = a.release(seat, outcome="clean", seconds=40, now=T0 + 40)
    assert out.status == Status.EXPIRED
    assert a.release(seat, outcome="clean", seconds=40, now=T0 + 40).status == Status.ALREADY_RELEASED
    s = pool_state(redis_client)
    assert float(s["succ"]) == 1 and s["running"] == "0"


def test_tick_is_idempotent_one_growth_step_per_interval_across_pods(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE))
    b = adm(redis_client, pod="pod-b", apply=False)
    Rounds(a).fill("x", 2)
    assert a.tick(now=T0 + 15).grew == {POOL: 4.0}
    assert b.tick(now=T0 + 15).grew == {}
    assert b.tick(now=T0 + 16).grew == {}
    assert float(pool_state(redis_client)["est"]) == 4.0


def test_the_watchdog_reports_a_stall_while_the_round_goes_on(redis_client):
    a = adm(redis_client, pol=policy(ONE_LANE, stall_after=1, seed_estimate=3, lease_ttl=3))
    with a.round(lane="x", model=POOL, round_id="slow") as r:
        a._book.seats[r.seat.id].started -= 2        # the round has run past its stall threshold
        a.tunables()                                 # what the clock reads before its watchdog
        a._watchdog()
        s = pool_state(redis_client)
        assert s["why"] == "stall" and s["running"] == "1"
    assert pool_state(redis_client)["running"] == "0"
    a.close()


# -- the drifts from the asyncio client, and one release path ------------------------------------

def _today() -> str:
    return time.strftime("%Y-%m-%d", time.gmtime())



def test_a_restarted_pod_replays_its_outbox_at_once(redis_client, tmp_path, monkeypatch):
    """Its clock starts at construction (no round needed), as the asyncio client's."""
    import redis as _redis

    from admission import scripts

    path = tmp_path / "p.outbox"
    a = Admission(redis_client, mesh="t", pod="p", background=False, outbox=path)
    a.ops.apply_policy(policy(ONE_LANE), recovery_hold=False)
    seat = a.try_admit(lane="x", model=POOL, round_id="r1").seat
    monkeypatch.setattr(scripts, "call", lambda *a_, **k: (_ for _ in ()).throw(_redis.ConnectionError("down")))
    assert a.release(seat, cost_usd=0.5).queued
    monkeypatch.undo()
    a._pending.outbox.close()                           # the pod stops
    b = Admission(redis_client, mesh="t", pod="p", outbox=path)
    try:
        deadline = time.monotonic() + 5
        while len(b._pending) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(b._pending) == 0, "the restarted pod did not replay its outbox"
    finally:
        b.close()
    assert b.ops.ledger(_today()) == {"x": {"p": 0.5}, "*": {"p": 0.5}}


def test_apply_policy_logs_the_version_it_applied(redis_client, caplog):
    import logging

    a = Admission(redis_client, mesh="t", pod="p", background=False)
    with caplog.at_level(logging.INFO, logger="admission"):
        version = a.ops.apply_policy(policy(ONE_LANE), recovery_hold=False)
    logs = [r.admission for r in caplog.records if getattr(r, "admission", None)]
    assert [(e["event"], e["mesh"], e["version"]) for e in logs] == [("policy_applied", "t", version)]


def test_revision_is_a_whole_number_on_every_ask(redis_client):
    import inspect

    from admission import BadArgument

    for name in ("try_admit", "admit_waiting", "round"):
        assert inspect.signature(getattr(Admission, name)).parameters["revision"].annotation == "int | None"
    a = Admission(redis_client, mesh="t", pod="p", background=False)
    a.ops.apply_policy(policy(ONE_LANE), recovery_hold=False)
    with a.round(lane="x", model=POOL, round_id="r1", revision=3) as r:
        assert r.seat.id == "r1"
    assert a.admit_waiting(lane="x", model=POOL, round_id="r2", revision=0).admitted
    with pytest.raises(BadArgument):
        with a.round(lane="x", model=POOL, round_id="r3", revision="R3"):
            pass


@pytest.mark.real
def test_a_release_with_a_price_while_redis_is_down_is_booked_once_when_it_is_back(real_engine, tmp_path):
    """The public release and round()'s exit share one path: a release that meets an
    unreachable Redis, then an empty restarted one with no policy, waits in the outbox
    (``queued``) and is booked exactly once when Redis can apply it."""
    from admission import UnknownSeat
    from admission.tools.servers import LocalServer

    pol = policy(ONE_LANE)
    pol.pop("clock")
    with LocalServer(real_engine) as srv:
        a = Admission.from_url(srv.url, mesh="t", pod="p", background=False, outbox=tmp_path / "p.outbox")
        a.ops.apply_policy(pol, recovery_hold=False)
        seat = a.try_admit(lane="x", model=POOL, round_id="r1").seat
        srv.kill()
        r = a.release(seat, cost_usd=0.5)
        assert r.queued and r.pool == POOL and len(a._pending) == 1 and a._book.seats == {}
        assert a.flush() == 1                           # still down: kept
        srv.restart()                                   # empty, as an unpersisted Redis after a crash
        assert a.flush() == 1                           # no policy yet: kept
        a.ops.apply_policy(pol, recovery_hold=False)
        assert a.flush() == 0
        assert a.ops.ledger(_today()) == {"x": {"p": 0.5}, "*": {"p": 0.5}}
        with pytest.raises(UnknownSeat):                # sent again: the seat is gone, its cost booked
            a.release(seat, cost_usd=0.5)
        assert a.flush() == 0
        assert a.ops.ledger(_today()) == {"x": {"p": 0.5}, "*": {"p": 0.5}}
        a.close()
