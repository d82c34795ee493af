"""One pod (a process): one thread per round of its share, in the mode the parent sends."""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import queue as queue_mod
import random
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from .settings import (LABELS, LANE, MESH, MESSAGES, MODEL, POLL, POOL, PROVIDER, SEMAPHORE, SETUP_TIMEOUT,
                       WRAP_RETRIES, NotDrained, Settings, backoff_s)


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
        from ...client import Admission
        from ...integrations.openai import wrap

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
        stop_pods(self.commands, self.procs, wait)


def stop_pods(commands: list[Any], procs: list[Any], wait: float = 10.0) -> None:
    """Stop pod processes: each is told to (None on its command queue), waited for ``wait``
    seconds, then terminated (both benchmark cases' fleets)."""
    for q in commands:
        with contextlib.suppress(Exception):
            q.put(None)
    for p in procs:
        p.join(timeout=wait)
        if p.is_alive():
            p.terminate()
            p.join(timeout=5)
