"""A fake LLM provider over HTTP: ``admission fake-provider`` (also ``python -m admission.tools.fake_provider``).

It speaks the OpenAI and the Anthropic protocols well enough for their real SDKs, and serves
every request through the simulator's provider model (``admission.tools.sim.model``), which is
its one source: no formula or constant of the model is copied here, and the model's functions
are looked up on the module at call time (a test that patches ``model.p_rate_limited`` changes
the server's refusals).

The model, per pool (one pool per ``model`` name, capacity K from ``--model NAME=K`` else
``--capacity``):

* a request that passes is a round of ``max_tokens`` tokens served by ``model.ProviderPool``:
  processor sharing, every round of the pool progresses at ``model.rate(n, K)`` tokens/s while n
  rounds are served. One scheduler task per pool sleeps until the pool's ``next_finish()`` or until
  n changes (an ``asyncio.Event``), pops the finished rounds and wakes their requests: no polling;
* a new request with n in flight (itself included) is refused with probability
  ``model.p_rate_limited(n, K)`` (a seeded ``random.Random``); the refusal arrives after
  uniform(0, ``RATE_LIMIT_WITHIN``) and the refused request takes no share meanwhile. The refusal
  is a 429 with ``retry-after``/``retry-after-ms``: the real time until the pool's next completion
  at its current load (the provider says when a slot frees up), capped at ``--retry-after-max``.
  A share ``--overloaded-share`` of these refusals is a 529 "Overloaded" instead (no retry-after);
* a round still unfinished ``ROUND_CAP`` after it started is cut: 504;
* the daily key limit is one ``model.ProviderKey`` per API key (``--key-limit-usd``, price
  ``--price-per-1k``): a completed request bills its ``total_tokens`` (prompt + completion, as
  its usage says) on the real ``time.time()`` day; once the key's count reached the limit, every
  request on that key gets ``KEY_LIMIT_STATUS`` with ``KEY_LIMIT_MESSAGE`` within
  ``KEY_REFUSAL_WITHIN``;
* injected faults (``--fault STATUS=P``, statuses 402, 500, 502, 503, 529) are drawn per request
  after the key check and before the capacity check, answered after 0.05 s.

Time is scaled: ``scale`` simulated seconds pass per real second. Every time of the model is in
simulated seconds; the virtual clock is ``(time.monotonic() - start) * scale`` and real sleeps
are simulated seconds / scale. The day clock of the keys is real wall time.

Routes:

* ``POST /v1/chat/completions`` (OpenAI; ``stream`` and ``stream_options.include_usage``);
* ``POST /v1/messages`` (Anthropic; ``stream``);
* ``GET /v1/models`` (OpenAI's list shape), ``GET /healthz`` ("ok"), ``GET /stats`` (JSON);
* ``POST /admin/faults`` ``{"faults": {"529": 0.2}, "key_limit_usd": 1, "capacity": {"m": 6} | 6,
  "overloaded_share": 0.1}`` (each key optional; ``faults`` replaces the faults), ``POST
  /admin/reset`` (zeroes the statistics; ``{"keys": true}`` also forgets the keys' spend).

``GET /stats`` (and ``FakeProviderServer.stats()``): ``{"models": {name: POOL}, "total": POOL,
"keys": {key[:8]: {"spent_usd", "limit_usd"}}, "rejected": {"400": n, "401": n, ...}, "scale",
"uptime_s", "default_capacity", "faults", "overloaded_share", "key_limit_usd", "price_per_1k"}``
where POOL is ``{"capacity", "in_flight", "peak_in_flight", "requests", "completions", "200",
"429", "529", "403", "402", "5xx", "504", ("499", ...), "tokens", "over_capacity_s",
"timeline": [[real s since start, in_flight], ...]}``. The total sums the pools (its
``over_capacity_s`` is the pools' sum) and tracks its own in-flight peak and timeline;
``rejected`` counts the requests answered before a pool was chosen.

The ``/v1`` prefix is optional. Errors come in the shape of the route's protocol (OpenAI
``{"error": {...}}``, Anthropic ``{"type": "error", "error": {...}}``). A stream is sent whole
when its round completes (the status is only known then), with a Content-Length like any other
answer: HTTP/1.1 with keep-alive, plain asyncio streams, no dependency; a chunked request body is
refused with 411. A client that hangs up during its round takes its round out of the pool
(counted as "499"). No key is needed for the GET routes and the admin routes.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import email.utils
import http
import itertools
import json
import logging
import math
import random
import signal
import sys
import threading
import time
import uuid
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

from .sim import model

log = logging.getLogger("admission.tools.fake_provider")

MAX_TOKENS = 100_000              # a round's completion tokens are capped here
FAULT_DELAY = 0.05                # simulated s before an injected fault is answered
FAULT_STATUSES = (402, 500, 502, 503, 529)
TIMELINE_POINTS = 20_000
DEFAULT_PORT = 8400
MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024
STATUS_KEYS = ("200", "429", "529", "403", "402", "5xx", "504")
FILLER = ("The quick brown fox jumps over the lazy dog while the fake provider pretends to think "
          "about your question and answers it at the pace of the model.").split()

#: status -> (Anthropic error type, OpenAI error type, OpenAI code, default message)
ERRORS: dict[int, tuple[str, str, str | None, str]] = {
    400: ("invalid_request_error", "invalid_request_error", None, "Bad request"),
    401: ("authentication_error", "invalid_request_error", "invalid_api_key",
          "No API key: send 'Authorization: Bearer <key>' or 'x-api-key'"),
    402: ("billing_error", "insufficient_quota", "insufficient_credits", "Insufficient credits"),
    403: ("permission_error", "permission_error", "key_limit_exceeded", model.KEY_LIMIT_MESSAGE),
    404: ("not_found_error", "invalid_request_error", "not_found", "Not found"),
    405: ("invalid_request_error", "invalid_request_error", None, "Method not allowed"),
    411: ("invalid_request_error", "invalid_request_error", None,
          "Length required: send a Content-Length (chunked bodies are not supported)"),
    413: ("request_too_large", "invalid_request_error", None, "Request body too large"),
    429: ("rate_limit_error", "rate_limit_error", "rate_limit_exceeded",
          "Rate limit reached: the pool is above its capacity"),
    500: ("api_error", "server_error", None, "Internal server error"),
    502: ("api_error", "server_error", None, "Bad gateway"),
    503: ("api_error", "server_error", None, "Service unavailable"),
    504: ("timeout_error", "server_error", "timeout", "Gateway timeout: the round was cut"),
    529: ("overloaded_error", "server_error", "overloaded", "Overloaded"),
}
REASONS = {529: "Overloaded", 499: "Client Closed Request"}


def _status_key(status: int) -> str:
    return "5xx" if status in (500, 502, 503) else str(status)


# -- configuration checks (the CLI's one-line errors come from here) --------------------------


def _positive(name: str, x: Any) -> float:
    x = float(x)
    if not (x > 0 and math.isfinite(x)):
        raise ValueError(f"{name} must be a positive number, got {x:g}")
    return x


def _share(name: str, x: Any) -> float:
    x = float(x)
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"{name} must be within 0..1, got {x:g}")
    return x


def check_faults(faults: dict | None) -> dict[int, float]:
    """``{status: probability}`` with the allowed statuses and a total of at most 1."""
    out: dict[int, float] = {}
    for status, p in (faults or {}).items():
        try:
            code = int(status)
        except (TypeError, ValueError):
            raise ValueError(f"fault status must be one of {FAULT_STATUSES}, got {status!r}") from None
        if code not in FAULT_STATUSES:
            raise ValueError(f"fault status must be one of {FAULT_STATUSES}, got {code}")
        out[code] = _share(f"fault {code} probability", p)
    if sum(out.values()) > 1.0 + 1e-9:
        raise ValueError("the fault probabilities add up to more than 1")
    return dict(sorted(out.items()))


def check_capacities(models: dict | None) -> dict[str, float]:
    return {str(name): _positive(f"capacity of {name}", k) for name, k in (models or {}).items()}


def check_key_limit(x: Any) -> float | None:
    if x is None:
        return None
    x = float(x)
    if not x >= 0:
        raise ValueError(f"key limit must be >= 0 USD, got {x:g}")
    return x


# -- the model: pools, keys, statistics (no sockets) -------------------------------------------


@dataclass
class Outcome:
    """What one request got: 200 with its round's tokens, or an error status and message."""

    status: int
    message: str = ""
    tokens: int = 0
    headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.message and self.status != 200:
            self.message = ERRORS[self.status][3]


