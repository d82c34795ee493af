"""The fence between planes (docs/design.md §8; the second seed and its fixture): per-plane retry
budgets, depth limits, health leases, one decision per intent, revision binding, absence sheds.
One test per rule, named after it; each runs on fakeredis, Redis 7 and Valkey 8 (the seed
fixture's four properties are the first four)."""
from __future__ import annotations

import threading

import pytest
import redis

from admission import Admission
from admission.client import fail_fast_options
from admission.errors import BadArgument, UnknownSeat

from admission.view import render_census

from helpers import T0, adm, policy, snapshot

P, Q, R = "m@p", "m@q", "m@r"            # the primary plane, a borrowed plane, a third
LANES = {"a": {"floor": 0, "weight": 1, "priority": 1}}


def fence_policy(primary=None, borrowed=None, third=None, **tunables):
    pol = policy(LANES, pools=(P, Q, R), **{"seed_estimate": 8, **tunables})
    pol["tiers"] = {}
    pol["pools"] = {P: dict(primary or {}), Q: dict(borrowed or {}), R: dict(third or {})}
    return pol


def borrow(a, rid="I1", now=T0, pool=Q, primary=P, **kw):
    return a.try_admit(lane="a", model=primary, round_id=rid, borrow=pool, now=now, draw=0.0, **kw)


def primary_keys(client, pool=P) -> dict:
    """Every key of the primary plane, with its value: equal means nothing changed there."""
    full = snapshot(client)
    mine = (f"adm:{{t}}:pool:{pool}", f"adm:{{t}}:lanes:{pool}", f"adm:{{t}}:plane:{pool}",
            f"adm:{{t}}:wait:{pool}:", f"adm:{{t}}:pinned:{pool}")
    return {k: v for k, v in full.items() if any(k.decode().startswith(m) for m in mine)}


def plane(client, pool):
    return {k.decode(): v.decode() for k, v in client.hgetall(f"adm:{{t}}:plane:{pool}").items()}


def wait_on(a, pool, n, start=0):
    """n waiters of lane a on `pool` (its depth), filling it first."""
    for i in range(8):
        a.try_admit(lane="a", model=pool, round_id=f"fill-{pool}-{i}", now=T0, draw=0.0, alternatives=[])
    for i in range(start, start + n):
        d = a.try_admit(lane="a", model=pool, round_id=f"w-{pool}-{i}", now=T0, draw=0.0, wait=True, alternatives=[])
        assert not d.admitted


# -- the seed fixture's four properties ---------------------------------------------------------------

def test_fence_borrowed_depth_does_not_spend_primary(redis_client):
    a = adm(redis_client, pol=fence_policy(primary={"retry_budget": 3}, borrowed={"depth_limit": 4, "retry_budget": 1}))
    wait_on(a, Q, 4)
    before = primary_keys(redis_client)
    d = borrow(a)
    assert not d.admitted and d.reason == "shed_borrowed_depth" and d.shed and d.pool == Q and d.borrowed_for == P
    assert primary_keys(redis_client) == before
    assert a.ops.census(now=T0)["pools"][0]["plane"]["retriesLeft"] == 3


def test_fence_stale_borrowed_health_is_not_capacity(redis_client):
    a = adm(redis_client, pol=fence_policy(borrowed={"health_required": True, "health_max_age": 10}))
    assert borrow(a, "I1").reason == "reject_stale_borrowed_health"           # no sample at all
    a.report_health(Q, depth=0, running=1, ok=True, at=T0 - 11, now=T0)
    assert borrow(a, "I2").reason == "reject_stale_borrowed_health"           # older than its max age
    a.report_health(Q, depth=0, running=1, ok=False, at=T0, now=T0)
    assert borrow(a, "I3").reason == "reject_stale_borrowed_health"           # fresh, but not answering
    a.report_health(Q, depth=0, running=1, ok=True, at=T0 + 1, now=T0 + 1)
    d = borrow(a, "I4", now=T0 + 1)
    assert d.admitted and d.pool == Q
    assert int(redis_client.hget(f"adm:{{t}}:pool:{P}", "running") or 0) == 0   # the primary stays idle


def test_fence_an_idle_borrower_cannot_hide_primary_saturation(redis_client):
    a = adm(redis_client, pol=fence_policy(primary={"depth_limit": 2}, borrowed={"retry_budget": 3}))
    wait_on(a, P, 2)
    d = borrow(a)
    assert d.reason == "reject_primary_depth"
    assert "retries" not in plane(redis_client, Q)                              # the borrower's budget untouched


