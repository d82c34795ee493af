"""Throw-away local Redis / Valkey servers for tests, the demo, the benchmark
and the simulator: single servers (LocalServer), clusters with or without replicas
(LocalCluster) and a primary with replicas under Sentinels (LocalSentinelGroup), with
the crashes and failovers chaos tests need (kill, kill_primary, wait_failover...).

Everything runs on 127.0.0.1 with persistence off, in a private temp dir that
is removed on stop(). Servers are stopped at interpreter exit (atexit) and, when
started from the main thread on Linux, also die with their parent process
(PR_SET_PDEATHSIG) so a killed test run leaves no orphans.

The package, by section: ``binaries`` (finding the servers, a free port), ``processes`` (process
hygiene), ``server`` (LocalServer), ``replication`` (what replicas share), ``cluster``
(LocalCluster), ``sentinel`` (LocalSentinel, LocalSentinelGroup).
"""
from __future__ import annotations

from .binaries import ENGINES, available_engines, binary_version, default_engine, find_server, free_port
from .cluster import CLUSTER_SLOTS, LocalCluster, _slot_ranges
from .processes import ServerStartError
from .replication import wait_replicas_online
from .sentinel import LocalSentinel, LocalSentinelGroup
from .server import LocalServer

__all__ = ["CLUSTER_SLOTS", "ENGINES", "LocalCluster", "LocalSentinel", "LocalSentinelGroup", "LocalServer",
           "ServerStartError", "available_engines", "binary_version", "default_engine", "find_server", "free_port",
           "wait_replicas_online", "_slot_ranges"]  # _slot_ranges: for tests/test_servers.py
