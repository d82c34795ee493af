"""The provider benchmark: ``python -m admission.tools.bench --provider`` (also ``admission bench --provider``).

One burst of rounds, three ways, side by side, against the fake provider
(``admission.tools.fake_provider``: the simulator's provider model over HTTP, with a hidden
capacity K that nobody here is told about except mode (c)). ``--rounds`` rounds, each one chat
completion of ``--tokens`` tokens, are split over ``--pods`` pod *processes*; each pod starts one
thread per round of its share and all pods start together (a start gate opened once every pod is ready: a barrier), so the whole burst
arrives at once. The same burst runs three times, one mode after another, each against a fresh
provider of the same capacity, scale and seed:

(a) **no admission** -- every round calls the plain OpenAI SDK (``max_retries=0``) and retries a
    429 itself with exponential backoff and full jitter: it sleeps uniform(0, min(cap, base·2^i))
    before attempt i + 1 (base ``--backoff-base`` 1 s real, doubling, cap ``--backoff-cap`` 30 s)
    until it succeeds. It honours nothing else (no Retry-After). This is what a fleet without
    shared admission does.
(b) **through the admission** -- the same calls through ``admission.integrations.openai.wrap``:
    every attempt is a ``round()`` of one lane on one pool (``m@fake``), so it waits for a seat,
    and a 429 that still happens releases the seat as ``rate_limited`` (the pool's estimate
    drops, its Retry-After pauses the pool for every pod) and is asked again through the
    admission (the wrapper's ``retries``, and a loop around it that never gives up before the
    bound). The admission starts cold: a pool never seen, ``seed_estimate`` 2, slow start.
(c) **a static shared semaphore set to the hidden capacity** -- a Redis list of K tokens shared by
    the pods (BLPOP takes one, RPUSH gives it back), plus mode (a)'s backoff on a 429 (the token is
    given back while it sleeps). Told the hidden K, this is the best a fixed limit can do; it is
    the yardstick, not a competitor: a real fleet does not know K, and K moves.

What is fair about it:

* the same rounds, pods, threads, start gate, provider model, capacity, scale and seed in all
  three modes (a new provider per mode, so each sees the same random sequence from the same
  virtual time 0); the same OpenAI SDK client settings (no SDK retries, the same HTTP client);
* every mode retries until every round has succeeded: nothing is dropped or counted as done
  without a 200;
* the admission gets one lane that owns the whole pool (floor 1) and **default tunables**; only the
  ones that are durations of the provider's world are scaled by ``--scale`` (the provider runs
  ``scale`` simulated seconds per real second, the admission runs on Redis' real clock):
  ``grow_interval``, ``stall_after``, ``round_cap``, ``starved_after``, ``probe_every``,
  ``closed_for`` and ``retry_after_max`` are divided by ``scale`` (clamped to their lower bound).
  The pod's own infrastructure times (``lease_ttl``, ``decision_ttl``, ``health_max_age``) and
  every count and share keep their defaults. Nothing is tuned to this scenario;
* the backoff of (a) and (c) is a real client's, in real seconds, not scaled: at ``--scale 60`` a
  1 s backoff lasts a minute of the provider's time (a round of 150 tokens takes 2.5 simulated s
  alone). That is what the brief asks for; ``--backoff-base`` / ``--backoff-cap`` change it
  (e.g. ``--backoff-base 0.0167 --backoff-cap 0.5`` is 1 s / 30 s of provider time).

What is measured, per mode:

* **drain s** -- from the first request any pod sent to the provider to the last round's 200, real s;
* **429s** -- the refusals the provider sent (its own count, ``GET /stats``);
* **peak in flight** -- the most rounds the provider served at once (its count) against K;
* **rounds/s** -- rounds / drain;
* **latency mean / p95** -- per round, from the burst's start (the gate) to its 200: waiting
  for a seat, a token or a backoff included;
* **limit** -- what bounded concurrency: nothing, the admission's slots (the most it allowed at any
  time, from its ``grew`` events and a poll of the pool; its K̂ and K at the end), the K tokens.

A mode that has not drained within the bound (20× the ideal drain of a fixed limit K with no
overhead, plus 4 backoff caps) stops the run: one line on stderr, exit 1.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.metadata
import json
import logging
import math
import multiprocessing
import os
import platform
import queue as queue_mod
import random
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

from ..policy import TUNABLES
from . import write_json
from .servers import ENGINES, LocalServer, find_server
from .sim import model

PROG = "python -m admission.tools.bench --provider"
MODES = ("none", "admission", "semaphore")
LABELS = {"none": "(a) no admission", "admission": "(b) admission", "semaphore": "(c) semaphore = K"}
MESH = "provider-bench"
PROVIDER = "fake"
MODEL = "m"
POOL = f"{MODEL}@{PROVIDER}"
LANE = "bench"
SEMAPHORE = "provider-bench:{sem}:tokens"
MESSAGES = [{"role": "user", "content": "Summarise the burst."}]
#: Tunables that are durations of the provider's world: divided by --scale (see the docstring).
SCALED_TUNABLES = ("grow_interval", "stall_after", "round_cap", "starved_after", "probe_every", "closed_for",
                   "retry_after_max")
#: The wrapper's own retries of a 429 per call (each a new round); the bench loops around it too.
WRAP_RETRIES = 100
#: The bound: BOUND_FACTOR x the ideal drain of a fixed limit K, plus BOUND_BACKOFFS backoff caps.
BOUND_FACTOR = 20.0
BOUND_BACKOFFS = 4
#: Pods start (spawn, imports) and set up their threads within this many seconds.
SETUP_TIMEOUT = 120.0
POLL = 0.05
MAX_ROUNDS = 5_000  # one thread per round: keep it to what a machine can hold

COLUMNS = ("mode", "drain s", "429s", "peak in flight", "rounds/s", "latency mean s", "latency p95 s",
           "requests", "limit")


@dataclass(frozen=True)
class Settings:
    rounds: int = 200
    pods: int = 4
    capacity: int = 12
    scale: float = 60.0
    tokens: int = 150
    seed: int = 1
    engine: str = "redis"
    backoff_base: float = 1.0
    backoff_cap: float = 30.0


class NotDrained(RuntimeError):
    """A mode did not drain its burst within the bound (or a pod failed)."""


# --------------------------------------------------------------------------------------------
# The policy and the yardsticks


def scaled_tunables(scale: float) -> dict[str, float]:
    """The default of every tunable in SCALED_TUNABLES divided by ``scale``, within its bounds."""
    out = {}
    for name in SCALED_TUNABLES:
        default, kind, lo, hi = TUNABLES[name][:4]
        value = min(hi, max(lo, default / scale))
        out[name] = kind(value) if kind is int else round(value, 6)
    return out


def bench_policy(scale: float) -> dict[str, Any]:
    """One lane owning the one pool; default tunables but the provider's durations, scaled."""
    return {"tunables": scaled_tunables(scale),
            "lanes": {LANE: {"floor": 1.0, "weight": 1, "priority": 1}},
            "providers": {PROVIDER: {}}, "pools": {POOL: {}}}