class _Track:
    """The in-flight count of a pool (or of all pools) over real time: peak, time above the
    capacity, and a bounded timeline of [seconds since start, n] at every change."""

    def __init__(self, t0: float, now: float):
        self.t0 = t0
        self.n = 0
        self.reset(now)

    def reset(self, now: float) -> None:
        self.peak = self.n
        self.over = 0.0
        self.since = now
        self.timeline: deque[list[float]] = deque([[round(now - self.t0, 4), self.n]], maxlen=TIMELINE_POINTS)

    def move(self, n: int, cap: float, now: float) -> None:
        if self.n > cap:
            self.over += now - self.since
        self.since = now
        self.n = n
        self.peak = max(self.peak, n)
        self.timeline.append([round(now - self.t0, 4), n])

    def over_s(self, cap: float, now: float) -> float:
        return self.over + (now - self.since if self.n > cap else 0.0)


class _Pool:
    """One model's pool: the model's ``ProviderPool`` plus the scheduler that wakes requests."""

    def __init__(self, provider: "FakeProvider", name: str, k: float):
        self.provider = provider
        self.pm = model.ProviderPool(name, k)
        self.waiters: dict[str, asyncio.Future] = {}
        self.counts: Counter[str] = Counter()
        self.tokens = 0
        self.track = _Track(provider.t0, provider.real())
        self.changed: asyncio.Event | None = None
        self.task: asyncio.Task | None = None
        self._ids = itertools.count(1)

    # the scheduler: sleeps until the next finish at the current n, or until n changes
    def _ensure_scheduler(self) -> None:
        loop = asyncio.get_running_loop()
        if self.task is None or self.task.done() or self.task.get_loop() is not loop:
            self.changed = asyncio.Event()
            self.task = loop.create_task(self._schedule(), name=f"fake-provider pool {self.pm.name}")

    async def _schedule(self) -> None:
        assert self.changed is not None
        while True:
            self.changed.clear()
            now = self.provider.sim()
            self._finish(now)
            nxt = self.pm.next_finish()
            delay = None if nxt is None else max(0.0, (nxt - now) / self.provider.scale)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), delay)

    def _finish(self, now: float) -> None:
        done = self.pm.pop_finished(now)
        for rid in done:
            fut = self.waiters.pop(rid, None)
            if fut is not None and not fut.done():
                fut.set_result(None)
        if done:
            self.provider._moved(self)

    async def serve(self, tokens: int) -> bool:
        """Serve one round of ``tokens``; False when it was cut at ROUND_CAP."""
        self._ensure_scheduler()
        rid = f"r{next(self._ids)}"
        fut = asyncio.get_running_loop().create_future()
        self.pm.add(rid, tokens, self.provider.sim())
        self.waiters[rid] = fut
        self.provider._moved(self)
        self.changed.set()
        try:
            done, _ = await asyncio.wait({fut}, timeout=model.ROUND_CAP / self.provider.scale)
            return bool(done)
        finally:  # cut, or the client hung up: the round leaves the pool
            if rid in self.pm.served:
                self.pm.remove(rid, self.provider.sim())
                self.waiters.pop(rid, None)
                self.provider._moved(self)
                self.changed.set()

    def until_free(self) -> float:
        """Real seconds until the pool's next completion at its current load (0 when idle)."""
        nxt = self.pm.next_finish()
        return 0.0 if nxt is None else max(0.0, nxt - self.provider.sim()) / self.provider.scale

    def set_capacity(self, k: float) -> None:
        now = self.provider.real()
        self.track.move(self.track.n, self.pm.k, now)  # the time above the old K counts first
        self.pm.advance(self.provider.sim())           # tokens served at the old rate
        self.pm.k = float(k)
        if self.changed is not None:
            self.changed.set()

    def close(self) -> None:
        if self.task is not None and not self.task.done():
            self.task.cancel()
        self.task = None


