"""The doctor (lua/doctor.lua, admission/doctor.py): the counts agree with the live records.

A clean mesh is ok; each kind of corruption is reported with its kind and details; the doctor
never changes anything; it works without a policy and for pools and lanes the policy dropped.
The conftest runs the same doctor after every test that touched state.
"""
from __future__ import annotations

import pytest
import redis

from admission import Admission, doctor
from admission.errors import BadName
from admission import scripts

from helpers import policy, snapshot

P = "adm:{t}:"
M, N = "m@p", "n@p"
LANES = {"a": {"floor": 0.5, "weight": 1, "priority": 2},   # a: below its floor it overdraws
         "b": {"floor": 0.0, "weight": 1, "priority": 1}}   # b: borrows only a free slot
POLICY = policy(LANES, pools=(M, N), seed_estimate=2, max_estimate=2)


def _setup(client):
    """Seats r1, r2 (lane a) on m@p, s3 (lane b) on n@p; waiters w1 (a) and w2 (b) on m@p."""
    a = Admission(client, mesh="t", pod="pod-a", background=False, seed=1)
    a.ops.apply_policy(POLICY, recovery_hold=False)   # a new mesh: nothing to re-assert
    seats = {}
    for rid, lane, pool in (("r1", "a", M), ("r2", "a", M), ("s3", "b", N)):
        d = a.try_admit(lane=lane, model=pool, round_id=rid, draw=0.0)
        assert d.admitted, d
        seats[rid] = d.seat
    for rid, lane in (("w1", "a"), ("w2", "b")):
        d = a.try_admit(lane=lane, model=M, round_id=rid, draw=0.0, wait=True)
        assert not d.admitted, d
    return a, seats


def _check(client, mesh: str = "t") -> doctor.Report:
    """Run the doctor and show that it changed nothing."""
    before = snapshot(client)
    report = doctor.check(client, mesh)
    assert snapshot(client) == before, "the doctor wrote"
    return report


def _ticket(client, rid: str, lane: str, pool: str = M) -> None:
    """A ticket with its lease, its queue place and its counts (consistent by itself)."""
    client.hset(P + f"ticket:{rid}", mapping={"lane": lane, "pool": pool, "pod": "pod-x", "agent": "", "since": "1"})
    client.zadd(P + "tickets", {rid: 9e12})
    client.zadd(P + f"wait:{pool}:{lane}", {rid: 1})
    client.hincrby(P + f"lanes:{pool}", lane + "|w", 1)
    client.hincrby(P + f"pool:{pool}", "waiting", 1)


def test_a_clean_mesh_is_ok(redis_client):
    assert _check(redis_client) == doctor.Report(True, 0, 0, [])   # nothing at all
    a, seats = _setup(redis_client)
    assert _check(redis_client) == doctor.Report(True, 3, 2, [])
    for seat in seats.values():
        a.release(seat)
    report = _check(redis_client)
    assert report.ok and report.seats == 0 and report.problems == []


def test_delegated_seats_are_counted_in_the_lane_d_field(redis_client):
    _setup(redis_client)
    redis_client.hset(P + "seat:r1", "delegated", "parent/r0")
    redis_client.hincrby(P + f"lanes:{M}", "a|d", 1)
    assert _check(redis_client).ok


