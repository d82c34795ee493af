"""One case of the grid: its state built (pipelined, never timed), then its timed loop and the
server's own µs per call."""
from __future__ import annotations

import contextlib
import gc
import itertools
import os
import platform
import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import redis

from ...client import Admission, fail_fast_options
from ...core import Call, Core, mesh_key
from ... import scripts
from ..progress import NoBar
from ..stats import percentile
from .policy import BIG_ESTIMATE, MEASURED_LANE, MESH, PIPELINE_CHUNK, POOL, REFILL, SERVER_BLOCK, bench_policy, lanes_table


@contextlib.contextmanager
def bench_clients(url: str, **options: Any) -> Iterator[tuple[redis.Redis, Admission]]:
    """The setup connection and the measured pod (its own fail-fast connection, ``options``), closed
    after the block."""
    setup = redis.Redis.from_url(url)
    adm = Admission(redis.Redis.from_url(url, **fail_fast_options(**options)), mesh=MESH, pod="bench",
                    background=False, seed=0)
    try:
        yield setup, adm
    finally:
        adm.close()
        adm.redis.close()
        setup.close()


def run_facts(engine: str, version: str | None) -> dict[str, Any]:
    """Where a run ran: the server, Python, the machine."""
    return {"engine": engine, "version": version, "python": platform.python_version(),
            "machine": f"{platform.machine()} {os.cpu_count()} cpu", "platform": platform.platform()}


def percentile_usec(ns: Sequence[int], q: float) -> float:
    """The q-quantile (stats.percentile, nearest rank) of nanoseconds, in microseconds."""
    return percentile(ns, q) / 1_000


@dataclass
class Case:
    lanes: int
    seats: int
    waiters: int
    iterations: int = 0
    # client round trips, µs (same loop: admit, release, PING, floor)
    admit_p50: float = 0.0
    admit_p99: float = 0.0
    release_p50: float = 0.0
    release_p99: float = 0.0
    ping_p50: float = 0.0
    ping_p99: float = 0.0
    floor_p50: float = 0.0  # the floor function: admit's reads and writes, no rules
    # the extra over the PING of the same iteration, µs
    admit_extra_p50: float = 0.0
    admit_extra_p99: float = 0.0
    release_extra_p50: float = 0.0
    release_extra_p99: float = 0.0
    floor_extra_p50: float = 0.0
    # the server's own µs per call (INFO commandstats over a block of one kind of call)
    server_admit_usec: float = 0.0
    server_release_usec: float = 0.0
    server_floor_usec: float = 0.0
    server_calls: int = 0  # admit and release calls in the server blocks
    vs_smallest: float = 1.0  # admit extra p50 / that of the smallest case of the same lanes
    setup_s: float = 0.0
    measure_s: float = 0.0
    reasons: dict[str, int] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"lanes={self.lanes} seats={self.seats} waiters={self.waiters}"


