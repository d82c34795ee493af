"""``--census``: census and tick against the estimate (both must be flat in it)."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import redis

from ...client import Admission
from ...core import Core, mesh_key
from ... import scripts
from ..progress import NoBar, progress_bar
from ..servers import LocalServer
from .case import _check_pool, _fcall_stats, _run_pipelined, bench_clients, percentile_usec, run_facts
from .output import report
from .policy import BIG_ESTIMATE, MESH, POOL, bench_policy, lanes_table


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
    adm.ops.apply_policy(bench_policy(lanes, BIG_ESTIMATE), recovery_hold=False)
    names = list(lanes_table(lanes))
    filler = Core(MESH, "filler", seed=0)
    seats = (filler.admit(lane=n, model=POOL, round_id=f"s-{n}", draw=0.0, wait=False) for n in names)
    if not all(d.admitted for d in _run_pipelined(setup, seats, len(names), NoBar())):
        raise RuntimeError("bench census setup: a seat was refused")
    key = mesh_key(MESH, "pool", POOL)
    setup.hset(key, mapping={"est": 1, "exhausted": 1})  # full: the next ask queues
    waiter = filler.admit(lane=names[-1], model=POOL, round_id="w-0", draw=0.0, wait=True)
    if _run_pipelined(setup, iter([waiter]), 1, NoBar())[0].admitted:
        raise RuntimeError("bench census setup: the waiter was admitted")
    sec, usec = setup.time()
    setup.hset(key, mapping={"est": estimate, "cap": estimate, "exhausted": 1, "lastGrow": sec + usec / 1e6})
    _check_pool(setup, len(names), 1)


def measure_census(setup: redis.Redis, adm: Admission, case: CensusCase, iterations: int, progress) -> None:
    perf = time.perf_counter_ns
    at_key = mesh_key(MESH, "census", "at")
    for name in ("census", "tick"):
        for _ in range(max(1, iterations // 10)):  # warm-up: library loaded, caches hot
            setup.delete(at_key)
            adm.ops.census() if name == "census" else adm.tick()
        ns: list[int] = []
        setup.config_resetstat()
        for _ in range(iterations):
            if name == "census":
                t0 = perf()
                c = adm.ops.census()
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
            case.census_usec, case.census_p50 = usec / max(1, calls), percentile_usec(ns, 0.5)
            case.bounds = sum(l["bound"] for p in c["pools"] for l in p["lanes"])
        else:
            case.tick_usec, case.tick_p50 = usec / max(1, calls), percentile_usec(ns, 0.5)
    case.iterations = iterations


def run_census(engine: str, lanes: Sequence[int], estimates: Sequence[int], iterations: int,
               progress: bool | None = None) -> dict[str, Any]:
    """census and tick per (lanes, estimate) against a fresh local server; the figures as a dict."""
    cases = [CensusCase(l, e) for l in sorted(set(lanes)) for e in sorted(set(estimates))]
    started = time.perf_counter()
    with LocalServer(engine) as srv, progress_bar(2 * iterations * len(cases), progress) as bar:
        with bench_clients(srv.url, socket_timeout=60) as (setup, adm):
            scripts.load(setup)
            for case in cases:
                bar.set_postfix_str(f"lanes={case.lanes} estimate={case.estimate}")
                census_state(setup, adm, case.lanes, case.estimate)
                measure_census(setup, adm, case, iterations, bar)
        version = srv.version
    for case in cases:
        base = min((c for c in cases if c.lanes == case.lanes), key=lambda c: c.estimate)
        case.vs_smallest = case.census_usec / base.census_usec if base.census_usec else float("nan")
    return {
        **run_facts(engine, version),
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
    return report(head, CENSUS_COLUMNS, rows, notes, markdown)