def retry_headers(seconds: float) -> dict[str, str]:
    """``retry-after`` in whole seconds (at least 1) and ``retry-after-ms``."""
    return {"retry-after": str(max(1, math.ceil(seconds))), "retry-after-ms": str(math.ceil(seconds * 1000))}


class FakeProvider:
    """The protocol-independent provider: pools, keys, faults and statistics (usable without
    sockets: ``await provider.round(model_name, key, tokens)`` in any event loop)."""

    def __init__(self, capacity: float = 12, models: dict[str, float] | None = None, scale: float = 1.0,
                 seed: int | None = None, tokens: int = 600, price_per_1k: float = 0.01,
                 key_limit_usd: float | None = None, faults: dict | None = None,
                 overloaded_share: float = 0.0, retry_after_max: float = 60.0):
        self.capacity = _positive("capacity", capacity)
        self.models = check_capacities(models)
        self.scale = _positive("scale", scale)
        self.tokens = int(tokens)
        if not 1 <= self.tokens <= MAX_TOKENS:
            raise ValueError(f"tokens must be within 1..{MAX_TOKENS}, got {tokens}")
        self.price_per_1k = float(price_per_1k)
        if not self.price_per_1k >= 0:
            raise ValueError(f"price per 1k must be >= 0, got {price_per_1k}")
        self.key_limit_usd = check_key_limit(key_limit_usd)
        self.faults = check_faults(faults)
        self.overloaded_share = _share("overloaded share", overloaded_share)
        self.retry_after_max = _positive("retry-after max", retry_after_max)
        self.rng = random.Random(seed)
        self.t0 = time.monotonic()
        self.pools: dict[str, _Pool] = {}
        self.keys: dict[str, model.ProviderKey] = {}
        self.rejected: Counter[str] = Counter()   # answered before a pool was chosen (400, 401, ...)
        self.total = _Track(self.t0, self.t0)
        for name in self.models:
            self.pool(name)

    # clocks: real seconds (monotonic) and the simulated seconds of the model
    def real(self) -> float:
        return time.monotonic()

    def sim(self) -> float:
        return (time.monotonic() - self.t0) * self.scale

    async def _sleep(self, sim_seconds: float) -> None:
        await asyncio.sleep(sim_seconds / self.scale)

    def pool(self, name: str) -> _Pool:
        """The pool of a model name (created at first use; unknown names get the default K)."""
        if name not in self.pools:
            self.pools[name] = _Pool(self, name, self.models.get(name, self.capacity))
        return self.pools[name]

    def key(self, api_key: str) -> model.ProviderKey:
        if api_key not in self.keys:
            self.keys[api_key] = model.ProviderKey(self.key_limit_usd, self.price_per_1k)
        return self.keys[api_key]

    def _moved(self, pool: _Pool) -> None:
        """n changed in ``pool``: the pool's track and the total's."""
        now = self.real()
        pool.track.move(pool.pm.n, pool.pm.k, now)
        self.total.move(sum(p.pm.n for p in self.pools.values()), math.inf, now)

    # -- one request ----------------------------------------------------------------------------
    async def round(self, model_name: str, key: str, tokens: int, prompt_tokens: int = 0) -> Outcome:
        """One request of ``tokens`` completion tokens on the pool ``model_name`` with the API
        key ``key``: waits as the model says and returns its outcome."""
        pool = self.pool(model_name)
        pool.counts["requests"] += 1
        try:
            out = await self._decide(pool, key, int(tokens), int(prompt_tokens))
        except asyncio.CancelledError:
            pool.counts["499"] += 1  # the client hung up
            raise
        pool.counts[_status_key(out.status)] += 1
        if out.status == 200:
            pool.tokens += out.tokens
        return out

    async def _decide(self, pool: _Pool, key: str, tokens: int, prompt_tokens: int) -> Outcome:
        account = self.key(key)
        if not account.open(time.time()):
            await self._sleep(self.rng.uniform(0.0, model.KEY_REFUSAL_WITHIN))
            return Outcome(model.KEY_LIMIT_STATUS, model.KEY_LIMIT_MESSAGE)
        fault = self._draw_fault()
        if fault:
            await self._sleep(FAULT_DELAY)
            return Outcome(fault)
        p = model.p_rate_limited(pool.pm.n + 1, pool.pm.k)
        if p > 0 and self.rng.random() < p:
            return await self._refuse(pool)
        if not await pool.serve(tokens):
            return Outcome(504, f"Gateway timeout: the round ran past {model.ROUND_CAP:g} s and was cut")
        account.bill(tokens + prompt_tokens, pool.pm.name, time.time())
        return Outcome(200, tokens=tokens)

    def _draw_fault(self) -> int | None:
        if not self.faults:
            return None  # no draw: the seeded sequence of a run without faults stays the same
        u = self.rng.random()
        for status, p in self.faults.items():
            if u < p:
                return status
            u -= p
        return None

    async def _refuse(self, pool: _Pool) -> Outcome:
        overloaded = self.overloaded_share > 0 and self.rng.random() < self.overloaded_share
        await self._sleep(self.rng.uniform(0.0, model.RATE_LIMIT_WITHIN))
        if overloaded:
            return Outcome(529)
        return Outcome(429, headers=retry_headers(min(pool.until_free(), self.retry_after_max)))

    # -- runtime settings -------------------------------------------------------------------------
    def set_faults(self, faults: dict | None) -> None:
        self.faults = check_faults(faults)

    def configure(self, faults: dict | None = None, key_limit_usd: Any = ..., capacity: Any = None,
                  overloaded_share: float | None = None) -> None:
        """Change the settings at runtime (``...``/None: unchanged). ``capacity`` is a number
        (the default and every pool) or ``{model: K}``. Everything is checked before anything
        changes."""
        new_faults = None if faults is None else check_faults(faults)
        limit = self.key_limit_usd if key_limit_usd is ... else check_key_limit(key_limit_usd)
        share = self.overloaded_share if overloaded_share is None else _share("overloaded share", overloaded_share)
        caps: dict[str, float] = {}
        if isinstance(capacity, dict):
            caps = check_capacities(capacity)
        elif capacity is not None:
            self.capacity = _positive("capacity", capacity)
            caps = {name: self.capacity for name in self.pools}
        if new_faults is not None:
            self.faults = new_faults
        self.overloaded_share = share
        self.key_limit_usd = limit
        for account in self.keys.values():
            account.limit = limit
        for name, k in caps.items():
            self.models[name] = k
            self.pool(name).set_capacity(k)

    def reset(self, keys: bool = False) -> None:
        """Zero the statistics (the rounds in flight stay); ``keys``: forget the keys' spend too."""
        now = self.real()
        for pool in self.pools.values():
            pool.counts.clear()
            pool.tokens = 0
            pool.track.reset(now)
        self.total.reset(now)
        self.rejected.clear()
        if keys:
            self.keys.clear()

    def close(self) -> None:
        """Stop the pools' schedulers (the server does it when it stops)."""
        for pool in self.pools.values():
            pool.close()

    # -- statistics ----------------------------------------------------------------------------------
    def _pool_stats(self, pool: _Pool, now: float) -> dict[str, Any]:
        counts = {k: pool.counts.get(k, 0) for k in STATUS_KEYS}
        counts.update((k, v) for k, v in pool.counts.items() if k not in counts and k != "requests")
        return {"capacity": pool.pm.k, "in_flight": pool.pm.n, "peak_in_flight": pool.track.peak,
                "requests": pool.counts.get("requests", 0), "completions": pool.counts.get("200", 0),
                **counts, "tokens": pool.tokens, "over_capacity_s": round(pool.track.over_s(pool.pm.k, now), 4),
                "timeline": list(pool.track.timeline)}

    def _total_stats(self, per_model: dict[str, dict], now: float) -> dict[str, Any]:
        total: dict[str, Any] = {"capacity": sum(m["capacity"] for m in per_model.values()),
                                 "in_flight": self.total.n, "peak_in_flight": self.total.peak}
        for m in per_model.values():
            for k, v in m.items():
                if k not in ("capacity", "in_flight", "peak_in_flight", "timeline"):
                    total[k] = total.get(k, 0) + v
        for k in ("requests", "completions", *STATUS_KEYS, "tokens"):
            total.setdefault(k, 0)
        total["over_capacity_s"] = round(total.get("over_capacity_s", 0.0), 4)  # the sum of the pools'
        total["timeline"] = list(self.total.timeline)
        return total

    def _key_stats(self) -> dict[str, dict]:
        now = time.time()
        out: dict[str, dict] = {}
        for api_key, account in self.keys.items():
            account.open(now)  # rolls the day over
            row = out.setdefault(api_key[:8], {"spent_usd": 0.0, "limit_usd": account.limit})
            row["spent_usd"] = round(row["spent_usd"] + account.spent, 9)
        return out

    def stats(self) -> dict[str, Any]:
        """Per model and in total, the keys' spend today, and the settings (the module's docstring)."""
        now = self.real()
        per_model = {name: self._pool_stats(pool, now) for name, pool in self.pools.items()}
        return {"models": per_model, "total": self._total_stats(per_model, now), "keys": self._key_stats(),
                "rejected": dict(self.rejected), "scale": self.scale, "uptime_s": round(now - self.t0, 3),
                "default_capacity": self.capacity, "faults": {str(k): v for k, v in self.faults.items()},
                "overloaded_share": self.overloaded_share, "key_limit_usd": self.key_limit_usd,
                "price_per_1k": self.price_per_1k}


