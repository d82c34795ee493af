"""Each pool's alternatives (DESIGN §7): the explicit ``[alternatives]`` entry, else the defaults
of its tier. Pure Python over a normalized policy (``admission.policy.validate``); no Redis.

Defaults of a pool ``model@provider`` whose model is in a tier (its id carries one of the tier's
tokens), among the pools of the catalog:

1. the same model on a different provider (a daily key limit is per key: another provider keeps
   the lane going), by pool name;
2. then the tier's other models in the tier's token order (a model ranks by the first token it
   carries; ties by model name), each model's pool on the own provider before its other pools
   (by pool name).

Never off the EU route (``may_move_to``). A model in no tier has no defaults. An explicit entry
(by pool, else by model) replaces the defaults; it too keeps to the EU route and never lists the
pool itself.

The lists are computed here when a policy is applied (``Core.apply`` stores them in the config
hash); ``lua/admit.lua`` tries them in the client's ranking, which ``Thompson`` draws.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

import numpy as np

from .policy import may_move_to, model_of, tier_of

__all__ = ["Thompson", "alternatives", "explicit_key", "may_move_to"]


class Thompson:
    """The client's ranking of a pool's alternatives (DESIGN §7), one seeded generator per pod."""

    def __init__(self, seed: int | None = None):
        self.rng = np.random.default_rng(seed)

    def rank(self, alternatives: Iterable[str], stats: Mapping[str, tuple[float, float, float]],
             cost_scale: float) -> list[str]:
        """Thompson sampling: for each alternative draw θ ~ Beta(successes + 1, failures + 1) and
        score θ / (1 + mean cost / cost_scale); best first. An unexplored pool draws from
        Beta(1, 1), so the choice keeps exploring."""
        alts = list(alternatives)
        if len(alts) < 2:
            return alts
        succ = np.empty(len(alts))
        fail = np.empty(len(alts))
        cost = np.empty(len(alts))
        for i, p in enumerate(alts):
            succ[i], fail[i], cost[i] = stats.get(p, (0.0, 0.0, 0.0))
        theta = self.rng.beta(succ + 1, fail + 1)
        score = theta / (1 + cost / cost_scale)
        return [alts[i] for i in np.argsort(-score, kind="stable")]


def explicit_key(policy: Mapping[str, Any], pool: str) -> str | None:
    """The ``[alternatives]`` key that applies to ``pool`` (the pool, else its model), or None."""
    explicit = policy.get("alternatives") or {}
    if pool in explicit:
        return pool
    model = model_of(pool)
    return model if model in explicit else None


def alternatives(policy: Mapping[str, Any]) -> dict[str, list[str]]:
    """Pool -> its ordered alternatives, for every pool of the catalog (sorted by pool name)."""
    providers = policy["providers"]
    tiers = policy.get("tiers") or {}
    explicit = policy.get("alternatives") or {}
    provider_of = {p["name"]: p["provider"] for p in policy["pools"]}
    out: dict[str, list[str]] = {}
    for pool in sorted(provider_of):
        own = provider_of[pool]

        def allowed(dst: str) -> bool:
            return dst != pool and may_move_to(providers[own], providers[provider_of[dst]])

        key = explicit_key(policy, pool)
        if key is not None:
            out[pool] = [p for p in explicit[key] if allowed(p)]
            continue
        model = model_of(pool)
        tier = tier_of(model, tiers)
        if tier is None:
            out[pool] = []
            continue
        same = sorted(p for p in provider_of if model_of(p) == model and allowed(p))
        others = []
        for p in provider_of:
            m = model_of(p)
            if m == model or not allowed(p):
                continue
            t = tier_of(m, tiers)
            if t is None or t[0] != tier[0]:
                continue
            others.append(((t[1], m, provider_of[p] != own, p), p))
        out[pool] = same + [p for _, p in sorted(others)]
    return out
