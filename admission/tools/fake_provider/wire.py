"""HTTP/1.1 over asyncio streams: requests read, responses encoded (no dependency)."""
from __future__ import annotations

import asyncio
import contextlib
import email.utils
import http
import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from .protocols import BadRequest
from .statuses import REASONS

MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024


# -- HTTP/1.1 over asyncio streams ----------------------------------------------------------------


class _Closed(Exception):
    """The peer closed the connection."""


@dataclass
class Request:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    keep_alive: bool


@dataclass
class Response:
    status: int
    body: bytes
    ctype: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    close: bool = False


class _Input:
    """A connection's bytes, buffered here so that what arrives while a round waits (a
    pipelined request) is kept for the next request."""

    def __init__(self, reader: asyncio.StreamReader):
        self.reader = reader
        self.buf = bytearray()

    async def _more(self) -> None:
        data = await self.reader.read(65536)
        if not data:
            raise _Closed
        self.buf += data

    async def head(self) -> bytes | None:
        while (end := self.buf.find(b"\r\n\r\n")) < 0:
            if len(self.buf) > MAX_HEAD:
                raise BadRequest(400, "request head too large")
            try:
                await self._more()
            except _Closed:
                if self.buf:
                    raise
                return None
        head = bytes(self.buf[:end])
        del self.buf[:end + 4]
        return head

    async def body(self, n: int) -> bytes:
        while len(self.buf) < n:
            await self._more()
        out = bytes(self.buf[:n])
        del self.buf[:n]
        return out

    async def hung_up(self) -> None:
        """Returns when the peer closes; reads (and keeps) what it sends meanwhile."""
        with contextlib.suppress(ConnectionError):
            while len(self.buf) <= MAX_BODY:
                data = await self.reader.read(65536)
                if not data:
                    return
                self.buf += data
        if len(self.buf) > MAX_BODY:
            await asyncio.Event().wait()  # a flood of pipelined bytes: stop watching


async def read_request(inp: _Input, writer: asyncio.StreamWriter) -> Request | None:
    head = await inp.head()
    if head is None:
        return None
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, version = lines[0].split(" ", 2)
    except ValueError:
        raise BadRequest(400, "bad request line") from None
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    conn = headers.get("connection", "").lower()
    keep_alive = conn != "close" if version == "HTTP/1.1" else conn == "keep-alive"
    if "chunked" in headers.get("transfer-encoding", "").lower():
        raise BadRequest(411)
    try:
        length = int(headers.get("content-length", "0"))
    except ValueError:
        raise BadRequest(400, "bad Content-Length") from None
    if length > MAX_BODY or length < 0:
        raise BadRequest(413)
    if length and headers.get("expect", "").lower() == "100-continue":
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    body = await inp.body(length)
    return Request(method.upper(), target.split("?", 1)[0], headers, body, keep_alive)


def encode_response(resp: Response, keep_alive: bool) -> bytes:
    reason = REASONS.get(resp.status) or http.HTTPStatus(resp.status).phrase
    headers = {"content-type": resp.ctype, "content-length": str(len(resp.body)),
               "date": email.utils.formatdate(usegmt=True), "connection": "keep-alive" if keep_alive else "close",
               "x-request-id": f"req_{uuid.uuid4().hex[:16]}", **resp.headers}
    if resp.ctype == "text/event-stream":
        headers["cache-control"] = "no-cache"
    head = f"HTTP/1.1 {resp.status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"\r\n" + resp.body


def _json(status: int, doc: Any) -> Response:
    return Response(status, json.dumps(doc).encode())


def _api_key(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer ") and auth[7:].strip():
        return auth[7:].strip()
    return headers.get("x-api-key") or None


def _route_path(path: str) -> str:
    """``/v1/x`` and ``/x`` are the same route (a base URL with or without /v1)."""
    return path[3:] if path.startswith("/v1/") else path
