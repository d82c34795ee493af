"""What the integrations share: one source for each fact.

Here, where a call runs and ``log``:

* **Where a call runs** (``use``, ``Settings``, ``ask_for``): the lane, agent and round id of an
  admitted call come from its own keyword arguments (popped before the SDK sees them), else from
  the ``use(...)`` context, else from the wrap-time defaults; its pool is the call's ``pool=``,
  else ``pools[model]``, else ``f"{model}@{provider}"``; its round id, when none is named, is a
  fresh ``uuid4().hex`` per request (a round id names one round in the census, the events and
  the logs, so ids are never reused behind the caller's back; a caller may reuse its own: the
  ledger books each admission's costs, its idempotency key carries the admission's seq).
* **Joining** (``joinable``): a call made inside a ``round()`` of the same admission (the round
  this task or thread holds, ``admission.current_round()``) takes no second seat unless it names
  another round id: it runs inside that round, its cost is booked with ``r.charge(cost, key)``
  (once per request id) and a 429/529 it meets is reported with ``r.report("rate_limited", ...)``
  on that round (only when the call ran on the round's own pool: load on another pool is not
  the round pool's load). Before it is sent it reserves through ``Round.reserve_call`` (the
  round's first call is its admit's reservation, each later one takes its own from the rate
  ceilings), and its usage is added to the round's (``_counts.add_usage``), which the round's end
  reconciles.

The rest, each in its own module and each building only on the ones before it:

* ``_prices``: prices and usage (``PRICES``, ``cost_of``, ``UsageTracker``, ``tokens_of``);
* ``_counts``: what a call declares to the rate ceilings and what the provider counted
  (``declared``, ``answer_budget``, ``usage_of``; built on ``_prices`` alone, this module uses it);
* ``_primitives``: what really differs between the asyncio and the sync flavour;
* ``_rate_headers``: the providers' rate-limit headers of each response, read into its round;
* ``_streams``: a stream's progress; ``_streams_async``: rounds that outlive the call and the
  streams that hold them (``AsyncHeldRound``, ``AsyncRoundStream``, its manager);
* ``_calls``: what the runners share (``CallsBase``, ``check_pair``); ``_calls_async``: SDK
  calls (``AsyncCalls``);
* ``_sdk``: the SDK proxies (``SDKProxy``, ``wrap_client``);
* ``_http`` and ``_httpx_async``: the httpx transports (``httpx`` builds the concrete classes).

Each ``*_async`` module is the source of a ``*_sync`` one (``HeldRound``, ``RoundStream``,
``Calls``, the sync transport) that ``scripts/unasync.py`` generates from it.
"""
from __future__ import annotations

import contextvars
import importlib
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

from ._counts import BUDGET_ARGS, answer_budget, declared  # noqa: F401 - BUDGET_ARGS, answer_budget: as before
from .._log import get_logger
from ..base import current_round
from ..classify import RATE_LIMITED, signal_of
from ..errors import AdmissionError, BadArgument

log = get_logger("admission.integrations")

#: The keyword arguments an admitted call may carry for the admission (popped before the SDK).
CALL_ARGS = ("lane", "round_id", "agent", "pool", "tokens", "input_tokens")