def ideal_drain_s(rounds: int, tokens: int, capacity: int, scale: float) -> float:
    """A fixed limit K with no overhead at all: K rounds at a time (the last wave smaller), each
    wave as long as its rounds take at the model's rate; real seconds."""
    left, sim_s = rounds, 0.0
    while left > 0:
        n = min(capacity, left)
        sim_s += tokens / model.rate(n, capacity)
        left -= n
    return sim_s / scale


def bound_s(s: Settings) -> float:
    return BOUND_FACTOR * ideal_drain_s(s.rounds, s.tokens, s.capacity, s.scale) + BOUND_BACKOFFS * s.backoff_cap


def backoff_s(rng: random.Random, attempt: int, base: float, cap: float) -> float:
    """Full jitter: uniform(0, min(cap, base * 2**attempt)), attempt counted from 0."""
    return rng.uniform(0.0, min(cap, base * 2.0 ** min(attempt, 60)))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``values``."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


# --------------------------------------------------------------------------------------------
# One pod (a process): one thread per round of its share


@dataclass
class Job:
    """What the parent tells the pods for one mode."""

    mode: str
    provider_url: str
    redis_url: str
    bound: float


@dataclass
class Item:
    """One round, as its pod saw it (monotonic seconds: system-wide, comparable across pods)."""

    index: int
    done: float | None = None
    attempts: int = 0       # calls this round made (the admission's own retries not included)
    refused: int = 0        # 429/529 this round's code saw (after the wrapper's retries in (b))
    error: str | None = None


