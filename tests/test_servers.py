"""Quick checks of admission.tools.servers (the harness every other test relies on)."""

from __future__ import annotations

import os
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from admission.tools.servers import (
    LocalCluster,
    LocalSentinelGroup,
    LocalServer,
    ServerStartError,
    _slot_ranges,
    free_port,
)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers kill(0); treat it as gone.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def test_free_port_is_bindable():
    assert 1024 <= free_port() <= 65535


def test_slot_ranges_cover_all_slots():
    ranges = _slot_ranges(3)
    assert ranges[0][0] == 0 and ranges[-1][1] == 16383
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))


def test_local_server_answers_and_stops_cleanly(real_engine):
    with LocalServer(real_engine) as srv:
        pid, tmp = srv.pid, srv.dir
        assert srv.url == f"redis://127.0.0.1:{srv.port}/0"
        assert srv.version and srv.version[0].isdigit()
        client = redis.Redis.from_url(srv.url)
        assert client.ping()
        # persistence off, as the tests and the benchmark assume
        assert client.config_get("save")["save"] == ""
        assert client.config_get("appendonly")["appendonly"] == "no"
        client.close()
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid)
    assert not tmp.exists()
    srv.stop()  # idempotent


def test_start_failure_reports_log_tail(real_engine):
    srv = LocalServer(real_engine, extra_args=["--no-such-option", "x"])
    with pytest.raises(ServerStartError, match="log tail"):
        srv.start()
    assert srv.pid is None and srv.dir is None


def test_session_server_and_flush(redis_client, engine):
    redis_client.set(b"k", b"v")
    assert redis_client.get(b"k") == b"v"
    assert redis_client.dbsize() == 1  # flushed before each test


def test_cluster_ok_and_hash_tag(cluster):
    for port in cluster.ports:
        info = redis.Redis(port=port).execute_command("CLUSTER", "INFO")
        assert b"cluster_state:ok" in info
    rc = RedisCluster(startup_nodes=cluster.startup_nodes)
    try:
        rc.set("{m}:probe", b"1")
        rc.set("{m}:other", b"2")
        assert rc.get("{m}:probe") == b"1"
        # same hash tag -> same slot, so multi-key commands work
        assert rc.mget("{m}:probe", "{m}:other") == [b"1", b"2"]
    finally:
        rc.delete("{m}:probe", "{m}:other")
        rc.close()


def _all_gone(pids: list[int]) -> bool:
    deadline = time.monotonic() + 5
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(_alive(p) for p in pids)


def test_local_server_kill_keeps_the_port_for_restart(real_engine):
    with LocalServer(real_engine) as srv:
        pid, port = srv.pid, srv.port
        srv.kill()
        assert not srv.running and not _alive(pid) and srv.dir.exists()
        srv.restart()
        assert srv.running and srv.port == port and srv.client().ping()


@pytest.mark.slow  # ~4-6 s: a real failover
def test_sentinel_failover_keeps_replicated_writes(real_engine):
    if real_engine == "redis":
        pytest.skip("on redis, tests/chaos/test_chaos_failover.py runs this failover under load")
    t0 = time.monotonic()
    with LocalSentinelGroup(real_engine) as group:
        started = time.monotonic() - t0
        pids = [s.pid for s in (*group.servers, *group.sentinels)]
        assert len(group.servers) == 2 and len(group.sentinel_addrs) == 3
        assert group.primary is group.servers[0]
        client = group.master_client(socket_timeout=1)
        client.set("k", "before")
        assert group.primary.client().wait(1, 1000) == 1  # on the replica before the crash

        old = group.kill_primary()
        assert not old.running
        t1 = time.monotonic()
        new = group.wait_failover(old.port, timeout=15)
        failover = time.monotonic() - t1
        assert new is group.servers[1] and group.primary is new
        assert new.client().get("k") == b"before"
        # the client made before the crash finds the new primary through the Sentinels
        client.set("k", "after")
        assert new.client().get("k") == b"after"
        assert group.sentinel_client().discover_master("admission") == ("127.0.0.1", new.port)
        client.close()
    print(f"sentinel group ({real_engine}): start {started:.2f}s, failover {failover:.2f}s")
    assert failover < 10
    assert _all_gone(pids)


def test_sentinel_group_with_acl_user(real_engine):
    with LocalSentinelGroup(real_engine, sentinels=1, username="chaos", password="s3cret",
                            master_name="acl") as group:
        # start() returned: the replica authenticated to the primary, the Sentinel to both
        group.master_client().set("k", "v")
        assert group.servers[1].client().get("k") in (b"v", None)  # replication is async
        with pytest.raises(redis.AuthenticationError):  # (no retries: redis-py's take 4 s)
            redis.Redis(port=group.primary.port, retry=Retry(NoBackoff(), 0)).ping()


@pytest.mark.slow  # ~4-6 s: a real failover
def test_cluster_replica_takes_over_a_killed_primary(real_engine):
    if real_engine == "redis":
        pytest.skip("on redis, tests/chaos/test_chaos_failover.py runs this failover under load")
    t0 = time.monotonic()
    with LocalCluster(real_engine, masters=3, replicas=1, node_timeout_ms=1000) as cluster:
        started = time.monotonic() - t0
        pids = [n.pid for n in cluster.nodes]
        assert len(cluster.nodes) == 6
        rc = cluster.client()
        rc.set("{chaos}:k", "v")
        primary = cluster.primary_for("{chaos}:k")
        assert primary in cluster.nodes[:3]
        assert primary.client().wait(1, 1000) == 1

        killed = cluster.kill_primary_for("{chaos}:k")
        assert killed is primary and not killed.running
        t1 = time.monotonic()
        new = cluster.wait_promoted("{chaos}:k", timeout=15)
        failover = time.monotonic() - t1
        assert new is not killed and new in cluster.nodes[3:]
        assert cluster.primary_for("{chaos}:k") is new
        assert new.client().get("{chaos}:k") == b"v"
        # a cluster client made before the crash follows the new slot map, and a new one too
        assert rc.get("{chaos}:k") == b"v"
        rc.close()
        with cluster.client() as rc2:
            rc2.set("{chaos}:k", "w")
        assert new.client().get("{chaos}:k") == b"w"
    print(f"cluster 3+3 ({real_engine}): start {started:.2f}s, failover {failover:.2f}s")
    assert failover < 10
    assert _all_gone(pids)
