"""What the httpx transports' sync and asyncio flavours share (``_httpx_async.py``, the source,
and ``_httpx_sync.py``, generated from it): what a response ended with (its verdict, read from
the teed body) and where a request asks to run.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Any, Callable

from ._common import Ask, MovedAway, Settings, ask_for, log
from ._prices import UsageTracker
from ..classify import CLEAN, retry_after_of, signal_of
from ..errors import BadArgument

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


def is_json(request: Any) -> bool:
    """A request whose body is JSON (an API call's): read before it is sent, for what it asks."""
    return "json" in (request.headers.get("content-type") or "").lower()


def _call_of(request: Any) -> tuple[dict[str, Any], bool]:
    """What a request declares to the ceilings from: its JSON body (read then; any other body
    is not read: {}), and whether it answers tokens (an embeddings request answers none)."""
    body = _body_json(request) if is_json(request) else {}
    answers = not str(getattr(request.url, "path", "")).rstrip("/").endswith("/embeddings")
    return body, answers


def _ask_of(settings: Settings, pool: str, model: str | None, request: Any) -> Ask:
    """The round a request asks for, from ``_call_of``: its size is the body's answer budget
    when budgets are declared, and it declares to the ceilings the body's prompt estimate and
    answer budget (``_counts.declared``)."""
    body, answers = _call_of(request)
    return ask_for(settings, {"pool": pool}, model, body, answers)


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

