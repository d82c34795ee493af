"""The model the server serves (no sockets): its pools, keys and statistics, on the simulator's
provider model (``admission.tools.sim.model``, looked up on the module at call time), and the
checks of its configuration (the CLI's one-line errors come from there)."""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from ..sim import ceilings as ceiling_model
from ..sim import model
from .rate_headers import rate_headers
from .statuses import ERRORS, FAULT_STATUSES, STATUS_KEYS, _status_key

MAX_TOKENS = 100_000              # a round's completion tokens are capped here
FAULT_DELAY = 0.05                # simulated s before an injected fault is answered
TIMELINE_POINTS = 20_000


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
    prompt: ceiling_model.Prompt | None = None  # the input as counted, when a cache share is set
    ceiling: str | None = None                  # the ceiling a 429 spent

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


def check_ceilings(limits: dict | None = None, style: str = "openai", outside: dict | None = None,
                   rpm_burst_s: Any = ceiling_model.MINUTE) -> ceiling_model.Config:
    return ceiling_model.check_config(limits, style, outside, rpm_burst_s)


def retry_headers(seconds: float) -> dict[str, str]:
    """``retry-after`` in whole seconds (at least 1) and ``retry-after-ms``."""
    return {"retry-after": str(max(1, math.ceil(seconds))), "retry-after-ms": str(math.ceil(seconds * 1000))}