# -- the protocols: request bodies in, answers out --------------------------------------------


class BadRequest(Exception):
    """A request the protocol layer refuses before the model sees it (status, message)."""

    def __init__(self, status: int, message: str | None = None):
        super().__init__(message or ERRORS[status][3])
        self.status = status


@dataclass
class Ask:
    """A parsed chat request, either protocol."""

    model: str
    tokens: int
    capped: bool
    prompt_tokens: int
    stream: bool
    include_usage: bool = False


def _chars(x: Any) -> int:
    """Characters of the text in a message list (the strings, not the roles or types)."""
    if isinstance(x, str):
        return len(x)
    if isinstance(x, list):
        return sum(_chars(v) for v in x)
    if isinstance(x, dict):
        return sum(_chars(v) for k, v in x.items() if k not in ("role", "type"))
    return 0


def _max_tokens(body: dict, names: Sequence[str], default: int) -> tuple[int, bool]:
    for name in names:
        value = body.get(name)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise BadRequest(400, f"{name} must be a positive integer")
            return min(value, MAX_TOKENS), value > MAX_TOKENS
    return default, False


def parse_ask(raw: bytes, protocol: str, default_tokens: int) -> Ask:
    """The request body of a chat route, or BadRequest(400)."""
    try:
        body = json.loads(raw or b"null")
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(400, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest(400, "the body must be a JSON object")
    name = body.get("model")
    if not isinstance(name, str) or not name:
        raise BadRequest(400, "model: a model name is required")
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise BadRequest(400, "messages must be a list")
    names = ("max_completion_tokens", "max_tokens") if protocol == "openai" else ("max_tokens",)
    tokens, capped = _max_tokens(body, names, default_tokens)
    chars = _chars(messages) + (_chars(body.get("system")) if protocol == "anthropic" else 0)
    options = body.get("stream_options")
    include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
    return Ask(name, tokens, capped, max(1, chars // 4), bool(body.get("stream")), include_usage)


def filler(tokens: int) -> str:
    """Some text for a round of ``tokens`` tokens (at most a few dozen words)."""
    return " ".join(FILLER[i % len(FILLER)] for i in range(max(1, min(tokens, 48))))


def _pieces(text: str, n: int = 4) -> list[str]:
    words = text.split(" ")
    step = max(1, math.ceil(len(words) / n))
    return [" ".join(words[i:i + step]) + (" " if i + step < len(words) else "") for i in range(0, len(words), step)]


def _sse(events: list[tuple[str | None, Any]]) -> bytes:
    out = []
    for name, data in events:
        head = f"event: {name}\n" if name else ""
        payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
        out.append(f"{head}data: {payload}\n\n")
    return "".join(out).encode()


def openai_answer(ask: Ask, out: Outcome) -> tuple[bytes, str]:
    """A chat.completion object, or its chunk stream."""
    cid, created, text = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), filler(out.tokens)
    finish = "length" if ask.capped else "stop"
    usage = {"prompt_tokens": ask.prompt_tokens, "completion_tokens": out.tokens,
             "total_tokens": ask.prompt_tokens + out.tokens}
    if not ask.stream:
        body = {"id": cid, "object": "chat.completion", "created": created, "model": ask.model,
                "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                             "logprobs": None, "finish_reason": finish}],
                "usage": usage, "system_fingerprint": "fake-provider"}
        return json.dumps(body).encode(), "application/json"

    def chunk(delta: dict, reason: str | None = None, choices: bool = True) -> dict:
        c = {"id": cid, "object": "chat.completion.chunk", "created": created, "model": ask.model,
             "system_fingerprint": "fake-provider",
             "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}] if choices else []}
        if ask.include_usage:
            c["usage"] = None
        return c

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": piece}) for piece in _pieces(text)]
    events.append(chunk({}, finish))
    if ask.include_usage:
        events.append({**chunk({}, choices=False), "usage": usage})
    return _sse([(None, e) for e in events] + [(None, "[DONE]")]), "text/event-stream"


def anthropic_answer(ask: Ask, out: Outcome) -> tuple[bytes, str]:
    """A message object, or its event stream."""
    mid, text = f"msg_{uuid.uuid4().hex[:24]}", filler(out.tokens)
    stop = "max_tokens" if ask.capped else "end_turn"
    usage = {"input_tokens": ask.prompt_tokens, "output_tokens": out.tokens}
    message = {"id": mid, "type": "message", "role": "assistant", "model": ask.model,
               "content": [{"type": "text", "text": text}], "stop_reason": stop, "stop_sequence": None,
               "usage": usage}
    if not ask.stream:
        return json.dumps(message).encode(), "application/json"
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 1}}
    events: list[tuple[str | None, Any]] = [
        ("message_start", {"type": "message_start", "message": start}),
        ("content_block_start", {"type": "content_block_start", "index": 0,
                                 "content_block": {"type": "text", "text": ""}}),
        ("ping", {"type": "ping"}),
    ]
    events += [("content_block_delta", {"type": "content_block_delta", "index": 0,
                                        "delta": {"type": "text_delta", "text": piece}}) for piece in _pieces(text)]
    events += [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                           "usage": {"output_tokens": out.tokens}}),
        ("message_stop", {"type": "message_stop"}),
    ]
    return _sse(events), "text/event-stream"


