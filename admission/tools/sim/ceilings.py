"""The providers' rate ceilings (part of the provider model beside ``model``): requests and tokens
per minute and per day, as one API key's buckets count them.

* **Per-minute limits** (``rpm``, ``tpm``, ``itpm``, ``otpm``) are continuous token buckets: a
  bucket of limit L refills at L / 60 per second up to its capacity (L; for ``rpm`` the capacity
  is ``rpm_burst_s`` seconds of rate, at least one request: ``rpm_burst_s = 1`` is Anthropic's
  "60 RPM may be enforced as 1 request per second"). No fixed window: nothing resets on the minute.
* **Daily limits** (``rpd``, ``tpd``) count per UTC day of the provider's clock and are full again
  at 00:00 UTC.
* **Counting styles.** ``openai``: a request is counted on arrival, one against ``rpm``/``rpd``
  and its prompt plus ``max_tokens`` against ``tpm``/``tpd`` (``itpm``: the prompt, ``otpm``:
  ``max_tokens``, if configured); nothing is refunded. ``anthropic``: one request against
  ``rpm``/``rpd``; ``itpm`` counts the input that is not read from the cache (uncached input plus
  cache creation; cache reads do not count) on arrival; ``otpm`` counts the output when the
  request completes (the output as produced, charged at the end); ``tpm``/``tpd`` count both,
  each when it is counted.
* **Admission.** A request passes when every bucket holds what it counts on arrival (and at least
  one token or request: a bucket charged at completion may be in debt, and then it refuses until
  the refill pays the debt back); it debits them all together or none. A refused request counts
  nothing. A refusal names the ceiling that waits longest, and how long until the request would
  fit (``Refusal.wait_s``, provider seconds; ``inf`` when it never can: more than the bucket holds).
* **Outside traffic.** ``outside`` = ``{"tpm": x, "rpm": y}``: a client outside the mesh spends x
  tokens and y requests per minute of the same key, continuously (a steady drain: tokens from
  ``tpm``, ``itpm`` and ``tpd``; requests from ``rpm`` and ``rpd``). A per-minute bucket then
  refills at (L − x) / 60 per second; the outside rate must be below each per-minute limit it drains.

Times are provider seconds on a Unix-like clock (the day is ``now // 86,400``). Nothing here draws
a random number or reads a clock: the caller passes ``now``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

KINDS = ("rpm", "tpm", "itpm", "otpm", "rpd", "tpd")
MINUTE_KINDS = ("rpm", "tpm", "itpm", "otpm")
DAY_KINDS = ("rpd", "tpd")
STYLES = ("openai", "anthropic")
OUTSIDE_DRAINS = {"tpm": ("tpm", "itpm", "tpd"), "rpm": ("rpm", "rpd")}
REQUEST_KINDS = ("rpm", "rpd")
DAY = 86_400.0
MINUTE = 60.0
MIN_FIT = 1.0            # a bucket in debt (below one token or request) admits nothing
TALLY_MINUTES = 10_080   # per-minute use is kept for a week of provider time

#: kind -> (OpenAI's words, abbreviation; Anthropic's words, window)
NAMES = {
    "rpm": ("requests per min", "RPM", "requests", "minute"),
    "tpm": ("tokens per min", "TPM", "tokens", "minute"),
    "itpm": ("input tokens per min", "ITPM", "input tokens", "minute"),
    "otpm": ("output tokens per min", "OTPM", "output tokens", "minute"),
    "rpd": ("requests per day", "RPD", "requests", "day"),
    "tpd": ("tokens per day", "TPD", "tokens", "day"),
}


# -- configuration -----------------------------------------------------------------------------


def _number(what: str, x: Any, errors: list[str], allow_zero: bool = False) -> float | None:
    try:
        if isinstance(x, bool):
            raise TypeError
        v = float(x)
    except (TypeError, ValueError):
        errors.append(f"{what} must be a number, got {x!r}")
        return None
    if not math.isfinite(v) or v < 0 or (v == 0 and not allow_zero):
        errors.append(f"{what} must be a {'non-negative' if allow_zero else 'positive'} finite number, got {x!r}")
        return None
    return v


@dataclass(frozen=True)
class Config:
    """One key's ceilings: ``limits`` {kind: limit}, the counting ``style``, the ``outside``
    traffic {"tpm"|"rpm": per minute} and the request buckets' burst ``rpm_burst_s``."""

    limits: Mapping[str, float] = field(default_factory=dict)
    style: str = "openai"
    outside: Mapping[str, float] = field(default_factory=dict)
    rpm_burst_s: float = MINUTE

    @property
    def active(self) -> bool:
        return bool(self.limits)