#: The floor of an admit: the reads and writes of a common admission (a newcomer admitted within
#: its lane's floor) with none of the rules. It reads the mesh's own keys and writes only
#: ``floor:*`` keys, so the real state is untouched. ARGV: id, lane, pool, pod, then the lane
#: count fields (what admit reads of the pool's lanes hash).
FLOOR_LIBRARY = """#!lua name=adm_bench_floor
redis.register_function('adm_bench_floor', function(keys, args)
  local prefix = string.sub(keys[1], 1, -7)
  local id, lane, pool, pod = args[1], args[2], args[3], args[4]
  local v = redis.call('HMGET', keys[1], 'token', 'pool:' .. pool)
  local now = tonumber(redis.call('TIME')[1])
  redis.call('ZRANGEBYSCORE', prefix .. 'seats', '-inf', now, 'LIMIT', 0, 4)
  redis.call('HGETALL', prefix .. 'ticket:' .. id)
  redis.call('HGETALL', prefix .. 'seat:' .. id)
  redis.call('HGETALL', prefix .. 'pool:' .. pool)
  redis.call('HGETALL', prefix .. 'provider:' .. (v[2] or ''))
  redis.call('HMGET', prefix .. 'lanes:' .. pool, unpack(args, 5))
  local f = prefix .. 'floor:'
  local seq = redis.call('HINCRBY', f .. 'pool', 'seq', 1)
  redis.call('HSET', f .. 'seat:' .. id, 'lane', lane, 'pool', pool, 'pod', pod, 'agent', '', 'at', now,
    'seq', seq, 'parent', '', 'rev', '', 'delegated', '', 'movedFrom', '', 'borrowedFor', '', 'signalled', '',
    'probe', '')
  redis.call('ZADD', f .. 'seats', now + 86400, id)
  redis.call('HINCRBY', f .. 'lanes', lane, 1)
  redis.call('HINCRBY', f .. 'pool', 'running', 1)
  redis.call('DEL', f .. 'gone:' .. id)
  redis.call('XADD', f .. 'events', 'MAXLEN', '~', 10000, '*', 'kind', 'admitted', 'round', id, 'lane', lane,
    'pool', pool, 'pod', pod, 'reason', 'within-floor', 'asked', pool, 'delegatedBy', '')
  redis.call('HINCRBY', f .. 'totals', 'admitted|' .. pool .. '|' .. lane .. '|within-floor', 1)
  return {1, 'within-floor', pool, id, seq, lane, '1', 1, 1, 1, tostring(now), pod, pool, {}}
end)
"""


def lane_fields(lanes: int) -> list[str]:
    return [f for name in lanes_table(lanes) for f in (name, f"{name}|w", f"{name}|d")]


def floor(client: redis.Redis, mesh_config_key: str, rid: str, fields: list[str]) -> Any:
    """One call of the floor function (FLOOR_LIBRARY, loaded once per run) for round ``rid``."""
    return client.fcall("adm_bench_floor", 1, mesh_config_key, rid, MEASURED_LANE, POOL, "bench", *fields)


# --------------------------------------------------------------------------------------------
# Building a case


def _run_pipelined(client: redis.Redis, calls: Iterator[Call], n: int, progress) -> list[Any]:
    """Send ``n`` admit calls by FCALL in pipelined chunks; decoded replies."""
    out: list[Any] = []
    scripts.load(client)  # a pipeline cannot reload a missing library on the fly
    for start in range(0, n, PIPELINE_CHUNK):
        chunk = list(itertools.islice(calls, min(PIPELINE_CHUNK, n - start)))
        with client.pipeline(transaction=False) as pipe:
            for call in chunk:
                scripts.pipe_call(pipe, call.script, call.keys, call.args)
            replies = pipe.execute()
        out += [call.decode(r) for call, r in zip(chunk, replies)]
        progress.update(len(chunk))
    return out


@dataclass
class Queue:
    """The measured lane's waiters: ids w-<oldest> .. w-<next - 1>, oldest first."""

    oldest: int = 0
    next: int = 0

    @property
    def live(self) -> int:
        return self.next - self.oldest


def fill_seats(setup: redis.Redis, adm: Admission, lanes: int, seats: int, progress, ceilings: bool = False) -> None:
    """Fresh state: the policy and ``seats`` live seats, round-robin over the lanes (the measured
    lane first, so it holds at least one); ``ceilings``: the pool's scope has six buckets."""
    setup.flushall()
    adm.ops.apply_policy(bench_policy(lanes, BIG_ESTIMATE, ceilings), recovery_hold=False)
    filler = Core(MESH, "filler", seed=0)
    names = list(lanes_table(lanes))
    fill = (filler.admit(lane=names[i % len(names)], model=POOL, round_id=f"s-{i}", draw=0.0, wait=False)
            for i in range(seats))
    refused = [d for d in _run_pipelined(setup, fill, seats, progress) if not d.admitted]
    if refused:
        raise RuntimeError(f"bench setup: {len(refused)} of {seats} seats refused (first: {refused[0].reason})")
    _check_pool(setup, seats, 0)