class _Counts:
    """The pod's HTTP traffic to the provider, from the SDK's httpx client hooks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.first_request: float | None = None
        self.statuses: dict[str, int] = {}

    def request(self, _request: Any) -> None:
        now = time.monotonic()
        with self.lock:
            if self.first_request is None or now < self.first_request:
                self.first_request = now

    def response(self, response: Any) -> None:
        with self.lock:
            key = str(response.status_code)
            self.statuses[key] = self.statuses.get(key, 0) + 1


def _sdk_client(job: Job, counts: _Counts, threads: int) -> Any:
    import httpx
    import openai

    http = openai.DefaultHttpxClient(
        limits=httpx.Limits(max_connections=threads + 8, max_keepalive_connections=threads + 8),
        event_hooks={"request": [counts.request], "response": [counts.response]})
    return openai.OpenAI(base_url=job.provider_url + "/v1", api_key="bench", max_retries=0,
                         timeout=job.bound, http_client=http)


def _is_load(exc: BaseException) -> bool:
    return getattr(exc, "status_code", None) in (429, 529)


def _pod_mode(index: int, s: Settings, job: Job, results: Any, start_gate: Any, done: Any) -> dict[str, Any]:
    """Run this pod's share of the burst in ``job.mode``: its threads are made and waiting, the pod
    says it is ready and waits for the parent's start (every pod ready: the barrier); the items
    and the pod's HTTP counts."""
    import openai
    import redis

    mine = list(range(index, s.rounds, s.pods))
    counts = _Counts()
    sdk = _sdk_client(job, counts, len(mine))
    adm = sem = None
    client: Any = sdk
    if job.mode == "admission":
        from ..client import Admission
        from ..integrations.openai import wrap

        adm = Admission.from_url(job.redis_url, mesh=MESH, pod=f"pod-{index}", seed=s.seed * 1000 + index)
        client = wrap(sdk, adm, lane=LANE, provider=PROVIDER, pools={MODEL: POOL}, retries=WRAP_RETRIES,
                      timeout=job.bound)
    elif job.mode == "semaphore":
        sem = redis.Redis.from_url(job.redis_url, socket_timeout=10, max_connections=len(mine) + 4)
    go = threading.Event()
    start: list[float] = []
    items = [Item(i) for i in mine]

    def finished(item: Item) -> None:
        item.done = time.monotonic()
        with done.get_lock():
            done.value += 1

    def one(item: Item) -> None:
        rng = random.Random(f"{s.seed}-{job.mode}-{item.index}")
        go.wait()
        if not start:  # the burst never started
            return
        deadline = start[0] + job.bound
        kwargs: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "max_tokens": s.tokens}
        if job.mode == "admission":
            kwargs["round_id"] = f"r-{item.index}"
        failures = 0
        while time.monotonic() < deadline:
            token = None
            if sem is not None:
                got = sem.blpop([SEMAPHORE], timeout=1)
                if got is None:
                    continue
                token = got[1]
            item.attempts += 1
            try:
                client.chat.completions.create(**kwargs)
            except openai.APIStatusError as exc:
                if _is_load(exc):
                    item.refused += 1
                else:  # not expected from the fake provider: recorded, retried like a refusal
                    item.error = f"{type(exc).__name__} {exc.status_code}"
            except Exception as exc:  # noqa: BLE001 - network, the admission's own errors: recorded, retried
                item.error = repr(exc)
                if job.mode == "admission":
                    time.sleep(0.05)
            else:
                finished(item)
                return
            finally:
                if token is not None:
                    sem.rpush(SEMAPHORE, token)
            if job.mode != "admission":  # (b) waits through the admission, not a backoff
                time.sleep(min(max(0.0, deadline - time.monotonic()),
                               backoff_s(rng, failures, s.backoff_base, s.backoff_cap)))
            failures += 1

    threads = [threading.Thread(target=one, args=(item,), name=f"round-{item.index}", daemon=True)
               for item in items]
    for t in threads:
        t.start()
    try:
        results.put({"pod": index, "ready": True})
        if not start_gate.wait(timeout=SETUP_TIMEOUT):
            raise RuntimeError(f"no start within {SETUP_TIMEOUT:.0f} s")
        start.append(time.monotonic())
        go.set()
        for t in threads:
            t.join(timeout=max(0.1, start[0] + job.bound + 5 - time.monotonic()))
    finally:
        go.set()
        if adm is not None:
            adm.close()
        sdk.close()
        if sem is not None:
            sem.close()
    return {"pod": index, "start": start[0], "first_request": counts.first_request, "statuses": counts.statuses,
            "items": [dataclasses.asdict(i) for i in items]}