# (id, corruption, the problems it must give, in the doctor's order)
CORRUPTIONS = [
    ("lane_running", lambda c: c.hincrby(P + f"lanes:{M}", "a", 1),
     [{"kind": "lane-count", "pool": M, "lane": "a", "field": "a", "stored": 3, "records": 2}]),
    ("lane_waiting", lambda c: c.hincrby(P + f"lanes:{M}", "b|w", 1),
     [{"kind": "lane-count", "pool": M, "lane": "b", "field": "b|w", "stored": 2, "records": 1}]),
    ("lane_delegated", lambda c: c.hset(P + f"lanes:{N}", "b|d", 1),
     [{"kind": "lane-count", "pool": N, "lane": "b", "field": "b|d", "stored": 1, "records": 0}]),
    ("pool_running", lambda c: c.hincrby(P + f"pool:{M}", "running", -1),
     [{"kind": "pool-count", "pool": M, "field": "running", "stored": 1, "records": 2}]),
    ("pool_waiting", lambda c: c.hincrby(P + f"pool:{M}", "waiting", 1),
     [{"kind": "pool-count", "pool": M, "field": "waiting", "stored": 3, "records": 2}]),
    ("negative_lane", lambda c: c.hset(P + f"lanes:{M}", "b", -1),
     [{"kind": "negative", "key": f"lanes:{M}", "field": "b", "value": -1},
      {"kind": "lane-count", "pool": M, "lane": "b", "field": "b", "stored": -1, "records": 0}]),
    ("negative_pool", lambda c: c.hset(P + f"pool:{N}", "waiting", -1),
     [{"kind": "negative", "key": f"pool:{N}", "field": "waiting", "value": -1},
      {"kind": "pool-count", "pool": N, "field": "waiting", "stored": -1, "records": 0}]),
    ("not_a_number", lambda c: c.hset(P + f"lanes:{M}", "a", "two"),
     [{"kind": "not-a-number", "key": f"lanes:{M}", "field": "a", "value": "two"}]),
    ("dropped_queue_member", lambda c: c.zrem(P + f"wait:{M}:a", "w1"),
     [{"kind": "ticket-not-queued", "id": "w1", "pool": M, "lane": "a"}]),
    ("queue_member_without_ticket", lambda c: c.zadd(P + f"wait:{M}:b", {"ghost": 1}),
     [{"kind": "queue-member-without-ticket", "pool": M, "lane": "b", "id": "ghost"}]),
    ("queue_member_misplaced", lambda c: c.zadd(P + f"wait:{M}:b", {"w1": 1}),
     [{"kind": "queue-member-misplaced", "pool": M, "lane": "b", "id": "w1", "ticketPool": M, "ticketLane": "a"}]),
    ("stray_seat", lambda c: c.zadd(P + "seats", {"ghost": 9e12}),
     [{"kind": "seat-without-record", "id": "ghost"}]),
    ("stray_ticket", lambda c: c.zadd(P + "tickets", {"ghost": 9e12}),
     [{"kind": "ticket-without-record", "id": "ghost"}]),
    ("seat_and_ticket", lambda c: _ticket(c, "r1", "a"),
     [{"kind": "seat-and-ticket", "id": "r1"}]),
    ("seat_not_leased", lambda c: c.hset(P + "seat:w2", mapping={"lane": "b", "pool": M, "pod": "pod-x"}),
     [{"kind": "seat-not-leased", "id": "w2"}, {"kind": "seat-and-ticket", "id": "w2"}]),
    ("ticket_not_leased", lambda c: (c.zrem(P + "tickets", "w2"), c.hincrby(P + f"lanes:{M}", "b|w", -1),
                                     c.hincrby(P + f"pool:{M}", "waiting", -1)),
     [{"kind": "ticket-not-leased", "id": "w2", "pool": M, "lane": "b"}]),
    ("bad_record", lambda c: c.hdel(P + "seat:s3", "lane"),
     [{"kind": "bad-record", "what": "seat", "id": "s3", "missing": "lane"},
      {"kind": "pool-count", "pool": N, "field": "running", "stored": 1, "records": 0},
      {"kind": "lane-count", "pool": N, "lane": "b", "field": "b", "stored": 1, "records": 0}]),
    ("bad_config", lambda c: c.hset(P + "config", "lanes", "not json"),
     [{"kind": "bad-config", "field": "lanes"}]),
]


@pytest.mark.corrupts_state
@pytest.mark.parametrize("corrupt,problems", [c[1:] for c in CORRUPTIONS], ids=[c[0] for c in CORRUPTIONS])
def test_each_corruption_is_reported_with_its_kind(redis_client, corrupt, problems):
    _setup(redis_client)
    corrupt(redis_client)
    report = _check(redis_client)
    assert not report.ok and report.problems == problems, report.problems
    assert report.kinds() == {p["kind"] for p in problems}
    lines = doctor.render(report, "t").splitlines()
    assert len(lines) == 1 + len(problems) and "mesh t" in lines[0]
    assert [line.split(":")[0].strip(" -") for line in lines[1:]] == [p["kind"] for p in problems]


def test_no_policy_records_and_counts_still_checked(redis_client):
    """Without a policy the catalog is empty: the pools and lanes come from the records."""
    _setup(redis_client)
    redis_client.delete(P + "config")
    assert _check(redis_client) == doctor.Report(True, 3, 2, [])


@pytest.mark.corrupts_state
def test_no_policy_a_bad_count_is_still_found(redis_client):
    _setup(redis_client)
    redis_client.delete(P + "config")
    redis_client.hincrby(P + f"lanes:{N}", "b", 1)
    redis_client.zrem(P + f"wait:{M}:b", "w2")
    assert _check(redis_client).problems == [
        {"kind": "lane-count", "pool": N, "lane": "b", "field": "b", "stored": 2, "records": 1},
        {"kind": "ticket-not-queued", "id": "w2", "pool": M, "lane": "b"}]


def test_a_mesh_with_seats_and_no_policy_at_all(redis_client):
    redis_client.hset(P + "seat:x", mapping={"lane": "l", "pool": "q@p", "pod": "p", "seq": 1})
    redis_client.zadd(P + "seats", {"x": 9e12})
    redis_client.hset(P + "lanes:q@p", "l", 1)
    redis_client.hset(P + "pool:q@p", "running", 1)
    assert _check(redis_client) == doctor.Report(True, 1, 0, [])


def test_a_removed_pool_and_lane_are_still_counted(redis_client):
    a, _ = _setup(redis_client)
    # the new policy drops pool n@p (where s3 runs) and lane b (w2 waits in it on m@p)
    a.ops.apply_policy(policy({"a": LANES["a"]}, pools=(M,), seed_estimate=2, max_estimate=2), recovery_hold=False)
    assert _check(redis_client) == doctor.Report(True, 3, 2, [])


