"""What a fault's run counts: its checks, decisions and calls."""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from .planes import FAULT_TEXT, SHED_REASONS


# -- results ---------------------------------------------------------------------------------------


@dataclass
class Check:
    held: int = 0
    cases: int = 0
    invariant: bool = False  # one of the fence's promises about the primary (the headline)

    @property
    def ok(self) -> bool:
        return self.held == self.cases


@dataclass
class FaultResult:
    fault: str
    intents: int = 0
    injected: int = 0
    injected_shed: int = 0  # shed decisions of injected intents (the design's denominator)
    admitted: int = 0
    reasons: Counter = field(default_factory=Counter)  # the server's decision of each intent's first ask
    calls: Counter = field(default_factory=Counter)  # follow-ups: retries, binds, lost replies, re-asks
    checks: dict[str, Check] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)  # the first failures, with their keys
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    headline: Check = field(default_factory=lambda: Check(invariant=True))  # keys and budget, per shed

    @property
    def shed(self) -> int:
        return sum(n for r, n in self.reasons.items() if r in SHED_REASONS)

    @property
    def shed_per_100(self) -> float:
        return 100.0 * self.shed / self.intents if self.intents else 0.0

    @property
    def shed_per_100_injected(self) -> float:
        return 100.0 * self.injected_shed / self.injected if self.injected else 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks.values())

    def as_dict(self) -> dict[str, Any]:
        inv = self.headline
        return {"fault": self.fault, "what": FAULT_TEXT[self.fault], "intents": self.intents,
                "injected": self.injected, "admitted": self.admitted, "shed": self.shed,
                "shedPer100": round(self.shed_per_100, 2), "injectedShed": self.injected_shed,
                "shedPer100Injected": round(self.shed_per_100_injected, 2),
                "reasons": dict(self.reasons.most_common()),
                "calls": dict(sorted(self.calls.items())),
                "invariant": {"held": inv.held, "cases": inv.cases, "ok": inv.ok},
                "checks": {k: {"held": c.held, "cases": c.cases, "ok": c.ok, "invariant": c.invariant}
                           for k, c in sorted(self.checks.items(), key=lambda kc: _rank(kc[0]))},
                "ok": self.ok, "failures": self.details, "notes": self.notes, "seconds": round(self.seconds, 3)}


def _rank(check: str) -> int:
    """The order checks print in: the invariant first, the doctor last."""
    for i, prefix in enumerate(("shed:", "borrow:", "retry:", "injected:")):
        if check.startswith(prefix):
            return i
    return 9 if check.startswith("doctor:") else 5
