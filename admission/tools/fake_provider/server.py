"""The HTTP server around a FakeProvider: its routes, in a daemon thread or in a running loop."""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from typing import Any, Callable, Iterator

from .pools import FakeProvider
from .protocols import BadRequest, anthropic_answer, error_body, openai_answer, parse_ask
from .statuses import ERRORS
from .wire import Request, Response, _api_key, _Closed, _Input, _json, _route_path, encode_response, read_request

log = logging.getLogger("admission.tools.fake_provider")


class FakeProviderServer:
    """The HTTP server around a ``FakeProvider``: in a daemon thread (``start``/``stop``,
    ``running()``) or in the caller's event loop (``await open()``, ``serve_forever()``,
    ``aclose()``)."""

    def __init__(self, capacity: float = 12, models: dict[str, float] | None = None, scale: float = 1.0,
                 seed: int | None = None, tokens: int = 600, price_per_1k: float = 0.01,
                 key_limit_usd: float | None = None, faults: dict | None = None, overloaded_share: float = 0.0,
                 retry_after_max: float = 60.0, host: str = "127.0.0.1", port: int = 0, **ceilings: Any):
        """``ceilings``: the rate ceilings' settings of ``FakeProvider`` (``ceilings``, ``style``,
        ``outside``, ``rpm_burst_s``, ``cache_read_share``, ``cache_write_share``, ``clock_start``)."""
        self.provider = FakeProvider(capacity=capacity, models=models, scale=scale, seed=seed, tokens=tokens,
                                     price_per_1k=price_per_1k, key_limit_usd=key_limit_usd, faults=faults,
                                     overloaded_share=overloaded_share, retry_after_max=retry_after_max, **ceilings)
        self.host, self.port = host, int(port)
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._conns: set[asyncio.Task] = set()
        self._done: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    # -- in the caller's loop --------------------------------------------------------------------------
    async def open(self) -> str:
        """Bind and start accepting; returns the URL (the real port when port was 0)."""
        self._loop = asyncio.get_running_loop()
        self._done = asyncio.Event()
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.url

    async def serve_forever(self) -> None:
        """Serve until ``aclose()`` (or ``stop()`` from another thread, or cancellation)."""
        if self._server is None:
            await self.open()
        assert self._done is not None
        try:
            await self._done.wait()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            await self._server.wait_closed()
            self._server = None
        self.provider.close()
        if self._done is not None:
            self._done.set()

    # -- in a daemon thread ----------------------------------------------------------------------------
    def start(self) -> str:
        """Serve in a daemon thread; returns the URL once it accepts."""
        ready = threading.Event()
        failed: list[BaseException] = []

        async def main() -> None:
            try:
                await self.open()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
                failed.append(exc)
                return
            finally:
                ready.set()
            await self.serve_forever()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), name="fake-provider", daemon=True)
        self._thread.start()
        ready.wait()
        if failed:
            raise failed[0]
        return self.url

    def stop(self) -> None:
        if self._thread is None:
            return
        if self._loop is not None and self._loop.is_running():
            with contextlib.suppress(RuntimeError):
                asyncio.run_coroutine_threadsafe(self.aclose(), self._loop).result(timeout=10)
        self._thread.join(timeout=10)
        self._thread = None

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        url = self.start()
        try:
            yield url
        finally:
            self.stop()

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn`` in the server's loop (the model's state lives there); waits for its result."""
        loop = self._loop
        if loop is None or not loop.is_running() or self._thread is None or \
                threading.current_thread() is self._thread:
            return fn(*args, **kwargs)

        async def call() -> Any:
            return fn(*args, **kwargs)

        return asyncio.run_coroutine_threadsafe(call(), loop).result(timeout=10)

    def stats(self) -> dict[str, Any]:
        return self._call(self.provider.stats)

    def set_faults(self, faults: dict | None) -> None:
        self._call(self.provider.set_faults, faults)

    def configure(self, **settings: Any) -> None:
        self._call(self.provider.configure, **settings)

    def reset(self, keys: bool = False) -> None:
        self._call(self.provider.reset, keys)

    # -- connections ---------------------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        inp = _Input(reader)
        try:
            while await self._one(inp, writer):
                pass
        except (_Closed, ConnectionError, asyncio.CancelledError):
            pass
        except Exception as exc:  # noqa: BLE001 - one line per error, the connection closes
            log.error("fake provider: connection failed: %r", exc)
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _one(self, inp: _Input, writer: asyncio.StreamWriter) -> bool:
        """Read, answer one request; False when the connection should close."""
        try:
            req = await read_request(inp, writer)
        except BadRequest as exc:
            self.provider.rejected[str(exc.status)] += 1
            resp = Response(exc.status, error_body("openai", exc.status, str(exc)), close=True)
            writer.write(encode_response(resp, False))
            await writer.drain()
            return False
        if req is None:
            return False
        try:
            resp = await self._while_connected(self._dispatch(req), inp)
        except _Closed:
            return False
        except Exception as exc:  # noqa: BLE001 - a bug here must not kill the server
            log.error("fake provider: %s %s failed: %r", req.method, req.path, exc)
            resp = Response(500, error_body(_protocol(req.path), 500, f"fake provider bug: {exc!r}"))
        keep = req.keep_alive and not resp.close
        writer.write(encode_response(resp, keep))
        await writer.drain()
        return keep

    async def _while_connected(self, coro: Any, inp: _Input) -> Response:
        """Run ``coro``; if the client hangs up first, cancel it (its round leaves the pool)."""
        work = asyncio.ensure_future(coro)
        gone = asyncio.ensure_future(inp.hung_up())
        try:
            await asyncio.wait({work, gone}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            gone.cancel()  # and wait for it: the next read of the connection must not race it
            with contextlib.suppress(asyncio.CancelledError):
                await gone
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        raise _Closed

    async def _dispatch(self, req: Request) -> Response:
        route = _route_path(req.path)
        if req.method == "GET":
            return self._get(route)
        if req.method != "POST":
            return self._reject(req.path, 405)
        if route == "/chat/completions":
            return await self._chat(req, "openai")
        if route == "/messages":
            return await self._chat(req, "anthropic")
        if route == "/admin/faults":
            return self._admin_faults(req.body)
        if route == "/admin/reset":
            return self._admin_reset(req.body)
        return self._reject(req.path, 404)

    def _reject(self, path: str, status: int, message: str | None = None) -> Response:
        self.provider.rejected[str(status)] += 1
        return Response(status, error_body(_protocol(path), status, message or ERRORS[status][3]))

    def _get(self, route: str) -> Response:
        if route == "/healthz":
            return Response(200, b"ok", "text/plain")
        if route == "/stats":
            return _json(200, self.provider.stats())
        if route == "/models":
            names = sorted(set(self.provider.models) | set(self.provider.pools))
            return _json(200, {"object": "list", "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "fake-provider"} for name in names]})
        return self._reject(route, 404)

    async def _chat(self, req: Request, protocol: str) -> Response:
        key = _api_key(req.headers)
        if key is None:
            return self._reject(req.path, 401)
        try:
            ask = parse_ask(req.body, protocol, self.provider.tokens)
        except BadRequest as exc:
            return self._reject(req.path, exc.status, str(exc))
        out = await self.provider.round(ask.model, key, ask.tokens, ask.prompt_tokens)
        if out.status != 200:
            return Response(out.status, error_body(protocol, out.status, out.message), headers=out.headers)
        body, ctype = (openai_answer if protocol == "openai" else anthropic_answer)(ask, out)
        return Response(200, body, ctype, headers=out.headers)

    def _admin_faults(self, raw: bytes) -> Response:
        try:
            doc = json.loads(raw or b"{}")
            if not isinstance(doc, dict):
                raise ValueError("the body must be a JSON object")
            settings = {k: doc[k] for k in ("faults", "key_limit_usd", "capacity", "overloaded_share", "ceilings",
                                            "outside", "style") if k in doc}
            if "faults" in settings and not isinstance(settings["faults"], dict):
                raise ValueError("faults must be an object {status: probability}")
            for name in ("ceilings", "outside"):
                if name in settings and not isinstance(settings[name], dict):
                    raise ValueError(f"{name} must be an object {{kind: per minute or day}}")
            if "faults" in settings:
                settings["faults"] = settings["faults"] or {}
            self.provider.configure(**settings)
        except (ValueError, TypeError) as exc:
            return self._reject("/admin", 400, str(exc))
        p = self.provider
        return _json(200, {"faults": {str(k): v for k, v in p.faults.items()}, "key_limit_usd": p.key_limit_usd,
                           "overloaded_share": p.overloaded_share, "default_capacity": p.capacity,
                           "capacity": {name: pool.pm.k for name, pool in p.pools.items()},
                           "ceilings": dict(p.ceilings.limits), "outside": dict(p.ceilings.outside),
                           "style": p.ceilings.style})

    def _admin_reset(self, raw: bytes) -> Response:
        try:
            doc = json.loads(raw or b"{}")
        except ValueError as exc:
            return self._reject("/admin", 400, f"the body is not JSON: {exc}")
        self.provider.reset(keys=isinstance(doc, dict) and bool(doc.get("keys")))
        return _json(200, {"reset": True})


def _protocol(path: str) -> str:
    return "anthropic" if _route_path(path) == "/messages" else "openai"
