"""The ceilings case's pods: processes of worker threads that call the fake provider for a
contender's run, each thread one call after another until the run's end (an endless backlog).

How each contender calls (the same OpenAI SDK client, no SDK retries):

* ``none``: the plain call; a 429 waits its retry-after (else a full-jitter backoff) and calls again;
* ``admission``, ``ceilings``, ``headers``: each call is one ``Admission.round()`` of the bench's lane
  that declares the call's prompt tokens and answer budget (``input_tokens=``, ``max_tokens=``) and
  sets ``handle.usage`` from the answer's usage (uncached input, cache reads, output), so the
  ceilings reserve and reconcile what the provider counts; with ``ceilings`` and ``headers`` a 429
  that names a spent ceiling sets ``handle.ceiling``/``reset_s`` (``admission.ratelimits``), so it
  is no load signal, and every response's rate-limit headers (success or 429) go with the
  round's end (``handle.rate_reading``), as the integrations send them, after the harness has
  scaled their limits to the run's clock (``scaled_limits``): ``ceilings`` has the key's limits
  configured and learns the rest (the outside traffic), ``headers`` learns everything. A 429 ends the round
  (``rate_limited``, or ``ceiling``) with its retry-after and the call asks again through the
  admission (no backoff);
* ``litellm``: ``litellm.Router`` with ``routing_strategy="usage-based-routing-v2"``, the key's
  ``rpm``/``tpm`` on its one deployment and the bench's Redis (``redis_host``/``redis_port``), so
  its pods share their usage; no retries inside it: a refusal (the router's own or the provider's)
  waits its retry-after, else the backoff, and calls again.
"""
from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import queue as queue_mod
import random
import re
import signal
import threading
import time
from typing import Any
from urllib.parse import urlparse

from .ceilings_settings import BACKOFF_BASE, BACKOFF_CAP, MAX_TOKENS, PROMPT, WARMUP_MODEL
from .pods import stop_pods
from .settings import LANE, MESH, MODEL, POOL, SETUP_TIMEOUT, backoff_s

#: (the ceilings case gets its own mesh prefix so it never reads the burst's state)
CEILING_MESH = f"{MESH}-ceilings"


def prompt_text(tokens: int) -> str:
    """A prompt of ``tokens`` tokens for both counters: 4 characters a token (the fake provider)
    and one cl100k token per " abc" (LiteLLM's)."""
    return " abc" * tokens


def _usage(resp: Any) -> Any:
    from ...core import Usage

    u = getattr(resp, "usage", None)
    if u is None:
        return None
    details = getattr(u, "prompt_tokens_details", None)
    cached = int(getattr(details, "cached_tokens", 0) or 0) if details is not None else 0
    return Usage(input_tokens=max(0, u.prompt_tokens - cached), cache_read_tokens=cached,
                 output_tokens=u.completion_tokens)


def _retry_after(exc: BaseException) -> float | None:
    from ...classify import retry_after_of

    with contextlib.suppress(Exception):
        return retry_after_of(exc)
    return None


def _name_the_ceiling(handle: Any, exc: BaseException) -> None:
    """A 429 that spent a rate ceiling (its error or headers say which) is no load: the round
    names it and its reset (``admission.ratelimits``), so K̂ is left alone."""
    from ...ratelimits import read

    response = getattr(exc, "response", None)
    if getattr(exc, "status_code", None) != 429 or response is None:
        return
    reading = read(response.headers, 429, exc)
    if reading.spent is None:
        return
    limit = reading.get(reading.spent)
    reset = reading.retry_after if reading.retry_after is not None else (limit.reset_s if limit else None)
    handle.ceiling, handle.reset_s = reading.spent, min(86_400.0, max(0.0, reset or 0.0))


#: the headers that carry a limit (per provider minute or day), OpenAI and Anthropic style
_LIMIT_HEADER = re.compile(r"^(x-ratelimit-limit-\w+|anthropic-ratelimit-[\w-]+-limit)$")


def scaled_limits(headers: Any, scale: float) -> None:
    """The fake provider's limits count provider minutes; the admission's buckets run on Redis'
    real clock, so its ceilings are per real minute: limit × ``scale``, as the configured
    contender's policy has them. Its remainings (a level) and resets (real time) stay as sent."""
    for name in [n for n in headers.keys() if _LIMIT_HEADER.match(n.lower())]:
        with contextlib.suppress(ValueError):
            headers[name] = f"{float(headers[name]) * scale:.0f}"


def _is_refusal(exc: BaseException) -> bool:
    return getattr(exc, "status_code", None) in (429, 529) or type(exc).__name__ in ("RateLimitError",
                                                                                  "RouterRateLimitError")


