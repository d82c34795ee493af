"""What a call will count against the provider's rate ceilings, and what the provider counted
(design §5.9): the integrations' side of the ceilings' reserve-and-reconcile.

* **Declared at admit** (``declared``): a round's ``input_tokens`` and ``max_tokens``, read from
  the request. ``max_tokens`` is its answer budget (``max_completion_tokens`` / ``max_tokens`` /
  ``max_output_tokens``, the fields ``declare_budget`` reads; an embeddings call answers no
  tokens: 0). ``input_tokens`` is an *estimate* of the prompt: the characters of its text
  (``messages``, ``input``, ``prompt``, ``system``, ``instructions``, ``tools``) / 4, rounded up
  (``input_estimate``); no SDK counts a prompt's tokens before sending it, and the round's end
  reconciles the estimate with what the provider counted. A call's own ``input_tokens=`` (popped
  before the SDK sees it) overrides the estimate. A request with neither declares nothing of
  that kind, and the scope's learned mean per call stands in for it.
* **Counted at the end** (``usage_of``): the answer's usage as ``admission.Usage`` (uncached
  input, cache creation, cache reads, output), from OpenAI chat (``prompt_tokens``,
  ``prompt_tokens_details.cached_tokens`` inside the prompt, ``completion_tokens``), Responses
  (``input_tokens``, ``input_tokens_details.cached_tokens`` inside the input, ``output_tokens``)
  or Anthropic (``input_tokens`` uncached, ``cache_creation_input_tokens``,
  ``cache_read_input_tokens``, ``output_tokens``; LiteLLM's form of it counts both cache parts
  inside its ``prompt_tokens``) usage, from a result, a stream's items or a JSON body; None when
  it carries no count.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ._prices import flat_usage, output_tokens
from ..core import Usage

#: Where an SDK call names its answer budget (OpenAI chat, OpenAI Responses, Anthropic).
BUDGET_ARGS = ("max_completion_tokens", "max_tokens", "max_output_tokens")
#: Characters per token of a text, for an estimate before the provider has counted.
CHARS_PER_TOKEN = 4.0
#: Where a request keeps the text its prompt is made of (OpenAI chat, completions, Responses,
#: embeddings; Anthropic messages; LiteLLM's and the JSON bodies' same names).
INPUT_FIELDS = ("messages", "input", "prompt", "system", "instructions", "tools", "functions")
#: Keys whose values are no prompt text: structure (roles, types) and binary or linked content
#: (base64 data, URLs), which the providers count by their own rules (an image is not its bytes).
NOT_TEXT = frozenset({"role", "type", "data", "url", "image_url", "file_data", "media_type", "cache_control"})
#: Fields whose keys are text the provider reads too (a tool's JSON schema).
KEYED = frozenset({"tools", "functions"})


def prompt_chars(x: Any, keys: bool = False) -> int:
    """Characters of the text in a request field: its strings (and a mapping's keys when
    ``keys``), a whole number in a list as one token's worth (a prompt given as token ids);
    pydantic objects through ``model_dump()``."""
    if isinstance(x, str):
        return len(x)
    if isinstance(x, bool) or x is None:
        return 0
    if isinstance(x, int):
        return int(CHARS_PER_TOKEN)  # a token id
    if isinstance(x, Mapping):
        return sum(prompt_chars(v, keys) + (len(k) if keys and isinstance(k, str) else 0)
                   for k, v in x.items() if k not in NOT_TEXT)
    if isinstance(x, (list, tuple)):
        return sum(prompt_chars(v, keys) for v in x)
    dump = getattr(x, "model_dump", None)
    if callable(dump):
        try:
            return prompt_chars(dump(exclude_none=True), keys)
        except Exception:  # noqa: BLE001 - an object that cannot say its text counts nothing
            return 0
    return 0


def input_estimate(request: Mapping[str, Any]) -> int | None:
    """The prompt tokens a request will send, estimated: its text's characters / 4, rounded up;
    None when it names none of ``INPUT_FIELDS``."""
    present = [name for name in INPUT_FIELDS if request.get(name) is not None]
    if not present:
        return None
    chars = sum(prompt_chars(request[name], keys=name in KEYED) for name in present)
    return math.ceil(chars / CHARS_PER_TOKEN)


def answer_budget(kwargs: Mapping[str, Any]) -> int | None:
    """The answer budget an SDK call names (``BUDGET_ARGS``), if it names a whole number."""
    for name in BUDGET_ARGS:
        v = kwargs.get(name)
        if isinstance(v, int) and not isinstance(v, bool) and v > 0:
            return v
    return None


def declared(request: Mapping[str, Any], input_tokens: Any = None, answers: bool = True) -> dict[str, Any]:
    """``round()``'s ``input_tokens`` and ``max_tokens`` for a request (each None: not declared).
    ``input_tokens``: the call's own count, which wins over the estimate; ``answers``: False for
    a call that answers no tokens (embeddings: its budget is 0)."""
    return {"input_tokens": input_tokens if input_tokens is not None else input_estimate(request),
            "max_tokens": answer_budget(request) if answers else 0}


def usage_of(usage: Any) -> Usage | None:
    """What the provider counted, as ``admission.Usage`` (see the module's docstring): None
    when the usage (object, mapping or ``flat_usage`` dict) has no count of input or output."""
    flat = flat_usage(usage)
    output = output_tokens(flat)
    if "cache_read_input_tokens" in flat or "cache_creation_input_tokens" in flat:
        creation, reads = flat.get("cache_creation_input_tokens", 0), flat.get("cache_read_input_tokens", 0)
        if "prompt_tokens" in flat:  # LiteLLM's form of Anthropic's: its prompt_tokens holds both cache parts
            uncached = max(0, flat["prompt_tokens"] - creation - reads)
        else:  # Anthropic's own: input_tokens is the uncached part, the cache parts beside it
            uncached = flat.get("input_tokens", 0)
        return Usage(input_tokens=uncached, cache_creation_tokens=creation, cache_read_tokens=reads,
                     output_tokens=output or 0)
    prompt = flat.get("prompt_tokens", flat.get("input_tokens"))
    if prompt is None and output is None:
        return None
    cached = min(flat.get("cached_tokens", 0), prompt or 0)  # OpenAI: the cached part is inside the prompt
    return Usage(input_tokens=(prompt or 0) - cached, cache_read_tokens=cached, output_tokens=output or 0)


def add_usage(handle: Any, usage: Usage | None) -> None:
    """A joined call's usage added to the round it joined (``handle.usage``): the round's end
    reconciles the sum of its calls. A usage its owner set by hand as something other than a
    ``Usage`` (a mapping) is the owner's word and is left as it is."""
    if usage is None:
        return
    have = getattr(handle, "usage", None)
    if have is None:
        handle.usage = usage
    elif isinstance(have, Usage):
        handle.usage = Usage(input_tokens=have.input_tokens + usage.input_tokens,
                             cache_creation_tokens=have.cache_creation_tokens + usage.cache_creation_tokens,
                             cache_read_tokens=have.cache_read_tokens + usage.cache_read_tokens,
                             output_tokens=have.output_tokens + usage.output_tokens)
