"""The latency benchmark: ``python -m admission.tools.bench`` (a benchmark, not a timed test).

It starts its own throw-away server (``--engine redis`` by default, or ``valkey``), and for
every case of a grid -- lanes in the policy x live seats held on the pool x waiter tickets on the
pool -- it runs one loop in which each iteration times, side by side on the same connection:

* **admit**   -- ``Admission.try_admit`` of a round that is admitted (the common path);
* **release** -- ``Admission.release`` of that seat (clean, priced: the spend ledger is written);
* **PING**    -- ``client.ping()``: the round trip of the cheapest command, the yardstick.

So machine noise hits the three alike. Before each measured block ``CONFIG RESETSTAT`` clears
the server's counters, and after it ``INFO commandstats`` gives the server's own microseconds per
function call (``cmdstat_fcall`` usec_per_call: admit and release together, client and network
excluded).

How a case is built (fast: pipelined, never timed):

* the policy has 1, 8 or 32 lanes (the seed's seven lanes, then filler lanes) on one pool, with a
  large ``seed_estimate`` so every seat is admitted within its lane's floor, and day-long leases
  so nothing expires while it runs;
* ``seats`` rounds are admitted round-robin over the lanes by another pod;
* ``waiters`` tickets are made in the measured lane: the estimate is briefly set to 1 so they
  are refused (the first ``full``, the rest ``behind-older``), then set back. With waiters, each
  iteration's admit is the lane's *oldest* waiter being admitted (as a woken waiter is), and
  every 100 iterations 100 newcomers queue behind the others (untimed, and their script time is
  taken out of the server figure): the lane always has between ``waiters`` and ``waiters`` + 100.
* the seats of one (lanes, seats) pair are made once; its waiter cases run on them in turn.

Targets (printed next to the figures): admit p50 within 1.5x PING p50; admit p50 flat in seats
and waiters, i.e. within 1.25x of the case with the fewest seats and waiters of the same lanes.

``--census`` runs another, small case set instead: the pool clock's read model at estimates of
10, 1,000 and 50,000 slots (``--estimates``) with 8 lanes (``--lanes``), every lane holding a seat
and one lane a waiter. It times ``census`` and ``tick`` (each tick rebuilds the census: its
``census:at`` is cleared, untimed, before it) and reports the server's µs per call: both must be
flat in the estimate (a lane's bound is computed in closed form, not one decision per newcomer).
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import logging
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

import redis
import structlog
from tqdm import tqdm

from .._log import show
from ..client import Admission, fail_fast_options
from ..core import Call, Core
from .. import scripts
from .servers import ENGINES, LocalServer
from . import write_json

MESH = "bench"
PROVIDER = "bench"
POOL = f"sonnet@{PROVIDER}"
MEASURED_LANE = "reviews"
#: The estimate every case runs at: far above any seats + waiters, so every fill is admitted
#: within its lane's floor and the measured admit takes the same path in every case.
BIG_ESTIMATE = 200_000
#: Day-long leases: nothing expires (and nothing is swept) while a case runs.
LEASE_TTL = 86_400

#: Targets printed next to the figures (µs; the 32-lane admit has its own).
TARGET_EXTRA = 40.0  # admit and release p50 over PING p50, same loop
TARGET_EXTRA_MANY_LANES = 55.0  # admit over PING with 32 lanes or more
TARGET_SERVER = 30.0  # the server's µs per admit
TARGET_SERVER_MANY_LANES = 45.0
MANY_LANES = 32
TARGET_FLAT_RATIO = 1.25

#: The seed's lanes (deploy/policy.example.toml), the measured lane first.
SEED_LANES: list[tuple[str, float, float, int]] = [
    ("reviews", 0.30, 2, 40),
    ("express", 0.10, 4, 70),
    ("watchdog", 0.05, 2, 60),
    ("babysitter", 0.05, 2, 50),
    ("bugfix", 0.25, 1, 30),
    ("triage", 0.10, 1, 20),
    ("embeddings", 0.05, 1, 10),
]

DEFAULT = dict(lanes=[1, 7, 32], seats=[10, 1_000, 10_000], waiters=[0, 1_000], iterations=2_000, pods=8)
QUICK = dict(lanes=[1, 7], seats=[10, 1_000], waiters=[0, 100], iterations=300, pods=8)
#: Calls of each kind in the blocks that measure the server's time per call.
SERVER_BLOCK = 1_000
#: Seconds of the multi-pod run (decisions per second).
PODS_SECONDS = 5.0
CENSUS_DEFAULT = dict(lanes=[8], estimates=[10, 1_000, 50_000], iterations=1_000)
PIPELINE_CHUNK = 1_000
#: With waiters, newcomers are queued this many at a time (untimed, outside the server figures).
REFILL = 100


# --------------------------------------------------------------------------------------------
# Policy



def _table(head: str, columns: Sequence[str], rows: list[list[str]], notes: list[str], markdown: bool) -> str:
    """A table of figures with its notes: Markdown (for the docs) or aligned plain text."""
    if markdown:
        out = [f"**{head}**", "", "| " + " | ".join(columns) + " |", "|" + "|".join("---:" for _ in columns) + "|"]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        out += [""] + [f"- {n}" for n in notes]
        return "\n".join(out)
    widths = [max(len(columns[i]), *(len(r[i]) for r in rows)) for i in range(len(columns))]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
    out = [head, "", line(columns), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    out += [""] + notes
    return "\n".join(out)

def lanes_table(n: int) -> dict[str, dict[str, Any]]:
    """``n`` lanes: the seed's (measured lane first), then ``batch-NN`` lanes sharing the floor
    left; floors always sum to <= 1."""
    if n < 1:
        raise ValueError("a policy needs at least one lane")
    seed = SEED_LANES[:n]
    extra = n - len(seed)
    left = max(0.0, 1.0 - sum(f for _, f, _, _ in seed))
    table = {name: {"floor": floor, "weight": weight, "priority": prio} for name, floor, weight, prio in seed}
    for i in range(extra):
        table[f"batch-{i + 1:02d}"] = {"floor": round(left / extra, 9) if extra else 0.0,
                                      "weight": 1, "priority": -(i + 1)}
    return table


def bench_policy(n_lanes: int, seed_estimate: float) -> dict[str, Any]:
    return {
        "tunables": {"seed_estimate": seed_estimate, "max_estimate": BIG_ESTIMATE,
                     "lease_ttl": LEASE_TTL, "grow_interval": LEASE_TTL},
        "lanes": lanes_table(n_lanes),
        "providers": {PROVIDER: {}},
        "pools": {POOL: {}},
    }


# --------------------------------------------------------------------------------------------
# Figures


def percentile(sorted_ns: Sequence[int], q: float) -> float:
    """The q-quantile (nearest rank) of sorted nanoseconds, in microseconds."""
    if not sorted_ns:
        return float("nan")
    i = min(len(sorted_ns) - 1, max(0, round(q * (len(sorted_ns) - 1))))
    return sorted_ns[i] / 1_000


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


def fill_seats(setup: redis.Redis, adm: Admission, lanes: int, seats: int, progress) -> None:
    """Fresh state: the policy and ``seats`` live seats, round-robin over the lanes (the measured
    lane first, so it holds at least one)."""
    setup.flushall()
    adm.apply_policy(bench_policy(lanes, BIG_ESTIMATE), recovery_hold=False)
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
        adm.apply_policy(bench_policy(lanes, 1), recovery_hold=False)
    ask = (filler.admit(lane=MEASURED_LANE, model=POOL, round_id=f"w-{queue.next + i}", draw=0.0, wait=True)
           for i in range(count))
    admitted = [d for d in _run_pipelined(setup, ask, count, progress) if d.admitted]
    if admitted:
        raise RuntimeError(f"bench setup: {len(admitted)} of {count} waiters were admitted")
    queue.next += count
    if small:
        adm.apply_policy(bench_policy(lanes, BIG_ESTIMATE), recovery_hold=False)


def _check_pool(setup: redis.Redis, running: int, waiting: int) -> None:
    r, w = setup.hmget(f"adm:{{{MESH}}}:pool:{POOL}", "running", "waiting")
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
                add_waiters(setup, adm, case.lanes, queue, REFILL, _NoBar())

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
    case.admit_p50, case.admit_p99 = percentile(admit_ns, 0.5), percentile(admit_ns, 0.99)
    case.release_p50, case.release_p99 = percentile(release_ns, 0.5), percentile(release_ns, 0.99)
    case.ping_p50, case.ping_p99 = percentile(ping_ns, 0.5), percentile(ping_ns, 0.99)
    case.floor_p50 = percentile(floor_ns, 0.5)
    case.admit_extra_p50, case.admit_extra_p99 = percentile(admit_extra, 0.5), percentile(admit_extra, 0.99)
    case.release_extra_p50, case.release_extra_p99 = percentile(release_extra, 0.5), percentile(release_extra, 0.99)
    case.floor_extra_p50 = percentile(floor_extra, 0.5)
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
                add_waiters(setup, adm, case.lanes, queue, REFILL, _NoBar())
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


# --------------------------------------------------------------------------------------------
# The run


class _NoBar:
    """Stands in for tqdm when there is no bar (a disabled tqdm still starts its monitor thread)."""

    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass


@contextlib.contextmanager
def progress_bar(total: int, progress: bool | None, unit: str = "call", desc: str = "bench") -> Iterator[Any]:
    """progress None: a bar when stderr is a terminal; True: always; False: never (the tools share it)."""
    if progress is False or (progress is None and not sys.stderr.isatty()):
        yield _NoBar()
        return
    with tqdm(total=total, unit=unit, desc=desc, dynamic_ncols=True, leave=False) as bar:
        yield bar


def run(engine: str, lanes: Sequence[int], seats: Sequence[int], waiters: Sequence[int], iterations: int,
        warmup: int | None = None, progress: bool | None = None, pods: int = 0) -> dict[str, Any]:
    """Run the whole grid against a fresh local server; the figures as a dict (also --json)."""
    warmup = max(10, min(200, iterations // 10)) if warmup is None else warmup
    if min(seats) < 1:
        raise ValueError("seats must be >= 1 (the measured lane holds one while waiters are made)")
    lanes, seats, waiters = sorted(set(lanes)), sorted(set(seats)), sorted(set(waiters))
    grid = [Case(l, s, w) for l in lanes for s in seats for w in waiters]
    total = sum(s for _ in lanes for s in seats) + sum(
        (c.waiters + REFILL if c.waiters else 0) + iterations for c in grid)
    started = time.perf_counter()
    with LocalServer(engine) as srv, progress_bar(total, progress) as bar:
        setup = redis.Redis.from_url(srv.url)
        adm = Admission(redis.Redis.from_url(srv.url, **fail_fast_options()), mesh=MESH, pod="bench",
                        background=False, seed=0)
        try:
            baseline = empty_script_usec(setup)
            scripts.load(setup)  # functions survive FLUSHALL
            setup.function_load(FLOOR_LIBRARY, replace=True)
            # one fill of seats per (lanes, seats); its waiter cases run on it, fewest first
            for (n_lanes, n_seats), cases in itertools.groupby(grid, key=lambda c: (c.lanes, c.seats)):
                bar.set_postfix_str(f"lanes={n_lanes} seats={n_seats} setup")
                t = time.perf_counter()
                fill_seats(setup, adm, n_lanes, n_seats, bar)
                fill_s = time.perf_counter() - t
                queue = Queue()
                for case in cases:
                    bar.set_postfix_str(case.label + " measure")
                    measure(setup, adm, case, queue, iterations, warmup, bar)
                    case.setup_s = fill_s
            if pods:
                bar.set_postfix_str(f"{pods} pod processes")
                throughput = pods_throughput(setup, srv.url, pods, 7 if 7 in lanes else lanes[0], PODS_SECONDS)
        finally:
            adm.close()
            adm.redis.close()
            setup.close()
        version = srv.version
    for case in grid:
        base = min((c for c in grid if c.lanes == case.lanes), key=lambda c: (c.seats, c.waiters))
        case.vs_smallest = (case.admit_extra_p50 / base.admit_extra_p50) if base.admit_extra_p50 > 0 else float("nan")
    return {
        "engine": engine, "version": version, "python": platform.python_version(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu", "platform": platform.platform(),
        "iterations": iterations, "warmup": warmup, "empty_script_usec": baseline,
        "grid": {"lanes": list(lanes), "seats": list(seats), "waiters": list(waiters)},
        "targets": targets(grid), "elapsed_s": round(time.perf_counter() - started, 1),
        "cases": [asdict(c) for c in grid], "pods": throughput if pods else None,
    }


def _extra_target(lanes: int) -> float:
    return TARGET_EXTRA_MANY_LANES if lanes >= MANY_LANES else TARGET_EXTRA


def _server_target(lanes: int) -> float:
    return TARGET_SERVER_MANY_LANES if lanes >= MANY_LANES else TARGET_SERVER


def targets(grid: list[Case]) -> dict[str, Any]:
    def count(ok: list[bool]) -> dict[str, int]:
        return {"met": sum(ok), "cases": len(ok)}

    by_lanes: dict[int, list[float]] = {}
    for c in grid:
        by_lanes.setdefault(c.lanes, []).append(c.admit_extra_p50)
    return {
        "admit_extra": count([c.admit_extra_p50 <= _extra_target(c.lanes) for c in grid]),
        "release_extra": count([c.release_extra_p50 <= TARGET_EXTRA for c in grid]),
        "server_admit": count([c.server_admit_usec <= _server_target(c.lanes) for c in grid]),
        "flat_seats_waiters": {**count([c.vs_smallest <= TARGET_FLAT_RATIO for c in grid]),
                               "max": max(c.vs_smallest for c in grid)},
        "lanes_median_admit_extra_p50": {str(k): sorted(v)[len(v) // 2] for k, v in sorted(by_lanes.items())},
    }


# --------------------------------------------------------------------------------------------
# Decisions per second with several pod processes


def _pod_loop(url: str, pod: int, lanes: int, seconds: float, start: Any, out: Any) -> None:
    """One pod process: once every pod is ready, admit and release rounds on random lanes for
    ``seconds``."""
    import random

    adm = Admission(redis.Redis.from_url(url), mesh=MESH, pod=f"pod-{pod}", background=False, seed=pod)
    adm.redis.ping()
    names, rng, n = list(lanes_table(lanes)), random.Random(pod), 0
    start.wait()
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        d = adm.try_admit(lane=rng.choice(names), model=POOL, round_id=f"p{pod}-{n}")
        if d.admitted:
            adm.release(d.seat, outcome="clean", seconds=1.0, cost_usd=0.002)
        n += 1
    out.put(n)


def pods_throughput(setup: redis.Redis, url: str, pods: int, lanes: int, seconds: float) -> dict[str, Any]:
    """``pods`` processes, each one pod asking and releasing as fast as it can for ``seconds``:
    decisions per second over all of them (each decision also releases its seat)."""
    import multiprocessing as mp

    setup.flushall()
    Admission(setup, mesh=MESH, pod="bench", background=False).apply_policy(
        bench_policy(lanes, BIG_ESTIMATE), recovery_hold=False)
    ctx = mp.get_context("spawn")
    out, start = ctx.Queue(), ctx.Barrier(pods + 1)  # all pods start together
    procs = [ctx.Process(target=_pod_loop, args=(url, i, lanes, seconds, start, out), daemon=True)
             for i in range(pods)]
    for p in procs:
        p.start()
    start.wait(timeout=120)
    counts = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join(timeout=10)
    return {"pods": pods, "lanes": lanes, "seconds": seconds, "decisions": sum(counts),
            "per_second": sum(counts) / seconds}


# --------------------------------------------------------------------------------------------
# --census: census and tick against the estimate


@dataclass
class CensusCase:
    lanes: int
    estimate: int
    iterations: int = 0
    bounds: int = 0  # sum of the lanes' bounds in the census (how much work the rules allow)
    census_usec: float = 0.0  # server µs per call (cmdstat_fcall)
    tick_usec: float = 0.0
    census_p50: float = 0.0  # client µs
    tick_p50: float = 0.0
    vs_smallest: float = 1.0  # census server µs / the smallest estimate's


def census_state(setup: redis.Redis, adm: Admission, lanes: int, estimate: int) -> None:
    """Fresh state: one seat in every lane, one waiter in the last lane, then the pool measured
    at ``estimate`` (exhausted) with its growth clock just reset, so the ticks do not grow it."""
    setup.flushall()
    adm.apply_policy(bench_policy(lanes, BIG_ESTIMATE), recovery_hold=False)
    names = list(lanes_table(lanes))
    filler = Core(MESH, "filler", seed=0)
    seats = (filler.admit(lane=n, model=POOL, round_id=f"s-{n}", draw=0.0, wait=False) for n in names)
    if not all(d.admitted for d in _run_pipelined(setup, seats, len(names), _NoBar())):
        raise RuntimeError("bench census setup: a seat was refused")
    key = f"adm:{{{MESH}}}:pool:{POOL}"
    setup.hset(key, mapping={"est": 1, "exhausted": 1})  # full: the next ask queues
    waiter = filler.admit(lane=names[-1], model=POOL, round_id="w-0", draw=0.0, wait=True)
    if _run_pipelined(setup, iter([waiter]), 1, _NoBar())[0].admitted:
        raise RuntimeError("bench census setup: the waiter was admitted")
    sec, usec = setup.time()
    setup.hset(key, mapping={"est": estimate, "cap": estimate, "exhausted": 1, "lastGrow": sec + usec / 1e6})
    _check_pool(setup, len(names), 1)


def measure_census(setup: redis.Redis, adm: Admission, case: CensusCase, iterations: int, progress) -> None:
    perf = time.perf_counter_ns
    at_key = f"adm:{{{MESH}}}:census:at"
    for name in ("census", "tick"):
        for _ in range(max(1, iterations // 10)):  # warm-up: library loaded, caches hot
            setup.delete(at_key)
            adm.census() if name == "census" else adm.tick()
        ns: list[int] = []
        setup.config_resetstat()
        for _ in range(iterations):
            if name == "census":
                t0 = perf()
                c = adm.census()
                ns.append(perf() - t0)
            else:
                setup.delete(at_key)  # not an FCALL: outside the server figure
                t0 = perf()
                t = adm.tick()
                ns.append(perf() - t0)
                if not t.census_refreshed:
                    raise RuntimeError("bench census: the tick did not rebuild the census")
            progress.update(1)
        calls, usec = _fcall_stats(setup)
        ns.sort()
        if name == "census":
            case.census_usec, case.census_p50 = usec / max(1, calls), percentile(ns, 0.5)
            case.bounds = sum(l["bound"] for p in c["pools"] for l in p["lanes"])
        else:
            case.tick_usec, case.tick_p50 = usec / max(1, calls), percentile(ns, 0.5)
    case.iterations = iterations


def run_census(engine: str, lanes: Sequence[int], estimates: Sequence[int], iterations: int,
               progress: bool | None = None) -> dict[str, Any]:
    """census and tick per (lanes, estimate) against a fresh local server; the figures as a dict."""
    cases = [CensusCase(l, e) for l in sorted(set(lanes)) for e in sorted(set(estimates))]
    started = time.perf_counter()
    with LocalServer(engine) as srv, progress_bar(2 * iterations * len(cases), progress) as bar:
        setup = redis.Redis.from_url(srv.url)
        adm = Admission(redis.Redis.from_url(srv.url, **fail_fast_options(socket_timeout=60)), mesh=MESH,
                        pod="bench", background=False, seed=0)
        try:
            scripts.load(setup)
            for case in cases:
                bar.set_postfix_str(f"lanes={case.lanes} estimate={case.estimate}")
                census_state(setup, adm, case.lanes, case.estimate)
                measure_census(setup, adm, case, iterations, bar)
        finally:
            adm.close()
            adm.redis.close()
            setup.close()
        version = srv.version
    for case in cases:
        base = min((c for c in cases if c.lanes == case.lanes), key=lambda c: c.estimate)
        case.vs_smallest = case.census_usec / base.census_usec if base.census_usec else float("nan")
    return {
        "engine": engine, "version": version, "python": platform.python_version(),
        "machine": f"{platform.machine()} {os.cpu_count()} cpu", "platform": platform.platform(),
        "iterations": iterations, "elapsed_s": round(time.perf_counter() - started, 1),
        "census_cases": [asdict(c) for c in cases],
    }


CENSUS_COLUMNS = ("lanes", "estimate", "Σ bound", "census server µs/call", "tick server µs/call",
                  "census p50", "tick p50", "census vs smallest")


def render_census(result: dict[str, Any], markdown: bool = False) -> str:
    rows = [[str(c["lanes"]), f"{c['estimate']:,}", f"{c['bounds']:,}", f"{c['census_usec']:.1f}",
             f"{c['tick_usec']:.1f}", f"{c['census_p50']:.0f}", f"{c['tick_p50']:.0f}",
             f"{c['vs_smallest']:.2f}×"] for c in result["census_cases"]]
    head = (f"admission bench --census — {result['engine']} {result['version']}, Python {result['python']}, "
            f"{result['machine']}; {result['iterations']:,} calls of each per case; times in µs")
    notes = [
        "server µs/call = INFO commandstats cmdstat_fcall over the calls (census and tick apart); "
        "p50 = client round trip",
        "each tick rebuilds the census (census:at cleared before it, untimed); it also sweeps and "
        "takes no growth step (the growth clock was just reset)",
        "Σ bound = the lanes' bounds in the census: the newcomers the rules would admit, which the "
        "census no longer counts one decision at a time",
        f"whole run {result['elapsed_s']:.0f} s",
    ]
    return _table(head, CENSUS_COLUMNS, rows, notes, markdown)


# --------------------------------------------------------------------------------------------
# --against: two versions of the Lua side by side, in one server


def _library_of(lua: Path) -> tuple[str, str]:
    """(code, version) of the library built from another Lua folder: by that checkout's own
    loader when the folder is a checkout's (its format may be older than this loader's)."""
    tree = lua.resolve().parent
    if (tree / "admission" / "scripts.py").is_file():
        code = "import json, sys; from admission.scripts import library; json.dump(library(), sys.stdout)"
        out = subprocess.run([sys.executable, "-c", code], cwd=tree, check=True, capture_output=True, text=True,
                             env={**os.environ, "ADMISSION_LUA_DIR": str(lua), "PYTHONPATH": str(tree)}).stdout
        built, version = json.loads(out)
        return built, version
    old = os.environ.get("ADMISSION_LUA_DIR")
    os.environ["ADMISSION_LUA_DIR"] = str(lua)
    scripts.library.cache_clear()
    try:
        return scripts.library()
    finally:
        if old is None:
            os.environ.pop("ADMISSION_LUA_DIR", None)
        else:
            os.environ["ADMISSION_LUA_DIR"] = old
        scripts.library.cache_clear()


def run_against(engine: str, other: Path, lanes: Sequence[int], rounds: int, block: int,
                progress: bool | None = None) -> dict[str, Any]:
    """This Lua against ``other`` in ONE server: both libraries loaded under their versioned names,
    blocks of ``block`` admits (then their releases) alternating between them for ``rounds``
    rounds, the server's µs per call of each block from INFO commandstats. One server and
    alternating blocks put the machine's drift on both alike; the minimum and the lower quintile
    over the blocks are the figures that stand out of a noisy machine's variance."""
    this_code, this_version = scripts.library()
    other_code, other_version = _library_of(other)
    if other_version == this_version:
        raise ValueError(f"{other} builds the same library as this checkout ({this_version})")
    versions = {"this": this_version, "other": other_version}
    cases = []
    started = time.perf_counter()
    with LocalServer(engine) as srv, progress_bar(len(lanes) * rounds * 2 * block, progress) as bar:
        setup = redis.Redis.from_url(srv.url)
        adm = Admission(setup, mesh=MESH, pod="bench", background=False, seed=0)
        n = 0
        for n_lanes in sorted(set(lanes)):
            fill_seats(setup, adm, n_lanes, 10, _NoBar())
            setup.function_load(this_code, replace=True)
            setup.function_load(other_code, replace=True)
            per: dict[str, dict[str, list[float]]] = {k: {"admit": [], "release": []} for k in versions}
            for r in range(rounds):
                for name in (("this", "other") if r % 2 == 0 else ("other", "this")):
                    version = versions[name]
                    calls = []
                    for _ in range(block):
                        n += 1
                        calls.append(adm.core.admit(lane=MEASURED_LANE, model=POOL, round_id=f"ab-{n}", draw=0.5))
                    setup.config_resetstat()
                    seats = [c.decode(setup.execute_command("FCALL", f"adm_admit_{version}", len(c.keys), *c.keys,
                                                            *c.args)).seat for c in calls]
                    per[name]["admit"].append(_usec_per_call(setup))
                    releases = [adm.core.release(seat, outcome="clean", seconds=1.0, cost_usd=0.002)
                                for seat in seats]
                    setup.config_resetstat()
                    for c in releases:
                        setup.execute_command("FCALL", f"adm_release_{version}", len(c.keys), *c.keys, *c.args)
                    per[name]["release"].append(_usec_per_call(setup))
                    bar.update(2 * block)
            row: dict[str, Any] = {"lanes": n_lanes}
            for name in versions:
                for kind in ("admit", "release"):
                    xs = sorted(per[name][kind])
                    row[f"{name}_{kind}_min"], row[f"{name}_{kind}_p20"] = xs[0], xs[len(xs) // 5]
            cases.append(row)
        version = srv.version
    return {"engine": engine, "version": version, "this": this_version, "other": other_version,
            "other_dir": str(other), "rounds": rounds, "block": block, "cases": cases,
            "elapsed_s": round(time.perf_counter() - started, 1)}


def _usec_per_call(client: redis.Redis) -> float:
    calls, usec = _fcall_stats(client)
    return usec / max(1, calls)


def render_against(result: dict[str, Any], markdown: bool = False) -> str:
    columns = ("lanes", "admit min", "other", "change", "admit p20", "other", "release min", "other", "change",
               "release p20", "other")
    rows = []
    for c in result["cases"]:
        ch = lambda kind: f"{(c[f'this_{kind}_min'] / c[f'other_{kind}_min'] - 1) * 100:+.0f} %"  # noqa: E731
        rows.append([str(c["lanes"]), f"{c['this_admit_min']:.1f}", f"{c['other_admit_min']:.1f}", ch("admit"),
                     f"{c['this_admit_p20']:.1f}", f"{c['other_admit_p20']:.1f}", f"{c['this_release_min']:.1f}",
                     f"{c['other_release_min']:.1f}", ch("release"), f"{c['this_release_p20']:.1f}",
                     f"{c['other_release_p20']:.1f}"])
    head = (f"admission bench --against {result['other_dir']} — {result['engine']} {result['version']}; "
            f"this library {result['this']} against {result['other']}; server µs per call")
    notes = [f"{result['rounds']} rounds of {result['block']} admits then their releases per library, the libraries "
             "alternating in one server; min and p20 over the blocks (INFO commandstats per block)",
             f"whole run {result['elapsed_s']:.0f} s"]
    return _table(head, columns, rows, notes, markdown)


# --------------------------------------------------------------------------------------------
# Output

COLUMNS = ("lanes", "seats", "waiters", "admit−PING p50", "p99", "release−PING p50", "p99", "floor−PING p50",
           "PING p50", "server admit", "server release", "server floor", "vs smallest")


def _mark(ok: bool) -> str:
    return "✓" if ok else "✗"


def _row(c: dict[str, Any]) -> list[str]:
    lanes = c["lanes"]
    return [str(lanes), f"{c['seats']:,}", f"{c['waiters']:,}",
            f"{c['admit_extra_p50']:.0f} {_mark(c['admit_extra_p50'] <= _extra_target(lanes))}",
            f"{c['admit_extra_p99']:.0f}",
            f"{c['release_extra_p50']:.0f} {_mark(c['release_extra_p50'] <= TARGET_EXTRA)}",
            f"{c['release_extra_p99']:.0f}", f"{c['floor_extra_p50']:.0f}", f"{c['ping_p50']:.0f}",
            f"{c['server_admit_usec']:.0f} {_mark(c['server_admit_usec'] <= _server_target(lanes))}",
            f"{c['server_release_usec']:.0f}", f"{c['server_floor_usec']:.0f}",
            f"{c['vs_smallest']:.2f}× {_mark(c['vs_smallest'] <= TARGET_FLAT_RATIO)}"]


def render(result: dict[str, Any], markdown: bool = False) -> str:
    rows = [_row(c) for c in result["cases"]]
    t = result["targets"]
    head = (f"admission bench — {result['engine']} {result['version']}, Python {result['python']}, "
            f"{result['machine']}; {result['iterations']:,} iterations per case "
            f"(+{result['warmup']} warm-up); times in µs")
    met = lambda k: f"met in {t[k]['met']}/{t[k]['cases']} cases"  # noqa: E731
    notes = [
        "X−PING = the call's round trip minus the PING of the same iteration (same loop, same "
        "connection, so the machine's noise hits both); p50 and p99 of those differences",
        "floor = a function with an admit's reads and writes (config, sweep range, ticket, seat, pool, "
        "provider, lane counts; seq, seat hash, lease, counts, tombstone, event, totals) and no rules: "
        "what any admit must cost",
        "server = the server's own µs per call (INFO commandstats cmdstat_fcall over a block of "
        f"{SERVER_BLOCK:,} calls of one kind, after the timed loop, in the case's state); an empty function "
        f"costs {result['empty_script_usec']:.1f} µs/call here",
        f"target: admit−PING p50 ≤ {TARGET_EXTRA:.0f} µs (≤ {TARGET_EXTRA_MANY_LANES:.0f} with "
        f"{MANY_LANES} lanes) — {met('admit_extra')}",
        f"target: release−PING p50 ≤ {TARGET_EXTRA:.0f} µs — {met('release_extra')}",
        f"target: server admit ≤ {TARGET_SERVER:.0f} µs (≤ {TARGET_SERVER_MANY_LANES:.0f} with {MANY_LANES} "
        f"lanes) — {met('server_admit')}",
        f"target: flat in seats and waiters (admit−PING p50 ≤ {TARGET_FLAT_RATIO}× the case with the fewest "
        f"seats and waiters of the same lanes) — {met('flat_seats_waiters')} (worst "
        f"{t['flat_seats_waiters']['max']:.2f}×)",
        "lanes (median admit−PING p50): " + ", ".join(
            f"{k} lanes {v:.0f} µs" for k, v in t["lanes_median_admit_extra_p50"].items()),
        "with waiters the measured round is the lane's oldest waiter, so its admit also removes its "
        "ticket (a few more commands than a newcomer's admit, none of them scanning the queue)",
    ]
    pods = result.get("pods")
    if pods:
        notes.append(f"{pods['pods']} pod processes ({pods['lanes']} lanes, {pods['seconds']:.0f} s, each an "
                     f"admit and a release per decision): {pods['per_second']:,.0f} decisions/s")
    notes.append(f"whole run {result['elapsed_s']:.0f} s")
    return _table(head, COLUMNS, rows, notes, markdown)


# --------------------------------------------------------------------------------------------
# CLI


def _ints(text: str) -> list[int]:
    try:
        values = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers >= 0, got {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m admission.tools.bench", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=ENGINES, default="redis", help="server to start (default redis)")
    p.add_argument("--quick", action="store_true",
                   help=f"smaller run: lanes {QUICK['lanes']}, seats {QUICK['seats']}, waiters "
                        f"{QUICK['waiters']}, {QUICK['iterations']} iterations")
    p.add_argument("--lanes", type=_ints, help=f"lanes in the policy (default {DEFAULT['lanes']})")
    p.add_argument("--seats", type=_ints, help=f"live seats held on the pool (default {DEFAULT['seats']})")
    p.add_argument("--waiters", type=_ints, help=f"waiter tickets on the pool (default {DEFAULT['waiters']})")
    p.add_argument("--iterations", type=int, help=f"timed iterations per case (default {DEFAULT['iterations']})")
    p.add_argument("--pods", type=int, help=f"then this many pod processes for {PODS_SECONDS:.0f} s: decisions "
                                            f"per second (default {DEFAULT['pods']}; 0 = skip)")
    p.add_argument("--census", action="store_true",
                   help=f"instead of the admit grid: time census and tick at estimates {CENSUS_DEFAULT['estimates']} "
                        f"with {CENSUS_DEFAULT['lanes']} lanes, {CENSUS_DEFAULT['iterations']} calls each")
    p.add_argument("--estimates", type=_ints, help="with --census: the pool estimates (slots)")
    p.add_argument("--against", metavar="LUA_DIR",
                   help="instead: this checkout's Lua against another Lua folder (e.g. of `git worktree add "
                        "/tmp/base HEAD~1`: /tmp/base/lua), side by side in one server, server µs per admit "
                        "and release (--lanes, default 7,32)")
    p.add_argument("--json", metavar="FILE", help="also save the figures as JSON")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--provider", action="store_true",
                   help="instead: one burst on the fake provider with no admission, through the admission and "
                        "with a static semaphore, side by side (admission.tools.provider_bench; its own options "
                        "follow: --provider --help)")
    return p


@contextlib.contextmanager
def quiet_logs(level: int = logging.WARNING) -> Iterator[None]:
    """structlog at ``level`` and on stderr while the bench runs (stdout carries the table)."""
    old = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    show(level, sys.stderr)
    try:
        yield
    finally:
        structlog.configure(**old)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--provider" in argv:  # the provider bench parses the rest itself
        from . import provider_bench

        argv.remove("--provider")
        return provider_bench.main(argv)
    args = parser().parse_args(argv)
    if args.census:
        return main_census(args)
    if args.against:
        other = Path(args.against)
        if not (other / "admit.lua").is_file():
            parser().error(f"--against: {other} holds no admit.lua")
        with quiet_logs():
            result = run_against(args.engine, other, args.lanes or [7, 32], 30 if not args.quick else 6,
                                 200 if not args.quick else 50, progress=False if args.no_progress else None)
        print(render_against(result, markdown=args.markdown), flush=True)
        if args.json:
            write_json(args.json, result)
        return 0
    base = QUICK if args.quick else DEFAULT
    lanes = args.lanes or base["lanes"]
    if 0 in lanes:
        parser().error("--lanes: a policy needs at least one lane")
    if args.seats and min(args.seats) < 1:
        parser().error("--seats: at least 1 (the measured lane holds a seat while waiters are made)")
    if args.iterations is not None and args.iterations < 1:
        parser().error("--iterations: at least 1")
    iterations = args.iterations or base["iterations"]
    with quiet_logs():
        if args.pods is not None and args.pods < 0:
            parser().error("--pods: 0 or more")
        result = run(args.engine, lanes, args.seats or base["seats"], args.waiters or base["waiters"],
                     iterations, progress=False if args.no_progress else None,
                     pods=base["pods"] if args.pods is None else args.pods)
    print(render(result, markdown=args.markdown), flush=True)
    if args.json:
        write_json(args.json, result)
    return 0


def main_census(args: argparse.Namespace) -> int:
    lanes = args.lanes or CENSUS_DEFAULT["lanes"]
    estimates = args.estimates or CENSUS_DEFAULT["estimates"]
    if 0 in lanes:
        parser().error("--lanes: a policy needs at least one lane")
    if 0 in estimates or max(estimates) > BIG_ESTIMATE:
        parser().error(f"--estimates: whole numbers in 1..{BIG_ESTIMATE:,}")
    if args.iterations is not None and args.iterations < 1:
        parser().error("--iterations: at least 1")
    with quiet_logs():
        result = run_census(args.engine, lanes, estimates, args.iterations or CENSUS_DEFAULT["iterations"],
                            progress=False if args.no_progress else None)
    print(render_census(result, markdown=args.markdown), flush=True)
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
