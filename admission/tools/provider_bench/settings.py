"""The burst's settings, the admission's policy, and the yardsticks (the ideal drain, the bound,
the clients' backoff)."""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from ...policy import TUNABLES
from ..sim import model


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
