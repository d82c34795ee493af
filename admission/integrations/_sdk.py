"""SDK calls: an SDK client's admitted methods, run through the admission.

* **SDK calls** (``Calls``, ``AsyncCalls``, ``SDKProxy``): the admitted methods of an SDK client
  run through the admission; everything else passes through untouched.
"""
from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping
from typing import Any, Callable

from ._common import Ask, MovedAway, Settings, ask_for, charge_key, is_load, joinable, log, pop_call_args
from ._prices import PRICES, _get, answer_received, cost_of
from ._streams import (AsyncHeldRound, AsyncRoundStream, AsyncRoundStreamManager, HeldRound, RoundStream,
                       RoundStreamManager)
from ..classify import RATE_LIMITED, retry_after_of
from ..errors import AdmissionError, BadArgument


def check_pair(adm: Any, is_async: bool, what: str) -> None:
    """A sync client needs a sync ``Admission``, an asyncio one an ``AsyncAdmission``."""
    from ..aio import AsyncAdmission
    from ..client import Admission

    want = AsyncAdmission if is_async else Admission
    if not isinstance(adm, want):
        raise BadArgument(f"{what} needs an admission.{want.__name__}, got {type(adm).__name__}"
                          + (" (an asyncio client waits with AsyncAdmission)" if is_async
                             else " (a sync client waits with Admission)"))


def received_of(ask: Ask, usage: Any) -> float | None:
    """A declared round's answer tokens received in all, from its usage (None: not declared, or
    the usage says nothing)."""
    return answer_received(usage) if ask.tokens is not None else None


class _CallsBase:
    """What the sync and async runners share: resolving, the model to call, retry decisions."""

    def __init__(self, adm: Any, settings: Settings):
        self.adm, self.settings = adm, settings

    def round_for(self, ask: Ask) -> Any:
        # moves only to the pools this client can call (its provider's, or those ``pools`` names)
        return self.adm.round(lane=ask.lane, model=ask.pool, round_id=ask.round_id, timeout=self.settings.timeout,
                              agent=ask.agent, move_to=lambda pool: self.settings.model_for(pool, ask) is not None,
                              tokens=ask.tokens)

    @staticmethod
    def reporter(ask: Ask, handle: Any) -> Any:
        """What a stream of this round calls with its progress (None: the round declared no size)."""
        return handle.progress if ask.tokens is not None else None

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
        ask = ask_for(self.settings, given, kwargs.get("model"), kwargs)
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
                return inner, stream, functools.partial(self._end_joined, handle, pool), None
            ask = ask_for(self.settings, given, kwargs.get("model"), kwargs)
            for attempt in itertools.count():
                held = HeldRound(self.round_for(ask))
                r = held.open()
                try:
                    inner = fn(*args, **self._kwargs(kwargs, ask, r))
                    return inner, inner.__enter__(), functools.partial(self._end_held, held), self.reporter(ask, r)
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
            return RoundStream(result, functools.partial(self._end_held, held), self.reporter(ask, r))
        with self.round_for(ask) as r:
            result = fn(*args, **self._kwargs(kwargs, ask, r))
            r.cost_usd = self.cost(r.decision.config_version, r.pool, _get(result, "usage"))
            r.received = received_of(ask, _get(result, "usage"))
            return result

    def _end_held(self, held: HeldRound, exc: BaseException | None, stream: RoundStream) -> None:
        r = held.handle
        try:
            r.received = stream.meter.received(stream.usage)
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
        ask = ask_for(self.settings, given, kwargs.get("model"), kwargs)
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
                return inner, stream, functools.partial(self._end_joined, handle, pool), None
            ask = ask_for(self.settings, given, kwargs.get("model"), kwargs)
            for attempt in itertools.count():
                held = AsyncHeldRound(self.round_for(ask))
                r = await held.open()
                try:
                    inner = fn(*args, **self._kwargs(kwargs, ask, r))
                    return (inner, await inner.__aenter__(), functools.partial(self._end_held, held),
                            self.reporter(ask, r))
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
            return AsyncRoundStream(result, functools.partial(self._end_held, held), self.reporter(ask, r))
        async with self.round_for(ask) as r:
            result = await fn(*args, **self._kwargs(kwargs, ask, r))
            r.cost_usd = await self.cost(r.decision.config_version, r.pool, _get(result, "usage"))
            r.received = received_of(ask, _get(result, "usage"))
            return result

    async def _end_held(self, held: AsyncHeldRound, exc: BaseException | None, stream: AsyncRoundStream) -> None:
        r = held.handle
        try:
            r.received = stream.meter.received(stream.usage)
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
