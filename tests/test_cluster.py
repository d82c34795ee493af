"""The scripts on a real three-master Redis Cluster (DESIGN §3 "Cluster-safe").

Every key of a mesh carries the mesh's hash tag and every script declares the mesh's config key
as KEYS[1], so redis-py routes EVALSHA by that key (RedisCluster.determine_slot special-cases
EVAL/EVALSHA: the slot of the first declared key) and SCRIPT LOAD (the NOSCRIPT fallback of
redis-py's Script) goes to every primary. Nothing cluster-specific is needed in the client.

Checked here, with `redis.cluster.RedisCluster` and several meshes placed on different nodes:
admit / refuse-and-wait / report / release / retried release / heartbeat / tick / census / plan /
allowance / a timed-out waiter's withdraw, the counts of each mesh (no leak between meshes), every
key of a mesh on one slot of one node, and the release wake-up reaching a ClusterPubSub.
"""
from __future__ import annotations

import time
import uuid

import pytest
import redis
from redis.cluster import RedisCluster

from admission import Admission, Status, WaitTimeout

POOL = "m@sim"
POLICY = {
    "tunables": {"seed_estimate": 2, "grow_interval": 5, "lease_ttl": 30},
    "clock": "caller",
    "lanes": {"alpha": {"floor": 0.5, "weight": 3, "priority": 30},
              "beta": {"floor": 0.3, "weight": 1, "priority": 20},
              "gamma": {"floor": 0.0, "weight": 2, "priority": 10}},
    "providers": {"sim": {}},
    "pools": {POOL: {}, "n@sim": {}},
}


