"""admission.tools.proxy.FaultProxy against a real redis-server: each fault as a client sees it."""

from __future__ import annotations

import threading
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from admission.tools.proxy import FaultProxy
from admission.tools.servers import LocalServer, find_server

pytestmark = [
    pytest.mark.real,
    pytest.mark.skipif(not find_server("redis"), reason="no redis-server on PATH"),
]


@pytest.fixture(scope="module")
def server():
    with LocalServer("redis") as srv:
        yield srv


@pytest.fixture
def proxy(server):
    server.client().flushall()
    with FaultProxy("127.0.0.1", server.port) as p:
        yield p
    assert not [t for t in threading.enumerate() if t.name.startswith("FaultProxy")]


# A connection that sends nothing but the commands: redis-py 8 otherwise opens each one with
# HELLO 3 and CLIENT SETINFO, whose replies a fault can drop as well.
_BARE = {"protocol": 2, "driver_info": None}


def _client(proxy: FaultProxy, retries: int = 0, **kw) -> redis.Redis:
    """No client-side retry unless asked: each test sees the fault itself."""
    kw.setdefault("socket_timeout", 0.3)
    kw.setdefault("socket_connect_timeout", 0.3)
    return redis.Redis.from_url(proxy.url, retry=Retry(NoBackoff(), retries), **kw)


def test_passes_traffic_through_and_counts_it(proxy, server):
    assert proxy.url == f"redis://127.0.0.1:{proxy.port}/0"
    with _client(proxy) as c:
        c.set("k", "v" * 1000)
        assert c.get("k") == b"v" * 1000
        assert c.pipeline().incr("n").incr("n").execute() == [1, 2]
    assert server.client().get("n") == b"2"
    st = proxy.stats()
    assert st["connections"] == 1 and st["bytes_up"] > 1000 and st["bytes_down"] > 1000
    assert st["replies_dropped"] == st["connections_dropped"] == 0


def test_delay_adds_latency_both_ways(proxy):
    with _client(proxy) as c:
        c.ping()
        proxy.delay(0.1)
        t0 = time.monotonic()
        c.ping()
        took = time.monotonic() - t0
        assert 0.2 <= took < 0.5  # request and reply each held 0.1 s
        proxy.delay(0)
        t0 = time.monotonic()
        c.ping()
        assert time.monotonic() - t0 < 0.1


def test_lost_reply_the_server_applied_the_command(proxy, server):
    with _client(proxy) as c:
        c.ping()  # connected before the fault
        proxy.drop_replies(1.0)
        with pytest.raises(redis.ConnectionError):
            c.incr("k")
    assert server.client().get("k") == b"1"  # applied, though the client saw an error
    st = proxy.stats()
    assert st["replies_dropped"] == 1 and st["connections_dropped"] == 1


def test_a_retried_lost_reply_is_applied_twice(proxy, server):
    # Why the lost reply matters: a client that retries on a connection error (redis-py's
    # default does, up to 10 times) sends a non-idempotent command again. No handshake here
    # (RESP2, no CLIENT SETINFO), so the reconnect itself has no reply to lose.
    with _client(proxy, retries=1, **_BARE) as c:
        c.ping()
        proxy.drop_replies(1.0)
        with pytest.raises(redis.ConnectionError):
            c.incr("k")
    assert server.client().get("k") == b"2"
    assert proxy.stats()["replies_dropped"] == 2


def test_drop_replies_is_seeded_and_turned_off(proxy, server):
    proxy.drop_replies(0.5, seed=7)
    outcomes = []
    for _ in range(20):
        with _client(proxy, **_BARE) as c:
            try:
                c.incr("k")
                outcomes.append(True)
            except redis.ConnectionError:
                outcomes.append(False)
    assert 0 < sum(outcomes) < 20
    assert int(server.client().get("k")) == 20  # every command applied, lost replies or not
    assert proxy.stats()["replies_dropped"] == outcomes.count(False)
    proxy.drop_replies(0)
    with _client(proxy) as c:
        assert c.incr("k") == 21
    with pytest.raises(ValueError):
        proxy.drop_replies(1.5)


@pytest.mark.parametrize("mode", ["blackhole", "reset"])
def test_partition_fails_commands_until_heal(proxy, mode):
    with _client(proxy, socket_timeout=0.15) as c:
        c.set("k", "1")
        proxy.partition(mode)
        expected = redis.TimeoutError if mode == "blackhole" else redis.ConnectionError
        for _ in range(2):  # the open connection, then a new one
            t0 = time.monotonic()
            with pytest.raises(expected):
                c.get("k")
            assert time.monotonic() - t0 < 0.4
        proxy.heal()
        assert c.get("k") == b"1"
    if mode == "reset":  # (a blackholed client gives up on its silent connection itself)
        assert proxy.stats()["connections_dropped"] >= 1
    with pytest.raises(ValueError):
        proxy.partition("nope")


def test_drop_connections_makes_the_client_reconnect(proxy):
    with _client(proxy, retries=1) as c:
        c.set("k", "1")
        assert proxy.drop_connections() == 1
        assert c.get("k") == b"1"  # redis-py retried once on a fresh connection
    st = proxy.stats()
    assert st["connections"] == 2 and st["connections_dropped"] == 1


def test_stop_is_idempotent_and_closes_clients(server):
    p = FaultProxy("127.0.0.1", server.port).start()
    c = _client(p)
    c.ping()
    p.stop()
    p.stop()
    with pytest.raises(redis.ConnectionError):
        c.ping()
    c.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("FaultProxy")]
    with pytest.raises(RuntimeError):
        p.drop_connections()