def test_fence_a_fresh_borrow_retries_inside_its_own_budget(redis_client):
    a = adm(redis_client, pol=fence_policy(primary={"retry_budget": 2}, borrowed={"retry_budget": 1}))
    d = borrow(a)
    assert d.admitted and d.pool == Q and d.reason == "borrowed"
    r = a.retry(d.seat, now=T0)
    assert r and (r.decision, r.retries_left, r.retries, r.plane) == ("retry_same_plane", 0.0, 1, Q)
    assert a.retry(d.seat, now=T0).decision == "compensate_or_shed"             # none left on Q
    assert "retries" not in plane(redis_client, P)                               # P's 2 untouched
    assert a.ops.census(now=T0)["pools"][0]["plane"]["retriesLeft"] == 2


# -- the order and the rest of the fence ----------------------------------------------------------------

def test_fence_stale_primary_health(redis_client):
    a = adm(redis_client, pol=fence_policy(primary={"health_required": True}))
    assert borrow(a).reason == "reject_stale_primary_health"


def test_fence_primary_retry_exhausted(redis_client):
    a = adm(redis_client, pol=fence_policy(primary={"retry_budget": 1}))
    seat = a.try_admit(lane="a", model=P, round_id="own", now=T0, draw=0.0).seat
    assert a.retry(seat, now=T0).decision == "retry_same_plane"                # the primary's own retry
    assert borrow(a).reason == "reject_primary_retry_exhausted"


def test_fence_borrowed_retry_exhausted(redis_client):
    a = adm(redis_client, pol=fence_policy(borrowed={"retry_budget": 0}))
    assert borrow(a).reason == "shed_borrowed_retry"


def test_fence_order_is_the_seed_fixtures(redis_client):
    """Every check fails at once: the primary's come first, health, depth, retries; then the
    borrowed plane's in the same order."""
    everything = {"health_required": True, "depth_limit": 1, "retry_budget": 0}
    a = adm(redis_client, pol=fence_policy(primary=dict(everything), borrowed=dict(everything)))
    wait_on(a, P, 1)
    wait_on(a, Q, 1)
    assert borrow(a, "I1").reason == "reject_stale_primary_health"
    a.report_health(P, depth=0, ok=True, now=T0)
    assert borrow(a, "I2").reason == "reject_primary_depth"


def test_fence_a_shed_borrow_leaves_the_primary_byte_for_byte(redis_client, engine):
    a = adm(redis_client, pol=fence_policy(primary={"retry_budget": 3, "depth_limit": 5, "health_required": True},
                                           borrowed={"health_required": True}))
    a.report_health(P, depth=1, running=2, ok=True, now=T0)
    wait_on(a, P, 1)                                                            # seats and a waiter on P
    a.retry(next(iter(a._book.seats.values())).seat, now=T0)                    # P has spent one retry
    before = primary_keys(redis_client)
    dumps = {k: redis_client.dump(k) for k in before} if engine != "fakeredis" else {}
    for i in range(5):
        d = borrow(a, f"I{i}", now=T0 + i)
        assert d.reason == "reject_stale_borrowed_health"
    assert primary_keys(redis_client) == before
    assert {k: redis_client.dump(k) for k in dumps} == dumps                    # DUMP: byte for byte


def test_fence_moves_are_borrows_fenced_on_the_borrowed_plane(redis_client):
    pol = fence_policy(borrowed={"health_required": True}, third={"depth_limit": 1})
    pol["alternatives"] = {P: [Q, R]}
    a = adm(redis_client, pol=pol)
    for i in range(8):
        a.try_admit(lane="a", model=P, round_id=f"fill{i}", now=T0, draw=0.0, alternatives=[])
    wait_on(a, R, 1)
    d = a.try_admit(lane="a", model=P, round_id="x", now=T0, draw=0.0, alternatives=[Q, R])
    assert not d.admitted and d.pool == P and d.reason == "full"               # Q no sample, R at depth
    a.report_health(Q, depth=0, ok=True, now=T0)
    d = a.try_admit(lane="a", model=P, round_id="y", now=T0, draw=0.0, alternatives=[Q, R])
    assert d.admitted and d.pool == Q and d.moved_from == P


# -- retries: the plane where the attempt ran, persisted ---------------------------------------------