def error_body(protocol: str, status: int, message: str) -> bytes:
    anthropic_type, openai_type, code, _ = ERRORS.get(status, ERRORS[500])
    if protocol == "anthropic":
        body: dict = {"type": "error", "error": {"type": anthropic_type, "message": message}}
    else:
        body = {"error": {"message": message, "type": openai_type, "param": None, "code": code}}
    return json.dumps(body).encode()


# -- HTTP/1.1 over asyncio streams ----------------------------------------------------------------


class _Closed(Exception):
    """The peer closed the connection."""


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


@dataclass
class Response:
    status: int
    body: bytes
    ctype: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False


class _Input:
    """A connection's bytes, buffered here so that what arrives while a round waits (a
    pipelined request) is kept for the next request."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader = reader
        self.buf = bytearray()

    async def _more(self) -> None:
        data = await self.reader.read(65536)
        if not data:
            raise _Closed
        self.buf += data

    async def head(self) -> bytes | None:
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > MAX_HEAD:
                raise BadRequest(400, "request head too large")
            try:
                await self._more()
            except _Closed:
                if self.buf:
                    raise
                return None
        head = bytes(self.buf[:end])
        del self.buf[:end + 4]
        return head

    async def body(self, n: int) -> bytes:
        while len(self.buf) < n:
            await self._more()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def hung_up(self) -> None:
        """Returns when the peer closes; reads (and keeps) what it sends meanwhile."""
        with contextlib.suppress(ConnectionError):
            while len(self.buf) <= MAX_BODY:
                data = await self.reader.read(65536)
                if not data:
                    return
                self.buf += data
        if len(self.buf) > MAX_BODY:
            await asyncio.Event().wait()  # a flood of pipelined bytes: stop watching


async def read_request(inp: _Input, writer: asyncio.StreamWriter) -> Request | None:
    head = await inp.head()
    if head is None:
        return None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError:
        raise BadRequest(400, "bad request line") from None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    conn = headers.get("connection", "").lower()
    keep_alive = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise BadRequest(411)
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise BadRequest(400, "bad Content-Length") from None
    if length > MAX_BODY or length < 0:
        raise BadRequest(413)
    if length and headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = await inp.body(length)
    return Request(method.upper(), target.split("?", 1)[0], headers, body, keep_alive)


def encode_response(resp: Response, keep_alive: bool) -> bytes:
    reason = REASONS.get(resp.status) or http.HTTPStatus(resp.status).phrase
    headers = {"content-type": resp.ctype, "content-length": str(len(resp.body)),
               "date": email.utils.formatdate(usegmt=True), "connection": "keep-alive" if keep_alive else "close",
               "x-request-id": f"req_{uuid.uuid4().hex[:16]}", **resp.headers}
    if resp.ctype == "text/event-stream":
        headers["cache-control"] = "no-cache"
    head = f"HTTP/1.1 {resp.status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"\r\n" + resp.body


def _json(status: int, doc: Any) -> Response:
    return Response(status, json.dumps(doc).encode())


def _api_key(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer ") and auth[7:].strip():
        return auth[7:].strip()
    return headers.get("x-api-key") or None


def _route_path(path: str) -> str:
    """``/v1/x`` and ``/x`` are the same route (a base URL with or without /v1)."""
    return path[3:] if path.startswith("/v1/") else path


class FakeProviderServer:
    """The HTTP server around a ``FakeProvider``: in a daemon thread (``start``/``stop``,
    ``running()``) or in the caller's event loop (``await open()``, ``serve_forever()``,
    ``aclose()``)."""

    def __init__(self, capacity: float = 12, models: dict[str, float] | None = None, scale: float = 1.0,
                 seed: int | None = None, tokens: int = 600, price_per_1k: float = 0.01,
                 key_limit_usd: float | None = None, faults: dict | None = None, overloaded_share: float = 0.0,
                 retry_after_max: float = 60.0, host: str = "127.0.0.1", port: int = 0):
        self.provider = FakeProvider(capacity=capacity, models=models, scale=scale, seed=seed, tokens=tokens,
                                     price_per_1k=price_per_1k, key_limit_usd=key_limit_usd, faults=faults,
                                     overloaded_share=overloaded_share, retry_after_max=retry_after_max)
        self.host, self.port = host, int(port)
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: set[asyncio.Task] = set()
        self._done: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- in the caller's loop --------------------------------------------------------------------------
    async def open(self) -> str:
        """Bind and start accepting; returns the URL (the real port when port was 0)."""
        self._loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.url

    async def serve_forever(self) -> None:
        """Serve until ``aclose()`` (or ``stop()`` from another thread, or cancellation)."""
        if self._server is None:
            await self.open()
        assert self._done is not None
        try:
            await self._done.wait()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None
        self.provider.close()
        if self._done is not None:
            self._done.set()

    # -- in a daemon thread ----------------------------------------------------------------------------
    def start(self) -> str:
        """Serve in a daemon thread; returns the URL once it accepts."""
        ready = threading.Event()
        failed: list[BaseException] = []

        async def main() -> None:
            try:
                await self.open()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                failed.append(exc)
                return
            finally:
                ready.set()
            await self.serve_forever()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), name="fake-provider", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        return self.url

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._loop.is_running():
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(self.aclose(), self._loop).result(timeout=10)
        self._thread.join(timeout=10)
        self._thread = None

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        url = self.start()
        try:
            yield url
        finally:
            self.stop()

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` in the server's loop (the model's state lives there); waits for its result."""
        loop = self._loop
        if loop is None or not loop.is_running() or self._thread is None or \
                threading.current_thread() is self._thread:
            return fn(*args, **kwargs)

        async def call() -> Any:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout=10)

    def stats(self) -> dict[str, Any]:
        return self._call(self.provider.stats)

    def set_faults(self, faults: dict | None) -> None:
        self._call(self.provider.set_faults, faults)

    def configure(self, **settings: Any) -> None:
        self._call(self.provider.configure, **settings)

    def reset(self, keys: bool = False) -> None:
        self._call(self.provider.reset, keys)

    # -- connections ---------------------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        inp = _Input(reader)
        try:
            while await self._one(inp, writer):
                pass
        except (_Closed, ConnectionError, asyncio.CancelledError):
            pass
        except Exception as exc:  # noqa: BLE001 - one line per error, the connection closes
            log.error("fake provider: connection failed: %r", exc)
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, inp: _Input, writer: asyncio.StreamWriter) -> bool:
        """Read, answer one request; False when the connection should close."""
        try:
            req = await read_request(inp, writer)
        except BadRequest as exc:
            self.provider.rejected[str(exc.status)] += 1
            resp = Response(exc.status, error_body("openai", exc.status, str(exc)), close=True)
            writer.write(encode_response(resp, False))
            await writer.drain()
            return False
        if req is None:
            return False
        try:
            resp = await self._while_connected(self._dispatch(req), inp)
        except _Closed:
            return False
        except Exception as exc:  # noqa: BLE001 - a bug here must not kill the server
            log.error("fake provider: %s %s failed: %r", req.method, req.path, exc)
            resp = Response(500, error_body(_protocol(req.path), 500, f"fake provider bug: {exc!r}"))
        keep = req.keep_alive and not resp.close
        writer.write(encode_response(resp, keep))
        await writer.drain()
        return keep

    async def _while_connected(self, coro: Any, inp: _Input) -> Response:
        """Run ``coro``; if the client hangs up first, cancel it (its round leaves the pool)."""
        work = asyncio.ensure_future(coro)
        gone = asyncio.ensure_future(inp.hung_up())
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            gone.cancel()  # and wait for it: the next read of the connection must not race it
            with contextlib.suppress(asyncio.CancelledError):
                await gone
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        raise _Closed

    async def _dispatch(self, req: Request) -> Response:
        route = _route_path(req.path)
        if req.method == "GET":
            return self._get(route)
        if req.method != "POST":
            return self._reject(req.path, 405)
        if route == "/chat/completions":
            return await self._chat(req, "openai")
        if route == "/messages":
            return await self._chat(req, "anthropic")
        if route == "/admin/faults":
            return self._admin_faults(req.body)
        if route == "/admin/reset":
            return self._admin_reset(req.body)
        return self._reject(req.path, 404)

    def _reject(self, path: str, status: int, message: str | None = None) -> Response:
        self.provider.rejected[str(status)] += 1
        return Response(status, error_body(_protocol(path), status, message or ERRORS[status][3]))

    def _get(self, route: str) -> Response:
        if route == "/healthz":
            return Response(200, b"ok", "text/plain")
        if route == "/stats":
            return _json(200, self.provider.stats())
        if route == "/models":
            names = sorted(set(self.provider.models) | set(self.provider.pools))
            return _json(200, {"object": "list", "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "fake-provider"} for name in names]})
        return self._reject(route, 404)

    async def _chat(self, req: Request, protocol: str) -> Response:
        key = _api_key(req.headers)
        if key is None:
            return self._reject(req.path, 401)
        try:
            ask = parse_ask(req.body, protocol, self.provider.tokens)
        except BadRequest as exc:
            return self._reject(req.path, exc.status, str(exc))
        out = await self.provider.round(ask.model, key, ask.tokens, ask.prompt_tokens)
        if out.status != 200:
            return Response(out.status, error_body(protocol, out.status, out.message), headers=out.headers)
        body, ctype = (openai_answer if protocol == "openai" else anthropic_answer)(ask, out)
        return Response(200, body, ctype)

    def _admin_faults(self, raw: bytes) -> Response:
        try:
            doc = json.loads(raw or b"{}")
            if not isinstance(doc, dict):
                raise ValueError("the body must be a JSON object")
            settings = {k: doc[k] for k in ("faults", "key_limit_usd", "capacity", "overloaded_share") if k in doc}
            if "faults" in settings and not isinstance(settings["faults"], dict):
                raise ValueError("faults must be an object {status: probability}")
            if "faults" in settings:
                settings["faults"] = settings["faults"] or {}
            self.provider.configure(**settings)
        except (ValueError, TypeError) as exc:
            return self._reject("/admin", 400, str(exc))
        p = self.provider
        return _json(200, {"faults": {str(k): v for k, v in p.faults.items()}, "key_limit_usd": p.key_limit_usd,
                           "overloaded_share": p.overloaded_share, "default_capacity": p.capacity,
                           "capacity": {name: pool.pm.k for name, pool in p.pools.items()}})

    def _admin_reset(self, raw: bytes) -> Response:
        try:
            doc = json.loads(raw or b"{}")
        except ValueError as exc:
            return self._reject("/admin", 400, f"the body is not JSON: {exc}")
        self.provider.reset(keys=isinstance(doc, dict) and bool(doc.get("keys")))
        return _json(200, {"reset": True})


def _protocol(path: str) -> str:
    return "anthropic" if _route_path(path) == "/messages" else "openai"


# -- the command ----------------------------------------------------------------------------------


class _Usage(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override] - one line, not the usage text
        raise _Usage(message)


def _pair(text: str, what: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, float(value)
    except ValueError:
        raise _Usage(f"{what} must be NAME=NUMBER, got {text!r}") from None


def _arguments() -> argparse.ArgumentParser:
    p = _Parser(prog="admission fake-provider", description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="0: any free port (printed)")
    p.add_argument("--capacity", type=float, default=12.0, help="K of a model without --model (default 12)")
    p.add_argument("--model", action="append", default=[], metavar="NAME=K", help="a model's capacity (repeatable)")
    p.add_argument("--scale", type=float, default=1.0, help="simulated seconds per real second")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--tokens", type=int, default=600, help="completion tokens when a request names none")
    p.add_argument("--price-per-1k", type=float, default=0.01, help="USD per 1,000 tokens")
    p.add_argument("--key-limit-usd", type=float, default=None, help="daily limit of every API key")
    p.add_argument("--fault", action="append", default=[], metavar="STATUS=P",
                   help=f"inject STATUS (one of {', '.join(map(str, FAULT_STATUSES))}) with probability P")
    p.add_argument("--overloaded-share", type=float, default=0.0, help="share of the 429s sent as 529")
    p.add_argument("--retry-after-max", type=float, default=60.0, help="cap of retry-after, real s")
    return p


def server_from_args(args: argparse.Namespace) -> FakeProviderServer:
    """The server the arguments describe; _Usage/ValueError with one line when they are bad."""
    models = dict(_pair(m, "--model") for m in args.model)
    faults = {status: p for status, p in (_pair(f, "--fault") for f in args.fault)}
    if not 0 <= args.port <= 65535:
        raise _Usage(f"--port must be within 0..65535, got {args.port}")
    return FakeProviderServer(capacity=args.capacity, models=models, scale=args.scale, seed=args.seed,
                              tokens=args.tokens, price_per_1k=args.price_per_1k, key_limit_usd=args.key_limit_usd,
                              faults=faults, overloaded_share=args.overloaded_share,
                              retry_after_max=args.retry_after_max, host=args.host, port=args.port)


async def _serve_until_signal(srv: FakeProviderServer) -> None:
    url = await srv.open()
    print(f"fake provider on {url} (OpenAI: {url}/v1, Anthropic: {url})", flush=True)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, lambda: asyncio.ensure_future(srv.aclose()))
    await srv.serve_forever()


def main(argv: Sequence[str] | None = None) -> int:
    try:
        srv = server_from_args(_arguments().parse_args(argv))
    except (_Usage, ValueError) as exc:
        print(f"admission fake-provider: {exc}", file=sys.stderr)
        return 2
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(_serve_until_signal(srv))
    except OSError as exc:  # the port is taken, the host cannot be bound
        print(f"admission fake-provider: cannot serve on {srv.host}:{srv.port}: {exc.strerror or exc}",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
