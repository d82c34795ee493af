"""The LiteLLM proxy hook: a LiteLLM proxy asks the admission before each call and reports each
outcome, so every call the proxy makes is a round of the mesh.

    # proxy config.yaml
    litellm_settings:
      callbacks: admission_hook.proxy_handler_instance
    # admission_hook.py (next to config.yaml)
    from admission.integrations.litellm import AdmissionHook
    proxy_handler_instance = AdmissionHook.from_env()

How a request flows (the proxy's documented custom-callback hooks, ``CustomLogger``):

* ``async_pre_call_hook`` — for a completion-like call (chat, text, responses, Anthropic
  messages, generate content) the request waits for a seat: ``admit_waiting`` on its lane and
  pool, at most ``timeout`` seconds. The seat is kept in a dict under the round id (the proxy's
  ``litellm_call_id``), and the id is written into the request's metadata
  (``admission_round``) so the logging callbacks find it. Refused until the timeout: the client
  gets **429** with a ``Retry-After``; the admission unreachable (a refusal
  ``admission-unavailable``, never a silent admit) or without a policy: **503**; a lane or model
  the policy does not know: **400**. Other calls (embeddings, moderation, files …) pass through.
* ``async_log_success_event`` — released ``clean`` with LiteLLM's ``response_cost``, or with the
  pool's own price table when the policy gives one (``price_input`` / ``price_output`` /
  ``price_cached_input``, USD per million tokens, applied to the response's ``usage``); a round
  that declared its size also sends the answer tokens it received (the usage's output count).
  The response's usage goes with the release (``usage=``: what the provider counted), so the
  pool's rate ceilings reconcile what the admit reserved.
* ``async_log_failure_event`` — released with the classified exception (``classify.outcome_of``:
  429/529 = ``rate_limited``, a daily key limit closes the provider, …) and its Retry-After
  (a rate-limited release pauses the pool for every pod).
* ``async_post_call_failure_hook`` — the request failed before (or without) a logged call: the
  seat, if still held, is released here.
* **Rate-limit headers**: the provider's headers LiteLLM passes on (an answer's
  ``_hidden_params["additional_headers"]``, ``llm_provider-`` prefixed; an exception's
  ``litellm_response_headers``) are read into the held seat (``Held.rate_reading``), which its
  release carries (the ceilings learn from it); a 429 whose
  headers or error name a spent ceiling is released ``ceiling`` with that ceiling and its reset
  (the bucket is held, the estimate not cut) instead of ``rate_limited``. A reading that fails is
  logged and the release goes on.

Choices:

* **Exactly once.** Every path releases through ``dict.pop`` of the round id, so whichever
  callback comes first releases and the others find nothing (the proxy fires both failure
  callbacks for one failed call).
* **Nothing orphaned.** A seat whose callbacks never come (a request cancelled between hook and
  call, a logging path that never fires) is released as ``error`` by a small reaper task after
  ``max_hold`` seconds (default: the policy's ``round_cap`` tunable, 1800 s). Meanwhile the
  client's clock keeps its lease alive like any round's.
* **Not the provider's answer, not the provider's load.** A 429 raised by LiteLLM itself (its
  own rate limiters: ``category`` ``litellm_*``; the router's "no deployments available") ends
  the seat as ``error``: it must not shrink the pool's estimate or pause it.
* **Moves follow the seat.** When the admission seats the round on an alternative pool, the
  request's ``model`` is rewritten to that pool's model group (``pools`` reversed, else the
  model part of ``model@<provider>``) so the call runs where the seat is. Only the alternatives
  a model group of this proxy calls are tried (``move_to``); a seat elsewhere (a policy changed
  between the ranking and the admit) keeps the call's model (logged).
* **One client per proxy process**, created lazily in the proxy's event loop (the proxy imports
  the callbacks module before its loop runs). A release that meets an unreachable Redis is kept
  by the client and replayed by its clock, as ``round()`` does.
* **Waiting**: at most ``timeout`` (600 s), or the request's metadata ``admission_timeout`` when
  it is shorter. A request waits in the pre-call hook like any waiter (oldest first, woken by
  releases); a cancelled request task withdraws its waiter (``admit_waiting`` does).
* **Size** (the cap line, design §4): the request's metadata ``admission_tokens`` (answer tokens)
  declares its round's size; with ``declare_budget=True`` a request that names none declares its
  answer budget (``max_completion_tokens`` / ``max_tokens`` / ``max_output_tokens``). Off by
  default, as in the SDK wrappers (``admission.integrations.openai``): a budget is an upper bound,
  and one the provider cannot produce before the round cap keeps the call waiting until it runs
  alone. A size the admission cannot take is a **400**. No progress is reported: the proxy's
  hooks see no stream.
* **Rate ceilings** (design §5.9, ``_counts``): the admit declares the request's answer budget
  (``max_tokens`` ...) and its prompt (the metadata ``admission_input_tokens``, else the estimate
  of its ``messages`` / ``input`` / ``prompt`` / ``system`` / ``tools`` text: characters / 4); a
  failed call sends no usage, and its reservation stays charged.
* **Lane**: the request's metadata ``admission_lane`` (or ``lane``), else the API key's metadata
  ``lane``, else the hook's default lane: the request's choice wins, the key's lane is a
  fallback, not an override (where clients must not choose, override ``lane_of``).
* Keep the router's own retries at 0 (``router_settings.num_retries``) and let the admission's
  ``[alternatives]`` do what router fallbacks would: a failed attempt releases the seat, so a
  retry or a fallback inside the proxy would run without one. The client retries, and asks again.
"""
from __future__ import annotations

