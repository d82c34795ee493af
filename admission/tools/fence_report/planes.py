"""The two planes the report drives (the primary and the plane it borrows), their policy, and the
invariant's comparison."""
from __future__ import annotations

from typing import Any

from ...codes import FENCE_REASONS, UNAVAILABLE


#: The faults, in the order they run and print.
FAULTS = ("stale-borrowed-health", "borrowed-depth", "primary-saturation", "late-score", "redis-unreachable",
          "lost-replies", "pod-killed")
#: What each fault shows (the table's footnotes and docs/fence.md).
FAULT_TEXT = {
    "stale-borrowed-health": "borrowed sample absent, older than health_max_age, or not ok",
    "borrowed-depth": "borrowed plane at its depth limit (waiters there, or a sample's depth)",
    "primary-saturation": "primary at its depth limit while the borrower is idle and fresh",
    "late-score": "a late score for R after the intent moved to R+1; a late score after a shed",
    "redis-unreachable": "the client points at a closed port (every intent)",
    "lost-replies": "the reply to an admit and/or a retry lost after the server applied it",
    "pod-killed": "the pod dies between admit and retry; restarted, or another pod takes over",
}
#: The refusals that count as shed decisions: the fence's reasons and absence.
SHED_REASONS = (*FENCE_REASONS, UNAVAILABLE)

PRIMARY = "primary@p"
BORROWED = "borrowed@q"
LANES = ("a", "b")
T0 = 1_800_000_000.0  # the caller clock's start (2027-01-15 08:00 UTC), for every fault
STEP = 1.0  # seconds of caller time per intent
LEASE_TTL = 60.0
HEALTH_MAX_AGE = 5.0
DEPTH_LIMIT = {PRIMARY: 4, BORROWED: 2}
RETRY_BUDGET = {PRIMARY: 5, BORROWED: 10}
REFILL = {PRIMARY: 0.5, BORROWED: 2.0}
SEED_ESTIMATE = 4  # slots of either pool (no tick runs, so the estimates stay)
PRIMARY_HELD = 2  # primary rounds the primary pod holds (saturation: the whole pool)
PRIMARY_RETRY_P = 0.2  # per intent: the primary pod retries one of its rounds
BORROW_RETRY_P = 0.3  # an admitted baseline borrow retries once
DEFAULT_SHARE = 0.5
MAX_DETAILS = 20  # failure details kept per fault


def fence_policy() -> dict[str, Any]:
    """Two planes with every fence setting: the primary and the plane it borrows."""
    pools = {p: {"depth_limit": DEPTH_LIMIT[p], "retry_budget": RETRY_BUDGET[p], "retry_refill_per_s": REFILL[p],
                 "health_required": True, "health_max_age": HEALTH_MAX_AGE} for p in (PRIMARY, BORROWED)}
    return {"tunables": {"lease_ttl": LEASE_TTL, "seed_estimate": SEED_ESTIMATE, "health_max_age": HEALTH_MAX_AGE,
                         "decision_ttl": 30},
            "lanes": {"a": {"floor": 0.5, "weight": 1, "priority": 2}, "b": {"floor": 0.3, "weight": 1, "priority": 1}},
            "providers": {"p": {}, "q": {}}, "pools": pools, "clock": "caller"}


def unchanged(before: Any, after: Any) -> bool:
    """The invariant's comparison of two snapshots of the primary's keys (byte-for-byte)."""
    return before == after
