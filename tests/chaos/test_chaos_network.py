"""The network between pods and Redis (each pod through its own FaultProxy): replies lost after
the server applied the command, delays, dropped connections, and one pod cut off for twice its
lease. What must hold: a lost reply never counts a dollar twice or seats a round twice (the
retry finds the same intent, the tombstone, the charge key), nothing is over-admitted, and a
partitioned pod loses only its own admissions: its seats lapse and go to the other pods, its
rounds that were still running are re-asserted when it heals, and its releases and charges wait
in its outbox and are booked once."""
from __future__ import annotations

import time

from figures import record, soak
from chaos.harness import Checker, Fleet, admin, admin_client, chaos_policy, judge, proxies, root_client, wait_until

LEASE = 1.5


def test_lost_replies_delays_and_dropped_connections_count_every_dollar_once(tmp_path, make_server, provider):
    server = make_server()
    mesh = "chaos-net"
    admin(admin_client(server.url), mesh).ops.apply_policy(chaos_policy(LEASE), recovery_hold=False)
    run_s = 60 if soak() else 3
    drop_p = 0.05
    with proxies(server, 3) as proxy:
        fleet = Fleet(tmp_path, mesh, pods=3, where=lambda i: {"url": proxy[i].url}, provider=provider.url)
        with fleet, Checker(lambda: root_client(server.url), mesh) as checker:
            wait_until(lambda: sum(e["ev"] == "released" for e in fleet.events()) >= 10, 30, what="rounds flowing")
            for i, p in enumerate(proxy):
                p.drop_replies(drop_p, seed=i)
            proxy[2].delay(0.02)
            end = time.monotonic() + run_s
            while time.monotonic() < end:
                time.sleep(0.5)
                proxy[1].drop_connections()
            for p in proxy:
                p.heal()
            time.sleep(1.0)
            fleet.stop()
        stats = [p.stats() for p in proxy]
    f, ledger = judge(fleet, checker, root_client(server.url))
    dropped = sum(s["replies_dropped"] for s in stats)
    assert dropped >= 5, stats
    assert ledger == f.expected_micro, (ledger, f.expected_micro)
    settings = {"reply_drop_probability": drop_p, "delay_s": 0.02, "connection_drops_every_s": 0.5,
                "run_s": run_s, "pods": 3, "outbox": True}
    record("network", "replies dropped after the server applied the command", dropped, settings=settings)
    record("network", "ledger error after lost replies (micro-USD)", ledger - f.expected_micro, must="0",
           settings=settings)
    record("network", "rounds seated twice after lost replies", f.seated_twice, must="0", settings=settings)
    record("network", "over-admission events", f.over_admissions, must="0", settings=settings)
    record("network", "rounds completed / shed / failed", f"{f.rounds_done} / {f.rounds_shed} / {f.rounds_failed}",
           settings=settings)


def test_a_partitioned_pod_loses_only_its_own_admissions_and_books_every_dollar_on_healing(
        tmp_path, make_server, provider):
    server = make_server()
    mesh = "chaos-part"
    admin(admin_client(server.url), mesh).ops.apply_policy(chaos_policy(LEASE), recovery_hold=False)
    cut_s = 2 * LEASE
    with proxies(server, 3) as proxy:
        # longer rounds, so the cut pod has rounds still running when it heals
        fleet = Fleet(tmp_path, mesh, pods=3, where=lambda i: {"url": proxy[i].url}, provider=provider.url,
                      work_s=(0.3, 1.5))
        with fleet, Checker(lambda: root_client(server.url), mesh) as checker:
            wait_until(lambda: sum(e["ev"] == "released" for e in fleet.events()) >= 5, 30, what="rounds flowing")
            wait_until(lambda: checker.samples and any(s[3] == "pod0" for s in checker.samples[-1].seats), 10,
                       what="pod0 holding a seat")
            cut = time.time()
            proxy[0].partition("blackhole")
            time.sleep(cut_s)
            healed = time.time()
            proxy[0].heal()
            time.sleep(LEASE)
            fleet.stop()
    f, ledger = judge(fleet, checker, root_client(server.url))
    events = fleet.events()
    assert ledger == f.expected_micro, (ledger, f.expected_micro)
    during = [e for e in events if cut <= e["t"] <= healed]
    # an answer that left Redis before the cut is journaled a moment after it: 0.2 s of grace
    cut_admitted = sum(1 for e in during if e["ev"] == "admitted" and e["pod"] == "pod0" and e["t"] > cut + 0.2)
    others = sum(1 for e in during if e["ev"] == "admitted" and e["pod"] != "pod0")
    before = [e for e in events if cut - cut_s <= e["t"] < cut]
    others_before = sum(1 for e in before if e["ev"] == "admitted" and e["pod"] != "pod0")
    # pod0's seats in the last sample before the cut; lapsed: none of them left once a lease and
    # a sweep have passed, while it is still cut off
    held = {x[0] for x in [s for s in checker.samples if s.t < cut][-1].seats if x[3] == "pod0"}
    after = {x[0] for s in checker.samples if cut + LEASE + 0.6 < s.t <= healed for x in s.seats}
    lapsed = len(held - after)
    assert cut_admitted == 0, [e for e in during if e["pod"] == "pod0"][:5]
    assert others > 0, during[:5]
    settings = {"partition_s": cut_s, "mode": "blackhole", "lease_ttl_s": LEASE, "pods": 3}
    record("network", "admissions of the partitioned pod while cut off", cut_admitted, must="0 (it cannot reach Redis)",
           settings=settings)
    record("network", "admissions of the other pods while it was cut off (same span before)",
           f"{others} ({others_before})", settings=settings)
    record("network", "seats it held when cut off that lapsed to the other pods", f"{lapsed} of {len(held)}",
           settings=settings)
    record("network", "ledger error after the partition (micro-USD)", ledger - f.expected_micro, must="0",
           settings=settings)
    record("network", "over-admission events (partition)", f.over_admissions, must="0", settings=settings)
