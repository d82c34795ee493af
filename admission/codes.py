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

ADMIT_REASONS = ("probe", "within-floor", "overdraft", "borrowed", "delegated", "same-intent")
"""Why a round was admitted (DESIGN §5): the rule that let it in."""
REFUSE_REASONS = ("recovering", "provider-closed", "paused", "budget-reserve", "budget-spent", "behind-older",
                  "cap-line", "reserved", "cost-guard", "fair-share", "full", "draw",
                  "ceiling-rpm", "ceiling-tpm", "ceiling-itpm", "ceiling-otpm", "ceiling-rpd", "ceiling-tpd")
"""Why a round was refused, in the order the checks run; ``full`` is a borrow (or a lane below
its floor on a measured pool) that finds no free slot, so no draw was made."""
CEILING_REASONS = tuple(r for r in REFUSE_REASONS if r.startswith("ceiling-"))
"""The refusals of a rate ceiling (lua/include/ceilings.lua), after the lane rules would admit:
the decision's ``wait_s`` says when that bucket could cover the round."""
FENCE_REASONS = ("reject_stale_primary_health", "reject_primary_depth", "reject_primary_retry_exhausted",
                 "reject_stale_borrowed_health", "shed_borrowed_depth", "shed_borrowed_retry",
                 "reject_stale_revision")
"""Why a borrow was refused or shed (DESIGN §8, in the seed fixture's order), and a borrow for a
revision older than its intent's watermark."""
RETRY_DECISIONS = ("retry_same_plane", "compensate_or_shed")
"""What ``retry`` decides: spend one retry of the attempt's own plane, or none is left."""
BIND_DECISIONS = ("bound", "reject_stale_revision", "reject_not_admitted", "advanced")
"""What ``bind`` and ``advance`` decide."""
UNAVAILABLE = "admission-unavailable"
"""The client's own refusal when Redis cannot be reached (DESIGN §8: absence sheds)."""

OUTCOMES = ("clean", "rate_limited", "stall", "round_cap", "error",
            "key_daily_limit", "budget_reached", "credit", "key_rejected", "ceiling")
"""What a round's release (or a mid-round report) may say it saw."""
LOAD_SIGNALS = ("rate_limited", "stall", "round_cap")
"""The outcomes that are load: the pool's estimate decreases."""
REPORT_SIGNALS = ("rate_limited", "stall", "round_cap", "key_daily_limit", "budget_reached", "credit", "key_rejected",
                  "ceiling")
"""What ``report`` takes mid-round: a load signal (one per seat) or a closing one."""

SIGNALS = ("clean", "rate_limited", "stall", "round_cap",
           "key_daily_limit", "budget_reached", "credit", "key_rejected", "error")
"""Every signal word the one classifier (``admission/classify.py``, DESIGN §6) names: the
outcomes a release takes."""
CLOSING_SIGNALS = ("key_daily_limit", "budget_reached", "credit", "key_rejected")
"""The signals that close a provider (every pool of it): the daily key limit and the daily budget
until the next 00:00 UTC, credit (402) and a rejected key (401, other 403) for ``closed_for``."""