def test_retry_refills_from_redis_time(redis_client):
    a = adm(redis_client, pol=fence_policy(borrowed={"retry_budget": 2, "retry_refill_per_s": 0.5}))
    seat = borrow(a).seat
    assert [a.retry(seat, now=T0).decision for _ in range(3)] == ["retry_same_plane"] * 2 + ["compensate_or_shed"]
    assert a.retry(seat, now=T0 + 1).decision == "compensate_or_shed"          # half a token
    r = a.retry(seat, now=T0 + 2)
    assert r.decision == "retry_same_plane" and r.retries_left == 0.0 and r.retries == 3
    assert a.retry(seat, now=T0 + 100).retries_left == 1.0                      # refilled to the budget, no more


def test_retry_counter_survives_a_pod_restart(redis_client):
    a = adm(redis_client, pol=fence_policy(borrowed={"retry_budget": 10}))
    seat = borrow(a).seat
    assert a.retry(seat, now=T0).retries == 1
    restarted = Admission(redis_client, mesh="t", pod="pod-a", background=False)   # the same pod, new process
    assert restarted.retry(seat, now=T0 + 1).retries == 2
    assert redis_client.hget("adm:{t}:intent:I1", "retries") == b"2"


def test_retry_needs_the_attempts_live_seat_and_changes_nothing_else(redis_client):
    a = adm(redis_client, pol=fence_policy(borrowed={"retry_budget": 1}))
    seat = borrow(a).seat
    a.release(seat, now=T0)
    before = snapshot(redis_client)
    with pytest.raises(UnknownSeat):
        a.retry(seat, now=T0)
    assert snapshot(redis_client) == before


def test_retry_two_pods_racing_the_last_retry_spend_it_once(redis_client, engine):
    a = adm(redis_client, pol=fence_policy(borrowed={"retry_budget": 1}))
    b = Admission(redis_client, mesh="t", pod="pod-b", background=False)
    seats = [borrow(a, "Ia").seat, borrow(b, "Ib").seat]
    got = []
    if engine == "fakeredis":                                                   # one connection: in turn
        got = [x.retry(s, now=T0).decision for x, s in ((a, seats[0]), (b, seats[1]))]
    else:
        barrier = threading.Barrier(2)

        def go(x, s):
            barrier.wait()
            got.append(x.retry(s, now=T0).decision)
        threads = [threading.Thread(target=go, args=(x, s)) for x, s in ((a, seats[0]), (b, seats[1]))]
        [t.start() for t in threads]
        [t.join(5) for t in threads]
    assert sorted(got) == ["compensate_or_shed", "retry_same_plane"]
    assert float(plane(redis_client, Q)["retries"]) == 0


# -- one decision per intent, revision binding ----------------------------------------------------------

def test_one_decision_per_intent_a_shed_is_answered_again_while_it_lives(redis_client):
    a = adm(redis_client, pol=fence_policy(borrowed={"health_required": True}, decision_ttl=20))
    assert borrow(a, "I1").reason == "reject_stale_borrowed_health"
    a.report_health(Q, depth=0, ok=True, at=T0 + 5, now=T0 + 5)
    before = snapshot(redis_client)
    assert borrow(a, "I1", now=T0 + 10).reason == "reject_stale_borrowed_health"   # the same decision
    assert snapshot(redis_client) == before
    assert borrow(a, "I2", now=T0 + 10).admitted                               # another intent: decided now
    assert borrow(a, "I1", now=T0 + 21).admitted                               # the decision lapsed


def test_revision_a_late_score_after_the_watermark_moved_is_rejected(redis_client):
    a = adm(redis_client, pol=fence_policy(primary={"retry_budget": 2}))
    d = borrow(a, "I1", revision=3)
    assert d.admitted
    assert a.advance("I1", 4, now=T0).watermark == 4
    before = primary_keys(redis_client)
    late = a.bind(d.seat, 3, now=T0 + 1)
    assert not late and late.decision == "reject_stale_revision" and late.watermark == 4
    assert primary_keys(redis_client) == before                                # never replayed onto P
    assert a.bind(d.seat, 4, now=T0 + 1).decision == "bound"
    assert a.bind("I1", 5, now=T0 + 1).watermark == 5


def test_revision_a_late_score_after_a_shed_binds_nothing(redis_client):
    a = adm(redis_client, pol=fence_policy(borrowed={"health_required": True}))
    assert borrow(a, "I1", revision=3).reason == "reject_stale_borrowed_health"
    before = snapshot(redis_client)
    late = a.bind("I1", 3, now=T0 + 1)
    assert not late and late.decision == "reject_not_admitted" and late.watermark == 3
    assert snapshot(redis_client) == before
    a.report_health(Q, depth=0, ok=True, now=T0 + 40)
    d = borrow(a, "I1", revision=3, now=T0 + 40)                                # past decision_ttl: admitted
    assert d.admitted and a.bind(d.seat, 3, now=T0 + 41).decision == "bound"