def require(module: str, extra: str) -> ModuleType:
    """Import an optional SDK, or a one-line ImportError naming the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"admission.integrations needs {module!r}: pip install '{extra}'") from exc


class MovedAway(AdmissionError):
    """The round was seated on an alternative pool this client cannot call (another provider's).
    Give SDK-wrapped lanes alternatives on their own provider, or pin them ([pins])."""


# -- where a call runs ----------------------------------------------------------------------------
_CONTEXT: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "admission_integrations_use", default=MappingProxyType({}))


class use:
    """``with use(lane="reviews", round_id="thr-1/r2", agent="reviewer"):`` (or ``async with``):
    the admitted calls made inside (this thread, or this task and the tasks it starts) take these
    unless the call names its own. Nests: an inner ``use`` overrides what it names."""

    def __init__(self, *, lane: str | None = None, round_id: str | None = None, agent: str | None = None):
        self._values = {k: v for k, v in (("lane", lane), ("round_id", round_id), ("agent", agent)) if v is not None}
        for k, v in self._values.items():
            if not isinstance(v, str) or not v:
                raise BadArgument(f"use(): {k} must be a non-empty string, got {v!r}")
        self._tokens: list[contextvars.Token] = []  # a stack: the same use() may be entered twice

    def __enter__(self) -> "use":
        self._tokens.append(_CONTEXT.set(MappingProxyType({**_CONTEXT.get(), **self._values})))
        return self

    def __exit__(self, *exc: Any) -> None:
        _CONTEXT.reset(self._tokens.pop())

    async def __aenter__(self) -> "use":
        return self.__enter__()

    async def __aexit__(self, *exc: Any) -> None:
        self.__exit__(*exc)


def context() -> Mapping[str, str]:
    """What the innermost ``use(...)`` says (lane, round_id, agent)."""
    return _CONTEXT.get()


@dataclass(frozen=True)
class Settings:
    """A wrapper's defaults: ``lane``, the ``provider`` a model's pool is named after, explicit
    ``pools`` (model -> pool), load refusals retried (``retries``), the wait for a seat
    (``timeout``), whether calls inside a held round join it (``join``) and whether a call's
    answer budget is its round's declared size (``declare_budget``)."""

    lane: str | None = None
    provider: str | None = None
    pools: Mapping[str, str] = field(default_factory=dict)
    retries: int = 2
    timeout: float = 600.0
    join: bool = True
    declare_budget: bool = False

    def __post_init__(self) -> None:
        if self.lane is not None and (not isinstance(self.lane, str) or not self.lane):
            raise BadArgument(f"lane must be a non-empty string or None, got {self.lane!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise BadArgument(f"retries must be a whole number >= 0, got {self.retries!r}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not self.timeout > 0:
            raise BadArgument(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        if not isinstance(self.declare_budget, bool):
            raise BadArgument(f"declare_budget must be True or False, got {self.declare_budget!r}")
        pools = dict(self.pools or {})
        for model, pool in pools.items():
            if not isinstance(pool, str) or "@" not in pool:
                raise BadArgument(f"pools[{model!r}] must be a pool name model@provider, got {pool!r}")
        object.__setattr__(self, "pools", MappingProxyType(pools))

    def pool_of(self, model: Any) -> str:
        """The pool a model's calls ask for."""
        if isinstance(model, str) and model in self.pools:
            return self.pools[model]
        if not isinstance(model, str) or not model:
            raise BadArgument(f"cannot name the pool of model {model!r}: pass pool= to the call")
        if not self.provider:
            raise BadArgument(f"no pool for model {model!r}: pass pools={{...}} or provider= when wrapping, "
                              "or pool= to the call")
        return f"{model}@{self.provider}"

    def model_for(self, pool: str, ask: "Ask") -> str | None:
        """The model to call on the pool a round was seated on (None: not this client's pool)."""
        if pool == ask.pool:
            return ask.model
        for model, p in self.pools.items():
            if p == pool:
                return model
        model, _, provider = pool.rpartition("@")
        return model if provider == self.provider else None


@dataclass(frozen=True)
class Ask:
    """One admitted call: where it asks to run."""

    lane: str | None
    agent: str | None
    pool: str
    model: str | None
    round_id: str
    tokens: float | None = None  # the round's declared size (answer tokens), None: not declared
    # what its call will count against the rate ceilings (``_counts.declared``), None: not declared
    input_tokens: float | None = None
    max_tokens: float | None = None


def pop_call_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the admission's keyword arguments out of an SDK call's (None counts as not given)."""
    given = {k: kwargs.pop(k) for k in CALL_ARGS if k in kwargs}
    return {k: v for k, v in given.items() if v is not None}


def ask_for(settings: Settings, given: Mapping[str, Any], model: Any,
            call_kwargs: Mapping[str, Any] | None = None, answers: bool = True) -> Ask:
    """Per call, else the ``use()`` context, else the wrap-time default. The size: the call's
    ``tokens=``, else its answer budget when the wrapper declares budgets, else none. What it
    will count against the ceilings: its ``input_tokens=``, else the estimate of its prompt,
    and its answer budget (``answers``: False for a call that answers no tokens), from
    ``call_kwargs`` (the SDK's arguments, or a request's JSON body)."""
    ctx = _CONTEXT.get()
    lane = given.get("lane") or ctx.get("lane") or settings.lane
    agent = given.get("agent") or ctx.get("agent")
    if not lane and not agent:
        raise BadArgument("no lane for this call: pass lane= when wrapping or to the call, or use(lane=...)")
    pool = given.get("pool") or settings.pool_of(model)
    round_id = given.get("round_id") or ctx.get("round_id") or uuid.uuid4().hex
    tokens = given.get("tokens")
    if tokens is None and settings.declare_budget:
        tokens = answer_budget(call_kwargs or {})
    counts = declared(call_kwargs or {}, given.get("input_tokens"), answers)
    return Ask(lane=lane, agent=agent, pool=pool, model=model if isinstance(model, str) else None,
               round_id=round_id, tokens=tokens, **counts)


def joinable(adm: Any, settings: Settings, given: Mapping[str, Any]) -> Any:
    """The round this call joins: the one held here by the same admission, unless the call
    names another round id (a ``use()`` round id is a default for new rounds, not a name)."""
    if not settings.join:
        return None
    handle = current_round()
    if handle is None or getattr(handle, "_adm", None) is not adm:
        return None
    named = given.get("round_id")
    return handle if named in (None, handle.seat.id) else None


def is_load(exc: BaseException) -> bool:
    """A provider's load refusal (429, 529): worth another admitted attempt."""
    try:
        return signal_of(exc) == RATE_LIMITED
    except AdmissionError:
        return False


_KEY_BAD = re.compile(r"[^\w.\-/:@#]")


def charge_key(*sources: Any) -> str:
    """The idempotency key of a joined call's charge: the provider's request id (or the
    answer's id), else a fresh uuid; shaped to what the ledger accepts."""
    for src in sources:
        for cand in _request_ids(src):
            if isinstance(cand, str) and cand:
                return "call:" + _KEY_BAD.sub("_", cand)[:180]
    return "call:" + uuid.uuid4().hex


def _request_ids(src: Any) -> list[Any]:
    if src is None:
        return []
    found = [getattr(src, "_request_id", None)]
    headers = getattr(getattr(src, "response", None), "headers", None)
    if headers is not None:
        found += [headers.get("x-request-id"), headers.get("request-id")]
    found.append(getattr(src, "id", None))
    return found