def _s(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


@pytest.fixture
def rc(cluster):
    client = RedisCluster(host="127.0.0.1", port=cluster.ports[0])
    yield client
    client.close()


def _meshes_on_distinct_nodes(rc: RedisCluster, wanted: int) -> list[str]:
    """Fresh mesh names (the cluster is never flushed), one per node, as many as `wanted`."""
    tag, by_node = uuid.uuid4().hex[:8], {}
    for i in range(200):
        mesh = f"clu-{tag}-{i}"
        node = rc.get_node_from_key(f"adm:{{{mesh}}}:config").name
        by_node.setdefault(node, mesh)
        if len(by_node) == wanted:
            break
    return list(by_node.values())


def _mesh_keys(rc: RedisCluster, mesh: str) -> list[str]:
    return sorted(_s(k) for k in rc.scan_iter(match=f"adm:{{{mesh}}}:*", count=1000))


def _counts(rc: RedisCluster, mesh: str, pool: str) -> tuple[int, int, dict[str, str]]:
    p = f"adm:{{{mesh}}}:"
    pool_h = {_s(k): _s(v) for k, v in rc.hgetall(p + "pool:" + pool).items()}
    lanes = {_s(k): _s(v) for k, v in rc.hgetall(p + "lanes:" + pool).items()}
    return int(pool_h.get("running", 0)), int(pool_h.get("waiting", 0)), lanes


def _exercise(rc: RedisCluster, mesh: str) -> dict:
    """One mesh's life on the cluster; returns what it left running/waiting."""
    adm = Admission(rc, mesh=mesh, pod="pod-a", background=False, seed=1)
    other = Admission(rc, mesh=mesh, pod="pod-b", background=False, seed=2)
    assert adm.ops.apply_policy(POLICY, recovery_hold=False) == 1
    assert adm.policy()["version"] == 1 and adm.tunables()["lease_ttl"] == 30
    t = time.time()  # near Redis' clock: admit_waiting below runs on real time
    a1 = adm.try_admit(lane="alpha", model=POOL, round_id="a1", now=t, draw=0.0)
    g1 = adm.try_admit(lane="gamma", model=POOL, round_id="g1", now=t, draw=0.0)
    assert (a1.reason, g1.reason) == ("within-floor", "borrowed"), (a1, g1)
    again = adm.try_admit(lane="alpha", model=POOL, round_id="a1", now=t, draw=0.0)
    assert again.reason == "same-intent" and again.seat.seq == a1.seat.seq
    w = other.try_admit(lane="gamma", model=POOL, round_id="w1", now=t + 1, draw=0.0, wait=True)
    assert not w.admitted and w.reason == "full"
    assert _counts(rc, mesh, POOL)[:2] == (2, 1)

    n1 = adm.try_admit(lane="gamma", model="n@sim", round_id="n1", now=t + 2, draw=0.0)
    assert n1.admitted
    r = adm.report(n1.seat, signal="stall", now=t + 2)
    assert r.status == Status.REPORTED and r.decreased
    assert adm.report(n1.seat, signal="stall", now=t + 2).status == Status.ALREADY_REPORTED
    assert adm.release(n1.seat, outcome="stall", seconds=1.0, now=t + 2).status == Status.RELEASED
    hb = adm.heartbeat(now=t + 3)
    assert hb.lost == [] and hb.reasserted == []
    hb = other.heartbeat(now=t + 3)
    assert hb.lost_tickets == []
    assert adm.release(g1.seat, outcome="clean", seconds=2.0, cost_usd=0.01, now=t + 4).status == Status.RELEASED
    assert adm.release(g1.seat, outcome="clean", seconds=2.0, now=t + 4).status == Status.ALREADY_RELEASED

    tk = adm.tick(now=t + 5)
    assert tk.swept == 0 and tk.census_refreshed
    doc = adm.ops.census(now=t + 5)
    (row,) = [p for p in doc["pools"] if p["pool"] == POOL]
    assert doc["mesh"] == mesh and row["running"] == 1 and row["waiting"] == 1 and not row["exhausted"]
    (other_row,) = [p for p in doc["pools"] if p["pool"] == "n@sim"]
    assert other_row["exhausted"] and other_row["why"] == "stall" and other_row["running"] == 0
    lanes = {l["lane"]: l for l in row["lanes"]}
    assert lanes["alpha"]["running"] == 1 and lanes["gamma"]["waiting"] == 1
    assert adm.plan(lane="gamma", model="n@sim", wanted=3, now=t + 5) == 1  # K̂ 0.7 -> one slot
    assert adm.allowance(lane="beta", now=t + 5) >= 0

    # the waiter is admitted now that the borrower left
    w = other.try_admit(lane="gamma", model=POOL, round_id="w1", now=t + 6, draw=0.0, wait=True)
    assert w.admitted, w
    # the tick grew the pool (a waiter is demand): 4 slots; fill them with borrowers
    assert w.slots == 4, w
    fill = [adm.try_admit(lane="gamma", model=POOL, round_id=f"g{i}", now=t + 6, draw=0.0) for i in (2, 3)]
    assert all(d.reason == "borrowed" for d in fill), fill
    # a waiter that gives up withdraws its ticket (withdraw script)
    with pytest.raises(WaitTimeout):
        other.admit_waiting(lane="gamma", model=POOL, round_id="w2", timeout=0.05)
    assert not rc.exists(f"adm:{{{mesh}}}:ticket:w2")
    for d in fill:
        adm.release(d.seat, now=t + 7)
    other.release(w.seat, now=t + 7)
    running, waiting, lane_counts = _counts(rc, mesh, POOL)
    assert (running, waiting) == (1, 0) and int(lane_counts["alpha"]) == 1
    return {"adm": adm, "a1": a1, "t": t}


def test_meshes_on_different_nodes(rc):
    meshes = _meshes_on_distinct_nodes(rc, 3)
    nodes = {rc.get_node_from_key(f"adm:{{{m}}}:config").name for m in meshes}
    slots = {rc.keyslot(f"adm:{{{m}}}:config") for m in meshes}
    assert len(meshes) >= 2 and len(nodes) == len(meshes) >= 2 and len(slots) == len(meshes), (meshes, nodes)

    left = {m: _exercise(rc, m) for m in meshes}

    for mesh in meshes:
        keys = _mesh_keys(rc, mesh)
        # the read model, the config, pools, lanes, seats, tombstones, events, the spend ledger
        for part in ("config", "census", "events", "seats", "pool:" + POOL, "lanes:" + POOL,
                     "seat:a1", "gone:g1", "gone:w1"):
            assert f"adm:{{{mesh}}}:{part}" in keys, (part, keys)
        assert any(k.startswith(f"adm:{{{mesh}}}:spend:") for k in keys), keys
        # every key of a mesh on one slot (CLUSTER KEYSLOT asked of the server) of one node
        server_slots = {rc.cluster_keyslot(k) for k in keys}
        assert server_slots == {rc.keyslot(f"adm:{{{mesh}}}:config")}, server_slots
        node = rc.get_node_from_key(f"adm:{{{mesh}}}:config")
        direct = redis.Redis(host=node.host, port=node.port)
        try:
            assert sorted(_s(k) for k in direct.scan_iter(match=f"adm:{{{mesh}}}:*", count=1000)) == keys
        finally:
            direct.close()
        # no leak between meshes: each holds only its own seat
        running, waiting, _ = _counts(rc, mesh, POOL)
        assert (running, waiting) == (1, 0)

    # the counts heal on every mesh: the leases run out and a tick sweeps them
    for mesh, st in left.items():
        tk = st["adm"].tick(now=st["t"] + 100)
        assert tk.swept == 1, (mesh, tk)
        assert _counts(rc, mesh, POOL)[:2] == (0, 0)
        r = st["adm"].release(st["a1"].seat, now=st["t"] + 101)
        assert r.status == Status.EXPIRED


def test_background_round_and_wakeup_on_cluster(rc):
    """Real time on the cluster: the background clock (heartbeat, tick, ClusterPubSub) and a
    release wake-up published from inside the release script."""
    (mesh,) = _meshes_on_distinct_nodes(rc, 1)
    setup = Admission(rc, mesh=mesh, pod="setup", background=False)
    setup.ops.apply_policy(POLICY, recovery_hold=False)
    sub = rc.pubsub()
    sub.subscribe(f"adm:{{{mesh}}}:wake")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:  # the subscribe confirmation
        msg = sub.get_message(timeout=0.2)
        if msg and msg["type"] == "subscribe":
            break
    with Admission(rc, mesh=mesh, pod="bg", background=True) as adm:
        with adm.round(lane="alpha", model=POOL, round_id="bg-1", timeout=10) as r:
            assert r.decision.admitted
            assert _counts(rc, mesh, POOL)[0] == 1
            time.sleep(0.3)  # the clock thread runs meanwhile (heartbeat + tick)
            assert rc.zscore(f"adm:{{{mesh}}}:seats", "bg-1") is not None
            # the pool's other slot taken, and a waiter behind: the release below is news to it
            other = setup.try_admit(lane="alpha", model=POOL, round_id="bg-2", draw=0.0)
            assert other.admitted
            assert not setup.try_admit(lane="alpha", model=POOL, round_id="bg-w", draw=0.0, wait=True).admitted
    assert _counts(rc, mesh, POOL)[:2] == (1, 1)
    got = None
    deadline = time.monotonic() + 5
    while got is None and time.monotonic() < deadline:
        msg = sub.get_message(timeout=0.2)
        if msg and msg["type"] == "message":
            got = msg
    sub.close()
    assert got is not None and _s(got["data"]) == POOL, got
    setup._give_up(POOL, "bg-w")
    setup.release(other.seat, outcome="clean", seconds=1)
    assert _counts(rc, mesh, POOL)[:2] == (0, 0)
