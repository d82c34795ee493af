"""Where the rounds really run: admission around the calls that reach a provider.

Four ways in, each its own submodule, imported only when used (importing
``admission.integrations`` imports no SDK; ``import admission`` imports none of this):

* ``admission.integrations.openai.wrap(client, adm, lane=...)``: an ``openai.OpenAI`` /
  ``AsyncOpenAI`` client whose ``create`` / ``parse`` calls (chat completions, completions,
  responses, embeddings) each run in a round (extra ``admission[openai]``);
* ``admission.integrations.anthropic.wrap(client, adm, lane=...)``: the same for
  ``anthropic.Anthropic`` / ``AsyncAnthropic`` (``messages.create``, ``messages.stream``; extra
  ``admission[anthropic]``);
* ``admission.integrations.httpx.AdmissionTransport`` / ``AsyncAdmissionTransport``: each HTTP
  request a round, for any API or as an SDK's ``http_client`` transport (needs ``httpx``);
* ``admission.integrations.litellm``: LiteLLM calls (extra ``admission[litellm]``);
* ``admitted(adm, lane=..., model=...)``: a decorator for plain functions, sync or async.

And ``use(lane=..., round_id=..., agent=...)``, a context (``with`` / ``async with``) that names
the lane, round id and agent of the admitted calls made inside it. Per call, the SDK wrappers also
take ``lane=``, ``round_id=``, ``agent=``, ``pool=``, ``tokens=`` (the round's declared size in
answer tokens) and ``input_tokens=`` (its prompt's tokens for the rate ceilings, instead of the
estimate); popped before the SDK sees them.

What they share, whichever you use: the SDK's or transport's errors are classified by the one
classifier (``admission.classify``: 429/529 are load, with their Retry-After pausing the pool for
every pod), the cost comes from the answer's usage at the pool's prices in the policy
(``price_input``, ``price_output``, ``price_cached_input`` per million tokens), a round declares
what its call will count against the rate ceilings (its answer budget, an estimate of its prompt)
and ends with what the provider counted (the answer's usage, which the ceilings reconcile), a
stream holds its seat until it ends, and a call made inside a ``round()`` of the same admission
joins that round instead of taking a second seat. The details and the choices are in each module's docstring.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["admitted", "use", "MovedAway", "openai", "anthropic", "httpx", "litellm", "decorator"]

_SUBMODULES = ("openai", "anthropic", "httpx", "litellm", "decorator")
_NAMES = {"admitted": "decorator", "use": "_common", "MovedAway": "_common"}


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