REASON_MEANINGS: dict[str, str] = {
    # admitted (lua/admit.lua, lua/include/decide.lua)
    "probe": "the one probe round of a closed provider, admitted every `probe_every` while nothing runs on "
             "the pool; a clean probe reopens the provider",
    "within-floor": "the lane is below its guaranteed slots on the pool and a slot is free",
    "overdraft": "the lane is below its guaranteed slots on a pool never measured exhausted: admitted even "
                 "though the pool is full (before the first measurement K̂ is a starting point, not a limit)",
    "borrowed": "the lane is at or above its guarantee and borrows a free slot: the draw passed",
    "delegated": "the round's parent holds a live seat: admitted at once on the parent's lane (only a "
                 "closed provider refuses it)",
    "same-intent": "a live seat of this round id exists already: the same decision is answered again, "
                   "never a second seat",
    # refused
    "recovering": "the policy was applied to a mesh that had none (new, or wiped by a restart): no round "
                  "starts during the recovery hold, while the running rounds re-assert their seats by heartbeat",
    "provider-closed": "the pool's provider is closed (a daily key limit, the day's budget spent, credit, "
                       "a rejected key, or by hand) and no probe is due",
    "paused": "the pool is paused for a provider's Retry-After (at most `retry_after_max`)",
    "budget-reserve": "what is left of the provider's daily budget, committed spend counted, is below the "
                      "lane's reserve",
    "budget-spent": "nothing (or less than one round's mean cost) is left of the provider's daily budget",
    "behind-older": "older rounds of the same lane wait for this pool: they go first",
    "cap-line": "one more round would take the pool past its cap line, or this round's declared size "
                "would not arrive by 95 % of `round_cap` at the load it makes",
    "reserved": "the free slots are owed to other lanes below their floors that have work waiting",
    "cost-guard": "the lane's spend today at the provider reached its floor share of the daily budget: it "
                  "borrows no more there (its guaranteed slots stay)",
    "fair-share": "another lane with work waiting has borrowed less per weight (or as much, with the "
                  "higher priority)",
    "full": "no slot is free: a borrow, or a lane below its floor on a measured pool; no draw was made",
    "draw": "a borrow's draw failed: the fuller the pool, the less likely a borrow passes",
    "ceiling-rpm": "the scope's requests-per-minute bucket cannot cover the round; `wait_s` says when it could",
    "ceiling-tpm": "the scope's tokens-per-minute bucket cannot cover the round; `wait_s` says when it could",
    "ceiling-itpm": "the scope's input-tokens-per-minute bucket cannot cover the round; `wait_s` says when "
                    "it could",
    "ceiling-otpm": "the scope's output-tokens-per-minute bucket cannot cover the round; `wait_s` says when "
                    "it could",
    "ceiling-rpd": "the scope's requests-per-day bucket cannot cover the round: until midnight UTC",
    "ceiling-tpd": "the scope's tokens-per-day bucket cannot cover the round: until midnight UTC",
    # the fence (lua/include/fence.lua), a borrow only
    "reject_stale_primary_health": "the primary plane requires a health sample and has no fresh one",
    "reject_primary_depth": "the primary plane's depth is at its depth limit",
    "reject_primary_retry_exhausted": "the primary plane's retry budget is empty",
    "reject_stale_borrowed_health": "the borrowed plane requires a health sample and has no fresh one",
    "shed_borrowed_depth": "the borrowed plane's depth is at its depth limit: the borrow is shed",
    "shed_borrowed_retry": "the borrowed plane's retry budget is empty: the borrow is shed",
    "reject_stale_revision": "the borrow is for a revision older than its intent's watermark",
    # the client's own
    UNAVAILABLE: "Redis could not be reached: the client refuses (absence sheds), never admits silently",
}
"""What each reason word means: every admit, refusal and fence reason, and ``admission-unavailable``."""

OUTCOME_MEANINGS: dict[str, str] = {
    "clean": "the round ended without a problem; a clean probe reopens its provider",
    "rate_limited": "a 429, or a 529 overloaded: load, K̂ decreases; with a Retry-After the pool pauses",
    "stall": "the round ran longer than `stall_after`: load, K̂ decreases (K stays on a measured pool)",
    "round_cap": "the round was cut at `round_cap`, or a gateway timed it out (504): load, as a stall",
    "error": "any other failure (a 5xx, a network error): counted as a failure; the estimate is unchanged",
    "key_daily_limit": "403 \"key limit exceeded (daily limit)\": the provider closes until the next "
                       "00:00 UTC",
    "budget_reached": "the provider's daily budget is reached: it closes until the next 00:00 UTC",
    "credit": "402, out of credit: the provider closes for `closed_for`",
    "key_rejected": "401 or another 403: the key is rejected; the provider closes for `closed_for`",
    "ceiling": "a 429 that names a spent rate ceiling (with `ceiling=` rpm ... tpd and its reset): that "
               "bucket is empty until the reset; neither load nor a closure",
}
"""What each outcome (and signal) word means: what the round saw and what it does to the pool."""

DECISION_MEANINGS: dict[str, str] = {
    "retry_same_plane": "one retry token of the attempt's own plane was spent (or the plane has no retry "
                        "budget): try again there",
    "compensate_or_shed": "the plane's retry budget is empty: compensate or drop inside that plane; "
                          "nothing was spent",
    "bound": "the result's revision is the intent's watermark or newer: it binds, and becomes the watermark",
    "reject_stale_revision": "the result is for a revision older than the intent's watermark: not counted",
    "reject_not_admitted": "the intent's last borrow was refused or shed: no attempt of it may bind",
    "advanced": "the intent's watermark moved on to the new revision: older results are stale",
}
"""What ``retry``, ``bind`` and ``advance`` decide (``RETRY_DECISIONS``, ``BIND_DECISIONS``)."""
