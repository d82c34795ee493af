"""The scenarios: which pools (with their carrying capacity K), how many pods, which load on
which pool and pod, where the measured window starts, and which policies are compared. The first
four are the seed's Monte Carlo comparison; ``provider-day`` is the seed's incident of the day a
provider key hit its daily limit (``day.DaySim``); ``provider-day-fallback`` is that day with the
same model on a second provider to move to; ``ceilings`` is a token-bound key with its rate ceilings
in the policy and without them (``ceiling_run.CeilingSim``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import load as L
from .load import Item
from .ceiling_run import OPENAI, Workload
from .ceiling_run import POLICIES as CEILING_POLICIES
from .policies import EU, PINNED_LANES, ROUTER

# (a new scenario goes last: a run's random stream is seeded by the scenario's place here)
NAMES = ("burst", "idle", "isolation", "multipod", "provider-day", "provider-day-fallback", "sustained", "ceilings")
SINGLE = ("step", "seed-and-grow", "oracle")
DAY_POLICIES = ("with-rules", "without-rules")
FALLBACK_POLICIES = ("fallback", "no-fallback")
#: the scenarios that run on day.DaySim (the key's day; their own tables)
DAYS = ("provider-day", "provider-day-fallback")
#: provider-day-fallback: one model, two providers (the router's key closes first)
ROUTER_POOL, EU_POOL = f"sonnet@{ROUTER}", f"sonnet@{EU}"


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
    # day: the keys of the other providers, provider -> daily limit (None: no limit); the first
    # pool's provider holds the key of ``limit_usd``
    other_keys: dict[str, float | None] | None = None
    ceilings: Workload | None = None  # runs on ceiling_run.CeilingSim with this key and workload


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


def sustained(k: float) -> Scenario:
    pool = "main@sim"
    return Scenario("sustained", {pool: k}, 1, SINGLE, lambda rng: L.sustained_load(rng, pool, k),
                    window_start=3600.0, hours=L.SUSTAINED_HOURS - 1.0,
                    about=f"{L.SUSTAINED_HOURS:g} h of load at {L.SUSTAINED_OVERLOAD:g}× what K rounds serve; "
                          "figures after the first hour")


def provider_day(k: float) -> Scenario:
    pool = "main@sim"
    return Scenario("provider-day", {pool: k}, 1, DAY_POLICIES, lambda rng: L.working_day(rng, pool),
                    hours=L.DAY_HOURS, day=True, limit_usd=L.KEY_DAILY_LIMIT_USD,
                    about=f"a working day (08:00-00:30 UTC) on one key with a daily limit of "
                          f"{L.KEY_DAILY_LIMIT_USD:g} USD")


def provider_day_fallback(k: float) -> Scenario:
    """The provider's day with a second provider of the same model: the router's key (the day's
    limit) closes first; the EU pool has its own key and its own hidden K."""
    pools = {ROUTER_POOL: k, EU_POOL: k * L.EU_CAPACITY_SHARE}
    return Scenario("provider-day-fallback", pools, 1, FALLBACK_POLICIES,
                    lambda rng: L.two_provider_day(rng, ROUTER_POOL, EU_POOL),
                    hours=L.DAY_HOURS, day=True, limit_usd=L.KEY_DAILY_LIMIT_USD,
                    other_keys={EU: L.EU_KEY_LIMIT_USD},
                    about=f"the working day on {ROUTER_POOL} (key limit {L.KEY_DAILY_LIMIT_USD:g} USD, "
                          f"known only to the provider) and {EU_POOL} (EU-routed: {L.EU_LANE}); "
                          f"hard-pinned: {', '.join(PINNED_LANES)}")


def ceilings(k: float) -> Scenario:
    """A token-bound key (ceiling_run.OPENAI), with its ceilings in the policy and without them;
    the provider has no concurrency limit, so K plays no part (no pool has one)."""
    w = OPENAI
    limits = ", ".join(f"{v:,.0f} {kind.upper()}" for kind, v in w.limits.items())
    return Scenario("ceilings", {}, w.pods, CEILING_POLICIES, lambda rng: [],
                    hours=w.minutes / 60.0, ceilings=w,
                    about=f"{w.pods} pods × {w.workers} workers on one key of {limits} ({w.style} style), "
                          f"prompts {w.prompt[0]:,}–{w.prompt[1]:,} tokens, max_tokens {w.max_tokens:,}, "
                          f"{w.minutes:g} provider minutes; figures from minute 2")


def make(name: str, capacity: float) -> Scenario:
    try:
        return {"burst": burst, "idle": idle, "isolation": isolation, "multipod": multipod, "sustained": sustained,
                "provider-day": provider_day, "provider-day-fallback": provider_day_fallback, "ceilings": ceilings}[name](capacity)
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(NAMES)}") from None
