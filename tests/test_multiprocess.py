"""Several pod processes on one mesh, on a real server (docs/design.md §3, §10).

* test_four_pods_three_lanes_one_pool: 4 pod processes × 50 rounds, each pod running rounds of
  three lanes at once (two threads per lane, `adm.round(...)` with real time and the background
  clock), all on one pool of one mesh; the parent applies the policy once. While they run the
  parent takes atomic snapshots (MULTI: the census script + the doctor + every seat/ticket record +
  the count hashes) and checks that the doctor is ok and the census and the counts equal the live
  records per lane. At the end:
  each of the 200 rounds was admitted exactly once and released once (events stream, tombstones,
  seqs 1..200), the pool's `seq` is 200, and nothing runs or waits anywhere.
* test_killed_pod_is_swept: a pod process holding seats and waiter tickets is SIGKILLed; after
  lease_ttl (1 s) and one tick its seats and tickets are gone and the counts are what the live
  pod holds.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import signal
import threading
import time
from collections import Counter

import redis

from admission import ADMIT_REASONS, Admission
from admission import doctor
from admission import scripts as adm_scripts
from admission.core import decode_census

from helpers import RECORDS_LUA

POOL = "m@sim"
LANE_CFG = {"alpha": (0.5, 3, 30), "beta": (0.3, 1, 20), "gamma": (0.0, 2, 10)}
LANES = tuple(LANE_CFG)
PODS = 4
ROUNDS_PER_POD = 50
THREADS_PER_LANE = 2


def _policy(**tunables) -> dict:
    return {
        "tunables": tunables,
        "lanes": {n: {"floor": f, "weight": w, "priority": p} for n, (f, w, p) in LANE_CFG.items()},
        "providers": {"sim": {}},
        "pools": {POOL: {}},
    }


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _queue_census(pipe, config_key: str) -> None:
    """Queue the census command (rebuilt now, '' = Redis TIME) on a MULTI pipeline (the library
    is loaded by the pods' first call)."""
    adm_scripts.pipe_call(pipe, "census", [config_key], [""])


def snapshot(client: redis.Redis, mesh: str) -> dict:
    """The census (rebuilt now), the doctor's report and the records and counts, all in one
    MULTI/EXEC."""
    prefix = f"adm:{{{mesh}}}:"
    pipe = client.pipeline(transaction=True)
    _queue_census(pipe, prefix + "config")
    adm_scripts.pipe_call(pipe, "doctor", [prefix + "config"], [])
    pipe.eval(RECORDS_LUA, 1, prefix + "config")
    pipe.hgetall(prefix + "lanes:" + POOL)
    pipe.hgetall(prefix + "pool:" + POOL)
    for lane in LANES:
        pipe.zcard(prefix + f"wait:{POOL}:{lane}")
    census, report, (seats, tickets), lanes, pool, *waits = pipe.execute()
    return {
        "census": decode_census(census),
        "doctor": doctor.decode(report),
        "seats": [tuple(_s(x) for x in row) for row in seats],
        "tickets": [tuple(_s(x) for x in row) for row in tickets],
        "lanes": {_s(k): int(v) for k, v in lanes.items()},
        "pool": {_s(k): _s(v) for k, v in pool.items()},
        "wait": dict(zip(LANES, waits)),
    }


def check_snapshot(snap: dict) -> dict:
    """The doctor finds nothing, and census, count hashes and records agree per lane; returns the
    running/waiting per lane."""
    report = snap["doctor"]
    assert report.ok, doctor.render(report)
    assert (report.seats, report.tickets) == (len(snap["seats"]), len(snap["tickets"])), report
    (row,) = [p for p in snap["census"]["pools"] if p["pool"] == POOL]
    by_lane = {r["lane"]: r for r in row["lanes"]}
    assert all(s[1] for s in snap["seats"]), f"a leased seat without its record: {snap['seats']}"
    assert all(t[1] for t in snap["tickets"]), f"a leased ticket without its record: {snap['tickets']}"
    seats = Counter(s[1] for s in snap["seats"] if s[2] == POOL)
    tickets = Counter(t[1] for t in snap["tickets"] if t[2] == POOL)
    out = {}
    for lane in LANES:
        r = by_lane.get(lane, {"running": 0, "waiting": 0})
        assert r["running"] == seats[lane] == snap["lanes"].get(lane, 0), (lane, r, seats, snap["lanes"])
        assert r["waiting"] == tickets[lane] == snap["wait"][lane] == snap["lanes"].get(lane + "|w", 0), \
            (lane, r, tickets, snap["wait"], snap["lanes"])
        assert snap["lanes"].get(lane + "|d", 0) == 0
        out[lane] = (seats[lane], tickets[lane])
    assert row["running"] == len(snap["seats"]) == int(snap["pool"].get("running", 0)) >= 0
    assert row["waiting"] == len(snap["tickets"]) == int(snap["pool"].get("waiting", 0)) >= 0
    return out


# ---------------------------------------------------------------------------------------------
# Pod processes (module-level: started with the spawn method)


def pod_main(url: str, mesh: str, pod: str, rounds: int, seed: int, results) -> None:
    """Run `rounds` rounds spread over two threads per lane, then report what was admitted."""
    adm = Admission.from_url(url, mesh=mesh, pod=pod, background=True, seed=seed)
    records, errors, lock = [], [], threading.Lock()
    plan = [(LANES[i % len(LANES)], i) for i in range(rounds)]
    workers = len(LANES) * THREADS_PER_LANE

    def work(k: int) -> None:
        rng = random.Random(seed * 100 + k)
        for lane, i in plan[k::workers]:
            rid = f"{pod}/{lane}/{i}"
            try:
                with adm.round(lane=lane, model=POOL, round_id=rid, timeout=60) as r:
                    with lock:
                        records.append((rid, lane, r.seat.seq, r.decision.reason))
                    time.sleep(rng.uniform(0.005, 0.03))
                    r.cost_usd = 0.001
            except Exception as exc:  # reported to the parent, which fails the test
                with lock:
                    errors.append(f"{rid}: {exc!r}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    adm.close()
    results.put((pod, records, errors))


def doomed_main(url: str, mesh: str, results) -> None:
    """Take seats and waiter tickets, keep them alive, and wait to be killed."""
    adm = Admission.from_url(url, mesh=mesh, pod="doomed", background=True, seed=7)
    held, waiting = [], []
    for i in range(4):
        d = adm.try_admit(lane="gamma", model=POOL, round_id=f"doomed/g{i}", draw=0.0, wait=True)
        (held if d.admitted else waiting).append(d.round_id)
    d = adm.try_admit(lane="beta", model=POOL, round_id="doomed/b0", draw=0.0, wait=True)
    (held if d.admitted else waiting).append(d.round_id)
    results.put((held, waiting))
    while True:  # the background clock heartbeats until SIGKILL
        time.sleep(1)


def _keep_alive(adm: Admission, seconds: float) -> None:
    """Sleep, heartbeating `adm` (background=False) every lease_ttl/4; ends with a heartbeat."""
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(left, 0.25))
        adm.heartbeat()


def _ctx():
    return mp.get_context("spawn")


# ---------------------------------------------------------------------------------------------


def test_four_pods_three_lanes_one_pool(server_url):
    mesh = "mp"
    prefix = f"adm:{{{mesh}}}:"
    client = redis.Redis.from_url(server_url)
    parent = Admission(client, mesh=mesh, pod="parent", background=False)
    # a small ceiling keeps the pool contended (waiters all along); a short clock keeps it moving
    parent.ops.apply_policy(_policy(seed_estimate=2, max_estimate=6, grow_interval=0.5, lease_ttl=10), recovery_hold=False)

    ctx = _ctx()
    results = ctx.Queue()
    procs = [ctx.Process(target=pod_main, args=(server_url, mesh, f"pod{i}", ROUNDS_PER_POD, i + 1, results),
                         daemon=True) for i in range(PODS)]
    for p in procs:
        p.start()
    got, samples, busiest = [], 0, 0
    deadline = time.monotonic() + 50
    try:
        while len(got) < PODS and time.monotonic() < deadline:
            per_lane = check_snapshot(snapshot(client, mesh))
            samples += 1
            busiest = max(busiest, sum(r + w for r, w in per_lane.values()))
            try:
                got.append(results.get(timeout=0.02))
            except queue.Empty:
                pass
        assert len(got) == PODS, f"only {len(got)} of {PODS} pods finished in time"
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    assert samples >= 5 and busiest > 0, (samples, busiest)

    errors = [e for _, _, errs in got for e in errs]
    assert not errors, errors[:5]
    records = [r for _, recs, _ in got for r in recs]
    total = PODS * ROUNDS_PER_POD
    assert len(records) == total
    ids = Counter(r[0] for r in records)
    assert len(ids) == total and set(ids.values()) == {1}
    assert sorted(r[2] for r in records) == list(range(1, total + 1)), "seqs are not 1..200 once each"
    reasons = Counter(r[3] for r in records)
    assert set(reasons) <= set(ADMIT_REASONS) - {"same-intent"}, reasons

    # the audit stream: every round admitted once and released once, clean
    assert client.xlen(prefix + "events") < 9000, "stream near its cap: trimming would hide events"
    admitted, released = Counter(), Counter()
    for _, fields in client.xrange(prefix + "events"):
        f = {_s(k): _s(v) for k, v in fields.items()}
        if f["kind"] == "admitted":
            admitted[f["round"]] += 1
        elif f["kind"] == "released":
            released[f["round"]] += 1
            assert f["outcome"] == "clean", f
    assert admitted == Counter(ids) and released == Counter(ids)
    for rid in ids:
        assert _s(client.get(prefix + "gone:" + rid)).startswith("released|"), rid

    snap = snapshot(client, mesh)
    per_lane = check_snapshot(snap)
    assert all(v == (0, 0) for v in per_lane.values()), per_lane
    assert snap["seats"] == [] and snap["tickets"] == []
    assert int(snap["pool"]["seq"]) == total
    assert int(snap["pool"]["running"]) == 0 and int(snap["pool"]["waiting"]) == 0
    assert int(float(snap["pool"]["succ"])) >= 1
    client.close()


def test_killed_pod_is_swept(server_url):
    mesh = "kill"
    prefix = f"adm:{{{mesh}}}:"
    lease_ttl = 1.0
    client = redis.Redis.from_url(server_url)
    live = Admission(client, mesh=mesh, pod="live", background=False)
    live.ops.apply_policy(_policy(seed_estimate=2, max_estimate=2, grow_interval=30, lease_ttl=lease_ttl), recovery_hold=False)
    mine = live.try_admit(lane="alpha", model=POOL, round_id="live/a0", draw=0.0)
    assert mine.admitted

    ctx = _ctx()
    results = ctx.Queue()
    proc = ctx.Process(target=doomed_main, args=(server_url, mesh, results), daemon=True)
    proc.start()
    try:
        held, waiting = results.get(timeout=30)
        live.heartbeat()
        # the live pod waits too, behind the doomed pod's waiters
        late = live.try_admit(lane="gamma", model=POOL, round_id="live/g0", draw=0.0, wait=True)
        assert not late.admitted and late.reason == "behind-older", late
        assert held and waiting, (held, waiting)
        snap = snapshot(client, mesh)
        check_snapshot(snap)
        assert {s[0] for s in snap["seats"]} == {"live/a0", *held}
        assert {t[0] for t in snap["tickets"]} == {"live/g0", *waiting}
        _keep_alive(live, 2 * lease_ttl)  # the doomed pod's own clock keeps its leases alive
        snap = snapshot(client, mesh)
        assert {s[0] for s in snap["seats"]} == {"live/a0", *held}, "a live pod's seats expired"
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(timeout=5)
        assert proc.exitcode == -signal.SIGKILL
    finally:
        if proc.is_alive():
            proc.kill()

    _keep_alive(live, lease_ttl + 0.3)
    t = live.tick()
    assert t.swept == len(held) + len(waiting), t
    snap = snapshot(client, mesh)
    per_lane = check_snapshot(snap)
    assert [s[0] for s in snap["seats"]] == ["live/a0"]
    assert [t[0] for t in snap["tickets"]] == ["live/g0"]
    assert per_lane == {"alpha": (1, 0), "beta": (0, 0), "gamma": (0, 1)}
    for rid in held:
        state, _seq, pod, _pool, _lane = _s(client.get(prefix + "gone:" + rid)).split("|")
        assert (state, pod) == ("expired", "doomed")
    # the freed slots go to the live pod's waiter, now the oldest of its lane
    d = live.try_admit(lane="gamma", model=POOL, round_id="live/g0", draw=0.0, wait=True)
    assert d.admitted, d
    check_snapshot(snapshot(client, mesh))
    client.close()