def test_retry_sent_again_with_its_attempt_key_spends_once(redis_client):
    a = adm(redis_client, pol=fence_policy(borrowed={"retry_budget": 5}))
    seat = borrow(a).seat
    first = a.retry(seat, now=T0, attempt="a1")
    again = a.retry(seat, now=T0, attempt="a1")                                 # the first reply was lost
    assert first == again and (again.decision, again.retries_left, again.retries) == ("retry_same_plane", 4.0, 1)
    assert a.retry(seat, now=T0, attempt="a2").retries_left == 3.0


def test_revision_a_borrow_for_a_stale_revision_is_refused(redis_client):
    a = adm(redis_client, pol=fence_policy())
    a.advance("I1", 4, now=T0)
    assert borrow(a, "I1", revision=3).reason == "reject_stale_revision"
    assert borrow(a, "I2", revision=3).admitted
    with pytest.raises(BadArgument):
        borrow(a, "I3", revision="R3")


# -- absence sheds, health leases -------------------------------------------------------------------------

def test_absence_sheds_a_borrow():
    # fail fast, as a pod's client does (redis-py's default retries with backoff for seconds)
    dead = redis.Redis(host="127.0.0.1", port=1, **fail_fast_options(0.2, 0.2))
    a = Admission(dead, mesh="t", pod="p", background=False)
    d = a.try_admit(lane="a", model=P, round_id="I1", borrow=Q, draw=0.0)
    assert not d.admitted and d.reason == "admission-unavailable" and d.pool == Q and d.borrowed_for == P


def test_health_a_sample_is_a_lease_that_ages_out(redis_client):
    a = adm(redis_client, pol=fence_policy(borrowed={"health_required": True, "health_max_age": 10}))
    assert a.report_health(Q, depth=3, running=5, ok=True, at=T0, now=T0) == T0 + 10
    view = a.ops.census(now=T0 + 4)["pools"][1]["plane"]
    assert (view["healthFresh"], view["healthAgeSeconds"], view["depth"], view["healthOk"]) == (True, 4, 3, True)
    assert borrow(a, "I1", now=T0 + 10).admitted
    assert borrow(a, "I2", now=T0 + 11).reason == "reject_stale_borrowed_health"
    doc = a.ops.census(now=T0 + 11)
    assert doc["pools"][1]["plane"]["healthFresh"] is False
    assert "plane: depth 0, health 11s old (STALE, max 10s)" in render_census(doc)   # a stale depth is not read


def test_health_an_older_sample_than_the_kept_one_changes_nothing(redis_client):
    a = adm(redis_client, pol=fence_policy())
    a.report_health(Q, depth=1, ok=True, at=T0, now=T0)
    before = snapshot(redis_client)
    a.report_health(Q, depth=9, ok=False, at=T0 - 5, now=T0)
    assert snapshot(redis_client) == before
    with pytest.raises(BadArgument):
        a.report_health(Q, depth=-1, now=T0)


def test_health_a_pods_clock_runs_the_policys_samplers(real_engine, server_pool):
    """Admission(health=True): the pod's clock reads each pool's health_url (a vLLM-style /metrics
    page served here) and writes the plane's sample; a borrow is then admitted on fresh health."""
    import http.server
    import time

    body = (b"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{model_name=\"m\"} 2.0\n"
            b"vllm:num_requests_running{model_name=\"m\"} 5.0\n")

    class Metrics(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = server_pool.get(real_engine).url
    client = redis.Redis.from_url(url)
    client.flushall()
    pol = fence_policy(borrowed={"health_required": True, "health_every": 0.2,
                                 "health_url": f"http://127.0.0.1:{httpd.server_address[1]}/metrics"})
    pol.pop("clock")
    setup = Admission(client, mesh="t", pod="setup", background=False)
    setup.ops.apply_policy(pol, recovery_hold=False)
    assert setup.try_admit(lane="a", model=P, round_id="I0", borrow=Q, draw=0.0).reason == "reject_stale_borrowed_health"
    pod = Admission(redis.Redis.from_url(url), mesh="t", pod="sampler", health=True)
    try:
        deadline = time.monotonic() + 5
        while not client.hget(f"adm:{{t}}:plane:{Q}", "healthAt") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert plane(client, Q)["healthDepth"] == "2" and plane(client, Q)["healthRunning"] == "5"
        assert setup.try_admit(lane="a", model=P, round_id="I1", borrow=Q, draw=0.0).admitted
    finally:
        pod.close()
        httpd.shutdown()