import asyncio
import json
import math
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any, Mapping

from fastapi import HTTPException
from litellm.integrations.custom_logger import CustomLogger

from .._log import get_logger
from ._common import answer_budget
from ._counts import declared, usage_of
from ._prices import answer_received, cost_of, prices_of
from ._rate_headers import note
from ..aio import AsyncAdmission
from ..base import release_record
from ..classify import ERROR, RATE_LIMITED, outcome_of, retry_after_of, text_of
from ..codes import UNAVAILABLE
from ..core import Decision
from ..errors import (AdmissionError, BadArgument, NoPolicy, RoundInProgress, Unavailable, UnknownLane,
                      UnknownPool, WaitTimeout)

log = get_logger("admission.integrations.litellm")

#: The proxy's call types that are rounds (a model generating an answer); the rest pass through.
CALL_TYPES = frozenset({
    "completion", "acompletion", "text_completion", "atext_completion", "responses", "aresponses",
    "anthropic_messages", "aanthropic_messages", "generate_content", "agenerate_content",
    "generate_content_stream", "agenerate_content_stream",
})
#: Where the proxy keeps a request's metadata: ``metadata`` on most routes, ``litellm_metadata`` on
#: the routes whose own protocol has a ``metadata`` field (responses, Anthropic messages).
METADATA_KEYS = ("metadata", "litellm_metadata")
ROUND_KEY = "admission_round"  # the round id, in the request's metadata
DEFAULT_URL = "redis://127.0.0.1:6379/0"  # as the CLI's defaults
DEFAULT_MESH = "prod"
DEFAULT_MAX_HOLD = 1800.0  # the round_cap tunable's default, until the policy is read
DEFAULT_REFUSED_RETRY_AFTER = 15.0  # the grow_interval default: when a full pool may have grown
UNAVAILABLE_RETRY_AFTER = 1.0
#: Exceptions that are LiteLLM's own judgement, not an answer of the provider.
_OWN_ERRORS = frozenset({"RouterRateLimitError", "RouterRateLimitErrorBasic", "BudgetExceededError"})


@dataclass
class Held:
    """A seat this proxy holds for one call."""

    decision: Decision
    started: float  # time.monotonic() at admission
    loop: asyncio.AbstractEventLoop  # the loop the admission client lives in
    declared: bool = False  # the round declared its size: its release sends what it received
    rate_reading: Any = None  # the provider's rate-limit headers of the call (ratelimits.Reading)
    ceiling: str | None = None  # the rate ceiling its 429 named as spent, and its reset (s)
    reset_s: float | None = None


