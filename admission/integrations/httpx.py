"""httpx transports that admit every request (``pip install httpx``).

    transport = AdmissionTransport(adm, lane="reviews", provider="openai")
    client = httpx.Client(transport=transport)                       # any HTTP API
    sdk = openai.OpenAI(http_client=httpx.Client(transport=transport))  # or an SDK's requests

``AdmissionTransport`` (an ``httpx.BaseTransport``, with ``Admission``) and
``AsyncAdmissionTransport`` (an ``httpx.AsyncBaseTransport``, with ``AsyncAdmission``) wrap an
inner transport (default: httpx's own) and run each request as one round.
``Httpx2AdmissionTransport`` / ``AsyncHttpx2AdmissionTransport`` are the same over ``httpx2``,
which the OpenAI 3.x and Anthropic 2.x SDKs run on (OpenAI also takes an ``httpx.Client``;
Anthropic only an ``httpx2`` one): ``anthropic.Anthropic(http_client=httpx2.Client(
transport=Httpx2AdmissionTransport(adm, ...)))``.

Choices:

* **The pool** is ``pool=`` (a name, or a callable given the request), else the JSON body's
  ``"model"`` + ``"@"`` + ``provider``; neither is a ``BadArgument`` before anything is sent.
  Lane, agent and round id: ``lane=``, else ``admission.integrations.use(...)``; round id from
  ``use(round_id=...)`` else a fresh uuid per request.
* **A response is not an exception at this level.** Its status is classified when its body is
  closed: 2xx/3xx is ``clean``, anything else ``admission.classify.signal_of`` of the status,
  headers and the body's text (a 403 daily key limit needs the text), with the Retry-After of a
  429/529 handed on (``r.outcome``, ``r.retry_after``). An exception of the inner transport (a
  timeout, a refused connection) ends the round with its own classification.
* **The round lasts until the response body is closed** (``close()`` / ``aclose()``: httpx does
  it after reading a whole body, and at the end of ``client.stream(...)``), so a streamed answer
  holds its seat while it streams. A response dropped unclosed ends its round when collected.
* **Cost** from the ``usage`` of a JSON body, or of the events of a server-sent-events body
  (OpenAI's usage chunk, Anthropic's ``message_start`` / ``message_delta``), at the pool's prices:
  the body is teed while it is read, up to ``TEE_LIMIT`` (1 MB; past it, no cost).
* **Join**: a request made inside a ``round()`` of the same admission runs inside it (no second
  seat), as the SDK wrappers' calls do; its cost is charged once per request id and a 429/529 is
  reported on the round. ``join=False`` makes it a delegated sub-round instead.
* **A refused round moves only to alternatives of the same provider** (``round(move_to=...)``),
  and the JSON body's ``model`` is rewritten to that pool's model; a seat elsewhere (the policy
  changed between ranking and admit) raises ``MovedAway`` (the request is not sent).
* **Sizes** (the cap line, design §4): with ``declare_budget=True`` a request declares its JSON
  body's answer budget (``max_completion_tokens`` / ``max_tokens`` / ``max_output_tokens``) as its
  round's size, and its round ends with the usage's output count. Off by default, as in the SDK
  wrappers. No progress is reported: the transport sees bytes, not an SDK's events.
* The SDKs' own retries, through this transport, are each a new admitted round.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import zlib
from dataclasses import dataclass
from typing import Any, Callable

from ._common import Ask, MovedAway, Settings, ask_for, charge_key, joinable, log, require, use
from ._prices import UsageTracker
from ._sdk import AsyncCalls, Calls, check_pair, received_of
from ._streams import AsyncHeldRound, HeldRound, end_unclosed
from ..classify import CLEAN, retry_after_of, signal_of
from ..errors import BadArgument

if importlib.util.find_spec("httpx") is None and importlib.util.find_spec("httpx2") is None:
    raise ImportError("admission.integrations.httpx needs 'httpx' (or 'httpx2'): pip install httpx")

__all__ = ["AdmissionTransport", "AsyncAdmissionTransport", "Httpx2AdmissionTransport",
           "AsyncHttpx2AdmissionTransport", "transports", "TEE_LIMIT", "use", "MovedAway"]

TEE_LIMIT = 1 << 20  # bytes of a response body kept for its usage and its error text

PoolSpec = str | Callable[[Any], str] | None


# -- what a response ended with -----------------------------------------------------------------------
@dataclass(frozen=True)
class StatusView:
    """A response as the classifier reads it: status, headers, the text of its body."""

    status_code: int
    headers: Any
    message: str | None = None


def _decoded(headers: Any, body: bytes) -> bytes | None:
    """The body without its content-encoding (gzip, deflate); None when it cannot be undone."""
    encoding = (headers.get("content-encoding") or "").strip().lower()
    if encoding in ("", "identity"):
        return body
    if encoding in ("gzip", "x-gzip", "deflate"):
        for wbits in (47, -15):  # gzip or zlib framing, else raw deflate
            try:
                return zlib.decompressobj(wbits).decompress(body)
            except zlib.error:
                continue
    return None


def usage_of_body(headers: Any, body: bytes | None) -> dict[str, int] | None:
    """The usage a JSON body or a server-sent-events body reported."""
    if not body:
        return None
    ctype = (headers.get("content-type") or "").lower()
    tracker = UsageTracker()
    try:
        if "json" in ctype:
            tracker.see(json.loads(body))
        elif "event-stream" in ctype:
            for line in body.splitlines():
                if line.startswith(b"data:") and line[5:].strip().startswith(b"{"):
                    tracker.see(json.loads(line[5:]))
    except (ValueError, UnicodeDecodeError):
        pass  # a body that is not what its type says has no usage
    return tracker.usage()


@dataclass(frozen=True)
class Verdict:
    """The outcome, Retry-After and usage of a response whose body was closed."""

    outcome: str
    retry_after: float | None
    usage: dict[str, int] | None
    view: StatusView

    @classmethod
    def of(cls, status: int, headers: Any, raw: bytes | None) -> "Verdict":
        body = _decoded(headers, raw) if raw is not None else None
        view = StatusView(status, headers, body.decode("utf-8", "replace") if body else None)
        if status < 400:
            return cls(CLEAN, None, usage_of_body(headers, body), view)
        return cls(signal_of(view), retry_after_of(view), usage_of_body(headers, body), view)


class _Tee:
    """The first TEE_LIMIT bytes of a body (``None`` past it)."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.size = 0

    def add(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self.size <= TEE_LIMIT:
            self.parts.append(chunk)

    def body(self) -> bytes | None:
        return b"".join(self.parts) if self.size <= TEE_LIMIT else None


# -- the pool and the request ---------------------------------------------------------------------------
def _body_json(request: Any) -> dict[str, Any]:
    """The request's JSON object body ({} when it has none); the body must have been read."""
    try:
        doc = json.loads(request.content or b"null")
    except (ValueError, UnicodeDecodeError):
        return {}
    return doc if isinstance(doc, dict) else {}


def _body_model(request: Any) -> str | None:
    model = _body_json(request).get("model")
    return model if isinstance(model, str) and model else None


def _ask_of(settings: Settings, pool: str, model: str | None, request: Any) -> Ask:
    """The round a request asks for; its size is the body's answer budget when budgets are
    declared (the body was read then)."""
    return ask_for(settings, {"pool": pool}, model, _body_json(request) if settings.declare_budget else {})


class _Route:
    """Where a request asks to run, and how to send it on the pool its round was seated on."""

    def __init__(self, pool: PoolSpec, provider: str | None):
        if pool is not None and not isinstance(pool, str) and not callable(pool):
            raise BadArgument(f"pool must be a pool name, a callable(request) -> pool or None, got {pool!r}")
        self.pool, self.provider = pool, provider

    def pool_of(self, request: Any) -> tuple[str, str | None]:
        """(pool, the body's model when the pool came from it); the body must have been read."""
        if callable(self.pool):
            return self.pool(request), None
        if isinstance(self.pool, str):
            return self.pool, None
        model = _body_model(request)
        if model is None or not self.provider:
            raise BadArgument(f"no pool for {request.method} {request.url}: pass pool= (a name or a callable), "
                              "or provider= for requests whose JSON body names the model")
        return f"{model}@{self.provider}", model

    def moved(self, request: Any, seated: str, asked: str, model: str | None) -> Any:
        """The request to send on the pool the round was seated on."""
        if seated == asked:
            return request
        new_model, _, provider = seated.rpartition("@")
        if model is None or provider != self.provider:
            raise MovedAway(f"request seated on {seated}, which this transport cannot send to (asked for {asked})")
        doc = json.loads(request.content)
        doc["model"] = new_model
        headers = {k: v for k, v in request.headers.items() if k.lower() != "content-length"}
        log.info("request_moved", asked=asked, pool=seated)
        return type(request)(request.method, request.url, headers=headers, content=json.dumps(doc).encode(),
                             extensions=request.extensions)


# -- sync ---------------------------------------------------------------------------------------------
class _RoundBody:
    """A response body whose round ends when it is closed (``end(raw_body, exc)``, once)."""

    def __init__(self, inner: Any, end: Callable[[bytes | None, BaseException | None], None]):
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
        try:
            self._inner.close()
        finally:
            self._finish(None)

    def _finish(self, exc: BaseException | None) -> None:
        if not self._ended:
            self._ended = True
            self._end(self._tee.body(), exc)

    def __del__(self) -> None:
        end_unclosed(self, "response", "close the response (or read it); its round ends now")


class _Transport:
    """Each request one round (see the module's docstring): ``AdmissionTransport``."""

    _hx: Any = None  # the httpx module the concrete class is built over
    _Body: Any = None

    def __init__(self, adm: Any, *, lane: str | None = None, pool: PoolSpec = None, provider: str | None = None,
                 inner: Any = None, timeout: float = 600.0, join: bool = True, declare_budget: bool = False):
        check_pair(adm, False, "AdmissionTransport")
        self._calls = Calls(adm, Settings(lane=lane, provider=provider, retries=0, timeout=timeout, join=join,
                                          declare_budget=declare_budget))
        self._route = _Route(pool, provider)
        self._inner = inner if inner is not None else self._hx.HTTPTransport()

    def handle_request(self, request: Any) -> Any:
        calls = self._calls
        if self._route.pool is None or calls.settings.declare_budget:
            request.read()  # the model (or the answer budget) is in the body
        pool, model = self._route.pool_of(request)
        handle = joinable(calls.adm, calls.settings, {})
        if handle is not None:
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

    def _watch(self, response: Any, end: Callable[[bytes | None, BaseException | None], None]) -> Any:
        response.stream = self._Body(response.stream, end)
        return response

    def _end_held(self, held: HeldRound, ask: Ask, response: Any, body: bytes | None,
                  exc: BaseException | None) -> None:
        if exc is not None:
            held.close(exc)
            return
        r = held.handle
        try:
            verdict = Verdict.of(response.status_code, response.headers, body)
            r.outcome, r.retry_after = verdict.outcome, verdict.retry_after
            r.received = received_of(ask, verdict.usage)
            r.cost_usd = self._calls.cost(r.decision.config_version, r.pool, verdict.usage)
        finally:
            held.close(None)

    def _end_joined(self, handle: Any, pool: str, response: Any, body: bytes | None,
                    exc: BaseException | None) -> None:
        if exc is not None:
            return  # a broken body is the caller's error, not load
        verdict = Verdict.of(response.status_code, response.headers, body)
        self._calls.charge(handle, pool, verdict.usage, charge_key(response))
        self._calls.report_load(handle, pool, verdict.view)

    def close(self) -> None:
        self._inner.close()


# -- asyncio ------------------------------------------------------------------------------------------
class _AsyncRoundBody:
    """``_RoundBody`` for asyncio (``aclose()`` ends the round)."""

    def __init__(self, inner: Any, end: Callable[..., Any]):
        self._inner, self._end, self._tee, self._ended = inner, end, _Tee(), False

    async def __aiter__(self) -> Any:
        try:
            async for chunk in self._inner:
                self._tee.add(chunk)
                yield chunk
        except GeneratorExit:
            raise
        except BaseException as exc:
            await self._finish(exc)
            raise

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            await self._finish(None)

    async def _finish(self, exc: BaseException | None) -> None:
        if not self._ended:
            self._ended = True
            await self._end(self._tee.body(), exc)


class _AsyncTransport:
    """``AdmissionTransport`` for ``AsyncClient`` (with ``AsyncAdmission``): ``AsyncAdmissionTransport``."""

    _hx: Any = None
    _Body: Any = None

    def __init__(self, adm: Any, *, lane: str | None = None, pool: PoolSpec = None, provider: str | None = None,
                 inner: Any = None, timeout: float = 600.0, join: bool = True, declare_budget: bool = False):
        check_pair(adm, True, "AsyncAdmissionTransport")
        self._calls = AsyncCalls(adm, Settings(lane=lane, provider=provider, retries=0, timeout=timeout, join=join,
                                               declare_budget=declare_budget))
        self._route = _Route(pool, provider)
        self._inner = inner if inner is not None else self._hx.AsyncHTTPTransport()

    async def handle_async_request(self, request: Any) -> Any:
        calls = self._calls
        if self._route.pool is None or calls.settings.declare_budget:
            await request.aread()  # the model (or the answer budget) is in the body
        pool, model = self._route.pool_of(request)
        handle = joinable(calls.adm, calls.settings, {})
        if handle is not None:
            response = await self._inner.handle_async_request(request)
            return self._watch(response, functools.partial(self._end_joined, handle, pool, response))
        ask = _ask_of(calls.settings, pool, model, request)
        held = AsyncHeldRound(calls.round_for(ask))
        r = await held.open()
        try:
            response = await self._inner.handle_async_request(self._route.moved(request, r.pool, pool, model))
        except BaseException as exc:
            await held.close(exc)
            raise
        return self._watch(response, functools.partial(self._end_held, held, ask, response))

    def _watch(self, response: Any, end: Callable[..., Any]) -> Any:
        response.stream = self._Body(response.stream, end)
        return response

    async def _end_held(self, held: AsyncHeldRound, ask: Ask, response: Any, body: bytes | None,
                        exc: BaseException | None) -> None:
        if exc is not None:
            await held.close(exc)
            return
        r = held.handle
        try:
            verdict = Verdict.of(response.status_code, response.headers, body)
            r.outcome, r.retry_after = verdict.outcome, verdict.retry_after
            r.received = received_of(ask, verdict.usage)
            r.cost_usd = await self._calls.cost(r.decision.config_version, r.pool, verdict.usage)
        finally:
            await held.close(None)

    async def _end_joined(self, handle: Any, pool: str, response: Any, body: bytes | None,
                          exc: BaseException | None) -> None:
        if exc is not None:
            return  # a broken body is the caller's error, not load
        verdict = Verdict.of(response.status_code, response.headers, body)
        await self._calls.charge(handle, pool, verdict.usage, charge_key(response))
        await self._calls.report_load(handle, pool, verdict.view)

    async def aclose(self) -> None:
        await self._inner.aclose()


# -- the concrete classes, over httpx or httpx2 ------------------------------------------------------
@functools.cache
def transports(module: str = "httpx") -> tuple[type, type]:
    """(AdmissionTransport, AsyncAdmissionTransport) built over ``httpx`` or ``httpx2`` (the
    same API; the OpenAI 3.x and Anthropic 2.x SDKs run on httpx2 and Anthropic refuses httpx
    objects). Each class is a ``BaseTransport`` / ``AsyncBaseTransport`` of that module."""
    if module not in _FLAVORS:
        raise BadArgument(f"transports() is built over one of {', '.join(_FLAVORS)}, got {module!r}")
    hx = require(module, module)
    body = type("_RoundBody", (_RoundBody, hx.SyncByteStream), {})
    abody = type("_AsyncRoundBody", (_AsyncRoundBody, hx.AsyncByteStream), {})
    prefix = _FLAVORS[module]
    sync = type(f"{prefix}AdmissionTransport", (_Transport, hx.BaseTransport),
                {"_hx": hx, "_Body": body, "__doc__": _Transport.__doc__, "__module__": __name__})
    asyn = type(f"Async{prefix}AdmissionTransport", (_AsyncTransport, hx.AsyncBaseTransport),
                {"_hx": hx, "_Body": abody, "__doc__": _AsyncTransport.__doc__, "__module__": __name__})
    return sync, asyn


_FLAVORS = {"httpx": "", "httpx2": "Httpx2"}
_NAMES = {"AdmissionTransport": ("httpx", 0), "AsyncAdmissionTransport": ("httpx", 1),
          "Httpx2AdmissionTransport": ("httpx2", 0), "AsyncHttpx2AdmissionTransport": ("httpx2", 1)}


if importlib.util.find_spec("httpx") is not None:
    AdmissionTransport, AsyncAdmissionTransport = transports("httpx")
if importlib.util.find_spec("httpx2") is not None:
    Httpx2AdmissionTransport, AsyncHttpx2AdmissionTransport = transports("httpx2")


def __getattr__(name: str) -> Any:
    """A transport over a module that is not installed: its one-line ImportError."""
    if name in _NAMES:
        module, i = _NAMES[name]
        return transports(module)[i]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