def _pod_main(index: int, settings: dict[str, Any], commands: Any, results: Any, start_gate: Any,
              done: Any) -> None:
    """A pod process: runs the modes it is sent until it is sent None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # an interrupt is the parent's to handle (it stops us)
    logging.getLogger("admission").setLevel(logging.WARNING)
    s = Settings(**settings)
    while True:
        job = commands.get()
        if job is None:
            return
        try:
            results.put(_pod_mode(index, s, Job(**job), results, start_gate, done))
        except BaseException as exc:  # noqa: BLE001 - the parent reports it and stops
            results.put({"pod": index, "error": f"{type(exc).__name__}: {exc}"})


class Pods:
    """The pod processes (spawned once, used by every mode)."""

    def __init__(self, s: Settings):
        ctx = multiprocessing.get_context("spawn")
        self.s = s
        self.start_gate = ctx.Event()
        self.done = ctx.Value("i", 0)
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(s.pods)]
        self.procs = [ctx.Process(target=_pod_main, name=f"bench-pod-{i}", daemon=True,
                                  args=(i, dataclasses.asdict(s), self.commands[i], self.results, self.start_gate,
                                        self.done))
                      for i in range(s.pods)]
        for p in self.procs:
            p.start()

    def run(self, job: Job, watch: Callable[[int], None]) -> list[dict[str, Any]]:
        """One mode: every pod sets up its threads and says so; once all have, the start gate
        opens and the burst goes. The pods' reports; ``watch(done)`` every POLL seconds meanwhile."""
        self.start_gate.clear()
        with self.done.get_lock():
            self.done.value = 0
        for q in self.commands:
            q.put(dataclasses.asdict(job))
        ready = self._collect(job, "ready", time.monotonic() + SETUP_TIMEOUT, lambda: None)
        self.start_gate.set()
        reports = self._collect(job, "report", time.monotonic() + job.bound + 30, lambda: watch(self.done.value))
        watch(self.done.value)
        assert len(ready) == len(reports) == self.s.pods
        return reports

    def _collect(self, job: Job, what: str, deadline: float, idle: Callable[[], None]) -> list[dict[str, Any]]:
        """One message of kind ``what`` from every pod; a pod's error, a dead pod or the deadline
        raise NotDrained."""
        got: list[dict[str, Any]] = []
        while len(got) < self.s.pods:
            idle()
            try:
                r = self.results.get(timeout=POLL)
            except queue_mod.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead or time.monotonic() > deadline:
                    waiting = "to be ready" if what == "ready" else "to finish"
                    why = f"{', '.join(dead)} died" if dead else "deadline passed"
                    raise NotDrained(f"{LABELS[job.mode]}: {self.s.pods - len(got)} pod(s) never came {waiting} "
                                     f"({why}; {self.done.value} of {self.s.rounds} rounds done)") from None
                continue
            if r.get("error"):
                raise NotDrained(f"{LABELS[job.mode]}: pod {r['pod']} failed: {r['error']}")
            if (what == "ready") != bool(r.get("ready")):
                raise NotDrained(f"{LABELS[job.mode]}: pod {r['pod']} out of step")
            got.append(r)
        return got

    def close(self, wait: float = 10.0) -> None:
        """Stop the pods: each is told to, waited for ``wait`` seconds, then terminated."""
        for q in self.commands:
            with contextlib.suppress(Exception):
                q.put(None)
        for p in self.procs:
            p.join(timeout=wait)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


# --------------------------------------------------------------------------------------------
# The parent: a provider per mode, the pods, the figures


