"""A primary, its replicas and the Sentinels watching them: LocalSentinel, LocalSentinelGroup."""
from __future__ import annotations

import secrets
import time
from pathlib import Path

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

from .binaries import free_port
from .processes import ServerStartError, _log_tail
from .replication import _FAST_SYNC, _info_field, _text
from .server import LocalServer

log = structlog.get_logger("admission.tools.servers")


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
