"""A cluster of local servers (masters, optionally with replicas): LocalCluster."""
from __future__ import annotations

import time

import redis
import structlog
from redis.backoff import NoBackoff
from redis.retry import Retry

from .processes import ServerStartError, _log_tail
from .replication import _FAST_SYNC, _info_field, _text
from .server import LocalServer

log = structlog.get_logger("admission.tools.servers")

CLUSTER_SLOTS = 16384


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