class AdmissionHook(CustomLogger):
    """Admission for a LiteLLM proxy (see the module's docstring).

    ``adm``: an ``AsyncAdmission`` to use (else one is made from ``url``, ``mesh``, ``pod`` in the
    proxy's loop at the first call). ``lane``: the lane of a request that names none.
    ``provider``: the provider of a model group that ``pools`` does not map (pool
    ``f"{model_group}@{provider}"``). ``pools``: model group -> pool. ``timeout``: how long a
    request waits for a seat. ``max_hold``: seconds after which a seat whose callbacks never
    came is released as ``error`` (default the policy's ``round_cap``). ``declare_budget``: a
    request that names no ``admission_tokens`` declares its answer budget as its size."""

    call_types = CALL_TYPES

    def __init__(self, adm: AsyncAdmission | None = None, *, url: str | None = None, mesh: str | None = None,
                 pod: str | None = None, lane: str = "default", provider: str = "litellm",
                 pools: Mapping[str, str] | None = None, timeout: float = 600.0, max_hold: float | None = None,
                 declare_budget: bool = False, **kwargs: Any):
        super().__init__(**kwargs)
        self._adm = adm
        self.url = url or DEFAULT_URL
        self.mesh = mesh or DEFAULT_MESH
        self.pod = pod or socket.gethostname()
        self.lane = lane
        self.provider = provider
        self.pools = dict(pools or {})
        self.timeout = float(timeout)
        self.max_hold = max_hold
        if not isinstance(declare_budget, bool):
            raise BadArgument(f"declare_budget must be True or False, got {declare_budget!r}")
        self.declare_budget = declare_budget
        self.held: dict[str, Held] = {}
        self._own_client = adm is None
        self._reaper: asyncio.Task | None = None
        self._reaper_wake: asyncio.Event | None = None
        self._policy_version = -1
        self._prices: dict[str, dict[str, float]] = {}  # pool -> its price table (USD per million tokens)
        self._tunables: dict[str, float] = {}

    @classmethod
    def from_env(cls, **overrides: Any) -> "AdmissionHook":
        """From ADMISSION_URL, ADMISSION_MESH, ADMISSION_POD (default the hostname),
        ADMISSION_LANE, ADMISSION_PROVIDER, ADMISSION_POOLS (a JSON object: model group -> pool),
        ADMISSION_TIMEOUT and ADMISSION_MAX_HOLD (seconds), ADMISSION_DECLARE_BUDGET (1 / 0)."""
        env = os.environ
        opts: dict[str, Any] = {"url": env.get("ADMISSION_URL"), "mesh": env.get("ADMISSION_MESH"),
                                "pod": env.get("ADMISSION_POD")}
        if env.get("ADMISSION_LANE"):
            opts["lane"] = env["ADMISSION_LANE"]
        if env.get("ADMISSION_PROVIDER"):
            opts["provider"] = env["ADMISSION_PROVIDER"]
        if env.get("ADMISSION_POOLS"):
            pools = json.loads(env["ADMISSION_POOLS"])
            if not isinstance(pools, dict) or not all(isinstance(v, str) for v in pools.values()):
                raise ValueError("ADMISSION_POOLS must be a JSON object: model group -> pool")
            opts["pools"] = pools
        if env.get("ADMISSION_TIMEOUT"):
            opts["timeout"] = float(env["ADMISSION_TIMEOUT"])
        if env.get("ADMISSION_MAX_HOLD"):
            opts["max_hold"] = float(env["ADMISSION_MAX_HOLD"])
        if env.get("ADMISSION_DECLARE_BUDGET"):
            if env["ADMISSION_DECLARE_BUDGET"] not in ("0", "1"):
                raise ValueError("ADMISSION_DECLARE_BUDGET must be 1 or 0")
            opts["declare_budget"] = env["ADMISSION_DECLARE_BUDGET"] == "1"
        opts.update(overrides)
        return cls(**opts)

    # -- the client, made in the proxy's loop -------------------------------------------------
    def admission(self) -> AsyncAdmission:
        """The admission client (made at first use, in the running loop: its Redis connections
        and its clock belong to that loop)."""
        if self._adm is None:
            self._adm = AsyncAdmission.from_url(self.url, mesh=self.mesh, pod=self.pod)
            log.info("litellm_hook_ready", mesh=self.mesh, pod=self.pod, lane=self.lane, provider=self.provider)
        return self._adm

    def pool_of(self, model: str) -> str:
        """The pool of a model group: ``pools``' entry, else ``f"{model}@{provider}"``."""
        return self.pools.get(model) or f"{model}@{self.provider}"

    def model_of(self, pool: str) -> str | None:
        """The model group that calls ``pool`` (the reverse of ``pool_of``), or None."""
        for group, p in self.pools.items():
            if p == pool:
                return group
        model, _, provider = pool.rpartition("@")
        return model if provider == self.provider and model not in self.pools else None

    def lane_of(self, data: Mapping[str, Any], user_api_key_dict: Any) -> str:
        """The request's lane: its metadata's, else its API key's, else the hook's default."""
        for meta in _metadatas(data):
            lane = meta.get("admission_lane") or meta.get("lane")
            if isinstance(lane, str) and lane:
                return lane
        key_meta = getattr(user_api_key_dict, "metadata", None)
        if isinstance(key_meta, Mapping):
            lane = key_meta.get("admission_lane") or key_meta.get("lane")
            if isinstance(lane, str) and lane:
                return lane
        return self.lane

    def timeout_of(self, data: Mapping[str, Any]) -> float:
        """How long a request waits for a seat: the hook's ``timeout``, or less when the request's
        metadata asks for less (``admission_timeout``, seconds: a caller that prefers a quick
        429 to a long wait)."""
        for meta in _metadatas(data):
            asked = _number(meta.get("admission_timeout"))
            if asked is not None:
                return min(self.timeout, asked)
        return self.timeout

    def size_of(self, data: Mapping[str, Any]) -> Any:
        """The round's declared size: the metadata's ``admission_tokens`` (checked by the
        admission: a bad one is a 400), else the answer budget when budgets are declared."""
        for meta in _metadatas(data):
            if meta.get("admission_tokens") is not None:
                return meta["admission_tokens"]
        return answer_budget(data) if self.declare_budget else None

    def counts_of(self, data: Mapping[str, Any]) -> dict[str, Any]:
        """What the call will count against the rate ceilings (``_counts.declared``): the
        metadata's ``admission_input_tokens``, else the estimate of the request's prompt, and its
        answer budget."""
        given = next((m["admission_input_tokens"] for m in _metadatas(data)
                      if m.get("admission_input_tokens") is not None), None)
        return declared(data, given)

    # -- the hooks ------------------------------------------------------------------------------
    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any) -> dict | None:
        """Wait for a seat (at most ``timeout``), or refuse the request with an HTTP error."""
        if call_type not in self.call_types or not isinstance(data.get("model"), str):
            return data
        adm = self.admission()
        lane, model = self.lane_of(data, user_api_key_dict), data["model"]
        pool = self.pool_of(model)
        round_id = str(data.get("litellm_call_id") or uuid.uuid4())
        timeout, tokens = self.timeout_of(data), self.size_of(data)
        try:
            # moves only to pools a model group of this proxy calls; declares what the call will
            # count against the rate ceilings
            d = await adm.admit_waiting(lane=lane, model=pool, round_id=round_id, timeout=timeout,
                                        move_to=lambda p: self.model_of(p) is not None, tokens=tokens,
                                        **self.counts_of(data))
        except WaitTimeout as exc:
            reason = exc.reason or "unknown"
            if reason == UNAVAILABLE:
                raise _refusal(503, f"admission unavailable: {exc}", UNAVAILABLE_RETRY_AFTER) from None
            raise _refusal(429, f"admission: no seat on {pool} for lane {lane} within {timeout:g}s "
                                f"(last refusal: {reason})", await self._refused_retry_after()) from None
        except RoundInProgress as exc:
            raise _refusal(409, str(exc)) from None
        except UnknownLane as exc:  # UnknownPool included: the policy does not know what was asked
            what = "model" if isinstance(exc, UnknownPool) else "lane"
            raise _refusal(400, f"admission: {what} not in the policy: {exc}") from None
        except (NoPolicy, Unavailable) as exc:
            raise _refusal(503, f"admission unavailable: {exc}", UNAVAILABLE_RETRY_AFTER) from None
        except BadArgument as exc:  # a lane or model name the admission cannot take
            raise _refusal(400, f"admission: {exc}") from None
        except AdmissionError as exc:
            raise _refusal(503, f"admission error: {exc}", UNAVAILABLE_RETRY_AFTER) from None
        if d.seat is None or d.seat.pod != adm.pod:  # the same call id is running on another pod
            raise _refusal(409, f"round {round_id} is already running on pod {d.seat.pod if d.seat else '?'}")
        self.held[round_id] = Held(d, time.monotonic(), asyncio.get_running_loop(), declared=tokens is not None)
        _metadata_of(data)[ROUND_KEY] = round_id
        if d.moved_from:
            target = self.model_of(d.pool)
            if target is not None:
                data["model"] = target
            log.info("litellm_round_moved", round=round_id, asked=d.moved_from, pool=d.pool, model=target or model)
        await self._note_policy(d)
        self._ensure_reaper()
        return data

    async def async_log_success_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """LiteLLM's success callback: the request's round ends ``clean``, priced from its usage."""
        held = self._take(_round_of(kwargs))
        if held is None:
            return
        note(held, _response_headers(response_obj, kwargs), 200)
        cost = self._price(held.decision.pool, response_obj, kwargs)
        if cost is None:
            cost = _number(kwargs.get("response_cost"))
        usage = _usage(response_obj, kwargs)
        received = answer_received(usage) if held.declared else None
        await self._release(held, "clean", cost=cost, received=received, usage=usage_of(usage))

    async def async_log_failure_event(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any) -> None:
        """LiteLLM's failure callback: the request's round ends with the classified outcome."""
        held = self._take(_round_of(kwargs))
        if held is None:
            return
        exc = kwargs.get("exception")
        _note_error(held, exc)
        cost = _number(kwargs.get("response_cost")) or None  # a failed call is priced only when it cost
        await self._release(held, *_classified(exc), cost=cost)

    async def async_post_call_failure_hook(self, request_data: dict, original_exception: Exception,
                                           user_api_key_dict: Any, traceback_str: str | None = None) -> None:
        """The proxy's failure hook: a round still held ends with the classified outcome."""
        held = self._take(_round_of(request_data))
        if held is not None:
            _note_error(held, original_exception)
            await self._release(held, *_classified(original_exception))
        return None  # the proxy's own error goes to the client

    # -- releases -------------------------------------------------------------------------------
    def _take(self, round_id: str | None) -> Held | None:
        """The seat of ``round_id``, taken out: whoever takes it releases it, once."""
        return self.held.pop(round_id, None) if round_id else None

    async def _release(self, held: Held, outcome: str, retry_after: float | None = None,
                       cost: float | None = None, received: float | None = None, usage: Any = None) -> None:
        """Release on the client's loop (a callback fired on another loop or thread is handed over)."""
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is held.loop:
            await self._release_here(held, outcome, retry_after, cost, received, usage)
        else:
            fut = asyncio.run_coroutine_threadsafe(
                self._release_here(held, outcome, retry_after, cost, received, usage), held.loop)
            await asyncio.wrap_future(fut)

    async def _release_here(self, held: Held, outcome: str, retry_after: float | None, cost: float | None,
                            received: float | None = None, usage: Any = None) -> None:
        adm, seat = self.admission(), held.decision.seat
        assert seat is not None
        seconds = max(0.0, time.monotonic() - held.started)
        # a 429 that named a spent rate ceiling: that bucket is held, the pool's estimate is not cut
        spent = outcome == RATE_LIMITED and held.ceiling is not None
        extra = {"ceiling": held.ceiling, "reset_s": held.reset_s} if spent else {}
        said = "ceiling" if spent else outcome
        if held.rate_reading is not None:  # what the provider's headers said: the ceilings learn from it
            extra["reading"] = held.rate_reading
        if usage is not None:  # what the provider counted: the ceilings reconcile the reservation
            extra["usage"] = usage
        try:
            try:
                await adm.release(seat, outcome=said, seconds=seconds, cost_usd=cost, retry_after=retry_after,
                                  received=received, **extra)
            except BadArgument as exc:  # a price, Retry-After or count it refuses: the seat still goes
                log.error("litellm_release_bad_argument", round=seat.id, cost_usd=cost, retry_after=retry_after,
                          received=received, error=str(exc))
                await adm.release(seat, outcome=outcome, seconds=seconds)
        except (Unavailable, NoPolicy) as exc:
            # as round() does: the client keeps the record (its outbox, else memory) and its clock
            # replays it when Redis answers; a release counts once however often it is sent
            record = release_record(seat, said, seconds, cost, retry_after=retry_after, received=received, **extra)
            await asyncio.to_thread(adm._queue, record, type(exc).__name__)
        except AdmissionError as exc:  # refused for good (unknown seat: expired long ago)
            log.warning("litellm_release_unapplied", round=seat.id, outcome=outcome, cost_usd=cost, error=str(exc))
        else:
            log.debug("litellm_released", round=seat.id, pool=seat.pool, outcome=outcome, seconds=seconds,
                      cost_usd=cost)

    # -- prices and the policy's numbers ----------------------------------------------------------
    async def _note_policy(self, d: Decision) -> None:
        """Read the pools' price tables and the tunables again when the policy changed."""
        if d.config_version == self._policy_version:
            return
        try:
            pol = await self.admission().policy()
        except Exception as exc:  # noqa: BLE001 - prices are an extra; LiteLLM's cost stands in
            log.warning("litellm_policy_unread", error=repr(exc))
            return
        self._prices = prices_of(pol)
        self._tunables = dict(pol.get("tunables", {}))
        self._policy_version = d.config_version
        if self._reaper_wake is not None:
            self._reaper_wake.set()  # a new round_cap: the reaper sleeps by it

    def _price(self, pool: str, response_obj: Any, kwargs: Mapping[str, Any]) -> float | None:
        """The call's cost at the pool's prices (the SDK integrations' rule, ``_prices.cost_of``)
        for the response's usage, or None (no prices for the pool, or no usage)."""
        prices = self._prices.get(pool)
        if not prices:
            return None
        return cost_of(prices, _usage(response_obj, kwargs))

    async def _refused_retry_after(self) -> float:
        """When a refused client may try again: the pool clock's next step (``grow_interval``),
        the earliest a full pool can have grown."""
        try:
            return float((await self.admission().tunables())["grow_interval"])
        except Exception:  # noqa: BLE001 - a refusal goes out whatever Redis says now
            return float(self._tunables.get("grow_interval", DEFAULT_REFUSED_RETRY_AFTER))

    def hold_limit(self) -> float:
        """Seconds after which a held seat is released as ``error``."""
        if self.max_hold is not None:
            return float(self.max_hold)
        return float(self._tunables.get("round_cap", DEFAULT_MAX_HOLD))

    # -- the reaper ---------------------------------------------------------------------------
    def _ensure_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper_wake = asyncio.Event()
            self._reaper = asyncio.get_running_loop().create_task(self._reap_forever(), name="admission-litellm-reaper")

    async def _reap_forever(self) -> None:
        assert self._reaper_wake is not None
        while True:
            limit = self.hold_limit()
            try:
                await self.reap()
            except Exception as exc:  # noqa: BLE001 - the reaper outlives a bad turn
                log.warning("litellm_reaper_error", error=repr(exc))
            self._reaper_wake.clear()
            # a turn every quarter of the limit: a seat is released at most 25 % past it
            try:
                await asyncio.wait_for(self._reaper_wake.wait(), min(30.0, max(0.05, limit / 4)))
            except asyncio.TimeoutError:
                pass

    async def reap(self) -> list[str]:
        """Release as ``error`` every seat held longer than ``hold_limit()``; returns their ids."""
        limit, now = self.hold_limit(), time.monotonic()
        overdue = [rid for rid, h in list(self.held.items()) if now - h.started >= limit]
        reaped = []
        for rid in overdue:
            held = self._take(rid)
            if held is not None:
                log.warning("litellm_seat_reaped", round=rid, pool=held.decision.pool, held_s=now - held.started)
                await self._release(held, ERROR)
                reaped.append(rid)
        return reaped

    async def aclose(self, release_held: bool = True) -> None:
        """Stop the reaper; release the seats still held as ``error`` (the proxy is going away);
        stop the client's clock and close its connections when this hook made it."""
        if self._reaper is not None:
            self._reaper.cancel()
            try:
                await self._reaper
            except asyncio.CancelledError:
                pass
            self._reaper = None
        if release_held:
            for rid in list(self.held):
                held = self._take(rid)
                if held is not None:
                    await self._release(held, ERROR)
        if self._adm is not None and self._own_client:
            await close_admission(self._adm)
            await self._adm.redis.aclose()
            self._adm = None


