# GENERATED from admission/integrations/_calls_async.py by scripts/unasync.py: do not edit by hand.
# Edit admission/integrations/_calls_async.py and run `python scripts/unasync.py` (tests/test_unasync.py fails while this is stale).
"""SDK calls (asyncio: the source of ``_calls_sync.py``, which ``scripts/unasync.py`` generates
from it): an SDK client's admitted methods run through the admission.
"""
from __future__ import annotations

import functools
import inspect
import itertools
from typing import Any, Callable

from ._calls import CallsBase, end_with
from ._common import Ask, ask_for, charge_key, is_load, joinable, log, pop_call_args
from ._counts import add_usage, declared, usage_of
from ._prices import PRICES, _get, cost_of
from ._rate_headers import note_error, note_response
from ._streams_sync import HeldRound, RoundStream, RoundStreamManager
from ..classify import RATE_LIMITED, retry_after_of
from ..errors import AdmissionError


class Calls(CallsBase):
    """Runs an SDK client's admitted methods."""

    def bind(self, method: Callable[..., Any], raw: Callable[..., Any] | None = None,
             answers: bool = True) -> Callable[..., Any]:
        """``method`` (an SDK's create / parse), admitted; ``raw``: its ``with_raw_response``
        form, when the SDK has one (the answer's headers come with it); ``answers``: False for
        a method that answers no tokens (embeddings)."""
        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self.run(method, args, kwargs, raw, answers)
        return call

    def run(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
            raw: Callable[..., Any] | None = None, answers: bool = True) -> Any:
        given = pop_call_args(kwargs)
        stream = kwargs.get("stream") is True
        send = functools.partial(self._send, fn, raw)
        handle = joinable(self.adm, self.settings, given)
        if handle is not None:
            self.reserve_call(handle, given, kwargs, answers)
            return self._joined(handle, self._call_pool(given, kwargs.get("model")), send, args, kwargs, stream)
        ask = ask_for(self.settings, given, kwargs.get("model"), kwargs, answers)
        for attempt in itertools.count():
            try:
                return self._admitted(ask, send, args, kwargs, stream)
            except Exception as exc:
                if not self._retry(exc, attempt, ask):
                    raise

    def manager(self, fn: Callable[..., Any], args: tuple, kwargs: dict[str, Any]) -> RoundStreamManager:
        given = pop_call_args(kwargs)

        def start() -> tuple[Any, Any, Callable[..., Any]]:
            handle = joinable(self.adm, self.settings, given)
            if handle is not None:
                pool = self._call_pool(given, kwargs.get("model"))
                self.reserve_call(handle, given, kwargs, True)
                inner = fn(*args, **kwargs)
                try:
                    stream = inner.__enter__()
                except Exception as exc:
                    note_error(handle, exc)
                    self.report_load(handle, pool, exc)
                    raise
                note_response(handle, stream)
                return inner, stream, functools.partial(self._end_joined, handle, pool), None
            ask = ask_for(self.settings, given, kwargs.get("model"), kwargs)
            for attempt in itertools.count():
                held = HeldRound(self.round_for(ask))
                r = held.open()
                try:
                    inner = fn(*args, **self._kwargs(kwargs, ask, r))
                    stream = inner.__enter__()
                    note_response(r, stream)
                    return inner, stream, functools.partial(self._end_held, held), self.reporter(ask, r)
                except BaseException as exc:
                    note_error(r, exc)
                    held.close(exc)
                    if not (isinstance(exc, Exception) and self._retry(exc, attempt, ask)):
                        raise
            raise AssertionError("unreachable")

        return RoundStreamManager(start)

    @staticmethod
    def _send(fn: Callable[..., Any], raw: Callable[..., Any] | None, handle: Any, args: tuple,
              kwargs: dict[str, Any]) -> Any:
        """The SDK's answer, its response's rate-limit headers read into ``handle`` (success or
        error): through ``raw`` (``with_raw_response``) when the SDK has it, else from what the
        answer or the error carries (a stream's response, an error's)."""
        try:
            response = (raw or fn)(*args, **kwargs)
        except BaseException as exc:
            note_error(handle, exc)
            raise
        note_response(handle, response)
        if raw is None:
            return response
        parsed = response.parse()  # a coroutine for Anthropic's asyncio client, an answer elsewhere
        return (parsed) if inspect.isawaitable(parsed) else parsed

    def _admitted(self, ask: Ask, send: Callable[..., Any], args: tuple, kwargs: dict[str, Any],
                  stream: bool) -> Any:
        if stream:
            held = HeldRound(self.round_for(ask))
            r = held.open()
            try:
                result = send(r, args, self._kwargs(kwargs, ask, r))
            except BaseException as exc:
                held.close(exc)
                raise
            return RoundStream(result, functools.partial(self._end_held, held), self.reporter(ask, r))
        with self.round_for(ask) as r:
            result = send(r, args, self._kwargs(kwargs, ask, r))
            r.cost_usd = self.cost(r.decision.config_version, r.pool, _get(result, "usage"))
            end_with(r, ask, _get(result, "usage"))
            return result

    def _end_held(self, held: HeldRound, exc: BaseException | None, stream: RoundStream) -> None:
        r = held.handle
        try:
            r.received = stream.meter.received(stream.usage)
            if exc is None:  # what the provider counted, for the ceilings (a failed round sends none)
                r.usage = usage_of(stream.usage.usage())
            r.cost_usd = self.cost(r.decision.config_version, r.pool, stream.usage.usage())
        finally:
            held.close(exc)

    def reserve_call(self, handle: Any, given: dict[str, Any], kwargs: dict[str, Any], answers: bool) -> None:
        """A call joining a held round takes its own request and tokens from the pool's rate
        ceilings before it is sent (``Round.reserve_call``: the round's first call is its
        admit's reservation), waiting, seat held, while a ceiling cannot cover it."""
        reserve = getattr(handle, "reserve_call", None)
        if reserve is not None:
            reserve(**declared(kwargs, given.get("input_tokens"), answers), timeout=self.settings.timeout)

    def _joined(self, handle: Any, pool: str | None, send: Callable[..., Any], args: tuple,
                kwargs: dict[str, Any], stream: bool) -> Any:
        try:
            result = send(handle, args, kwargs)
        except Exception as exc:
            self.report_load(handle, pool, exc)
            raise
        if stream:
            return RoundStream(result, functools.partial(self._end_joined, handle, pool))
        add_usage(handle, usage_of(_get(result, "usage")))  # the round reconciles its calls' sum
        self.charge(handle, pool, _get(result, "usage"), charge_key(result))
        return result

    def _end_joined(self, handle: Any, pool: str | None, exc: BaseException | None,
                    stream: RoundStream) -> None:
        if exc is None:
            add_usage(handle, usage_of(stream.usage.usage()))
        self.charge(handle, pool, stream.usage.usage(), charge_key(stream.inner))
        if isinstance(exc, Exception):
            self.report_load(handle, pool, exc)

    def report_load(self, handle: Any, pool: str | None, exc: Any) -> None:
        """A joined call's 429/529 on its round's pool: load, or a spent rate ceiling when its
        response named one (``handle.ceiling``, read by ``note_error``)."""
        if pool == handle.pool and is_load(exc):
            try:
                if getattr(handle, "ceiling", None) is not None:
                    handle._adm.report(handle.seat, signal="ceiling", ceiling=handle.ceiling,
                                       reset_s=handle.reset_s)
                else:
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
