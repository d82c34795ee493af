"""Quick checks of admission.tools.servers (the harness every other test relies on)."""

from __future__ import annotations

import os
import time

import pytest
import redis
from redis.cluster import RedisCluster

from admission.tools.servers import LocalServer, ServerStartError, _slot_ranges, free_port


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