async def close_admission(adm: AsyncAdmission, attempts: int = 20) -> None:
    """``adm.close()`` that cannot hang: on Python 3.11 ``asyncio.wait_for`` (which redis-py uses
    to send a command) drops a cancellation that lands as the command is sent, so the client's
    clock may never see the cancel of ``close()`` and ``close()`` waits for it forever. Each new
    ``close()`` cancels the clock again; a lost cancel costs a quarter of a second."""
    for _ in range(attempts):
        try:
            await asyncio.wait_for(adm.close(), 0.25)
            return
        except asyncio.TimeoutError:
            log.info("admission_close_retry")
    log.warning("admission_close_gave_up")


# -- what the proxy hands over --------------------------------------------------------------------
def _metadatas(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [m for k in METADATA_KEYS if isinstance(m := data.get(k), Mapping)]


def _metadata_of(data: dict) -> dict:
    """The request's metadata dict the proxy carries into the logging callbacks."""
    key = "litellm_metadata" if isinstance(data.get("litellm_metadata"), dict) and not isinstance(
        data.get("metadata"), dict) else "metadata"
    if not isinstance(data.get(key), dict):
        data[key] = {}
    return data[key]


def _round_of(kwargs: Mapping[str, Any]) -> str | None:
    """The round id of a callback's kwargs (or a request's data): the one the pre-call hook
    wrote into the metadata, else the call id."""
    params = kwargs.get("litellm_params")
    for meta in [*_metadatas(kwargs), *(_metadatas(params) if isinstance(params, Mapping) else [])]:
        rid = meta.get(ROUND_KEY)
        if isinstance(rid, str) and rid:
            return rid
    rid = kwargs.get("litellm_call_id")
    return rid if isinstance(rid, str) and rid else None


def _classified(exc: BaseException | None) -> tuple[str, float | None]:
    """The outcome word and Retry-After of a failed call. LiteLLM's own refusals (its rate
    limiters, the router finding no deployment) say nothing of the provider's load: ``error``."""
    if exc is None:
        return ERROR, None
    names = {t.__name__ for t in type(exc).__mro__}
    category = getattr(exc, "category", None)
    if names & _OWN_ERRORS or (isinstance(category, str) and category.startswith("litellm_")):
        return ERROR, None
    outcome = outcome_of(exc)
    return outcome, (retry_after_of(exc) if outcome == "rate_limited" else None)


def _usage(response_obj: Any, kwargs: Mapping[str, Any]) -> Any:
    """The response's usage, else the token counts of LiteLLM's standard logging payload."""
    usage = response_obj.get("usage") if isinstance(response_obj, Mapping) else getattr(response_obj, "usage", None)
    if usage is not None:
        return usage
    slo = kwargs.get("standard_logging_object")
    if isinstance(slo, Mapping):
        return {k: slo[k] for k in ("prompt_tokens", "completion_tokens") if isinstance(slo.get(k), int)}
    return None


def _response_headers(response_obj: Any, kwargs: Mapping[str, Any]) -> Any:
    """The provider's headers LiteLLM passed on with an answer: ``_hidden_params``'
    ``additional_headers`` (``llm_provider-`` prefixed; ``ratelimits.read`` takes the prefix off),
    else the standard logging payload's."""
    hidden = response_obj.get("_hidden_params") if isinstance(response_obj, Mapping) else \
        getattr(response_obj, "_hidden_params", None)
    if isinstance(hidden, Mapping) and hidden.get("additional_headers") is not None:
        return hidden["additional_headers"]
    slo = kwargs.get("standard_logging_object")
    hidden = slo.get("hidden_params") if isinstance(slo, Mapping) else None
    return hidden.get("additional_headers") if isinstance(hidden, Mapping) else None


def _note_error(held: Held, exc: Any) -> None:
    """Read a failed call's rate-limit headers into ``held``: LiteLLM keeps the provider's on the
    exception (``litellm_response_headers``; its ``response`` may be one it made up)."""
    if exc is None:
        return
    try:
        headers = getattr(exc, "litellm_response_headers", None)
        if headers is None:
            headers = getattr(getattr(exc, "response", None), "headers", None)
        text = text_of(exc)
    except Exception as err:  # noqa: BLE001 - advice to the ceilings, never a failed release
        log.warning("litellm_ratelimit_read_failed", error=repr(err))
        return
    note(held, headers, getattr(exc, "status_code", None), text)


def _number(x: Any) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or x < 0:
        return None
    return float(x)


def _refusal(status: int, message: str, retry_after: float | None = None) -> HTTPException:
    """The error the proxy sends to the client (it keeps an HTTPException's status and headers)."""
    headers = {"retry-after": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
    return HTTPException(status_code=status, detail={"error": message}, headers=headers)