def add_waiters(setup: redis.Redis, adm: Admission, lanes: int, queue: Queue, count: int, progress) -> None:
    """``count`` more waiter tickets in the measured lane. While the lane has none, the estimate
    is set to 1 for a moment so the first newcomer is refused (``full``); the rest queue behind
    it (``behind-older``)."""
    if count <= 0:
        return
    filler = Core(MESH, "filler", seed=0)
    small = queue.live == 0
    if small:
        adm.ops.apply_policy(bench_policy(lanes, 1), recovery_hold=False)
    ask = (filler.admit(lane=MEASURED_LANE, model=POOL, round_id=f"w-{queue.next + i}", draw=0.0, wait=True)
           for i in range(count))
    admitted = [d for d in _run_pipelined(setup, ask, count, progress) if d.admitted]
    if admitted:
        raise RuntimeError(f"bench setup: {len(admitted)} of {count} waiters were admitted")
    queue.next += count
    if small:
        adm.ops.apply_policy(bench_policy(lanes, BIG_ESTIMATE), recovery_hold=False)


def _check_pool(setup: redis.Redis, running: int, waiting: int) -> None:
    r, w = setup.hmget(mesh_key(MESH, "pool", POOL), "running", "waiting")
    if int(r or 0) != running or int(w or 0) != waiting:
        raise RuntimeError(f"bench setup: pool has running={r} waiting={w}, expected {running} and {waiting}")


def _fcall_stats(client: redis.Redis) -> tuple[int, int]:
    stats = client.info("commandstats").get("cmdstat_fcall", {})
    return int(stats.get("calls", 0)), int(stats.get("usec", 0))


# --------------------------------------------------------------------------------------------
# Measuring a case