def check_config(limits: Mapping[str, Any] | None = None, style: str = "openai",
                 outside: Mapping[str, Any] | None = None, rpm_burst_s: Any = MINUTE) -> Config:
    """A ``Config`` from raw settings (None limits and zero outside rates are left out), or one
    ``ValueError`` that lists every mistake."""
    errors: list[str] = []
    lims: dict[str, float] = {}
    for kind, x in (limits or {}).items():
        if kind not in KINDS:
            errors.append(f"unknown ceiling {kind!r} (one of {', '.join(KINDS)})")
        elif x is not None and (v := _number(kind, x, errors)) is not None:
            lims[kind] = v
    out: dict[str, float] = {}
    for kind, x in (outside or {}).items():
        if kind not in OUTSIDE_DRAINS:
            errors.append(f"unknown outside traffic {kind!r} (tpm or rpm)")
        elif x is not None and (v := _number(f"outside {kind}", x, errors, allow_zero=True)):
            out[kind] = v
            for drained in OUTSIDE_DRAINS[kind]:
                if drained in MINUTE_KINDS and drained in lims and v >= lims[drained]:
                    errors.append(f"outside {kind} ({v:g}) must be below the {drained} limit ({lims[drained]:g})")
    if style not in STYLES:
        errors.append(f"style must be one of {', '.join(STYLES)}, got {style!r}")
    burst = _number("rpm burst seconds", rpm_burst_s, errors)
    if burst is not None and burst > MINUTE:
        errors.append(f"rpm burst seconds must be at most {MINUTE:g}, got {burst:g}")
    if errors:
        raise ValueError("; ".join(errors))
    return Config({k: lims[k] for k in KINDS if k in lims}, style, out, burst or MINUTE)


# -- what a request counts ---------------------------------------------------------------------


@dataclass(frozen=True)
class Prompt:
    """A request's input tokens as the provider sees them: all of it (``tokens``), the part read
    from the cache and the part written to it."""

    tokens: int
    cache_read: int = 0
    cache_creation: int = 0

    @property
    def uncached(self) -> int:
        return self.tokens - self.cache_read - self.cache_creation


def split_prompt(tokens: int, read_share: float = 0.0, write_share: float = 0.0) -> Prompt:
    """``tokens`` of input with ``read_share`` of it read from the cache and ``write_share`` of
    it written to the cache (both rounded down)."""
    read = int(tokens * read_share)
    write = min(int(tokens * write_share), tokens - read)
    return Prompt(int(tokens), read, write)


def on_arrival(style: str, prompt: Prompt, max_tokens: int) -> dict[str, float]:
    """What a request counts when it arrives, per kind (the module's docstring)."""
    if style == "openai":
        budget = float(prompt.tokens + max_tokens)
        return {"rpm": 1.0, "rpd": 1.0, "tpm": budget, "tpd": budget, "itpm": float(prompt.tokens),
                "otpm": float(max_tokens)}
    counted = float(prompt.tokens - prompt.cache_read)  # uncached input plus cache creation
    return {"rpm": 1.0, "rpd": 1.0, "itpm": counted, "tpm": counted, "tpd": counted, "otpm": 0.0}


