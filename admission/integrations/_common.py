"""What the integrations share: one source for each fact, sync and async side by side.

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
  the round pool's load).
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
* **Rounds that outlive the call** (``HeldRound``, ``AsyncHeldRound``): a stream's round is
  opened by the call and closed when the stream ends, in a copy of the caller's context, so the
  caller does not find itself "inside" that round after the call returned (no join into it, no
  delegation under it).
* **Streams** (``RoundStream``, ``AsyncRoundStream`` and the managers of the SDKs' ``.stream()``
  helpers): the round ends when the stream is exhausted, closed or left (``with``), or fails
  (classified); a stream dropped unclosed ends its round when it is collected (logged).
* **SDK calls** (``Calls``, ``AsyncCalls``, ``SDKProxy``): the admitted methods of an SDK client
  run through the admission; everything else passes through untouched.
"""
from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import itertools
import re
import threading
import uuid
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any, Callable

from .._log import get_logger
from ..base import current_round
from ..classify import RATE_LIMITED, signal_of, retry_after_of
from ..errors import AdmissionError, BadArgument
from ..policy import PRICE_KEYS

log = get_logger("admission.integrations")

#: The keyword arguments an admitted call may carry for the admission (popped before the SDK).
CALL_ARGS = ("lane", "round_id", "agent", "pool")


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
    (``timeout``) and whether calls inside a held round join it (``join``)."""

    lane: str | None = None
    provider: str | None = None
    pools: Mapping[str, str] = field(default_factory=dict)
    retries: int = 2
    timeout: float = 600.0
    join: bool = True

    def __post_init__(self) -> None:
        if self.lane is not None and (not isinstance(self.lane, str) or not self.lane):
            raise BadArgument(f"lane must be a non-empty string or None, got {self.lane!r}")
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise BadArgument(f"retries must be a whole number >= 0, got {self.retries!r}")
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not self.timeout > 0:
            raise BadArgument(f"timeout must be a positive number of seconds, got {self.timeout!r}")
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


def pop_call_args(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the admission's keyword arguments out of an SDK call's (None counts as not given)."""
    given = {k: kwargs.pop(k) for k in CALL_ARGS if k in kwargs}
    return {k: v for k, v in given.items() if v is not None}


def ask_for(settings: Settings, given: Mapping[str, Any], model: Any) -> Ask:
    """Per call, else the ``use()`` context, else the wrap-time default."""
    ctx = _CONTEXT.get()
    lane = given.get("lane") or ctx.get("lane") or settings.lane
    agent = given.get("agent") or ctx.get("agent")
    if not lane and not agent:
        raise BadArgument("no lane for this call: pass lane= when wrapping or to the call, or use(lane=...)")
    pool = given.get("pool") or settings.pool_of(model)
    round_id = given.get("round_id") or ctx.get("round_id") or uuid.uuid4().hex
    return Ask(lane=lane, agent=agent, pool=pool, model=model if isinstance(model, str) else None,
               round_id=round_id)


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


# -- prices -----------------------------------------------------------------------------------------
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


def tokens_of(usage: Any) -> Tokens | None:
    """Input (uncached), cached input and output tokens of a usage (object, mapping or a
    ``flat_usage`` dict); None when it says nothing."""
    flat = flat_usage(usage)
    if not flat:
        return None
    output = flat.get("completion_tokens", flat.get("output_tokens", 0))
    if "cache_read_input_tokens" in flat or "cache_creation_input_tokens" in flat:  # Anthropic: beside the input
        return Tokens(flat.get("input_tokens", 0) + flat.get("cache_creation_input_tokens", 0),
                      flat.get("cache_read_input_tokens", 0), output)
    prompt = flat.get("prompt_tokens", flat.get("input_tokens", 0))  # OpenAI: cached inside the prompt
    cached = min(flat.get("cached_tokens", 0), prompt)
    return Tokens(prompt - cached, cached, output)


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


