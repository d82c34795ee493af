"""Reply codes and reason words, mirrored from ``lua/include/codes.lua`` (the one source).

``tests/test_codes.py`` parses the Lua file and asks a live server, so the two cannot drift.
"""
from __future__ import annotations

from enum import IntEnum


class Status(IntEnum):
    """The first element of every script reply."""

    REFUSED = 0
    ADMITTED = 1
    RELEASED = 2
    ALREADY_RELEASED = 3
    EXPIRED = 4
    REPORTED = 5
    ALREADY_REPORTED = 6
    OK = 7
    CHARGED = 8
    ALREADY_CHARGED = 9
    TAKEN = 10
    ALREADY_TAKEN = 11
    SEAT_LOST = 12


#: Error-reply prefixes (``ERR`` in codes.lua) by their Lua name.
ERRORS = {
    "BAD_ARG": "ADM_BAD_ARG",
    "BAD_NAME": "ADM_BAD_NAME",
    "UNKNOWN_LANE": "ADM_UNKNOWN_LANE",
    "UNKNOWN_POOL": "ADM_UNKNOWN_POOL",
    "UNKNOWN_SEAT": "ADM_UNKNOWN_SEAT",
    "NOT_YOUR_SEAT": "ADM_NOT_YOUR_SEAT",
    "NO_CONFIG": "ADM_NO_CONFIG",
    "BAD_POLICY": "ADM_BAD_POLICY",
    "STALE_VERSION": "ADM_STALE_VERSION",
    "UNKNOWN_PROVIDER": "ADM_UNKNOWN_PROVIDER",
}

#: Why a round was admitted (DESIGN §5): the rule that let it in.
ADMIT_REASONS = ("probe", "within-floor", "overdraft", "borrowed", "delegated", "same-intent")
#: Why a round was refused, in the order the checks run; ``full`` is a borrow (or a lane below
#: its floor on a measured pool) that finds no free slot, so no draw was made.
REFUSE_REASONS = ("recovering", "provider-closed", "paused", "budget-reserve", "budget-spent", "behind-older",
                  "cap-line", "reserved", "cost-guard", "fair-share", "full", "draw",
                  "ceiling-rpm", "ceiling-tpm", "ceiling-itpm", "ceiling-otpm", "ceiling-rpd", "ceiling-tpd")
#: The refusals of a rate ceiling (lua/include/ceilings.lua), after the lane rules would admit:
#: the decision's ``wait_s`` says when that bucket could cover the round.
CEILING_REASONS = tuple(r for r in REFUSE_REASONS if r.startswith("ceiling-"))
#: Why a borrow was refused or shed (DESIGN §8, in the seed fixture's order), and a borrow for a
#: revision older than its intent's watermark.
FENCE_REASONS = ("reject_stale_primary_health", "reject_primary_depth", "reject_primary_retry_exhausted",
                 "reject_stale_borrowed_health", "shed_borrowed_depth", "shed_borrowed_retry",
                 "reject_stale_revision")
#: What ``retry`` decides: spend one retry of the attempt's own plane, or none is left.
RETRY_DECISIONS = ("retry_same_plane", "compensate_or_shed")
#: What ``bind`` and ``advance`` decide.
BIND_DECISIONS = ("bound", "reject_stale_revision", "reject_not_admitted", "advanced")
#: The client's own refusal when Redis cannot be reached (DESIGN §8: absence sheds).
UNAVAILABLE = "admission-unavailable"

OUTCOMES = ("clean", "rate_limited", "stall", "round_cap", "error",
            "key_daily_limit", "budget_reached", "credit", "key_rejected", "ceiling")
LOAD_SIGNALS = ("rate_limited", "stall", "round_cap")
#: What ``report`` takes mid-round: a load signal (one per seat) or a closing one.
REPORT_SIGNALS = ("rate_limited", "stall", "round_cap", "key_daily_limit", "budget_reached", "credit", "key_rejected",
                  "ceiling")

#: Every signal word the one classifier (``admission/classify.py``, DESIGN §6) names: the
#: outcomes a release takes.
SIGNALS = ("clean", "rate_limited", "stall", "round_cap",
           "key_daily_limit", "budget_reached", "credit", "key_rejected", "error")
#: The signals that close a provider (every pool of it): the daily key limit and the daily budget
#: until the next 00:00 UTC, credit (402) and a rejected key (401, other 403) for ``closed_for``.
CLOSING_SIGNALS = ("key_daily_limit", "budget_reached", "credit", "key_rejected")
