"""Failovers under load: a Sentinel group (a primary, a replica, three Sentinels; the pods connect
through Sentinel with redis-py) and a 3-primary Cluster with a replica each, whose primary of the
mesh's slot is killed (SIGKILL) while a fleet runs rounds, then brought back (it rejoins as a
replica of the new primary, as an operator's restart would). What must hold: no round is ever
seated twice, nothing is over-admitted, every dollar is in the ledger exactly once, and the rounds
shed and the length of the outage are measured.

Replication is asynchronous: what the old primary acknowledged in its last moment and had not yet
sent to its replica is gone with it (a run without confirmation lost 9,768 of 867,505 µ$ so). The
pods therefore run with ``confirm_replicas=1``: a release or charge leaves the pod's outbox only
once WAIT says the replica has it, and one that was not confirmed is applied again on the new
primary (it counts once)."""
from __future__ import annotations

import time

import redis

from admission.client import fail_fast_options
from admission.tools.servers import LocalCluster, LocalSentinelGroup, wait_replicas_online

from acl import ADMIN_PW, ADMIN_USER
from figures import record, soak
from chaos.harness import Checker, Fleet, admin, chaos_policy, judge, secure, wait_until

LEASE = 1.5


def _outage(events: list[dict], down: float) -> tuple[float, int]:
    """Seconds from the kill to the first admission after it, and the rounds shed or failed
    in that window (plus one second: a round refused just before the answer came back)."""
    first = min(e["t"] for e in events if e["ev"] == "admitted" and e["t"] > down)
    shed = sum(1 for e in events if e["ev"] in ("shed", "failed") and down <= e["t"] <= first + 1)
    return first - down, shed


def _prepare(nodes, connect_admin, mesh: str) -> None:
    """The deploy file's users on every data node (replication does not carry them), then the
    policy applied by the admin user (connected only once the users exist)."""
    secure(*(n.client() for n in nodes))
    admin(connect_admin(), mesh).ops.apply_policy(chaos_policy(LEASE), recovery_hold=False)


def _through_a_kill(fleet: Fleet, checker: Checker, kill, promoted, run_s: float) -> tuple[float, float]:
    """Rounds flow, the primary is killed, a new one is promoted, rounds flow again, the killed
    node comes back as a replica; returns (when it was killed, seconds until the new primary
    answered)."""
    with fleet, checker:
        wait_until(lambda: sum(e["ev"] == "released" for e in fleet.events()) >= 10, 30, what="rounds flowing")
        time.sleep(run_s)
        killed = kill()
        down = time.time()
        new = promoted()
        failover_s = time.time() - down
        wait_until(lambda: any(e["ev"] == "admitted" and e["t"] > down for e in fleet.events()), 30,
                   what="an admission after the failover")
        time.sleep(run_s)
        # until a replica is back, the pods' ledger writes wait unconfirmed in their outboxes
        killed.restart()
        secure(killed.client())
        wait_replicas_online(new, timeout=30)
        time.sleep(run_s)
        fleet.stop()
    return down, failover_s


def _judge(section: str, fault: str, fleet: Fleet, checker: Checker, client: redis.Redis, down: float,
           failover_s: float, settings: dict) -> None:
    f, ledger = judge(fleet, checker, client)
    events = fleet.events()
    assert ledger == f.expected_micro, (ledger, f.expected_micro)
    unconfirmed = sum(1 for e in events if e["ev"] == "queued" and e["why"].startswith("unconfirmed"))
    window, shed = _outage(events, down)
    record(section, f"{fault}: new primary after the kill", round(failover_s, 2), unit="s", settings=settings)
    record(section, f"{fault}: admission-unavailable window (kill to first admission)", round(window, 2), unit="s",
           settings=settings)
    record(section, f"{fault}: rounds shed or failed in that window", shed, settings=settings)
    record(section, f"{fault}: rounds seated twice", f.seated_twice, must="0", settings=settings)
    record(section, f"{fault}: over-admission events", f.over_admissions, must="0", settings=settings)
    record(section, f"{fault}: ledger error after the failover (micro-USD; outbox, confirm_replicas=1)",
           ledger - f.expected_micro, must="0", settings=settings)
    record(section, f"{fault}: ledger writes kept for a replica's confirmation", unconfirmed, settings=settings)
    record(section, f"{fault}: seats re-asserted by heartbeats", f.reasserted, settings=settings)


def test_a_sentinel_failover_seats_no_round_twice_and_loses_no_dollar(tmp_path, provider):
    mesh = "chaos-sentinel"
    down_after = 1000
    with LocalSentinelGroup("redis", replicas=1, sentinels=3, down_after_ms=down_after) as group:
        fast = fail_fast_options()
        _prepare(group.servers, lambda: group.master_client(username=ADMIN_USER, password=ADMIN_PW, **fast), mesh)
        run_s = 30 if soak() else 1.0
        fleet = Fleet(tmp_path, mesh, pods=3, provider=provider.url,
                      where={"sentinels": group.sentinel_addrs, "master": group.master_name, "confirm_replicas": 1})
        checker = Checker(lambda: group.master_client(**fast), mesh)
        killed: list = []
        down, failover_s = _through_a_kill(fleet, checker, lambda: killed.append(group.kill_primary()) or killed[0],
                                           lambda: group.wait_failover(killed[0].port, timeout=30), run_s)
        _judge("failover", "Sentinel", fleet, checker, group.master_client(**fast), down, failover_s,
               {"replicas": 1, "sentinels": 3, "down_after_ms": down_after, "lease_ttl_s": LEASE, "pods": 3,
                "kill": "SIGKILL of the primary, restarted after the failover", "confirm_replicas": 1})


def test_a_cluster_failover_seats_no_round_twice_and_loses_no_dollar(tmp_path, provider):
    mesh = "chaos-cluster"
    config_key = f"adm:{{{mesh}}}:config"
    with LocalCluster("redis", masters=3, replicas=1, node_timeout_ms=1000) as cluster:
        fast = fail_fast_options()
        _prepare(cluster.nodes, lambda: cluster.client(username=ADMIN_USER, password=ADMIN_PW, **fast), mesh)
        run_s = 30 if soak() else 1.0

        def primary() -> redis.Redis:
            return cluster.primary_for(config_key).client(**fast)

        fleet = Fleet(tmp_path, mesh, pods=3, provider=provider.url,
                      where={"cluster_nodes": [["127.0.0.1", p] for p in cluster.ports], "confirm_replicas": 1})
        checker = Checker(primary, mesh)
        down, failover_s = _through_a_kill(fleet, checker, lambda: cluster.kill_primary_for(config_key),
                                           lambda: cluster.wait_promoted(config_key, timeout=30), run_s)
        _judge("failover", "Cluster", fleet, checker, primary(), down, failover_s,
               {"masters": 3, "replicas_each": 1, "cluster_node_timeout_ms": 1000, "lease_ttl_s": LEASE, "pods": 3,
                "kill": "SIGKILL of the mesh's primary, restarted after the failover", "confirm_replicas": 1})
