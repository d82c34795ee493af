"""The measured load (control instance, 2026-10-02), and every size the seed does not give.

The seed gives: 35 review heads within two minutes, 40,000 tokens each; the bug backlog, 100
rounds of 20,000 tokens; three red mains five minutes in; triage every four minutes; the
babysitter every six. Everything else the simulator needs is chosen here, in one place, and
documented in docs/simulation.md ("Sizes the seed does not give").
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ...urgency import urgency

# -- given by the seed ------------------------------------------------------------------------
REVIEW_HEADS = 35
REVIEW_WINDOW = 120.0        # s: the heads arrive uniformly within two minutes
REVIEW_TOKENS = 40_000
BUG_BACKLOG = 100
BUG_TOKENS = 20_000
RED_MAINS = 3
RED_MAIN_AT = 300.0          # s: five minutes in
TRIAGE_EVERY = 240.0         # s
BABYSITTER_EVERY = 360.0     # s

# -- chosen here (the seed does not say) ------------------------------------------------------
RED_MAIN_TOKENS = 20_000     # a red main is a bug round of the bug pool, the size of the others
TRIAGE_TOKENS = 6_000        # one issue read, labelled and answered
BABYSITTER_TOKENS = 3_000    # one look at the open pull requests and CI
PERIODIC_FOR = 3_600.0       # s: triage and the babysitter arrive during the first hour
#: severity mix of the backlog (the seed's bug pool labels) and its age: uniform up to a week
BUG_SEVERITY = {"B": 0.05, "H": 0.15, "M": 0.30, "L": 0.30, None: 0.20}
BUG_MAX_AGE = 7 * 86_400.0
# idle scenario: the remembered pool first serves a warm-up (enough to be measured exhausted),
# both pools then idle and take the same burst at IDLE_BURST_AT
IDLE_WARMUP_ROUNDS = 36
IDLE_BURST_ROUNDS = 12
IDLE_TOKENS = 20_000
IDLE_BURST_AT = 3 * 3_600.0
# isolation: the small pool's carrying capacity, as a share of --capacity (the review pool has K)
SMALL_POOL_SHARE = 1 / 3
# multipod
PODS = 4
# provider-day: a working day on one provider key with a daily limit. Simulated t = 0 is 08:00 UTC
# (engine.EPOCH); the window runs to 00:30 UTC, half an hour past the key's reset at midnight.
DAY_HOURS = 16.5                 # 08:00 to 00:30 UTC
#: the key's daily limit (and the policy's daily_limit_usd with the rules): without the rules the
#: load reaches it at 14:48 on average (seed 1, ten runs), as on the seed's day (14:47). It was
#: 155 until the estimate stopped ratcheting K down on stalls (design §4): the provider then
#: serves more of the load and reached 155 at 13:55
KEY_DAILY_LIMIT_USD = 178.0
PRICE_PER_1K_TOKENS = 0.02       # USD per 1,000 tokens of a round: a review round costs 0.80
TURN_TOKENS = 2_000              # one request of a round (billed at its end, the key checked at its start)
ERROR_RETRY_AFTER = 1_800.0      # s: a worker whose round failed with an `error` asks again 30 min later
DAY_REVIEWS_PER_HOUR = 12.0      # review heads (40,000 tokens), Poisson, all day
DAY_BUG_BACKLOG = 300            # open bugs at 08:00 (20,000 tokens, the seed's severities and ages)
DAY_EXPRESS_PER_HOUR = 6.0       # express asks (a person waits on the answer), Poisson, all day
EXPRESS_TOKENS = 20_000
# provider-day-fallback: the same day on one model reached through two providers
EU_LANE = "express"              # its rounds are EU-routed: they ask for the EU pool all day
EU_CAPACITY_SHARE = 1.0          # the EU pool's hidden K, as a share of the router pool's K
EU_KEY_LIMIT_USD = None          # the EU provider's key has no daily limit
# sustained: hours of load above capacity on one pool. Rounds of one size arrive (Poisson) at
# SUSTAINED_OVERLOAD times what K rounds in flight serve, so work always waits; the first hour is
# the estimate's to find K, the figures are taken over the hours after it
SUSTAINED_HOURS = 4.0
SUSTAINED_TOKENS = 20_000
SUSTAINED_OVERLOAD = 1.5


@dataclass
class Item:
    """One piece of work; it is done when one of its rounds ends clean."""

    id: str
    lane: str
    pool: str
    tokens: float
    arrival: float
    group: str = ""              # what the report calls it (default: the lane)
    pod: int = 0
    severity: str | None = None  # bug pool items only
    age0: float = 0.0            # age at arrival (s)
    attempts: int = 0
    done_at: float | None = None
    first_start: float | None = None  # first round the provider served (not refused)
    meta: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.group = self.group or self.lane

    def urgency(self, now: float) -> float:
        return urgency(self.severity, self.age0 + max(0.0, now - self.arrival))


def reviews(rng: np.random.Generator, pool: str, t0: float = 0.0) -> list[Item]:
    at = np.sort(rng.uniform(0.0, REVIEW_WINDOW, REVIEW_HEADS))
    return [Item(f"rev{i:02d}", "reviews", pool, REVIEW_TOKENS, t0 + float(a)) for i, a in enumerate(at)]


def bug_backlog(rng: np.random.Generator, pool: str, t0: float = 0.0, n: int = BUG_BACKLOG) -> list[Item]:
    names = list(BUG_SEVERITY)
    sev = rng.choice(len(names), size=n, p=list(BUG_SEVERITY.values()))
    ages = rng.uniform(0.0, BUG_MAX_AGE, n)
    return [Item(f"bug{i:03d}", "bugfix", pool, BUG_TOKENS, t0, severity=names[s], age0=float(a))
            for i, (s, a) in enumerate(zip(sev, ages))]


def red_mains(pool: str, t0: float = 0.0) -> list[Item]:
    return [Item(f"red{i}", "bugfix", pool, RED_MAIN_TOKENS, t0 + RED_MAIN_AT, severity="red-main",
                 meta={"red_main": True}) for i in range(RED_MAINS)]


def periodic(lane: str, every: float, tokens: float, pool: str, t0: float = 0.0) -> list[Item]:
    n = int(PERIODIC_FOR // every)
    return [Item(f"{lane[:3]}{i:02d}", lane, pool, tokens, t0 + i * every) for i in range(n)]


def measured_load(rng: np.random.Generator, pool: str, t0: float = 0.0) -> list[Item]:
    """The whole measured load on one pool, in draw order (reviews, then the backlog)."""
    return (reviews(rng, pool, t0) + bug_backlog(rng, pool, t0) + red_mains(pool, t0)
            + periodic("triage", TRIAGE_EVERY, TRIAGE_TOKENS, pool, t0)
            + periodic("babysitter", BABYSITTER_EVERY, BABYSITTER_TOKENS, pool, t0))


def poisson(rng: np.random.Generator, lane: str, per_hour: float, tokens: float, pool: str, until: float,
            t0: float = 0.0) -> list[Item]:
    """Arrivals of one lane at ``per_hour`` (Poisson) from ``t0`` until ``until``."""
    n = int(rng.poisson(per_hour * (until - t0) / 3600.0))
    at = np.sort(rng.uniform(t0, until, n))
    return [Item(f"{lane[:3]}{i:03d}", lane, pool, tokens, float(a)) for i, a in enumerate(at)]


def sustained_load(rng: np.random.Generator, pool: str, k: float) -> list[Item]:
    """Rounds of SUSTAINED_TOKENS arriving for SUSTAINED_HOURS at SUSTAINED_OVERLOAD times the
    rate K rounds in flight complete (the provider model's rate at n = K)."""
    from .model import rate

    per_hour = SUSTAINED_OVERLOAD * k * rate(max(1, round(k)), k) / SUSTAINED_TOKENS * 3600.0
    items = poisson(rng, "reviews", per_hour, SUSTAINED_TOKENS, pool, SUSTAINED_HOURS * 3600.0)
    for item in items:
        item.group = "sustained"
    return items


def working_day(rng: np.random.Generator, pool: str) -> list[Item]:
    """provider-day: the bug backlog open at 08:00 (the bug pool works it all day), review heads
    and express asks arriving all day, triage every four minutes and the babysitter every six
    (the seed's periods), until the end of the window."""
    until = DAY_HOURS * 3600.0
    return (poisson(rng, "reviews", DAY_REVIEWS_PER_HOUR, REVIEW_TOKENS, pool, until)
            + bug_backlog(rng, pool, n=DAY_BUG_BACKLOG)
            + poisson(rng, "express", DAY_EXPRESS_PER_HOUR, EXPRESS_TOKENS, pool, until)
            + [Item(f"tri{i:03d}", "triage", pool, TRIAGE_TOKENS, i * TRIAGE_EVERY)
               for i in range(int(until // TRIAGE_EVERY))]
            + [Item(f"bab{i:03d}", "babysitter", pool, BABYSITTER_TOKENS, i * BABYSITTER_EVERY)
               for i in range(int(until // BABYSITTER_EVERY))])


def two_provider_day(rng: np.random.Generator, pool: str, eu_pool: str) -> list[Item]:
    """provider-day-fallback: the working day above on ``pool``, except that the rounds of
    ``EU_LANE`` are EU-routed: they ask for ``eu_pool`` (same draws, so the same arrivals)."""
    items = working_day(rng, pool)
    for item in items:
        if item.lane == EU_LANE:
            item.pool = eu_pool
    return items


def sizes() -> dict:
    """Every size above, for the report (JSON ``config.load``)."""
    return {k.lower(): (v if not isinstance(v, dict) else {str(s): p for s, p in v.items()})
            for k, v in globals().items() if k.isupper()}
