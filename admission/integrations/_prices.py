"""Prices and usage: what an admitted call cost.

* **Prices** (``PRICES``, ``cost_of``): a pool's ``price_input`` / ``price_output`` /
  ``price_cached_input`` (USD per million tokens, ``admission.policy.PRICE_KEYS``) read from the
  applied policy, cached per policy version (the version a round was decided under says when
  to read again). A token kind with a count and no price is no cost at all (never a guess);
  cached input without its own price is priced as input (an upper bound).
* **Usage** (``UsageTracker``, ``tokens_of``): OpenAI ``prompt_tokens`` / ``completion_tokens``
  (``prompt_tokens_details.cached_tokens`` inside the prompt), Responses ``input_tokens`` /
  ``output_tokens`` (``input_tokens_details.cached_tokens`` inside the input), Anthropic
  ``input_tokens`` / ``output_tokens`` with ``cache_read_input_tokens`` beside the input
  (``cache_creation_input_tokens`` priced as input); from a result, a stream's items or a JSON
  body.
"""
from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..policy import PRICE_KEYS


def prices_of(policy: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """pool -> its price keys, from an applied policy (pools as a list or a table)."""
    pools = policy.get("pools") or []
    entries = pools.values() if isinstance(pools, Mapping) else pools
    names = pools.keys() if isinstance(pools, Mapping) else (p.get("name") for p in pools)
    out = {}
    for name, entry in zip(names, entries):
        prices = {k: float(entry[k]) for k in PRICE_KEYS if isinstance(entry, Mapping) and entry.get(k) is not None}
        if name and prices:
            out[name] = prices
    return out


class PriceCache:
    """The price table of each admission client, kept for one policy version."""

    def __init__(self) -> None:
        self._tables: "weakref.WeakKeyDictionary[Any, tuple[int, dict]]" = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()

    def get(self, adm: Any, version: int) -> dict[str, dict[str, float]] | None:
        with self._lock:
            kept = self._tables.get(adm)
        return kept[1] if kept is not None and kept[0] == version else None

    def keep(self, adm: Any, policy: Mapping[str, Any]) -> dict[str, dict[str, float]]:
        table = prices_of(policy)
        with self._lock:
            self._tables[adm] = (int(policy.get("version") or 0), table)
        return table


PRICES = PriceCache()


@dataclass(frozen=True)
class Tokens:
    input: int   # uncached input (cache writes included)
    cached: int  # input read from the provider's cache
    output: int


def _get(x: Any, name: str) -> Any:
    if x is None:
        return None
    return x.get(name) if isinstance(x, Mapping) else getattr(x, name, None)


def _count(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


_FLAT = ("prompt_tokens", "completion_tokens", "input_tokens", "output_tokens", "cache_read_input_tokens",
         "cache_creation_input_tokens")


def flat_usage(usage: Any) -> dict[str, int]:
    """The token counts a usage object (or mapping) carries, flattened."""
    out = {k: v for k in (*_FLAT, "cached_tokens") if (v := _count(_get(usage, k))) is not None}
    for details in ("prompt_tokens_details", "input_tokens_details"):
        if (v := _count(_get(_get(usage, details), "cached_tokens"))) is not None:
            out["cached_tokens"] = v
    return out


def output_tokens(flat: Mapping[str, int]) -> int | None:
    """The answer's tokens in a ``flat_usage`` dict (OpenAI ``completion_tokens``, Responses and
    Anthropic ``output_tokens``), None when it has no count of them."""
    return flat.get("completion_tokens", flat.get("output_tokens"))


def tokens_of(usage: Any) -> Tokens | None:
    """Input (uncached), cached input and output tokens of a usage (object, mapping or a
    ``flat_usage`` dict); None when it says nothing."""
    flat = flat_usage(usage)
    if not flat:
        return None
    output = output_tokens(flat) or 0
    if "cache_read_input_tokens" in flat or "cache_creation_input_tokens" in flat:  # Anthropic: beside the input
        return Tokens(flat.get("input_tokens", 0) + flat.get("cache_creation_input_tokens", 0),
                      flat.get("cache_read_input_tokens", 0), output)
    prompt = flat.get("prompt_tokens", flat.get("input_tokens", 0))  # OpenAI: cached inside the prompt
    cached = min(flat.get("cached_tokens", 0), prompt)
    return Tokens(prompt - cached, cached, output)


def answer_received(usage: Any) -> float | None:
    """The answer tokens a usage (object, mapping or ``flat_usage`` dict) counts, None when it
    says nothing: what a declared round received in all."""
    tokens = tokens_of(usage)
    return None if tokens is None else float(tokens.output)


def cost_of(prices: Mapping[str, float] | None, usage: Any) -> float | None:
    """USD of a usage at a pool's prices (per million tokens); None when unknown."""
    tokens = tokens_of(usage) if not isinstance(usage, Tokens) else usage
    if not prices or tokens is None:
        return None
    p_in, p_out = prices.get("price_input"), prices.get("price_output")
    p_cached = prices.get("price_cached_input", p_in)
    total = 0.0
    for n, p in ((tokens.input, p_in), (tokens.cached, p_cached), (tokens.output, p_out)):
        if n:
            if p is None:
                return None  # a count without its price: no cost rather than a wrong one
            total += n * p
    return total / 1e6


class UsageTracker:
    """The usage a stream's items (or a body's events) carried: the latest count of each kind
    wins (Anthropic's ``message_delta`` counts are cumulative; OpenAI's usage chunk is last)."""

    #: where an item keeps a usage: itself (OpenAI chunk, Anthropic message_delta), its message
    #: (message_start / stop), its response (Responses events), its chunk (stream helpers)
    _HOLDERS = ("message", "response", "chunk")

    def __init__(self) -> None:
        self.flat: dict[str, int] = {}

    def see(self, item: Any) -> None:
        for holder in (item, *(_get(item, h) for h in self._HOLDERS)):
            usage = _get(holder, "usage")
            if usage is not None:
                self.flat.update(flat_usage(usage))

    def see_snapshot(self, stream: Any) -> None:
        """When no item showed a usage: the stream helper's accumulated snapshot, if any."""
        if self.flat:
            return
        for attr in ("current_message_snapshot", "current_completion_snapshot"):
            try:
                self.see(getattr(stream, attr))
            except Exception:  # noqa: BLE001 - no snapshot yet is no usage
                continue

    def usage(self) -> dict[str, int] | None:
        return dict(self.flat) or None
