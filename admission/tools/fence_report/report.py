"""The whole report: every fault on a server of its own (or the one given)."""
from __future__ import annotations

import contextlib
import platform
import random
import time
from typing import Any, Iterator, Sequence

import redis

from ...client import fail_fast_options
from ..progress import progress_bar
from ..servers import LocalServer, default_engine, free_port
from .faults import FaultRun
from .planes import DEFAULT_SHARE, FAULTS
from .results import FaultResult


@contextlib.contextmanager
def _server(engine: str | None, url: str | None, client: Any) -> Iterator[tuple[Any, str, bool]]:
    """(client, description, real server?)"""
    if client is not None:
        fake = type(client).__module__.startswith("fakeredis")
        yield client, "fakeredis (given)" if fake else "a given client", not fake
        return
    if url:
        c = redis.Redis.from_url(url, **fail_fast_options(1.0, 10.0))
        info = c.info("server")
        name = "valkey" if "valkey_version" in info else "redis"
        yield c, f"{name} {info.get('valkey_version') or info.get('redis_version')} at {url}", True
        return
    engine = engine or default_engine("fakeredis")
    if engine == "fakeredis":
        import fakeredis

        yield (fakeredis.FakeRedis(server=fakeredis.FakeServer()),
               f"fakeredis {getattr(fakeredis, '__version__', '?')}", False)
        return
    with LocalServer(engine) as srv:
        c = redis.Redis.from_url(srv.url, **fail_fast_options(1.0, 10.0))
        try:
            yield c, f"{engine} {srv.version} (embedded, started for this run)", True
        finally:
            c.close()


def run(intents: int, seed: int, *, engine: str | None = None, url: str | None = None, client: Any = None,
        faults: Sequence[str] = FAULTS, share: float = DEFAULT_SHARE, progress: bool | None = False) -> dict[str, Any]:
    """Run the report; returns it as a dict (``ok``: every check held in every case)."""
    if intents < 1:
        raise ValueError("intents must be >= 1")
    if not 0 < share <= 1:
        raise ValueError("share must be in (0, 1]")
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    started = time.perf_counter()
    results: list[FaultResult] = []
    with (_server(engine, url, client) as (c, desc, real),
          progress_bar(intents * len(faults), progress, unit="intent", desc="fence-report") as bar):
        closed_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
        for k, fault in enumerate(faults):
            bar.set_postfix_str(fault)
            rng = random.Random(f"{seed}/{fault}")  # each fault its own seeded stream
            results.append(FaultRun(c, fault, intents, rng, share=share, dump=real,
                                    closed_url=closed_url).run(bar))
    seconds = time.perf_counter() - started
    return {"intents": intents, "seed": seed, "share": share, "server": desc,
            "comparison": "DUMP + PTTL of each primary key" if real else "HGETALL/ZRANGE + PTTL of each primary key",
            "python": platform.python_version(), "machine": f"{platform.machine()} {_cpus()} cpu",
            "seconds": round(seconds, 2), "faults": [r.as_dict() for r in results],
            "ok": all(r.ok for r in results)}


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)
