"""The measured load (control instance, 2026-10-02), and every size the seed does not give.

The seed gives: 35 review heads within two minutes, 40,000 tokens each; the bug backlog, 100
rounds of 20,000 tokens; three red mains five minutes in; triage every four minutes; the
babysitter every six. Everything else the simulator needs is chosen here, in one place, and
documented in docs/simulation.md ("Sizes the seed does not give").
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..urgency import urgency

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


def bug_backlog(rng: np.random.Generator, pool: str, t0: float = 0.0) -> list[Item]:
    names = list(BUG_SEVERITY)
    sev = rng.choice(len(names), size=BUG_BACKLOG, p=list(BUG_SEVERITY.values()))
    ages = rng.uniform(0.0, BUG_MAX_AGE, BUG_BACKLOG)
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


def sizes() -> dict:
    """Every size above, for the report (JSON ``config.load``)."""
    return {k.lower(): (v if not isinstance(v, dict) else {str(s): p for s, p in v.items()})
            for k, v in globals().items() if k.isupper()}
