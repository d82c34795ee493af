"""OpenAI SDK calls that ask the admission first (``pip install 'admission[openai]'``).

    from admission.integrations import openai as adm_openai
    client = adm_openai.wrap(openai.OpenAI(), adm, lane="reviews")
    client.chat.completions.create(model="gpt-x", messages=[...], round_id="thr-1/r2")

``wrap(client, adm)`` returns a proxy of an ``openai.OpenAI`` (with ``Admission``) or
``openai.AsyncOpenAI`` (with ``AsyncAdmission``) client. Admitted: ``create`` (and ``parse``) of
``chat.completions``, ``completions``, ``responses`` and ``embeddings``, and the ``.stream(...)``
helpers of ``chat.completions`` and ``responses``. Everything else (files, models,
``with_raw_response`` ...) is the client's own, not admitted.

Choices:

* **One call, one round.** Each admitted call runs inside ``adm.round()``: lane, agent and round
  id from the call's own keyword arguments (``lane=``, ``round_id=``, ``agent=``, ``pool=``,
  popped before the SDK sees them, as are ``tokens=`` and ``input_tokens=``), else from
  ``admission.integrations.use(...)``, else the wrap-time defaults; pool ``pools[model]`` else
  ``f"{model}@{provider}"``; round id a fresh uuid per request unless named. A refused round
  moves only to the alternatives this client can call (its provider's pools, or those ``pools``
  names: ``round(move_to=...)``) and calls that pool's model; a seat elsewhere (the policy
  changed between ranking and admit) raises ``MovedAway``.
* **Every attempt is admitted.** The SDK's own retries are off (``with_options(max_retries=0)``);
  a load refusal (429, 529) is retried by the wrapper up to ``retries`` times, each attempt a new
  ``round()``: it waits for a seat, and for the pause the provider's Retry-After set on the pool.
  Errors propagate out of ``round()``, which classifies them (``admission.classify``) and hands
  the Retry-After on.
* **Cost** from the answer's ``usage`` at the pool's prices in the policy
  (``price_input``, ``price_output``, ``price_cached_input``), reported with the release.
* **Streams** (``stream=True``): the round stays open until the stream is exhausted, closed or
  left (``with``); its cost comes from a usage chunk when there is one (pass
  ``stream_options={"include_usage": True}`` to get one: the wrapper never changes what the
  stream yields).
* **Sizes and progress** (the cap line, design §4). A call may declare its round's size in answer
  tokens: ``tokens=N`` per call, or ``wrap(..., declare_budget=True)`` to declare each call's
  answer budget (``max_completion_tokens`` / ``max_tokens`` / ``max_output_tokens``). Off by
  default: a budget far above what calls produce holds the cap line lower than it need be, and
  one the provider cannot produce within 95 % of ``round_cap`` at the pool's pace keeps the call
  waiting until it is alone on its pool. A declared call's stream reports the answer tokens it
  has received every 15 s (``Round.progress``: the usage the chunks carried, else the text's
  characters / 4), and every declared call ends its round with the answer tokens received in all
  (the usage's ``completion_tokens`` / ``output_tokens``), so a budget is never read as the
  answer's size. A call that declares nothing is admitted as before, and a joined call (below)
  declares nothing: the round it joins has its own size.
* **Rate ceilings** (design §5.9, ``_counts``). Every call declares what it will count against
  its pool's ceilings: ``max_tokens=`` its answer budget (the fields above; an embeddings call 0)
  and ``input_tokens=`` an estimate of its prompt (the characters of its ``messages`` /
  ``input`` / ``prompt`` / ``instructions`` / ``tools`` text / 4; a call's own ``input_tokens=N``,
  popped before the SDK sees it, wins). A request with neither declares nothing of that kind:
  the scope's learned mean per call stands in. A call that answered ends its round with the
  answer's usage (``r.usage``: ``prompt_tokens`` less ``prompt_tokens_details.cached_tokens``
  uncached, those cached as cache reads, ``completion_tokens``; Responses' ``input_tokens`` /
  ``input_tokens_details`` / ``output_tokens``), a stream with its usage chunk (only with
  ``stream_options={"include_usage": True}``), so the buckets are refunded or charged what the
  provider counted beyond the reservation. A failed call (a 429, an error, a broken stream) sends
  no usage: its reservation stays charged. A joined call reserves before it is sent
  (``Round.reserve_call``: the round's first call is its admit's reservation, each later one
  takes its own request and tokens, waiting with its seat while a ceiling cannot cover it) and
  adds its usage to the round's ``r.usage``, so the round's end reconciles all its calls.
* **Join.** A call made inside a ``round()`` of the same admission (this thread or task holds
  it: ``admission.current_round()``) and naming no other ``round_id`` takes no second seat: it
  runs inside that round, books its cost with ``r.charge(cost, key=<request id>)`` (once per
  request) and reports a 429/529 with ``r.report("rate_limited", retry_after=...)`` before
  re-raising; the wrapper does not retry it (the round's owner decides). ``join=False`` turns
  this off (the call is then a delegated sub-round of the held one).
* **Rate-limit headers** (``_rate_headers``): every answer (success or error, streamed or not)
  leaves its response's ``x-ratelimit-*`` headers on the round as ``r.rate_reading``
  (``admission.ratelimits.Reading``), sent with the round's end; no extra request (a call goes
  through the SDK's ``with_raw_response`` form and returns the same parsed answer; a stream's and
  an error's own response carry them). A 429 whose headers or error name a spent ceiling ("...
  on tokens per min (TPM)") sets ``r.ceiling`` / ``r.reset_s``: the round ends ``ceiling``, which
  holds that bucket until its reset and leaves the pool's estimate alone; a 429 naming none is
  load as before. A joined call reports a spent ceiling with ``report("ceiling", ...)``. A header
  that cannot be read is ignored (logged): it never fails the call.
"""
from __future__ import annotations

