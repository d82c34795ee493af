"""Running the simulations: a Redis server per process, one seeded Generator per run, the rows
spread over worker processes."""
from __future__ import annotations

import os
import shutil
import tempfile
import time
import uuid
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np

from . import scenarios
from . import load as L
from .engine import Sim
from .policies import REDIS_BACKED
from .policies import make as make_policy

ENGINES = ("redis", "valkey", "fakeredis")


class Backend:
    """Where seed-and-grow's Lua runs: a server this process starts (redis or valkey), or
    fakeredis when asked for explicitly. ``client()`` is empty for each run."""

    def __init__(self, engine: str = "redis"):
        if engine not in ENGINES:
            raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
        self.engine = engine
        self.server = None
        self._client = None

    def client(self):
        if self.engine == "fakeredis":
            import fakeredis

            return fakeredis.FakeRedis(server=fakeredis.FakeServer())
        if self._client is None:
            import redis

            from ..servers import LocalServer

            # a unix socket beside the loopback port: about a fifth less per round trip
            self._dir = tempfile.mkdtemp(prefix="admission-sim-")
            sock = os.path.join(self._dir, "redis.sock")
            self.server = LocalServer(self.engine, extra_args=["--unixsocket", sock, "--unixsocketperm", "700"]).start()
            self._client = redis.Redis(unix_socket_path=sock)
        self._client.flushall()
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self.server is not None:
            self.server.stop()
            self.server = None
            shutil.rmtree(self._dir, ignore_errors=True)


def rng_for(seed: int, scenario: str, run: int) -> np.random.Generator:
    """One Generator per run; every policy of a row gets the same one (so the same load)."""
    return np.random.default_rng([seed, scenarios.NAMES.index(scenario), run])


@dataclass(frozen=True)
class Job:
    scenario: str
    policy: str
    run: int
    seed: int = 1
    capacity: float = 18.0
    hours: float = 10.0
    record: bool = False


def simulate(sc: scenarios.Scenario, policy: str, rng: np.random.Generator, *, hours: float = 10.0,
             backend: Backend | None = None, record: bool = False) -> Any:
    """One run of one policy on one scenario (the load is drawn first from ``rng``)."""
    if sc.ceilings is not None:
        from .ceiling_run import CeilingSim

        return CeilingSim((backend or _backend()).client(), policy, rng, sc.ceilings).run()
    items = sc.build(rng)
    client = None
    if policy in REDIS_BACKED:
        client = (backend or _backend()).client()
    pol = make_policy(policy, client, mesh_prefix=f"sim-{uuid.uuid4().hex[:8]}",
                      limit_usd=sc.policy_limit_usd or sc.limit_usd)
    kw = dict(pools=sc.pools, pods=sc.pods, items=items, policy=pol, rng=rng, window_start=sc.window_start,
              hours=sc.hours or hours, record=record)
    if sc.day:
        from .day import DaySim

        return DaySim(limit_usd=sc.limit_usd, price_per_1k=L.PRICE_PER_1K_TOKENS,
                      turn_tokens=L.TURN_TOKENS, other_keys=sc.other_keys, **kw).run()
    return Sim(**kw).run()


def run_job(job: Job, backend: Backend | None = None) -> tuple[Job, dict[str, Any], Any]:
    """One run: returns its figures (and its trace when ``job.record``)."""
    started = time.perf_counter()
    sim = simulate(scenarios.make(job.scenario, job.capacity), job.policy, rng_for(job.seed, job.scenario, job.run),
                   hours=job.hours, backend=backend, record=job.record)
    figures = sim.figures()
    figures["wall_seconds"] = time.perf_counter() - started
    trace = getattr(sim, "trace", None)
    return job, figures, (trace.points if trace is not None else None)


# -- worker processes ------------------------------------------------------------------------
_BACKEND: Backend | None = None
_ENGINE = "redis"


def _init(engine: str) -> None:
    global _ENGINE
    _ENGINE = engine
    try:  # stop this worker's server when the worker exits (atexit does not run in a worker)
        from multiprocessing import util

        util.Finalize(None, _close_backend, exitpriority=10)
    except Exception:  # pragma: no cover
        pass


def _backend() -> Backend:
    global _BACKEND
    if _BACKEND is None:
        _BACKEND = Backend(_ENGINE)
    return _BACKEND


def _close_backend() -> None:
    global _BACKEND
    if _BACKEND is not None:
        _BACKEND.close()
        _BACKEND = None


def run_jobs(jobs: Iterable[Job], *, engine: str = "redis", workers: int = 1,
             progress: Callable[[Job], None] | None = None) -> list[tuple[Job, dict[str, Any], Any]]:
    """Run every job (in ``workers`` processes when > 1); results in the jobs' order."""
    jobs = list(jobs)
    out: dict[Job, tuple] = {}
    if workers <= 1:
        _init(engine)
        try:
            for job in jobs:
                out[job] = run_job(job)
                if progress:
                    progress(job)
        finally:
            _close_backend()
    else:
        # the slowest jobs first, so the two workers finish together
        order = sorted(jobs, key=lambda j: (j.policy in REDIS_BACKED, j.scenario in scenarios.DAYS,
                                            j.scenario == "multipod"), reverse=True)
        with ProcessPoolExecutor(max_workers=workers, initializer=_init, initargs=(engine,)) as pool:
            futures = {pool.submit(run_job, job): job for job in order}
            for fut in as_completed(futures):
                job, fig, trace = fut.result()
                out[job] = (job, fig, trace)
                if progress:
                    progress(job)
    return [out[j] for j in jobs]


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))