@pytest.mark.corrupts_state
def test_a_removed_pool_and_lane_bad_counts_are_found(redis_client):
    a, _ = _setup(redis_client)
    a.ops.apply_policy(policy({"a": LANES["a"]}, pools=(M,), seed_estimate=2, max_estimate=2), recovery_hold=False)
    redis_client.hincrby(P + f"pool:{N}", "running", 1)
    redis_client.hincrby(P + f"lanes:{M}", "b|w", 1)
    assert _check(redis_client).problems == [
        {"kind": "lane-count", "pool": M, "lane": "b", "field": "b|w", "stored": 2, "records": 1},
        {"kind": "pool-count", "pool": N, "field": "running", "stored": 2, "records": 1}]


@pytest.mark.corrupts_state
def test_a_removed_lane_is_checked_by_its_records_and_by_its_count_fields(redis_client):
    a, _ = _setup(redis_client)
    a.ops.apply_policy(policy({"a": LANES["a"]}, pools=(M,), seed_estimate=2, max_estimate=2), recovery_hold=False)
    redis_client.hdel(P + f"lanes:{M}", "b|w")   # lane b: named only by its waiter w2 now
    redis_client.hset(P + f"lanes:{N}", "c", 1)  # lane c: named only by its count field
    assert _check(redis_client).problems == [
        {"kind": "lane-count", "pool": M, "lane": "b", "field": "b|w", "stored": 0, "records": 1},
        {"kind": "lane-count", "pool": N, "lane": "c", "field": "c", "stored": 1, "records": 0}]


def test_a_bad_mesh_name_is_an_error(redis_client):
    with pytest.raises(BadName):
        doctor.check(redis_client, "a}b")
    with pytest.raises(redis.ResponseError, match="ADM_BAD_ARG"):
        scripts.call(redis_client, "doctor", ["not-a-config-key"], [])


def test_decode_reads_an_empty_problem_object_as_a_list():
    r = doctor.decode(b'{"ok":true,"seats":2,"tickets":0,"problems":{}}')
    assert r == doctor.Report(True, 2, 0, [])
    r = doctor.decode('{"ok":false,"seats":1,"tickets":0,"problems":[{"kind":"seat-without-record","id":"x"}]}')
    assert not r.ok and r.kinds() == {"seat-without-record"}


def test_render():
    assert doctor.render(doctor.Report(True, 3, 1, [])) == "ok: 3 seats, 1 tickets"
    text = doctor.render(doctor.Report(False, 1, 0, [{"kind": "negative", "key": "pool:m@p", "field": "running",
                                                      "value": -1}]), "prod")
    assert text.splitlines() == ["1 problem in mesh prod (1 seats, 0 tickets):",
                                 "  - negative: field=running key=pool:m@p value=-1"]


@pytest.mark.corrupts_state
def test_a_sweep_marker_after_a_lease_is_reported(redis_client):
    """An admit skips the sweep before the marker (config sweepAt): one after a lease would let
    that lease outlive its end."""
    _setup(redis_client)
    assert _check(redis_client).ok
    first = min(s for _, s in redis_client.zrange(P + "seats", 0, 0, withscores=True)
                + redis_client.zrange(P + "tickets", 0, 0, withscores=True))
    redis_client.hset(P + "config", "sweepAt", "9e12")
    (problem,) = _check(redis_client).problems
    assert problem["kind"] == "sweep-marker-late" and problem["marker"] == "9e12"
    assert float(problem["lease"]) == first
    redis_client.hset(P + "config", "sweepAt", "")              # "no lease" while leases exist
    assert _check(redis_client).kinds() == {"sweep-marker-late"}
    redis_client.hset(P + "config", "sweepAt", repr(first))    # at the earliest lease: fine
    assert _check(redis_client).ok


@pytest.mark.corrupts_state
def test_the_cap_lines_index_out_of_step_with_the_seats_is_reported(redis_client):
    """sized:<p> (capline.lua) must hold exactly the seats of p that declared a size: a member left
    behind, a declared seat missing from it, or one at another size is reported."""
    a, _ = _setup(redis_client)
    d = a.try_admit(lane="b", model=N, round_id="big", draw=0.0, tokens=40_000)
    assert d.admitted and _check(redis_client).ok
    redis_client.zadd(P + "sized:" + N, {"ghost": 5})
    (problem,) = _check(redis_client).problems
    assert problem == {"kind": "sized-index", "pool": N, "id": "ghost"}
    redis_client.zrem(P + "sized:" + N, "ghost", "big")
    assert [(p["kind"], p["id"]) for p in _check(redis_client).problems] == [("sized-index", "big")]
    redis_client.zadd(P + "sized:" + N, {"big": 39_999})
    assert _check(redis_client).kinds() == {"sized-index"}
    redis_client.zadd(P + "sized:" + N, {"big": 40_000})
    assert _check(redis_client).ok
    redis_client.hset(P + "pool:" + N, "sized", 2)  # the pool's count of its declared rounds
    (problem,) = _check(redis_client).problems
    assert (problem["kind"], problem["field"], problem["stored"], problem["records"]) == ("pool-count", "sized", 2, 1)
    redis_client.hset(P + "pool:" + N, "sized", 1)
    assert _check(redis_client).ok