def on_completion(style: str, output: int) -> dict[str, float]:
    """What a request counts when it completes with ``output`` tokens."""
    if style == "openai":
        return {}
    return {"otpm": float(output), "tpm": float(output), "tpd": float(output)}


# -- the buckets -------------------------------------------------------------------------------


class Bucket:
    """One ceiling of one key: a continuous bucket (per minute) or a UTC day's allowance."""

    def __init__(self, kind: str, limit: float, now: float, burst_s: float = MINUTE, drain: float = 0.0):
        self.kind = kind
        self.daily = kind in DAY_KINDS
        self.burst_s = burst_s
        self.drain = drain          # per minute, from outside the mesh
        self.limit = limit
        self.level = self.capacity
        self.t = now
        self.day = int(now // DAY)

    @property
    def capacity(self) -> float:
        if self.kind == "rpm":
            return max(MIN_FIT, self.limit * self.burst_s / MINUTE)
        return self.limit

    @property
    def net_rate(self) -> float:
        """Per second: what the mesh gets back (a daily bucket refills only at midnight)."""
        return 0.0 if self.daily else (self.limit - self.drain) / MINUTE

    def advance(self, now: float) -> None:
        if now <= self.t:
            return
        if self.daily:
            day = int(now // DAY)
            if day != self.day:
                self.day, self.level, self.t = day, self.capacity, day * DAY
            if self.drain and self.level > 0:
                self.level = max(0.0, self.level - self.drain / MINUTE * (now - self.t))
        else:
            self.level = min(self.capacity, self.level + self.net_rate * (now - self.t))
        self.t = now

    def wait(self, need: float, now: float) -> float:
        """Provider seconds until the bucket holds ``need`` (0: now; inf: never)."""
        self.advance(now)
        need = max(need, MIN_FIT)
        if self.level >= need:
            return 0.0
        if need > self.capacity:
            return math.inf
        if self.daily:
            return (self.day + 1) * DAY - now  # full again at midnight
        return (need - self.level) / self.net_rate

    def take(self, amount: float, now: float) -> None:
        self.advance(now)
        self.level -= amount

    def reset_s(self, now: float) -> float:
        """Provider seconds until the bucket is full again."""
        self.advance(now)
        if self.level >= self.capacity:
            return 0.0
        if self.daily:
            return (self.day + 1) * DAY - now
        return (self.capacity - self.level) / self.net_rate

    def reconfigure(self, limit: float, burst_s: float, drain: float, now: float) -> None:
        """A new limit (a lowered one is in force at once: the level is cut to the new capacity)."""
        self.advance(now)
        self.limit, self.burst_s, self.drain = limit, burst_s, drain
        self.level = min(self.level, self.capacity)


@dataclass(frozen=True)
class Refusal:
    """A request that does not fit: the ceiling that waits longest, what it holds and what the
    request asked of it, and ``wait_s`` until the whole request fits (inf: never)."""

    kind: str
    limit: float
    used: float
    requested: float
    wait_s: float


class Tally:
    """What was counted per minute of provider time since ``origin`` (minute 0 starts there)."""

    def __init__(self, origin: float):
        self.origin = origin
        self.total = 0.0
        self.first = 0                 # the minute of per_minute[0] (older minutes are dropped)
        self.per_minute: list[float] = []

    def add(self, amount: float, now: float) -> None:
        self.total += amount
        minute = max(0, int((now - self.origin) // MINUTE))
        if minute >= self.first + len(self.per_minute):
            self.per_minute.extend([0.0] * (minute + 1 - self.first - len(self.per_minute)))
        if minute >= self.first:
            self.per_minute[minute - self.first] += amount
        if len(self.per_minute) > TALLY_MINUTES:
            drop = len(self.per_minute) - TALLY_MINUTES
            del self.per_minute[:drop]
            self.first += drop


class KeyCeilings:
    """The buckets of one key (and model), their use per minute and their refusals per ceiling."""

    def __init__(self, config: Config, now: float, origin: float | None = None):
        self.config = config
        self.buckets: dict[str, Bucket] = {}
        self.origin = now if origin is None else origin
        self.used: dict[str, Tally] = {}
        self.refused: dict[str, int] = {}
        self.reconfigure(config, now)

    def _drain(self, config: Config, kind: str) -> float:
        return sum(rate for what, rate in config.outside.items() if kind in OUTSIDE_DRAINS[what])

    def reconfigure(self, config: Config, now: float) -> None:
        self.config = config
        for kind in list(self.buckets):
            if kind not in config.limits:
                del self.buckets[kind]
        for kind, limit in config.limits.items():
            drain = self._drain(config, kind)
            if kind in self.buckets:
                self.buckets[kind].reconfigure(limit, config.rpm_burst_s, drain, now)
            else:
                self.buckets[kind] = Bucket(kind, limit, now, config.rpm_burst_s, drain)
            self.used.setdefault(kind, Tally(self.origin))
            self.refused.setdefault(kind, 0)

    def _charge(self, charges: Mapping[str, float], now: float) -> None:
        for kind, bucket in self.buckets.items():
            amount = charges.get(kind, 0.0)
            if amount:
                bucket.take(amount, now)
                self.used[kind].add(amount, now)

    def admit(self, prompt: Prompt, max_tokens: int, now: float) -> Refusal | None:
        """Debit what the request counts on arrival and return None, or debit nothing and return
        the refusal."""
        charges = on_arrival(self.config.style, prompt, max_tokens)
        worst: Refusal | None = None
        for kind, bucket in self.buckets.items():
            need = charges.get(kind, 0.0)
            wait = bucket.wait(need, now)
            if wait > 0 and (worst is None or wait > worst.wait_s):
                worst = Refusal(kind, bucket.limit, max(0.0, bucket.capacity - bucket.level), need, wait)
        if worst is not None:
            self.refused[worst.kind] = self.refused.get(worst.kind, 0) + 1
            return worst
        self._charge(charges, now)
        return None

    def complete(self, output: int, now: float) -> None:
        """The request completed with ``output`` tokens: what the style counts then."""
        self._charge(on_completion(self.config.style, output), now)

    def state(self, now: float) -> dict[str, dict[str, float]]:
        """Per kind: ``limit``, ``remaining`` (the level, not below 0) and ``reset_s`` (until full)."""
        out = {}
        for kind, b in self.buckets.items():
            reset = b.reset_s(now)
            out[kind] = {"limit": b.limit, "remaining": max(0.0, b.level), "reset_s": reset}
        return out


# -- the providers' words -------------------------------------------------------------------------


def _n(x: float) -> str:
    return f"{x:.0f}" if math.isfinite(x) else "inf"


def refusal_message(style: str, refusal: Refusal, model_name: str, try_again_s: float | None = None) -> str:
    """The 429's error message in the style's words (``admission.ratelimits`` names the ceiling
    from it); ``try_again_s``: the wait the client is told (default ``refusal.wait_s``)."""
    wait = refusal.wait_s if try_again_s is None else try_again_s
    openai_words, abbrev, anthropic_words, window = NAMES[refusal.kind]
    if style == "openai":
        if not math.isfinite(refusal.wait_s):
            return (f"Request too large for {model_name} in organization org-fake-provider on {openai_words} "
                    f"({abbrev}): Limit {_n(refusal.limit)}, Requested {_n(refusal.requested)}. "
                    "The input or output tokens must be reduced in order to run successfully.")
        return (f"Rate limit reached for {model_name} in organization org-fake-provider on {openai_words} "
                f"({abbrev}): Limit {_n(refusal.limit)}, Used {_n(refusal.used)}, "
                f"Requested {_n(refusal.requested)}. Please try again in {wait:.3f}s.")
    return (f"This request would exceed your organization's rate limit of {refusal.limit:,.0f} "
            f"{anthropic_words} per {window}. Please reduce the prompt length or the maximum tokens "
            "requested, or try again later.")
