"""Anthropic SDK calls that ask the admission first (``pip install 'admission[anthropic]'``).

    from admission.integrations import anthropic as adm_anthropic
    client = adm_anthropic.wrap(anthropic.Anthropic(), adm, lane="reviews")
    client.messages.create(model="claude-x", max_tokens=1024, messages=[...], round_id="thr-1/r2")

``wrap(client, adm)`` returns a proxy of an ``anthropic.Anthropic`` (with ``Admission``) or
``anthropic.AsyncAnthropic`` (with ``AsyncAdmission``) client. Admitted: ``messages.create``,
``messages.parse`` and the ``messages.stream(...)`` helper (its ``with`` block is the round), and
the same under ``beta.messages``. ``messages.count_tokens`` is not admitted (it runs no model),
nor is anything else the client has.

The choices are the OpenAI wrapper's (``admission.integrations.openai``): one call one round
(lane, agent, round id and pool per call, else ``use(...)``, else the defaults), the SDK's own
retries off and load refusals retried in new rounds, streams holding their round until they end,
calls inside a held round joining it, sizes and progress (``tokens=``, ``declare_budget``: an
Anthropic call's budget is its ``max_tokens``, which it must name), the rate ceilings' declaration
(``max_tokens`` and the estimate of ``system`` / ``messages`` / ``tools``, or ``input_tokens=``)
and usage. Anthropic specifics:

* **529 "overloaded" is load**, like a 429 (the classifier says so by status and by the SDK's
  ``OverloadedError``): retried, and it decreases the pool's estimate; it carries no Retry-After.
* **Cost**: ``input_tokens`` and ``cache_creation_input_tokens`` at ``price_input``,
  ``cache_read_input_tokens`` at ``price_cached_input`` (else ``price_input``), ``output_tokens``
  at ``price_output``; a stream's usage from its ``message_start`` / ``message_delta`` events (or
  the helper's message snapshot). The same four counts go with the round's end for the ceilings
  (``r.usage``: ``input_tokens`` is the uncached part, the cache writes and reads beside it).
* **Rate-limit headers**: ``anthropic-ratelimit-*`` read into the round as the OpenAI wrapper
  reads its own (``r.rate_reading``; a 429 naming a spent ceiling, "... output tokens per
  minute", ends the round ``ceiling``); ``messages.parse`` has no raw form in the SDK, so its
  answer's headers are not read (its errors' are).
"""
from __future__ import annotations

from typing import Any, Mapping

from ._common import MovedAway, Settings, require, use
from ._sdk import wrap_client

_anthropic = require("anthropic", "admission[anthropic]")

__all__ = ["wrap", "use", "MovedAway", "ADMITTED"]

#: The admitted methods: attribute path -> ``call`` | ``manager`` (see ``_sdk.SDKProxy``).
ADMITTED: Mapping[tuple[str, ...], str] = {
    ("messages", "create"): "call",
    ("messages", "parse"): "call",
    ("messages", "stream"): "manager",
    ("beta", "messages", "create"): "call",
    ("beta", "messages", "parse"): "call",
    ("beta", "messages", "stream"): "manager",
}


def wrap(client: Any, adm: Any, *, lane: str | None = None, provider: str = "anthropic",
         pools: Mapping[str, str] | None = None, retries: int = 2, timeout: float = 600.0,
         join: bool = True, declare_budget: bool = False) -> Any:
    """An ``anthropic.Anthropic`` / ``AsyncAnthropic`` client whose model calls are admitted;
    the arguments are ``admission.integrations.openai.wrap``'s."""
    settings = Settings(lane=lane, provider=provider, pools=pools or {}, retries=retries, timeout=timeout, join=join,
                        declare_budget=declare_budget)

    def again(copy: Any) -> Any:
        return wrap(copy, adm, lane=lane, provider=provider, pools=pools, retries=retries, timeout=timeout, join=join,
                    declare_budget=declare_budget)

    types = (_anthropic.Anthropic, _anthropic.AsyncAnthropic)
    return wrap_client(client, adm, sdk="anthropic", types=types, table=ADMITTED, settings=settings, again=again)