# -- rounds that outlive the call that opened them ----------------------------------------------------
class HeldRound:
    """A ``round()`` opened by one call and closed later (a stream's end), in a copy of the
    caller's context: the round's own context variables never leak into the caller's."""

    def __init__(self, cm: Any):
        self._cm, self._ctx = cm, contextvars.copy_context()
        self._open = False
        self._lock = threading.Lock()
        self.handle: Any = None

    def open(self) -> Any:
        self.handle = self._ctx.run(self._cm.__enter__)
        self._open = True
        return self.handle

    def close(self, exc: BaseException | None = None) -> None:
        with self._lock:
            if not self._open:
                return
            self._open = False
        args = (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)
        self._ctx.run(self._cm.__exit__, *args)


class AsyncHeldRound:
    """``HeldRound`` for asyncio: each step runs as a task in the round's own context copy; the
    release is shielded from the caller's cancellation."""

    def __init__(self, cm: Any):
        self._cm, self._ctx = cm, contextvars.copy_context()
        self._open = False
        self.handle: Any = None

    async def open(self) -> Any:
        task = asyncio.get_running_loop().create_task(self._cm.__aenter__(), context=self._ctx)
        try:
            self.handle = await task
        except BaseException as exc:
            if task.done() and not task.cancelled() and task.exception() is None:
                self.handle, self._open = task.result(), True  # seated as the caller was cancelled
                await self.close(exc)
            raise
        self._open = True
        return self.handle

    async def close(self, exc: BaseException | None = None) -> None:
        if not self._open:
            return
        self._open = False
        args = (None, None, None) if exc is None else (type(exc), exc, exc.__traceback__)
        task = asyncio.get_running_loop().create_task(self._cm.__aexit__(*args), context=self._ctx)
        await asyncio.shield(task)


# -- streams ------------------------------------------------------------------------------------------
class _StreamBase:
    """What the sync and async stream proxies share: the inner stream, the usage seen, and
    everything else passed through (``response``, ``text_stream``, ``get_final_message`` ...)."""

    def __init__(self, inner: Any, end: Callable[..., Any]):
        self.inner = inner
        self.usage = UsageTracker()
        self._end = end
        self._ended = False

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "usage", "_end", "_ended"):  # not set yet (a failed __init__)
            raise AttributeError(name)
        return getattr(self.inner, name)

    def _ending(self) -> bool:
        """True once: the caller that gets it ends the round."""
        if self._ended:
            return False
        self._ended = True
        self.usage.see_snapshot(self.inner)
        return True


class RoundStream(_StreamBase):
    """An SDK stream whose round ends with it: exhausted, closed, left (``with``) or failed.
    ``end(exc, stream)`` is called once."""

    def __iter__(self) -> "RoundStream":
        return self

    def __next__(self) -> Any:
        try:
            item = next(self.inner)
        except StopIteration:
            self._finish(None)
            raise
        except BaseException as exc:
            self._finish(exc)
            raise
        self.usage.see(item)
        return item

    def close(self) -> None:
        try:
            self.inner.close()
        finally:
            self._finish(None)

    def __enter__(self) -> "RoundStream":
        return self

    def __exit__(self, _t: Any, exc: BaseException | None, _tb: Any) -> None:
        try:
            self.inner.close()
        finally:
            self._finish(exc)

    def _finish(self, exc: BaseException | None) -> None:
        if self._ending():
            self._end(exc, self)

    def __del__(self) -> None:
        if not self.__dict__.get("_ended", True):
            log.warning("stream_not_closed", hint="close the stream or use it in a with-block; its round ends now")
            try:
                self._finish(None)
            except Exception as exc:  # noqa: BLE001 - a finalizer never raises
                log.warning("stream_round_end_failed", error=repr(exc))


class AsyncRoundStream(_StreamBase):
    """``RoundStream`` for asyncio streams (``async for``, ``await close()``, ``async with``)."""

    def __init__(self, inner: Any, end: Callable[..., Any]):
        super().__init__(inner, end)
        self._loop = asyncio.get_running_loop()

    def __aiter__(self) -> "AsyncRoundStream":
        return self

    async def __anext__(self) -> Any:
        try:
            item = await self.inner.__anext__()
        except StopAsyncIteration:
            await self._finish(None)
            raise
        except BaseException as exc:
            await self._finish(exc)
            raise
        self.usage.see(item)
        return item

    async def close(self) -> None:
        try:
            await self.inner.close()
        finally:
            await self._finish(None)

    aclose = close

    async def __aenter__(self) -> "AsyncRoundStream":
        return self

    async def __aexit__(self, _t: Any, exc: BaseException | None, _tb: Any) -> None:
        try:
            await self.inner.close()
        finally:
            await self._finish(exc)

    async def _finish(self, exc: BaseException | None) -> None:
        if self._ending():
            await self._end(exc, self)

    def __del__(self) -> None:
        loop = self.__dict__.get("_loop")
        if not self.__dict__.get("_ended", True) and loop is not None and not loop.is_closed():
            log.warning("stream_not_closed", hint="close the stream or use it in async with; its round ends now")
            loop.call_soon_threadsafe(_spawn, loop, self._finish(None))


