"""What primaries and replicas share (a cluster's and a Sentinel group's): a fast full sync,
waiting for replicas to be online, reading INFO fields."""
from __future__ import annotations

import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from .processes import _log_tail
from .server import LocalServer


# A diskless full sync waits 5 s by default for more replicas to share it: not here.
_FAST_SYNC = ("--repl-diskless-sync-delay", "0")


def wait_replicas_online(primary: LocalServer, n: int = 1, timeout: float = 30.0) -> None:
    """Wait until `primary` counts `n` replicas online: what WAIT counts (after a diskless sync a
    replica is online only from its first ACK, up to a second later). A crashed primary brought
    back after a failover becomes a replica of the new one (the Sentinels or the cluster tell it
    to) and syncs first."""
    deadline = time.monotonic() + timeout
    online = 0
    while time.monotonic() < deadline:
        try:
            with primary.client(socket_timeout=1, retry=Retry(NoBackoff(), 0)) as c:
                info = c.info("replication")
            online = sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                         and v.get("state") == "online")
            if online >= n:
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{primary.port} counts {online} of {n} replicas online after {timeout:.0f}s; "
                       f"log tail:\n{_log_tail(primary.log_path) if primary.log_path else ''}")


def _info_field(client: redis.Redis, section: str, field: str) -> str | None:
    v = client.info(section).get(field)
    return None if v is None else _text(v)


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)