def measure(setup: redis.Redis, adm: Admission, case: Case, queue: Queue, iterations: int, warmup: int,
            progress) -> None:
    """The timed loop: admit, release, PING and the floor per iteration. With waiters, each admit
    is the lane's oldest waiter, and every REFILL iterations (untimed, and kept out of the
    server's figures) REFILL newcomers queue behind the others, so the lane keeps >= case.waiters."""
    client = adm.redis
    perf = time.perf_counter_ns
    admit_ns: list[int] = []
    release_ns: list[int] = []
    ping_ns: list[int] = []
    floor_ns: list[int] = []
    fields = lane_fields(case.lanes)
    reasons: dict[str, int] = {}
    step = max(1, min(250, iterations // 20))
    if case.waiters:
        add_waiters(setup, adm, case.lanes, queue, case.waiters + REFILL - queue.live, progress)
        _check_pool(setup, case.seats, queue.live)

    def one(i: int, keep: bool) -> None:
        rid = f"w-{queue.oldest}" if case.waiters else f"m-{i}"
        t0 = perf()
        d = adm.try_admit(lane=MEASURED_LANE, model=POOL, round_id=rid)
        t1 = perf()
        if not d.admitted:
            raise RuntimeError(f"bench {case.label}: measured round {rid} refused ({d.reason})")
        adm.release(d.seat, outcome="clean", seconds=1.0, cost_usd=0.002)
        t2 = perf()
        client.ping()
        t3 = perf()
        floor(client, adm.core.config_key, f"f-{i}", fields)
        t4 = perf()
        if keep:
            admit_ns.append(t1 - t0)
            release_ns.append(t2 - t1)
            ping_ns.append(t3 - t2)
            floor_ns.append(t4 - t3)
            reasons[d.reason] = reasons.get(d.reason, 0) + 1
        if case.waiters:
            queue.oldest += 1
            if queue.live < case.waiters:
                add_waiters(setup, adm, case.lanes, queue, REFILL, NoBar())

    for i in range(warmup):  # scripts loaded, connection warm, caches hot
        one(i, keep=False)
    gc.collect()
    started = time.perf_counter()
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for i in range(warmup, warmup + iterations):
            one(i, keep=True)
            if (i - warmup + 1) % step == 0:
                progress.update(step)
    finally:
        if gc_was:
            gc.enable()
    case.measure_s = time.perf_counter() - started
    progress.update(iterations % step)
    extra = lambda xs: sorted(x - p for x, p in zip(xs, ping_ns))  # noqa: E731  (per iteration)
    admit_extra, release_extra, floor_extra = extra(admit_ns), extra(release_ns), extra(floor_ns)
    for xs in (admit_ns, release_ns, ping_ns, floor_ns):
        xs.sort()
    case.iterations = iterations
    case.admit_p50, case.admit_p99 = percentile_usec(admit_ns, 0.5), percentile_usec(admit_ns, 0.99)
    case.release_p50, case.release_p99 = percentile_usec(release_ns, 0.5), percentile_usec(release_ns, 0.99)
    case.ping_p50, case.ping_p99 = percentile_usec(ping_ns, 0.5), percentile_usec(ping_ns, 0.99)
    case.floor_p50 = percentile_usec(floor_ns, 0.5)
    case.admit_extra_p50, case.admit_extra_p99 = percentile_usec(admit_extra, 0.5), percentile_usec(admit_extra, 0.99)
    case.release_extra_p50, case.release_extra_p99 = percentile_usec(release_extra, 0.5), percentile_usec(release_extra, 0.99)
    case.floor_extra_p50 = percentile_usec(floor_extra, 0.5)
    case.reasons = reasons
    server_blocks(setup, adm, case, queue, min(iterations, SERVER_BLOCK), fields)


def server_blocks(setup: redis.Redis, adm: Admission, case: Case, queue: Queue, n: int, fields: list[str]) -> None:
    """The server's own µs per call (INFO commandstats, cmdstat_fcall), one kind of call per
    block: ``n`` admits (the lane's oldest waiters when it has waiters, refilled as in the timed
    loop, the refills' own calls taken out), then their ``n`` releases, then ``n`` floors."""
    seats = []
    excluded = [0, 0]
    setup.config_resetstat()
    for i in range(n):
        rid = f"w-{queue.oldest}" if case.waiters else f"b-{i}"
        call = adm.core.admit(lane=MEASURED_LANE, model=POOL, round_id=rid, draw=0.5)
        d = call.decode(scripts.call(adm.redis, call.script, call.keys, call.args))
        if not d.admitted:
            raise RuntimeError(f"bench {case.label}: server block round {rid} refused ({d.reason})")
        seats.append(d.seat)
        if case.waiters:
            queue.oldest += 1
            if queue.live < case.waiters:
                c0, u0 = _fcall_stats(setup)
                add_waiters(setup, adm, case.lanes, queue, REFILL, NoBar())
                c1, u1 = _fcall_stats(setup)
                excluded[0] += c1 - c0
                excluded[1] += u1 - u0
    c, u = _fcall_stats(setup)
    case.server_admit_usec = (u - excluded[1]) / max(1, c - excluded[0])
    case.server_calls = c - excluded[0]
    setup.config_resetstat()
    for seat in seats:
        rel = adm.core.release(seat, outcome="clean", seconds=1.0, cost_usd=0.002)
        scripts.call(adm.redis, rel.script, rel.keys, rel.args)
    c, u = _fcall_stats(setup)
    case.server_release_usec = u / max(1, c)
    case.server_calls += c
    setup.config_resetstat()
    for i in range(n):
        floor(setup, adm.core.config_key, f"fb-{i}", fields)
    c, u = _fcall_stats(setup)
    case.server_floor_usec = u / max(1, c)


def empty_script_usec(client: redis.Redis, n: int = 1_000) -> float:
    """The server's floor for any function call: FCALL of one returning 1, microseconds per call."""
    client.function_load("#!lua name=adm_bench_empty\n"
                         "redis.register_function('adm_bench_empty', function() return 1 end)", replace=True)
    client.config_resetstat()
    for _ in range(n):
        client.fcall("adm_bench_empty", 0)
    return float(client.info("commandstats").get("cmdstat_fcall", {}).get("usec_per_call", 0.0))