_TASKS: set[asyncio.Task] = set()  # tasks started from a finalizer, kept until they end


def _spawn(loop: asyncio.AbstractEventLoop, coro: Any) -> None:
    task = loop.create_task(coro)
    _TASKS.add(task)
    task.add_done_callback(_TASKS.discard)


class RoundStreamManager:
    """The manager an SDK's ``.stream(...)`` helper returns, admitted: the round opens (and the
    request goes) at ``with``, and ends when the block is left."""

    def __init__(self, start: Callable[[], tuple[Any, Any, Callable[..., Any]]]):
        self._start = start
        self._inner: Any = None
        self._stream: RoundStream | None = None

    def __enter__(self) -> RoundStream:
        self._inner, stream, end = self._start()
        self._stream = RoundStream(stream, end)
        return self._stream

    def __exit__(self, t: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            self._inner.__exit__(t, exc, tb)
        finally:
            self._stream._finish(exc)  # type: ignore[union-attr]


class AsyncRoundStreamManager:
    """``RoundStreamManager`` for ``async with``."""

    def __init__(self, start: Callable[[], Any]):
        self._start = start
        self._inner: Any = None
        self._stream: AsyncRoundStream | None = None

    async def __aenter__(self) -> AsyncRoundStream:
        self._inner, stream, end = await self._start()
        self._stream = AsyncRoundStream(stream, end)
        return self._stream

    async def __aexit__(self, t: Any, exc: BaseException | None, tb: Any) -> None:
        try:
            await self._inner.__aexit__(t, exc, tb)
        finally:
            await self._stream._finish(exc)  # type: ignore[union-attr]


# -- SDK calls ---------------------------------------------------------------------------------------
def check_pair(adm: Any, is_async: bool, what: str) -> None:
    """A sync client needs a sync ``Admission``, an asyncio one an ``AsyncAdmission``."""
    from ..aio import AsyncAdmission
    from ..client import Admission

    want = AsyncAdmission if is_async else Admission
    if not isinstance(adm, want):
        raise BadArgument(f"{what} needs an admission.{want.__name__}, got {type(adm).__name__}"
                          + (" (an asyncio client waits with AsyncAdmission)" if is_async
                             else " (a sync client waits with Admission)"))


class _CallsBase:
    """What the sync and async runners share: resolving, the model to call, retry decisions."""

    def __init__(self, adm: Any, settings: Settings):
        self.adm, self.settings = adm, settings

    def round_for(self, ask: Ask) -> Any:
        return self.adm.round(lane=ask.lane, model=ask.pool, round_id=ask.round_id, timeout=self.settings.timeout,
                              agent=ask.agent)

    def _kwargs(self, kwargs: dict[str, Any], ask: Ask, handle: Any) -> dict[str, Any]:
        """The SDK's arguments for the pool the round was seated on (it may have moved)."""
        if handle.pool == ask.pool:
            return kwargs
        model = self.settings.model_for(handle.pool, ask)
        if model is None:
            raise MovedAway(f"round {ask.round_id} was seated on {handle.pool}, which this client cannot call "
                            f"(asked for {ask.pool})")
        log.info("call_moved", round=ask.round_id, asked=ask.pool, pool=handle.pool, model=model)
        return {**kwargs, "model": model}

    def _retry(self, exc: BaseException, attempt: int, ask: Ask) -> bool:
        if attempt >= self.settings.retries or not is_load(exc):
            return False
        log.info("provider_refused_retry", round=ask.round_id, pool=ask.pool, attempt=attempt + 1,
                 status=getattr(exc, "status_code", None), retry_after=retry_after_of(exc))
        return True

    def _call_pool(self, given: Mapping[str, Any], model: Any) -> str | None:
        try:
            return given.get("pool") or self.settings.pool_of(model)
        except BadArgument:
            return None


class Calls(_CallsBase):
    """Runs an SDK client's admitted methods (sync)."""

    def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        given = pop_call_args(kwargs)
        stream = kwargs.get("stream") is True
        handle = joinable(self.adm, self.settings, given)
        if handle is not None:
            return self._joined(handle, self._call_pool(given, kwargs.get("model")), fn, args, kwargs, stream)
        ask = ask_for(self.settings, given, kwargs.get("model"))
        for attempt in itertools.count():
            try:
                return self._admitted(ask, fn, args, kwargs, stream)
            except Exception as exc:
                if not self._retry(exc, attempt, ask):
                    raise

    def manager(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> RoundStreamManager:
        given = pop_call_args(kwargs)

        def start() -> tuple[Any, Any, Callable[..., Any]]:
            handle = joinable(self.adm, self.settings, given)
            if handle is not None:
                pool = self._call_pool(given, kwargs.get("model"))
                inner = fn(*args, **kwargs)
                try:
                    stream = inner.__enter__()
                except Exception as exc:
                    self.report_load(handle, pool, exc)
                    raise
                return inner, stream, functools.partial(self._end_joined, handle, pool)
            ask = ask_for(self.settings, given, kwargs.get("model"))
            for attempt in itertools.count():
                held = HeldRound(self.round_for(ask))
                r = held.open()
                try:
                    inner = fn(*args, **self._kwargs(kwargs, ask, r))
                    return inner, inner.__enter__(), functools.partial(self._end_held, held)
                except BaseException as exc:
                    held.close(exc)
                    if not (isinstance(exc, Exception) and self._retry(exc, attempt, ask)):
                        raise
            raise AssertionError("unreachable")

        return RoundStreamManager(start)

    def _admitted(self, ask: Ask, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any], stream: bool) -> Any:
        if stream:
            held = HeldRound(self.round_for(ask))
            r = held.open()
            try:
                result = fn(*args, **self._kwargs(kwargs, ask, r))
            except BaseException as exc:
                held.close(exc)
                raise
            return RoundStream(result, functools.partial(self._end_held, held))
        with self.round_for(ask) as r:
            result = fn(*args, **self._kwargs(kwargs, ask, r))
            r.cost_usd = self.cost(r.decision.config_version, r.pool, _get(result, "usage"))
            return result

    def _end_held(self, held: HeldRound, exc: BaseException | None, stream: RoundStream) -> None:
        r = held.handle
        try:
            r.cost_usd = self.cost(r.decision.config_version, r.pool, stream.usage.usage())
        finally:
            held.close(exc)

    # joined: inside the round this thread holds
    def _joined(self, handle: Any, pool: str | None, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
                stream: bool) -> Any:
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:
            self.report_load(handle, pool, exc)
            raise
        if stream:
            return RoundStream(result, functools.partial(self._end_joined, handle, pool))
        self.charge(handle, pool, _get(result, "usage"), charge_key(result))
        return result

    def _end_joined(self, handle: Any, pool: str | None, exc: BaseException | None, stream: RoundStream) -> None:
        self.charge(handle, pool, stream.usage.usage(), charge_key(stream.inner))
        if isinstance(exc, Exception):
            self.report_load(handle, pool, exc)

    def report_load(self, handle: Any, pool: str | None, exc: Any) -> None:
        if pool == handle.pool and is_load(exc):
            try:
                handle.report(RATE_LIMITED, retry_after=retry_after_of(exc))
            except AdmissionError as err:  # the call's own error is what the caller must see
                log.warning("joined_report_failed", round=handle.seat.id, error=str(err))

    def charge(self, handle: Any, pool: str | None, usage: Any, key: str) -> None:
        cost = self.cost(handle.decision.config_version, pool, usage) if pool else None
        if cost:
            try:
                handle.charge(cost, key=key)
            except AdmissionError as err:
                log.warning("joined_charge_failed", round=handle.seat.id, key=key, error=str(err))

    def cost(self, version: int, pool: str, usage: Any) -> float | None:
        if usage is None:
            return None
        table = PRICES.get(self.adm, version)
        if table is None:
            try:
                table = PRICES.keep(self.adm, self.adm.policy())
            except Exception as exc:  # noqa: BLE001 - no price is no cost, never a failed call
                log.warning("price_lookup_failed", pool=pool, error=repr(exc))
                return None
        return cost_of(table.get(pool), usage)


class AsyncCalls(_CallsBase):
    """Runs an SDK client's admitted methods (asyncio); mirrors ``Calls``."""

    async def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> Any:
        given = pop_call_args(kwargs)
        stream = kwargs.get("stream") is True
        handle = joinable(self.adm, self.settings, given)
        if handle is not None:
            return await self._joined(handle, self._call_pool(given, kwargs.get("model")), fn, args, kwargs, stream)
        ask = ask_for(self.settings, given, kwargs.get("model"))
        for attempt in itertools.count():
            try:
                return await self._admitted(ask, fn, args, kwargs, stream)
            except Exception as exc:
                if not self._retry(exc, attempt, ask):
                    raise

    def manager(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> AsyncRoundStreamManager:
        given = pop_call_args(kwargs)

        async def start() -> tuple[Any, Any, Callable[..., Any]]:
            handle = joinable(self.adm, self.settings, given)
            if handle is not None:
                pool = self._call_pool(given, kwargs.get("model"))
                inner = fn(*args, **kwargs)
                try:
                    stream = await inner.__aenter__()
                except Exception as exc:
                    await self.report_load(handle, pool, exc)
                    raise
                return inner, stream, functools.partial(self._end_joined, handle, pool)
            ask = ask_for(self.settings, given, kwargs.get("model"))
            for attempt in itertools.count():
                held = AsyncHeldRound(self.round_for(ask))
                r = await held.open()
                try:
                    inner = fn(*args, **self._kwargs(kwargs, ask, r))
                    return inner, await inner.__aenter__(), functools.partial(self._end_held, held)
                except BaseException as exc:
                    await held.close(exc)
                    if not (isinstance(exc, Exception) and self._retry(exc, attempt, ask)):
                        raise
            raise AssertionError("unreachable")

        return AsyncRoundStreamManager(start)

    async def _admitted(self, ask: Ask, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
                        stream: bool) -> Any:
        if stream:
            held = AsyncHeldRound(self.round_for(ask))
            r = await held.open()
            try:
                result = await fn(*args, **self._kwargs(kwargs, ask, r))
            except BaseException as exc:
                await held.close(exc)
                raise
            return AsyncRoundStream(result, functools.partial(self._end_held, held))
        async with self.round_for(ask) as r:
            result = await fn(*args, **self._kwargs(kwargs, ask, r))
            r.cost_usd = await self.cost(r.decision.config_version, r.pool, _get(result, "usage"))
            return result

    async def _end_held(self, held: AsyncHeldRound, exc: BaseException | None, stream: AsyncRoundStream) -> None:
        r = held.handle
        try:
            r.cost_usd = await self.cost(r.decision.config_version, r.pool, stream.usage.usage())
        finally:
            await held.close(exc)

    async def _joined(self, handle: Any, pool: str | None, fn: Callable[..., Any], args: tuple,
                      kwargs: dict[str, Any], stream: bool) -> Any:
        try:
            result = await fn(*args, **kwargs)
        except Exception as exc:
            await self.report_load(handle, pool, exc)
            raise
        if stream:
            return AsyncRoundStream(result, functools.partial(self._end_joined, handle, pool))
        await self.charge(handle, pool, _get(result, "usage"), charge_key(result))
        return result

    async def _end_joined(self, handle: Any, pool: str | None, exc: BaseException | None,
                          stream: AsyncRoundStream) -> None:
        await self.charge(handle, pool, stream.usage.usage(), charge_key(stream.inner))
        if isinstance(exc, Exception):
            await self.report_load(handle, pool, exc)

    async def report_load(self, handle: Any, pool: str | None, exc: Any) -> None:
        if pool == handle.pool and is_load(exc):
            try:
                await handle.report(RATE_LIMITED, retry_after=retry_after_of(exc))
            except AdmissionError as err:
                log.warning("joined_report_failed", round=handle.seat.id, error=str(err))

    async def charge(self, handle: Any, pool: str | None, usage: Any, key: str) -> None:
        cost = await self.cost(handle.decision.config_version, pool, usage) if pool else None
        if cost:
            try:
                await handle.charge(cost, key=key)
            except AdmissionError as err:
                log.warning("joined_charge_failed", round=handle.seat.id, key=key, error=str(err))

    async def cost(self, version: int, pool: str, usage: Any) -> float | None:
        if usage is None:
            return None
        table = PRICES.get(self.adm, version)
        if table is None:
            try:
                table = PRICES.keep(self.adm, await self.adm.policy())
            except Exception as exc:  # noqa: BLE001 - no price is no cost, never a failed call
                log.warning("price_lookup_failed", pool=pool, error=repr(exc))
                return None
        return cost_of(table.get(pool), usage)


def _bind(calls: Calls | AsyncCalls, kind: str, method: Callable[..., Any]) -> Callable[..., Any]:
    """An SDK method, admitted: ``call`` (create / parse) or ``manager`` (a ``.stream()`` helper)."""
    if kind == "manager":
        @functools.wraps(method)
        def stream(*args: Any, **kwargs: Any) -> Any:
            return calls.manager(method, args, kwargs)
        return stream
    if isinstance(calls, AsyncCalls):
        @functools.wraps(method)
        async def acall(*args: Any, **kwargs: Any) -> Any:
            return await calls.run(method, args, kwargs)
        return acall

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        return calls.run(method, args, kwargs)
    return call


class SDKProxy:
    """An SDK client (or one of its resources) whose admitted methods (``table``: attribute path
    -> ``call`` | ``manager``) run through the admission on a copy of the client that never
    retries by itself (``quiet``); every other attribute is the client's own."""

    def __init__(self, target: Any, quiet: Any, calls: Calls | AsyncCalls, table: Mapping[tuple[str, ...], str],
                 path: tuple[str, ...] = (), rewrap: Callable[[Any], Any] | None = None):
        self._target, self._quiet, self._calls = target, quiet, calls
        self._table, self._path, self._rewrap = table, path, rewrap

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_target", "_quiet", "_calls", "_table", "_path", "_rewrap"):
            raise AttributeError(name)
        value = getattr(self._target, name)
        path = (*self._path, name)
        kind = self._table.get(path)
        if kind is not None:
            return _bind(self._calls, kind, getattr(self._quiet, name))
        if any(p[:len(path)] == path for p in self._table):
            return SDKProxy(value, getattr(self._quiet, name), self._calls, self._table, path)
        if not self._path and name in ("with_options", "copy") and self._rewrap is not None:
            return lambda *a, **kw: self._rewrap(value(*a, **kw))  # the copy is admitted too
        return value

    def __dir__(self) -> list[str]:
        return dir(self._target)

    def __repr__(self) -> str:
        return f"<admitted {self._target!r}>"

    @property
    def unwrapped(self) -> Any:
        """The SDK object this proxy admits calls of."""
        return self._target


def wrap_client(client: Any, adm: Any, *, sdk: str, types: tuple[type, type], table: Mapping[tuple[str, ...], str],
                settings: Settings, again: Callable[[Any], Any]) -> SDKProxy:
    """The proxy an SDK module's ``wrap()`` returns: ``types`` = (sync client, asyncio client);
    ``again`` wraps a copy of the client (``with_options``) with the same settings."""
    if isinstance(client, SDKProxy):
        client = client.unwrapped
    sync_type, async_type = types
    if isinstance(client, async_type):
        is_async = True
    elif isinstance(client, sync_type):
        is_async = False
    else:
        raise BadArgument(f"wrap() needs a {sdk}.{sync_type.__name__} or {sdk}.{async_type.__name__} client, "
                          f"got {type(client).__name__}")
    check_pair(adm, is_async, f"a {type(client).__name__} client")
    calls = (AsyncCalls if is_async else Calls)(adm, settings)
    return SDKProxy(client, client.with_options(max_retries=0), calls, table, rewrap=again)