class FakeProvider:
    """The protocol-independent provider: pools, keys, faults and statistics (usable without
    sockets: ``await provider.round(model_name, key, tokens)`` in any event loop)."""

    def __init__(self, capacity: float = 12, models: dict[str, float] | None = None, scale: float = 1.0,
                 seed: int | None = None, tokens: int = 600, price_per_1k: float = 0.01,
                 key_limit_usd: float | None = None, faults: dict | None = None,
                 overloaded_share: float = 0.0, retry_after_max: float = 60.0,
                 ceilings: dict | None = None, style: str = "openai", outside: dict | None = None,
                 rpm_burst_s: float = ceiling_model.MINUTE, cache_read_share: float = 0.0,
                 cache_write_share: float = 0.0, clock_start: float | None = None):
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
        self.ceilings = check_ceilings(ceilings, style, outside, rpm_burst_s)
        self.cache_read_share = _share("cache read share", cache_read_share)
        self.cache_write_share = _share("cache write share", cache_write_share)
        if self.cache_read_share + self.cache_write_share > 1.0:
            raise ValueError("the cache read and write shares add up to more than 1")
        self.rng = random.Random(seed)
        self.clock_start = time.time() if clock_start is None else float(clock_start)
        if not math.isfinite(self.clock_start):
            raise ValueError(f"clock start must be a finite Unix time, got {clock_start!r}")
        self.t0 = time.monotonic()
        self.scopes: dict[tuple[str, str], ceiling_model.KeyCeilings] = {}  # (API key, model) -> buckets
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

    def provider_now(self) -> float:
        """The provider's clock (Unix-like seconds, scaled): its ceilings' minutes and UTC days."""
        return self.clock_start + self.sim()

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

    def scope(self, api_key: str, model_name: str) -> ceiling_model.KeyCeilings | None:
        """The ceilings' buckets of one key and model (None while no ceiling is configured)."""
        if not self.ceilings.active:
            return None
        if (api_key, model_name) not in self.scopes:
            self.scopes[api_key, model_name] = ceiling_model.KeyCeilings(self.ceilings, self.provider_now(),
                                                                         origin=self.clock_start)
        return self.scopes[api_key, model_name]

    def ceiling_headers(self, api_key: str, model_name: str) -> dict[str, str]:
        """The rate-limit headers of the style for this key and model, now ({} without ceilings)."""
        scope = self.scope(api_key, model_name)
        if scope is None:
            return {}
        return rate_headers(self.ceilings.style, scope.state(self.provider_now()), self.scale, time.time())

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
        out.headers.update(self.ceiling_headers(key, model_name))
        return out

    async def _decide(self, pool: _Pool, key: str, tokens: int, prompt_tokens: int) -> Outcome:
        account = self.key(key)
        if not account.open(time.time()):
            await self._sleep(self.rng.uniform(0.0, model.KEY_REFUSAL_WITHIN))
            return Outcome(model.KEY_LIMIT_STATUS, model.KEY_LIMIT_MESSAGE)
        prompt = ceiling_model.split_prompt(prompt_tokens, self.cache_read_share, self.cache_write_share)
        scope = self.scope(key, pool.pm.name)
        if scope is not None and (refusal := scope.admit(prompt, tokens, self.provider_now())) is not None:
            return self._over_ceiling(pool, refusal)
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
        if scope is not None:
            scope.complete(tokens, self.provider_now())
        cached = self.cache_read_share > 0 or self.cache_write_share > 0
        return Outcome(200, tokens=tokens, prompt=prompt if cached else None)

    def _over_ceiling(self, pool: _Pool, refusal: ceiling_model.Refusal) -> Outcome:
        """A 429 naming the ceiling, at once, with retry-after until the request would fit (none
        when it never can)."""
        real_wait = refusal.wait_s / self.scale
        message = ceiling_model.refusal_message(self.ceilings.style, refusal, pool.pm.name, real_wait)
        headers = retry_headers(real_wait) if math.isfinite(real_wait) else {}
        return Outcome(429, message, headers=headers, ceiling=refusal.kind)

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
                  overloaded_share: float | None = None, ceilings: dict | None = None,
                  outside: dict | None = None, style: str | None = None) -> None:
        """Change the settings at runtime (``...``/None: unchanged). ``capacity`` is a number
        (the default and every pool) or ``{model: K}``. ``ceilings`` ``{kind: limit}`` and
        ``outside`` ``{"tpm"|"rpm": per minute}`` change the kinds they name (a None limit removes
        that ceiling); a lowered limit is in force at once. Everything is checked before anything
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
        limits = {**self.ceilings.limits, **(ceilings or {})}
        rates = {**self.ceilings.outside, **(outside or {})}
        new_ceilings = check_ceilings(limits, style or self.ceilings.style, rates, self.ceilings.rpm_burst_s)
        if new_faults is not None:
            self.faults = new_faults
        self.ceilings = new_ceilings
        now_p = self.provider_now()
        for scope in self.scopes.values():
            scope.reconfigure(new_ceilings, now_p)
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
        for scope in self.scopes.values():
            scope.used = {kind: ceiling_model.Tally(scope.origin) for kind in scope.used}
            scope.refused = {kind: 0 for kind in scope.refused}
        if keys:
            self.keys.clear()
            self.scopes.clear()

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

    def _ceiling_stats(self) -> dict[str, Any]:
        now = self.provider_now()
        cfg = self.ceilings
        scopes: dict[str, dict] = {}
        used: dict[str, dict] = {}
        refused: dict[str, int] = {}
        for (api_key, model_name), scope in self.scopes.items():
            name = f"{api_key[:8]}/{model_name}"
            while name in scopes:  # two keys alike in their first 8 characters
                name += "+"
            scope_used = {kind: {"total": t.total, "first_minute": t.first, "per_minute": list(t.per_minute)}
                          for kind, t in scope.used.items()}
            scopes[name] = {"state": scope.state(now), "used": scope_used, "429": dict(scope.refused)}
            for kind, t in scope.used.items():
                row = used.setdefault(kind, {"total": 0.0, "per_minute": []})
                row["total"] += t.total
                minutes = [0.0] * t.first + t.per_minute
                row["per_minute"] += [0.0] * (len(minutes) - len(row["per_minute"]))
                for i, x in enumerate(minutes):
                    row["per_minute"][i] += x
            for kind, n in scope.refused.items():
                refused[kind] = refused.get(kind, 0) + n
        return {"style": cfg.style, "limits": dict(cfg.limits), "outside_per_minute": dict(cfg.outside),
                "rpm_burst_s": cfg.rpm_burst_s, "cache_read_share": self.cache_read_share,
                "cache_write_share": self.cache_write_share, "clock_start": self.clock_start,
                "provider_minute": int((now - self.clock_start) // ceiling_model.MINUTE),
                "real_s_per_minute": ceiling_model.MINUTE / self.scale,
                "429": {kind: refused.get(kind, 0) for kind in cfg.limits} | refused, "used": used,
                "scopes": scopes}

    def stats(self) -> dict[str, Any]:
        """Per model and in total, the keys' spend today, and the settings (the module's docstring)."""
        now = self.real()
        per_model = {name: self._pool_stats(pool, now) for name, pool in self.pools.items()}
        extra = {"ceilings": self._ceiling_stats()} if self.ceilings.active or self.scopes else {}
        return {**extra, "models": per_model, "total": self._total_stats(per_model, now), "keys": self._key_stats(),
                "rejected": dict(self.rejected), "scale": self.scale, "uptime_s": round(now - self.t0, 3),
                "default_capacity": self.capacity, "faults": {str(k): v for k, v in self.faults.items()},
                "overloaded_share": self.overloaded_share, "key_limit_usd": self.key_limit_usd,
                "price_per_1k": self.price_per_1k}
