"""The HTTP server: routes each request to the source, the metrics or the page, with the
security headers every answer carries; one bad request never stops it."""
from __future__ import annotations

import json
import secrets
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Iterable
from urllib.parse import parse_qs, urlsplit, urlunsplit

import redis

from .._log import get_logger
from ..client import fail_fast_options
from . import metrics
from .page import render_page
from .source import CACHE_SECONDS, CensusSource, one_line

log = get_logger("admission.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464  # the port Prometheus' default-port allocations list for exporters like this one


class Handler(BaseHTTPRequestHandler):
    server_version = "admission-serve"
    source: CensusSource  # set on the subclass make_server builds

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        log.debug("http_access", client=self.client_address[0], line=format % args)

    def do_HEAD(self) -> None:  # noqa: N802
        self._route(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._route(head=False)

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        path = url.path.rstrip("/") or "/"
        try:
            if path == "/healthz":
                return self._send(200, b"ok\n", "text/plain; charset=utf-8", head)
            if path not in ("/", "/index.html", "/metrics", "/census.json", "/readyz"):
                return self._send(404, b"not found\n", "text/plain; charset=utf-8", head)
            asked = query.get("mesh") or []
            unknown = [m for m in asked if m not in self.source.adms]
            if unknown:
                return self._send(404, f"unknown mesh {unknown[0]!r}; serving {', '.join(self.source.meshes)}\n"
                                  .encode(), "text/plain; charset=utf-8", head)
            mesh = asked[0] if asked else self.source.meshes[0]
            if path == "/metrics":
                body, ctype = metrics.metrics_text(self.source, list(dict.fromkeys(asked)) or self.source.meshes,
                                           self.headers.get("Accept"))
                return self._send(200, body, ctype, head)
            if path == "/readyz":
                ok, why = self.source.ready(mesh)
                return self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8", head)
            snap = self.source.snapshot(mesh)
            if path == "/census.json":
                doc = snap.census if snap.census is not None else {"error": snap.error, "mesh": mesh}
                return self._send(200 if snap.census is not None else 503, json.dumps(doc).encode(),
                                  "application/json", head)
            nonce = secrets.token_urlsafe(16)
            page = render_page(mesh, self.source.meshes, snap.census, snap.error, nonce=nonce)
            csp = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
                   "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
            return self._send(200, page.encode(), "text/html; charset=utf-8", head, {"Content-Security-Policy": csp})
        except (BrokenPipeError, ConnectionResetError):
            return None
        except Exception as exc:  # one bad request never stops the server
            log.error("serve_request_failed", path=url.path, error=f"{type(exc).__name__}: {one_line(exc)}")
            try:
                return self._send(500, b"internal error\n", "text/plain; charset=utf-8", head)
            except OSError:
                return None

    def _send(self, status: int, body: bytes, ctype: str, head: bool, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)


def make_server(redis_or_url: redis.Redis | str, meshes: Iterable[str], host: str = DEFAULT_HOST,
                port: int = DEFAULT_PORT, *, cache_seconds: float = CACHE_SECONDS) -> ThreadingHTTPServer:
    """A bound server (port 0: any free port, see ``server.server_address``); run it with
    ``serve_forever()`` and stop it with ``shutdown()`` then ``server_close()``. Its ``source``
    attribute is the CensusSource."""
    metrics.prometheus()  # a missing extra fails here, not at the first scrape
    client = (redis.Redis.from_url(redis_or_url, **fail_fast_options()) if isinstance(redis_or_url, str)
              else redis_or_url)
    source = CensusSource(client, meshes, cache_seconds=cache_seconds)
    handler = type("CensusHandler", (Handler,), {"source": source})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    server.source = source  # type: ignore[attr-defined]
    return server


def serve(url: str, meshes: Iterable[str], host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve until interrupted (KeyboardInterrupt propagates; the socket is closed)."""
    server = make_server(url, meshes, host, port)
    log.info("serving", host=server.server_address[0], port=server.server_address[1],
             meshes=server.source.meshes, redis=redact(url))  # type: ignore[attr-defined]
    try:
        server.serve_forever()
    finally:
        server.server_close()


def redact(url: str) -> str:
    """The URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))


