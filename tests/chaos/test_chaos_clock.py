"""Clocks: the server's time steps past every lease (DEBUG SLEEP: the server stalls, then its
TIME has jumped), and pods whose wall clocks are off by an hour either way while their releases
meet an outage and wait in their outboxes. What must hold: leases are judged on the server's one
clock, a stall re-asserts the live rounds instead of losing them, no pool is over-admitted beyond
that, and a pod's wrong clock never loses or misplaces a dollar of the ledger."""
from __future__ import annotations

import time

from figures import record, soak
from chaos.harness import Checker, Fleet, admin, admin_client, chaos_policy, judge, proxies, root_client, wait_until

LEASE = 1.5


def _flowing(fleet: Fleet, n: int = 10) -> None:
    wait_until(lambda: sum(e["ev"] == "released" for e in fleet.events()) >= n, 30, what="rounds flowing")


def test_a_server_clock_step_past_every_lease_reasserts_live_rounds_without_over_admission(
        tmp_path, make_server, provider):
    server = make_server("--enable-debug-command", "yes")
    mesh = "chaos-step"
    admin(admin_client(server.url), mesh).ops.apply_policy(chaos_policy(LEASE), recovery_hold=False)
    stall = 2 * LEASE
    fleet = Fleet(tmp_path, mesh, pods=3, where={"url": server.url}, provider=provider.url, work_s=(0.2, 0.8))
    with fleet, Checker(lambda: root_client(server.url), mesh) as checker:
        _flowing(fleet, 5)
        stalls = 3 if soak() else 1
        for _ in range(stalls):
            _debug_sleep(server.url, stall)
            time.sleep(LEASE)
        fleet.stop()
    f, ledger = judge(fleet, checker, root_client(server.url))
    assert ledger == f.expected_micro, (ledger, f.expected_micro)
    settings = {"stall_s": stall, "lease_ttl_s": LEASE, "pods": 3, "stalls": stalls}
    record("clock", "server clock step (DEBUG SLEEP): seats re-asserted", f.reasserted, settings=settings)
    record("clock", "server clock step: over-admission events", f.over_admissions, must="0", settings=settings)
    record("clock", "server clock step: ledger error (micro-USD)", ledger - f.expected_micro, must="0",
           settings=settings)


def _debug_sleep(url: str, seconds: float) -> None:
    import redis

    with redis.Redis.from_url(url, socket_timeout=seconds + 5) as c:
        c.execute_command("DEBUG", "SLEEP", str(seconds))


def test_a_pod_whose_clock_is_off_by_an_hour_books_every_dollar_on_the_servers_day(
        tmp_path, make_server, provider):
    server = make_server()
    mesh = "chaos-drift"
    admin(admin_client(server.url), mesh).ops.apply_policy(chaos_policy(LEASE), recovery_hold=False)
    skews = {0: 3600.0, 1: -3600.0, 2: 0.0}
    outages = 4 if soak() else 2
    with proxies(server, len(skews)) as proxy:
        fleet = Fleet(tmp_path, mesh, pods=3, where=lambda i: {"url": proxy[i].url}, provider=provider.url,
                      extra=lambda i: {"clock_skew": skews[i]})
        with fleet, Checker(lambda: root_client(server.url), mesh) as checker:
            _flowing(fleet)
            for _ in range(outages):
                # Redis is unreachable for a second: releases and charges wait in the outboxes,
                # stamped with the time, and are replayed after
                for p in proxy:
                    p.partition("reset")
                time.sleep(1.0)
                for p in proxy:
                    p.heal()
                time.sleep(0.5)
            fleet.stop()
    root = root_client(server.url)
    f, ledger = judge(fleet, checker, root)
    events = fleet.events()
    days = sorted(k.decode().rpartition(":")[2] for k in root.scan_iter(match=f"adm:{{{mesh}}}:spend:*"))
    server_days = {time.strftime("%Y-%m-%d", time.gmtime(t)) for t in (min(e["t"] for e in events),
                                                                         max(e["t"] for e in events))}
    assert ledger == f.expected_micro, (ledger, f.expected_micro)
    assert set(days) <= server_days, (days, server_days)
    settings = {"pod_clock_skews_s": sorted(skews.values()), "outages": outages, "outage_s": 1.0}
    record("clock", "pods off by an hour: ledger error (micro-USD)", ledger - f.expected_micro, must="0",
           settings=settings)
    record("clock", "pods off by an hour: ledger days other than the server's", len(set(days) - server_days),
           must="0", settings=settings)
