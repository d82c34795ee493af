"""Small builders shared by the tests."""
from __future__ import annotations

import copy
from typing import Any

from admission import Admission

T0 = 1_800_000_000.0  # a fixed epoch: every test passes `now`
POOL = "m@p"


def policy(lanes: dict[str, dict[str, Any]] | None = None, pools: tuple[str, ...] = (POOL,),
           **tunables: Any) -> dict[str, Any]:
    """A policy dict (TOML shape) with long leases unless a test sets them."""
    lanes = lanes or {"a": {"floor": 0.5, "weight": 1, "priority": 2},
                      "b": {"floor": 0.3, "weight": 1, "priority": 1}}
    providers = {p.rpartition("@")[2]: {} for p in pools}
    return {"tunables": {"lease_ttl": 10_000, **tunables}, "lanes": copy.deepcopy(lanes),
            "providers": providers, "pools": {p: {} for p in pools}, "clock": "caller"}


def adm(client, pod: str = "pod-a", mesh: str = "t", pol: dict | None = None, apply: bool = True) -> Admission:
    a = Admission(client, mesh=mesh, pod=pod, background=False, seed=1)
    if apply:
        a.ops.apply_policy(pol or policy(), recovery_hold=False)  # a new mesh: nothing to re-assert
    return a


class Rounds:
    """Numbered round ids and admits with a fixed clock, to keep tests short."""

    def __init__(self, a: Admission, now: float = T0):
        self.a, self.now, self.n = a, now, 0

    def ask(self, lane: str, pool: str = POOL, draw: float = 0.0, wait: bool = False,
            round_id: str | None = None, now: float | None = None):
        if round_id is None:
            self.n += 1
            round_id = f"r{self.n}"
        return self.a.try_admit(lane=lane, model=pool, round_id=round_id, now=now or self.now,
                                draw=draw, wait=wait)

    def fill(self, lane: str, count: int, pool: str = POOL):
        seats = []
        for _ in range(count):
            d = self.ask(lane, pool)
            assert d.admitted, d
            seats.append(d.seat)
        return seats


def pool_state(client, pool: str = POOL, mesh: str = "t") -> dict[str, str]:
    raw = client.hgetall(f"adm:{{{mesh}}}:pool:{pool}")
    return {k.decode(): v.decode() for k, v in raw.items()}


def lane_row(census: dict, lane: str, pool: str = POOL) -> dict:
    row = next(p for p in census["pools"] if p["pool"] == pool)
    return next((l for l in row["lanes"] if l["lane"] == lane), {})


def pool_row(census: dict, pool: str = POOL) -> dict:
    return next(p for p in census["pools"] if p["pool"] == pool)


def snapshot(client) -> dict:
    """Every key with its type and full value: equal snapshots mean byte-for-byte equal state."""
    out = {}
    for k in sorted(client.keys("*")):
        t = client.type(k).decode()
        if t == "string":
            v = client.get(k)
        elif t == "hash":
            v = sorted(client.hgetall(k).items())
        elif t == "zset":
            v = client.zrange(k, 0, -1, withscores=True)
        elif t == "set":
            v = sorted(client.smembers(k))
        elif t == "list":
            v = client.lrange(k, 0, -1)
        elif t == "stream":
            v = client.xrange(k)
        else:
            v = t
        out[k] = (t, v, client.ttl(k) > 0)
    return out


# An atomic read of every seat and ticket record of a mesh (their ids come from the lease sets):
# {seats: [id, lane, pool, pod, seq], tickets: [id, lane, pool, pod]}. KEYS[1] is the config key.
RECORDS_LUA = """
local prefix = string.sub(KEYS[1], 1, -7)
local seats, tickets = {}, {}
for _, id in ipairs(redis.call('ZRANGE', prefix .. 'seats', 0, -1)) do
  local v = redis.call('HMGET', prefix .. 'seat:' .. id, 'lane', 'pool', 'pod', 'seq')
  seats[#seats + 1] = {id, v[1] or '', v[2] or '', v[3] or '', v[4] or ''}
end
for _, id in ipairs(redis.call('ZRANGE', prefix .. 'tickets', 0, -1)) do
  local v = redis.call('HMGET', prefix .. 'ticket:' .. id, 'lane', 'pool', 'pod')
  tickets[#tickets + 1] = {id, v[1] or '', v[2] or '', v[3] or ''}
end
return {seats, tickets}
"""


def spy_releases(adm) -> dict:
    """The ``received`` of every release ``adm`` sends, by seat id (its core's release, wrapped;
    the wrapper lives as long as ``adm``)."""
    sent: dict = {}
    release = adm.core.release

    def spy(seat, **kw):
        sent[seat.id] = kw.get("received")
        return release(seat, **kw)

    adm.core.release = spy
    return sent
