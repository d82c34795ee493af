"""The whole grid against a fresh local server, its targets, and the decisions per second of
several pod processes."""
from __future__ import annotations

import itertools
import time
from dataclasses import asdict
from typing import Any, Sequence

import redis

from ...client import Admission
from ... import scripts
from ..progress import progress_bar
from ..servers import LocalServer
from ..stats import percentile
from .case import FLOOR_LIBRARY, Case, Queue, bench_clients, empty_script_usec, fill_seats, measure, run_facts
from .policy import (BIG_ESTIMATE, MESH, PODS_SECONDS, POOL, REFILL, TARGET_EXTRA, TARGET_FLAT_RATIO, bench_policy,
                     extra_target, lanes_table, server_target)


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
        with bench_clients(srv.url) as (setup, adm):
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
        version = srv.version
    for case in grid:
        base = min((c for c in grid if c.lanes == case.lanes), key=lambda c: (c.seats, c.waiters))
        case.vs_smallest = (case.admit_extra_p50 / base.admit_extra_p50) if base.admit_extra_p50 > 0 else float("nan")
    return {
        **run_facts(engine, version),
        "iterations": iterations, "warmup": warmup, "empty_script_usec": baseline,
        "grid": {"lanes": list(lanes), "seats": list(seats), "waiters": list(waiters)},
        "targets": targets(grid), "elapsed_s": round(time.perf_counter() - started, 1),
        "cases": [asdict(c) for c in grid], "pods": throughput if pods else None,
    }


def targets(grid: list[Case]) -> dict[str, Any]:
    def count(ok: list[bool]) -> dict[str, int]:
        return {"met": sum(ok), "cases": len(ok)}

    by_lanes: dict[int, list[float]] = {}
    over_floor: dict[int, list[float]] = {}
    for c in grid:
        by_lanes.setdefault(c.lanes, []).append(c.admit_extra_p50)
        over_floor.setdefault(c.lanes, []).append(admit_over_floor(c))
    return {
        "admit_extra": count([c.admit_extra_p50 <= extra_target(c.lanes) for c in grid]),
        "release_extra": count([c.release_extra_p50 <= TARGET_EXTRA for c in grid]),
        "server_admit": count([c.server_admit_usec <= server_target(c.lanes) for c in grid]),
        "flat_seats_waiters": {**count([c.vs_smallest <= TARGET_FLAT_RATIO for c in grid]),
                               "max": max(c.vs_smallest for c in grid)},
        "lanes_median_admit_extra_p50": {str(k): percentile(v, 0.5) for k, v in sorted(by_lanes.items())},
        "lanes_median_admit_over_floor": {str(k): percentile(v, 0.5) for k, v in sorted(over_floor.items())},
    }


def admit_over_floor(c: Any) -> float:
    """The server's µs per admit over the floor's, measured in the same server and run: how speed is
    judged on a noisy machine (an absolute µs moves with the machine's load; the ratio much less)."""
    return c.server_admit_usec / c.server_floor_usec if c.server_floor_usec > 0 else float("nan")


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
    Admission(setup, mesh=MESH, pod="bench", background=False).ops.apply_policy(
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
