"""A TCP proxy that injects network faults between a client and a Redis server (chaos tests).

    with LocalServer() as srv, FaultProxy("127.0.0.1", srv.port) as proxy:
        client = redis.Redis.from_url(proxy.url)
        proxy.drop_replies(1.0)     # the server applies the next command, the client never hears
        proxy.partition()           # commands time out until heal()
        proxy.heal()

The proxy runs its own asyncio loop in a daemon thread, so synchronous tests drive it through
thread-safe methods; a method that closes connections returns once they are closed. Bytes are
forwarded chunk by chunk as they arrive (no RESP parsing): a "reply" is whatever the server
sent in one read, which for a request/response client is one reply.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from dataclasses import asdict, dataclass

import structlog

log = structlog.get_logger(__name__)

PARTITION_MODES = ("blackhole", "reset")
_CHUNK = 65536


@dataclass
class ProxyStats:
    """Counters since start(); `active` is the number of connections open now."""

    connections: int = 0  # accepted from clients (including the ones refused by a partition)
    active: int = 0
    bytes_up: int = 0  # client -> server, forwarded
    bytes_down: int = 0  # server -> client, forwarded
    replies_dropped: int = 0
    connections_dropped: int = 0  # closed by a fault: drop_*, partition, heal, a refused connect


class _Link:
    """A client connection and, unless refused, its connection to the server."""

    def __init__(self, client: asyncio.StreamWriter) -> None:
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.tasks: list[asyncio.Task] = []
        self.silenced = False  # caught by a blackhole partition: bytes are discarded
        self.closed = False


class FaultProxy:
    """Forwards 127.0.0.1:`port` to `target_host`:`target_port`, with faults on demand.

    Faults: delay(), drop_connections(), drop_replies(), partition() / heal(). stats() returns
    the counters. Use as a context manager, or call start()/stop() yourself.
    """

    def __init__(self, target_host: str, target_port: int, *, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.host = host
        self.port: int | None = port or None
        self._want_port = port
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._server: asyncio.base_events.Server | None = None
        self._links: set[_Link] = set()
        self._lock = threading.Lock()  # guards the settings and the counters
        self._stats = ProxyStats()
        self._delay = 0.0
        self._drop_p = 0.0
        self._rng = random.Random()
        self._partition: str | None = None

    # -- lifecycle ----------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("proxy not started")
        return f"redis://{self.host}:{self.port}/0"

    def start(self) -> "FaultProxy":
        if self._thread is not None:
            return self
        loop = asyncio.new_event_loop()
        thread = threading.Thread(target=loop.run_forever, name=f"FaultProxy->{self.target_port}",
                                  daemon=True)
        thread.start()
        self._loop, self._thread = loop, thread
        try:
            self._server = self._call(asyncio.start_server(
                self._accept, self.host, self._want_port, reuse_address=True))
        except BaseException:
            self.stop()
            raise
        self.port = self._server.sockets[0].getsockname()[1]
        log.debug("proxy.started", port=self.port, target=f"{self.target_host}:{self.target_port}")
        return self

    def stop(self) -> None:
        """Close the listener and every connection, stop the loop and join its thread."""
        loop, thread = self._loop, self._thread
        if loop is None or thread is None:
            return
        try:
            if thread.is_alive():
                self._call(self._shutdown())
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)
            if not thread.is_alive():
                loop.close()
            self._loop = self._thread = self._server = None
            log.debug("proxy.stopped", port=self.port)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- faults -------------------------------------------------------------

    def delay(self, seconds: float) -> None:
        """Hold every chunk, either way, `seconds` before forwarding it (0: no delay). A
        request/response round trip then takes at least 2 * seconds more."""
        with self._lock:
            self._delay = max(0.0, float(seconds))

    def drop_replies(self, probability: float, seed: int | None = None) -> None:
        """The lost reply: the client's bytes reach the server (which applies the command), but
        each reply chunk is discarded with `probability` and that connection closed, so the
        client sees a connection error for a command that was applied. 0 turns it off."""
        if not 0.0 <= probability <= 1.0:
            raise ValueError("probability must be within [0, 1]")
        with self._lock:
            self._drop_p = float(probability)
            self._rng = random.Random(seed)

    def drop_connections(self) -> int:
        """Close (reset) every current connection now; returns how many. New ones work."""
        return self._call(self._drop_all(reset=True))

    def partition(self, mode: str = "blackhole") -> None:
        """Cut the client off from the server until heal().

        "blackhole" (what a partition usually looks like: timeouts): open connections go
        silent, bytes both ways are discarded; new connections are accepted (the kernel
        completes the handshake) and never answered. "reset": every connection is reset and
        new ones are reset at once (a refused connection, as a down node or a firewall REJECT).
        """
        if mode not in PARTITION_MODES:
            raise ValueError(f"unknown partition mode {mode!r}; expected one of {PARTITION_MODES}")
        self._call(self._set_partition(mode))

    def heal(self) -> None:
        """End a partition and turn every fault off. Connections silenced by a blackhole are
        closed (bytes were lost: their protocol stream is broken); clients reconnect."""
        with self._lock:
            self._delay = 0.0
            self._drop_p = 0.0
        self._call(self._set_partition(None))

    def stats(self) -> dict[str, int]:
        with self._lock:
            return asdict(self._stats)

    # -- inside the loop ----------------------------------------------------

    def _call(self, coro, timeout: float = 10.0):
        """Run `coro` on the proxy's loop from another thread and wait for its result."""
        if self._loop is None:
            coro.close()
            raise RuntimeError("proxy not started")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _count(self, **deltas: int) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self._stats, k, getattr(self._stats, k) + v)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = _Link(writer)
        self._links.add(link)
        self._count(connections=1, active=1)
        mode = self._partition
        if mode == "reset":
            self._close(link, reset=True, fault=True)
            return
        if mode == "blackhole":
            link.silenced = True
            link.tasks = [asyncio.current_task()]  # type: ignore[list-item]
            await self._pump(link, reader, None, up=True)
            return
        try:
            s_reader, link.server = await asyncio.open_connection(self.target_host,
                                                                  self.target_port)
        except OSError:
            self._close(link, reset=True, fault=True)
            return
        if link.closed:  # dropped while connecting
            link.server.transport.abort()
            return
        link.tasks = [asyncio.ensure_future(self._pump(link, reader, link.server, up=True)),
                      asyncio.ensure_future(self._pump(link, s_reader, writer, up=False))]

    async def _pump(self, link: _Link, reader: asyncio.StreamReader,
                    writer: asyncio.StreamWriter | None, *, up: bool) -> None:
        try:
            while not link.closed:
                data = await reader.read(_CHUNK)
                if not data:
                    break
                with self._lock:
                    delay, drop_p, rng = self._delay, self._drop_p, self._rng
                if delay:
                    await asyncio.sleep(delay)
                if link.silenced or link.closed or writer is None:
                    continue  # blackholed: read and discard
                if not up and drop_p and rng.random() < drop_p:
                    self._count(replies_dropped=1)
                    self._close(link, reset=True, fault=True)
                    break
                writer.write(data)
                await writer.drain()
                self._count(**{"bytes_up" if up else "bytes_down": len(data)})
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            self._close(link)

    def _close(self, link: _Link, *, reset: bool = False, fault: bool = False) -> None:
        """Close both sides of `link` (idempotent); `reset` sends an RST instead of a FIN."""
        if link.closed:
            return
        link.closed = True
        self._links.discard(link)
        self._count(active=-1, connections_dropped=1 if fault else 0)
        for w in (link.client, link.server):
            if w is None:
                continue
            if reset:
                sock = w.get_extra_info("socket")
                try:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                except (OSError, AttributeError):
                    pass
                w.transport.abort()
            else:
                w.close()
        current = asyncio.current_task()
        for t in link.tasks:
            if t is not current:
                t.cancel()

    async def _drop_all(self, *, reset: bool, only_silenced: bool = False) -> int:
        links = [ln for ln in self._links if ln.silenced or not only_silenced]
        for ln in links:
            self._close(ln, reset=reset, fault=True)
        await asyncio.sleep(0)  # let the cancelled pumps finish
        return len(links)

    async def _set_partition(self, mode: str | None) -> None:
        self._partition = mode
        if mode == "reset":
            await self._drop_all(reset=True)
        elif mode == "blackhole":
            for ln in self._links:
                ln.silenced = True
        else:
            await self._drop_all(reset=True, only_silenced=True)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        tasks = [t for ln in self._links for t in ln.tasks]
        for ln in list(self._links):
            self._close(ln, reset=True)
        if self._server is not None:
            await self._server.wait_closed()
        await asyncio.gather(*tasks, return_exceptions=True)