class _Caller:
    """One pod's way of making a call in its contender's run."""

    def __init__(self, job: dict[str, Any], pod: int, threads: int):
        import httpx
        import openai

        self.job, self.pod, self.mode = job, pod, job["contender"]
        self.scale = job["scale"]
        self.rng = random.Random(f"{job['seed']}-{self.mode}-{pod}")  # the backoff's draws
        self.adm = self.router = None
        # a key with an alternative pool: this caller can call either model (its round may move)
        self.move_to = (lambda pool: True) if job.get("alternative") else None
        self.last = threading.local()  # each worker thread's last response headers (``headers``)
        hooks = {"response": [self._seen]} if self.mode in ("ceilings", "headers") else {}
        self.sdk = openai.OpenAI(base_url=job["provider_url"] + "/v1", api_key="bench", max_retries=0,
                                 timeout=600.0, http_client=openai.DefaultHttpxClient(
                                     limits=httpx.Limits(max_connections=threads + 8,
                                                         max_keepalive_connections=threads + 8),
                                     event_hooks=hooks))
        if self.mode in ("admission", "ceilings", "headers"):
            from ...client import Admission

            self.adm = Admission.from_url(job["redis_url"], mesh=CEILING_MESH, pod=f"pod-{pod}",
                                          seed=job["seed"] * 1000 + pod)
        elif self.mode == "litellm":
            os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch of the price list
            import litellm

            litellm.suppress_debug_info = True
            url = urlparse(job["redis_url"])
            limits = job["limits"]
            params = {"model": f"openai/{MODEL}", "api_base": job["provider_url"] + "/v1", "api_key": "bench",
                      "rpm": int(limits.get("rpm", 0)) or None,
                      "tpm": int(limits.get("tpm", limits.get("itpm", 0))) or None}
            self.router = litellm.Router(
                model_list=[{"model_name": MODEL, "litellm_params": {k: v for k, v in params.items() if v}}],
                routing_strategy="usage-based-routing-v2", redis_host=url.hostname, redis_port=url.port,
                num_retries=0, allowed_fails=10**9, cooldown_time=0)

    def warm_up(self) -> None:
        """One call on a model of its own before the start: a pod's first call builds the SDK's
        request and response machinery, which at the run's scale delays its send by a provider
        second (long-running pods are past that); the warm-up's model and key (one per pod) have
        buckets of their own, and the call is left out of the figures."""
        if self.router is None:
            self.sdk.with_options(api_key=f"warm-up-{self.pod}").chat.completions.create(
                model=WARMUP_MODEL, messages=[{"role": "user", "content": "warm"}], max_tokens=1)

    def _seen(self, response: Any) -> None:
        scaled_limits(response.headers, self.scale)
        self.last.headers = response.headers

    def _reading(self, exc: BaseException | None = None) -> Any:
        """The reading of this call's response (the error's, else the one the hook saw), or None."""
        from ...ratelimits import read

        if exc is not None:
            response = getattr(exc, "response", None)
            return None if response is None else read(response.headers, getattr(exc, "status_code", None), exc)
        headers = getattr(self.last, "headers", None)
        return None if headers is None else read(headers)

    def call(self, prompt: int, rid: str, end: float) -> str:
        """One call until it succeeds (``"done"``) or the run ends (``"end"``); refusals counted."""
        messages = [{"role": "user", "content": prompt_text(prompt)}]
        failures = 0
        while time.monotonic() < end:
            try:
                if self.adm is not None:
                    with self.adm.round(lane=LANE, model=POOL, round_id=f"{rid}.{failures}",
                                        timeout=max(0.05, end - time.monotonic()),
                                        input_tokens=prompt, max_tokens=MAX_TOKENS,
                                        move_to=self.move_to) as r:
                        self.last.headers = None
                        try:
                            resp = self.sdk.chat.completions.create(model=r.pool.partition("@")[0],
                                                                    messages=messages, max_tokens=MAX_TOKENS)
                        except Exception as exc:
                            if self.mode != "admission":
                                _name_the_ceiling(r, exc)
                            if self.mode != "admission":
                                r.rate_reading = self._reading(exc)
                            raise
                        r.usage = _usage(resp)
                        if self.mode != "admission":
                            r.rate_reading = self._reading()
                elif self.router is not None:
                    self.router.completion(model=MODEL, messages=messages, max_tokens=MAX_TOKENS)
                else:
                    self.sdk.chat.completions.create(model=MODEL, messages=messages, max_tokens=MAX_TOKENS)
                return "done"
            except Exception as exc:  # noqa: BLE001 - a refusal waits; the admission's timeout ends the run
                if type(exc).__name__ == "WaitTimeout":
                    return "end"
                if not _is_refusal(exc):
                    time.sleep(0.05)  # not expected: retried like a refusal, a little later
                if self.adm is None:  # the admission waits through its own pause, not a backoff
                    wait = _retry_after(exc)
                    if wait is None:
                        wait = backoff_s(self.rng, failures, BACKOFF_BASE / self.scale, BACKOFF_CAP / self.scale)
                    time.sleep(max(0.0, min(wait, end - time.monotonic())))
                failures += 1
        return "end"

    def close(self) -> None:
        if self.adm is not None:
            self.adm.close()
        self.sdk.close()


