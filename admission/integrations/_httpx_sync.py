# GENERATED from admission/integrations/_httpx_async.py by scripts/unasync.py: do not edit by hand.
# Edit admission/integrations/_httpx_async.py and run `python scripts/unasync.py` (tests/test_unasync.py fails while this is stale).
"""The httpx transports (asyncio: the source of ``_httpx_sync.py``, which ``scripts/unasync.py``
generates from it): each request one round, which ends when its response body is closed. The
concrete classes, over httpx or httpx2, are built in ``httpx.py``.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from ._calls import check_pair, end_with
from ._calls_sync import Calls
from ._common import Ask, Settings, charge_key, joinable
from ._counts import add_usage, usage_of
from ._http import PoolSpec, Verdict, _ask_of, _call_of, _Route, _Tee, is_json
from ._rate_headers import note
from ._streams_sync import HeldRound
from ..client import Admission


class RoundBody:
    """A response body whose round ends when it is closed (``end(raw_body, exc)``, once)."""

    def __init__(self, inner: Any, end: Callable[..., Any]):
        self._inner, self._end, self._tee, self._ended = inner, end, _Tee(), False

    def __iter__(self) -> Any:
        try:
            for chunk in self._inner:
                self._tee.add(chunk)
                yield chunk
        except GeneratorExit:
            raise  # the reader stopped early: close() ends the round
        except BaseException as exc:
            self._finish(exc)
            raise

    def close(self) -> None:
        """Close the body; its round ends now."""
        try:
            self._inner.close()
        finally:
            self._finish(None)

    def _finish(self, exc: BaseException | None) -> None:
        if not self._ended:
            self._ended = True
            self._end(self._tee.body(), exc)


class RoundTransport:
    """Each request one round (see the module's docstring), with ``Admission``:
    ``AdmissionTransport``."""

    _hx: Any = None  # the httpx module the concrete class is built over
    _Body: Any = None

    def __init__(self, adm: Any, *, lane: str | None = None, pool: PoolSpec = None, provider: str | None = None,
                 inner: Any = None, timeout: float = 600.0, join: bool = True, declare_budget: bool = False):
        check_pair(adm, Admission, "AdmissionTransport")
        self._calls = Calls(adm, Settings(lane=lane, provider=provider, retries=0, timeout=timeout, join=join,
                                          declare_budget=declare_budget))
        self._route = _Route(pool, provider)
        self._inner = inner if inner is not None else self._hx.HTTPTransport()

    def handle_request(self, request: Any) -> Any:
        """Send ``request`` in a round of its pool (or in the round it is made inside); the
        round ends when the response's body is read to its end or closed."""
        calls = self._calls
        if self._route.pool is None or is_json(request):
            request.read()  # the model, the answer budget and the prompt are in the body
        pool, model = self._route.pool_of(request)
        handle = joinable(calls.adm, calls.settings, {})
        if handle is not None:
            body, answers = _call_of(request)  # a JSON body was read above
            calls.reserve_call(handle, {}, body, answers)  # its own request and tokens, before it is sent
            response = self._inner.handle_request(request)
            return self._watch(response, functools.partial(self._end_joined, handle, pool, response))
        ask = _ask_of(calls.settings, pool, model, request)
        held = HeldRound(calls.round_for(ask))
        r = held.open()
        try:
            response = self._inner.handle_request(self._route.moved(request, r.pool, pool, model))
        except BaseException as exc:
            held.close(exc)
            raise
        return self._watch(response, functools.partial(self._end_held, held, ask, response))

    def _watch(self, response: Any, end: Callable[..., Any]) -> Any:
        response.stream = self._Body(response.stream, end)
        return response

    def _end_held(self, held: HeldRound, ask: Ask, response: Any, body: bytes | None,
                  exc: BaseException | None) -> None:
        r = held.handle
        if exc is not None:
            note(r, response.headers, response.status_code)
            held.close(exc)
            return
        try:
            verdict = Verdict.of(response.status_code, response.headers, body)
            note(r, response.headers, response.status_code, verdict.view.message)
            r.outcome, r.retry_after = verdict.outcome, verdict.retry_after
            if response.status_code < 400:  # a refused or failed request sends no usage
                end_with(r, ask, verdict.usage)
            r.cost_usd = self._calls.cost(r.decision.config_version, r.pool, verdict.usage)
        finally:
            held.close(None)

    def _end_joined(self, handle: Any, pool: str, response: Any, body: bytes | None,
                    exc: BaseException | None) -> None:
        if exc is not None:
            note(handle, response.headers, response.status_code)
            return  # a broken body is the caller's error, not load
        verdict = Verdict.of(response.status_code, response.headers, body)
        note(handle, response.headers, response.status_code, verdict.view.message)
        if response.status_code < 400:  # a failed request adds none; the round reconciles its calls' sum
            add_usage(handle, usage_of(verdict.usage))
        self._calls.charge(handle, pool, verdict.usage, charge_key(response))
        self._calls.report_load(handle, pool, verdict.view)

    def close(self) -> None:
        """Close the inner transport."""
        self._inner.close()