class Progress:
    """tqdm on a terminal when it is importable; else a \\r line on a terminal; a line per mode on
    anything else; nothing when disabled."""

    def __init__(self, enabled: bool, total: int):
        self.enabled, self.total = enabled, total
        self.tty = enabled and sys.stderr.isatty()
        self.bar: Any = None
        self.label = ""
        self.last = -1

    def start(self, label: str) -> None:
        self.label, self.last = label, -1
        if not self.enabled:
            return
        if self.tty:
            try:
                from tqdm import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=self.total, desc=label, unit="round", leave=False, dynamic_ncols=True)
                return
        else:
            print(f"provider bench: {label}: {self.total} rounds ...", file=sys.stderr, flush=True)

    def update(self, done: int) -> None:
        if not self.enabled or done == self.last:
            return
        if self.bar is not None:
            self.bar.update(done - max(0, self.last))
        elif self.tty:
            print(f"\r{self.label}: {done}/{self.total} rounds", end="", file=sys.stderr, flush=True)
        self.last = done

    def end(self, summary: str) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.tty:
            print("\r\033[K", end="", file=sys.stderr)
        print(f"provider bench: {self.label}: {summary}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """A run that stopped: the bar (or the line) goes, nothing is printed."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        elif self.tty and self.last >= 0:
            print("\r\033[K", end="", file=sys.stderr, flush=True)


class SlotWatch:
    """The most slots the admission allowed: polled from the pool while (b) runs, and every
    ``grew`` event of the mesh read afterwards (the estimate rises only by those)."""

    def __init__(self, url: str):
        import redis

        self.redis = redis.Redis.from_url(url, socket_timeout=5)
        self.key = f"adm:{{{MESH}}}:pool:{POOL}"
        self.max_est = float(TUNABLES["seed_estimate"][0])

    def poll(self) -> None:
        with contextlib.suppress(Exception):
            est = self.redis.hget(self.key, "est")
            if est is not None:
                self.max_est = max(self.max_est, float(est))

    def finish(self) -> dict[str, Any]:
        events = self.redis.xrange(f"adm:{{{MESH}}}:events")
        for _id, fields in events:
            if fields.get(b"kind") == b"grew" and fields.get(b"pool") == POOL.encode():
                self.max_est = max(self.max_est, float(fields[b"est"]))
        est, cap = self.redis.hmget(self.key, "est", "cap")
        decreases = sum(1 for _id, f in events if f.get(b"kind") == b"exhausted")
        self.redis.close()
        return {"max_slots": max(1, math.floor(self.max_est)), "final_estimate": float(est or 0),
                "final_cap": float(cap or 0), "decreases": decreases}


def _prepare(mode: str, s: Settings, redis_url: str) -> SlotWatch | None:
    import redis

    from ..client import Admission

    r = redis.Redis.from_url(redis_url)
    try:
        if mode == "admission":
            r.flushall()
            adm = Admission(r, mesh=MESH, pod="bench-parent", background=False)
            adm.apply_policy(bench_policy(s.scale), recovery_hold=False)
            return SlotWatch(redis_url)
        if mode == "semaphore":
            with r.pipeline() as pipe:
                pipe.delete(SEMAPHORE)
                pipe.rpush(SEMAPHORE, *[f"t{i}" for i in range(s.capacity)])
                pipe.execute()
        return None
    finally:
        r.close()


def _row(mode: str, s: Settings, reports: list[dict[str, Any]], stats: dict[str, Any],
         slots: dict[str, Any] | None, bound: float) -> dict[str, Any]:
    items = [it for rep in reports for it in rep["items"]]
    done = [it for it in items if it["done"] is not None]
    if len(done) < s.rounds:
        errors = sorted({it["error"] for it in items if it["error"]})
        raise NotDrained(f"{LABELS[mode]} did not drain within the bound of {bound:.3g} s: "
                         f"{len(done)} of {s.rounds} rounds done" + (f" (last error: {errors[-1]})" if errors else ""))
    first = min(rep["first_request"] for rep in reports if rep["first_request"] is not None)
    latencies = [it["done"] - rep["start"] for rep in reports for it in rep["items"]]
    drain = max(it["done"] for it in done) - first
    total = stats["total"]
    client_statuses: dict[str, int] = {}
    for rep in reports:
        for k, v in rep["statuses"].items():
            client_statuses[k] = client_statuses.get(k, 0) + v
    row = {
        "mode": mode, "label": LABELS[mode], "rounds": len(done), "drain_s": round(drain, 3),
        "provider_429": int(total.get("429", 0)), "provider_529": int(total.get("529", 0)),
        "peak_in_flight": int(total.get("peak_in_flight", 0)), "capacity": s.capacity,
        "over_capacity_s": total.get("over_capacity_s", 0.0),
        "requests": int(total.get("requests", 0)), "completions": int(total.get("completions", 0)),
        "rounds_per_s": round(len(done) / drain, 2) if drain > 0 else float("nan"),
        "latency_mean_s": round(sum(latencies) / len(latencies), 3),
        "latency_p95_s": round(percentile(latencies, 0.95), 3),
        "latency_max_s": round(max(latencies), 3),
        "client_statuses": dict(sorted(client_statuses.items())),
        "client_refusals_seen": sum(it["refused"] for it in items),
    }
    if mode == "none":
        row["limit"] = "none"
    elif mode == "semaphore":
        row["limit"] = f"{s.capacity} tokens"
    else:
        assert slots is not None
        row.update(slots)
        cap = f"{slots['final_cap']:g}" if slots["final_cap"] else "never measured"
        row["limit"] = f"slots ≤ {slots['max_slots']} (at the end K̂ {slots['final_estimate']:.1f}, K {cap})"
    return row


@contextlib.contextmanager
def quiet_logs(level: int = logging.WARNING) -> Iterator[None]:
    """structlog (the servers' logs) at ``level`` and on stderr while the bench runs: stdout
    carries the table."""
    import structlog

    old = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(level),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    try:
        yield
    finally:
        structlog.configure(**old)


def run(s: Settings, progress: bool = False) -> dict[str, Any]:
    """The three modes, one after another; the figures as a dict (what --json prints)."""
    from .fake_provider import FakeProviderServer

    if s.rounds < 1 or s.pods < 1 or s.capacity < 1 or not s.scale > 0 or s.tokens < 1:
        raise ValueError("rounds, pods, capacity, scale and tokens must be positive")
    bound = bound_s(s)
    started = time.monotonic()
    bar = Progress(progress, s.rounds)
    rows: list[dict[str, Any]] = []
    with quiet_logs(), LocalServer(s.engine) as server:
        pods = Pods(s)
        finished = False
        try:
            for mode in MODES:
                watch = _prepare(mode, s, server.url)
                provider = FakeProviderServer(capacity=s.capacity, scale=s.scale, seed=s.seed, tokens=s.tokens)
                url = provider.start()
                bar.start(LABELS[mode])
                try:
                    def tick(done: int) -> None:
                        bar.update(done)
                        if watch is not None:
                            watch.poll()

                    reports = pods.run(Job(mode, url, server.url, bound), tick)
                    stats = provider.stats()
                finally:
                    provider.stop()
                slots = watch.finish() if watch is not None else None
                row = _row(mode, s, reports, stats, slots, bound)
                rows.append(row)
                bar.end(f"drained in {row['drain_s']:.2f} s, {row['provider_429']} × 429")
            finished = True
        finally:
            bar.close()
            pods.close(wait=10.0 if finished else 1.0)
        version = server.version
    return {
        "settings": dataclasses.asdict(s),
        "versions": _versions(s.engine, version),
        "ideal_drain_s": round(ideal_drain_s(s.rounds, s.tokens, s.capacity, s.scale), 3),
        "bound_s": round(bound, 1),
        "policy": bench_policy(s.scale),
        "wrap_retries": WRAP_RETRIES,
        "rows": rows,
        "elapsed_s": round(time.monotonic() - started, 1),
    }


def _versions(engine: str, server_version: str | None) -> dict[str, str]:
    def version(name: str) -> str:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    return {"engine": f"{engine} {server_version or '?'}", "python": platform.python_version(),
            "openai": version("openai"), "httpx": version("httpx"), "admission": version("admission"),
            "machine": f"{platform.machine()} {os.cpu_count()} cpu"}


# --------------------------------------------------------------------------------------------
# Output


def settings_line(result: dict[str, Any]) -> str:
    s, v = result["settings"], result["versions"]
    return (f"rounds {s['rounds']}, pods {s['pods']}, capacity {s['capacity']}, scale {s['scale']:g}, "
            f"tokens {s['tokens']}, seed {s['seed']}; {v['engine']}, Python {v['python']}, openai {v['openai']}, "
            f"httpx {v['httpx']}, admission {v['admission']}, {v['machine']}")


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    return [[r["label"], f"{r['drain_s']:.2f}", f"{r['provider_429']:,}",
             f"{r['peak_in_flight']} / {r['capacity']}", f"{r['rounds_per_s']:.1f}",
             f"{r['latency_mean_s']:.2f}", f"{r['latency_p95_s']:.2f}", f"{r['requests']:,}", r["limit"]]
            for r in result["rows"]]


def notes(result: dict[str, Any]) -> list[str]:
    s = result["settings"]
    tun = ", ".join(f"{k} {v:g}" for k, v in result["policy"]["tunables"].items())
    return [
        f"ideal drain of a fixed limit K (K at a time, no overhead): {result['ideal_drain_s']:.2f} s; "
        f"bound {result['bound_s']:.0f} s",
        "drain = first request to the last round's 200; latency = burst start to the round's 200 "
        "(waiting and backoff included); 429s, peak and requests are the provider's own counts",
        f"(a) and (c) back off a 429 with full jitter, base {s['backoff_base']:g} s doubling to "
        f"{s['backoff_cap']:g} s (real seconds, not scaled)",
        f"(b): one lane owning pool {POOL}, default tunables except the provider's durations / scale: {tun}; "
        f"the wrapper retries a 429 through the admission (a new round each time)",
        f"whole run {result['elapsed_s']:.0f} s",
    ]


def render(result: dict[str, Any], markdown: bool = False) -> str:
    rows, head = table_rows(result), settings_line(result)
    if markdown:
        out = [f"**admission bench --provider** — {head}", "",
               "| " + " | ".join(COLUMNS) + " |", "|---|" + "|".join("---:" for _ in COLUMNS[1:-1]) + "|---|"]
        out += ["| " + " | ".join(r) + " |" for r in rows]
        out += [""] + [f"- {n}" for n in notes(result)]
        return "\n".join(out)
    widths = [max(len(COLUMNS[i]), *(len(r[i]) for r in rows)) for i in range(len(COLUMNS))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i in (0, len(cells) - 1) else c.rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [f"admission bench --provider — {head}", "", line(COLUMNS), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    out += [""] + notes(result)
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# CLI


class _Usage(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override] - one line, not the usage text
        raise _Usage(message)


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def parser() -> argparse.ArgumentParser:
    d = Settings()
    p = _Parser(prog=PROG, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=_positive_int, default=d.rounds, help=f"rounds in the burst (default {d.rounds})")
    p.add_argument("--pods", type=_positive_int, default=d.pods, help=f"pod processes (default {d.pods})")
    p.add_argument("--capacity", type=_positive_int, default=d.capacity,
                   help=f"the provider's hidden capacity K (default {d.capacity})")
    p.add_argument("--scale", type=_positive_float, default=d.scale,
                   help=f"provider's simulated seconds per real second (default {d.scale:g})")
    p.add_argument("--tokens", type=_positive_int, default=d.tokens, help=f"tokens per round (default {d.tokens})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"provider and backoff seed (default {d.seed})")
    p.add_argument("--engine", choices=ENGINES, default=d.engine, help="server to start (default redis)")
    p.add_argument("--backoff-base", type=_positive_float, default=d.backoff_base,
                   help=f"(a), (c): first backoff cap, real s (default {d.backoff_base:g})")
    p.add_argument("--backoff-cap", type=_positive_float, default=d.backoff_cap,
                   help=f"(a), (c): largest backoff, real s (default {d.backoff_cap:g})")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="print the figures as JSON instead of the table (FILE: save them there, print the table)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the docs)")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    return p


def settings_of(args: argparse.Namespace) -> Settings:
    if args.pods > args.rounds:
        raise _Usage(f"--pods ({args.pods}) must be at most --rounds ({args.rounds})")
    if args.rounds > MAX_ROUNDS:
        raise _Usage(f"--rounds must be at most {MAX_ROUNDS:,} (one thread per round)")
    if args.tokens > 100_000:
        raise _Usage("--tokens must be at most 100,000")
    if args.backoff_cap < args.backoff_base:
        raise _Usage("--backoff-cap must be >= --backoff-base")
    return Settings(rounds=args.rounds, pods=args.pods, capacity=args.capacity, scale=args.scale, tokens=args.tokens,
                    seed=args.seed, engine=args.engine, backoff_base=args.backoff_base, backoff_cap=args.backoff_cap)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        s = settings_of(args)
    except _Usage as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if find_server(s.engine) is None:
        print(f"{PROG}: error: no {s.engine} server binary found", file=sys.stderr)
        return 2
    try:
        result = run(s, progress=not args.no_progress)
    except NotDrained as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    if args.json == "-":
        print(json.dumps(result, indent=2), flush=True)
        return 0
    print(render(result, markdown=args.markdown), flush=True)
    if args.json:
        write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