from typing import Any, Mapping

from ._common import MovedAway, Settings, require, use
from ._sdk import wrap_client

_openai = require("openai", "admission[openai]")

__all__ = ["wrap", "use", "MovedAway", "ADMITTED"]

#: The admitted methods: attribute path -> ``call`` (runs in a round) | ``manager`` (a stream
#: helper whose ``with`` block is the round).
ADMITTED: Mapping[tuple[str, ...], str] = {
    ("chat", "completions", "create"): "call",
    ("chat", "completions", "parse"): "call",
    ("chat", "completions", "stream"): "manager",
    ("completions", "create"): "call",
    ("responses", "create"): "call",
    ("responses", "parse"): "call",
    ("responses", "stream"): "manager",
    ("embeddings", "create"): "call",
}


def wrap(client: Any, adm: Any, *, lane: str | None = None, provider: str = "openai",
         pools: Mapping[str, str] | None = None, retries: int = 2, timeout: float = 600.0,
         join: bool = True, declare_budget: bool = False) -> Any:
    """An ``openai.OpenAI`` / ``AsyncOpenAI`` client whose model calls are admitted (see the
    module's docstring). ``pools``: model -> pool where ``f"{model}@{provider}"`` is not the
    pool's name; ``retries``: load refusals (429/529) tried again, each in a new round;
    ``timeout``: seconds a call waits for a seat (``WaitTimeout``); ``declare_budget``: a call
    that names no ``tokens=`` declares its answer budget (``max_completion_tokens``,
    ``max_tokens``, ``max_output_tokens``) as its round's size."""
    settings = Settings(lane=lane, provider=provider, pools=pools or {}, retries=retries, timeout=timeout, join=join,
                        declare_budget=declare_budget)

    def again(copy: Any) -> Any:
        return wrap(copy, adm, lane=lane, provider=provider, pools=pools, retries=retries, timeout=timeout, join=join,
                    declare_budget=declare_budget)

    return wrap_client(client, adm, sdk="openai", types=(_openai.OpenAI, _openai.AsyncOpenAI), table=ADMITTED,
                       settings=settings, again=again)
