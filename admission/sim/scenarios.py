"""The scenarios: which pools (with their carrying capacity K), how many pods, which load on
which pool and pod, where the measured window starts, and which policies are compared. The first
four are the seed's Monte Carlo comparison; ``provider-day`` is the seed's incident of the day a
provider key hit its daily limit (``day.DaySim``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import load as L
from .load import Item

NAMES = ("burst", "idle", "isolation", "multipod", "provider-day")
SINGLE = ("step", "seed-and-grow", "oracle")
DAY_POLICIES = ("with-rules", "without-rules")


@dataclass(frozen=True)
class Scenario:
    name: str
    pools: dict[str, float]
    pods: int
    policies: tuple[str, ...]
    build: Callable[[np.random.Generator], list[Item]]
    window_start: float = 0.0
    about: str = ""
    hours: float | None = None  # its own horizon (None: the CLI's --hours)
    day: bool = False           # runs on day.DaySim (the provider's key and its day)
    limit_usd: float | None = None  # day: the key's daily limit (and the rules' daily_limit_usd)
    policy_limit_usd: float | None = None  # day: the rules' daily_limit_usd when not the key's limit


def burst(k: float) -> Scenario:
    pool = "main@sim"
    return Scenario("burst", {pool: k}, 1, SINGLE, lambda rng: L.measured_load(rng, pool),
                    about="the measured load on one pool")


def idle(k: float) -> Scenario:
    warm, cold = "warm@sim", "cold@sim"

    def build(rng):
        warmup = [Item(f"wup{i:02d}", "reviews", warm, L.IDLE_TOKENS, 0.0, group="_warmup")
                  for i in range(L.IDLE_WARMUP_ROUNDS)]
        burst = [Item(f"{name[:4]}{i:02d}", "reviews", pool, L.IDLE_TOKENS, L.IDLE_BURST_AT, group=name)
                 for name, pool in (("remembered", warm), ("never-measured", cold))
                 for i in range(L.IDLE_BURST_ROUNDS)]
        return warmup + burst

    return Scenario("idle", {warm: k, cold: k}, 1, SINGLE, build, window_start=L.IDLE_BURST_AT,
                    about="a remembered pool and a never-measured one take the same burst after idling")


def isolation(k: float) -> Scenario:
    big, small = "reviews@sim", "small@sim"
    ks = max(1.0, round(k * L.SMALL_POOL_SHARE))
    return Scenario("isolation", {big: k, small: ks}, 1, SINGLE,
                    lambda rng: L.reviews(rng, big) + L.bug_backlog(rng, small) + L.red_mains(small),
                    about="the bug flood on a small pool, the reviews on another")


def multipod(k: float) -> Scenario:
    pool = "main@sim"

    def build(rng):
        items = L.measured_load(rng, pool)
        counters: dict[str, int] = {}
        for item in items:  # each lane's items go round the pods
            i = counters.get(item.group, 0)
            counters[item.group] = i + 1
            item.pod = i % L.PODS
        return items

    return Scenario("multipod", {pool: k}, L.PODS, ("step", "seed-and-grow-private", "seed-and-grow", "oracle"),
                    build, about=f"the measured load spread over {L.PODS} pods on one pool")


def provider_day(k: float) -> Scenario:
    pool = "main@sim"
    return Scenario("provider-day", {pool: k}, 1, DAY_POLICIES, lambda rng: L.working_day(rng, pool),
                    hours=L.DAY_HOURS, day=True, limit_usd=L.KEY_DAILY_LIMIT_USD,
                    about=f"a working day (08:00-00:30 UTC) on one key with a daily limit of "
                          f"{L.KEY_DAILY_LIMIT_USD:g} USD")


def make(name: str, capacity: float) -> Scenario:
    try:
        return {"burst": burst, "idle": idle, "isolation": isolation, "multipod": multipod,
                "provider-day": provider_day}[name](capacity)
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(NAMES)}") from None