def _run(job: dict[str, Any], pod: int, results: Any, gate: Any) -> dict[str, Any]:
    threads_n = job["workers"]
    caller = _Caller(job, pod, threads_n)
    counts = {"done": 0, "unfinished": 0}
    lock = threading.Lock()
    go = threading.Event()
    t0: list[float] = []

    def worker(w: int) -> None:
        rng = random.Random(f"{job['seed']}-{pod}-{w}")  # the same prompts for every contender
        go.wait()
        if not t0:
            return
        end, n = t0[0] + job["real_s"], 0
        while time.monotonic() < end:
            n += 1
            outcome = caller.call(rng.randint(*PROMPT), f"p{pod}w{w}c{n}", end)
            with lock:
                counts["done" if outcome == "done" else "unfinished"] += 1

    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(threads_n)]
    for t in threads:
        t.start()
    try:
        caller.warm_up()
        results.put({"pod": pod, "ready": True})
        if not gate.wait(timeout=SETUP_TIMEOUT):
            raise RuntimeError(f"no start within {SETUP_TIMEOUT:.0f} s")
        t0.append(time.monotonic())
        go.set()
        for t in threads:
            t.join(timeout=job["real_s"] + 60)
    finally:
        go.set()
        caller.close()
    return {"pod": pod, **counts}


def _pod_main(pod: int, commands: Any, results: Any, gate: Any) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.getLogger("admission").setLevel(logging.WARNING)
    logging.getLogger("LiteLLM").setLevel(logging.ERROR)
    while True:
        job = commands.get()
        if job is None:
            return
        try:
            results.put(_run(job, pod, results, gate))
        except BaseException as exc:  # noqa: BLE001 - the parent reports it and stops
            results.put({"pod": pod, "error": f"{type(exc).__name__}: {exc}"})


class CeilingPods:
    """The pod processes, spawned once and used by every contender."""

    def __init__(self, pods: int):
        ctx = multiprocessing.get_context("spawn")
        self.n = pods
        self.killed: set[int] = set()  # pods SIGKILLed mid-run (the killed key): no report comes
        self.gate = ctx.Event()
        self.results = ctx.Queue()
        self.commands = [ctx.Queue() for _ in range(pods)]
        self.procs = [ctx.Process(target=_pod_main, name=f"ceilings-pod-{i}", daemon=True,
                                  args=(i, self.commands[i], self.results, self.gate)) for i in range(pods)]
        for p in self.procs:
            p.start()

    def run(self, job: dict[str, Any], at_start: Any = None) -> list[dict[str, Any]]:
        """One contender: every pod makes its threads and says so; then the gate opens
        (``at_start()`` is called just before) and the reports come back."""
        self.gate.clear()
        for q in self.commands:
            q.put(job)
        self._collect("ready", time.monotonic() + SETUP_TIMEOUT)
        if at_start is not None:
            at_start()
        self.gate.set()
        return self._collect("report", time.monotonic() + job["real_s"] + 90)

    def kill(self, pod: int) -> None:
        """SIGKILL one pod process mid-run, its rounds, reservations and waiters with it (a
        pod lost as a node is): its seats are left for their leases to end."""
        self.killed.add(pod)
        os.kill(self.procs[pod].pid, signal.SIGKILL)

    def _collect(self, what: str, deadline: float) -> list[dict[str, Any]]:
        got: list[dict[str, Any]] = []
        while len(got) < self.n - len(self.killed):
            try:
                r = self.results.get(timeout=0.1)
            except queue_mod.Empty:
                dead = [p.name for i, p in enumerate(self.procs) if not p.is_alive() and i not in self.killed]
                if dead or time.monotonic() > deadline:
                    raise RuntimeError(f"ceilings case: {self.n - len(got)} pod(s) never came {what} "
                                       f"({', '.join(dead) + ' died' if dead else 'deadline passed'})") from None
                continue
            if r.get("error"):
                raise RuntimeError(f"ceilings case: pod {r['pod']} failed: {r['error']}")
            if (what == "ready") != bool(r.get("ready")):
                raise RuntimeError(f"ceilings case: pod {r['pod']} out of step")
            got.append(r)
        return got

    def close(self, wait: float = 10.0) -> None:
        stop_pods(self.commands, self.procs, wait)
