"""Redis restarts under a running fleet: a graceful restart and a crash (SIGKILL) with AOF
`everysec`, and a crash with no persistence (every key gone: the operator re-applies the policy,
the pods' heartbeats re-assert the rounds still running, new admissions wait out the recovery
hold). What must hold: the counts equal the records in every sample, nothing is over-admitted,
no round is seated twice; the ledger is exact after a graceful restart (the outbox replays what
met the outage) and loses at most what AOF `everysec` had not yet written after a crash."""
from __future__ import annotations

import os
import signal
import time

import pytest

from figures import record, soak
from chaos.harness import (Checker, Fleet, admin, admin_client, chaos_policy, judge, in_flight_micro, ledger_micro,
                           root_client, secure, wait_until)

LEASE = 1.5
AOF = ("--appendonly", "yes", "--appendfsync", "everysec")
NONE = ("--appendonly", "no")

MODES = {
    # mode: (server args, how it stops, policy lost)
    "aof-everysec, SIGTERM": (AOF, signal.SIGTERM, False),
    "aof-everysec, SIGKILL": (AOF, signal.SIGKILL, False),
    "no persistence, SIGKILL": (NONE, signal.SIGKILL, True),
}


@pytest.mark.parametrize("mode", list(MODES))
def test_a_redis_restart_heals_without_over_admission_and_the_ledger_keeps_what_was_persisted(
        tmp_path, make_server, provider, mode):
    args, sig, wiped = MODES[mode]
    server = make_server(*args)
    mesh = "chaos-restart"
    policy = chaos_policy(LEASE)
    admin(admin_client(server.url), mesh).ops.apply_policy(policy, recovery_hold=False)
    run_s = 20 if soak() else 1.0
    # each pod's thread 0 runs long rounds (4-5 s): a wipe timed just inside one finds it running past the
    # restart and the policy's re-apply, so a heartbeat must re-assert it
    fleet = Fleet(tmp_path, mesh, pods=3, where={"url": server.url}, provider=provider.url, work_s=(0.2, 0.8),
                  extra=lambda i: {"long_s": [4.0, 5.0]} if wiped else {})
    with fleet, Checker(lambda: root_client(server.url), mesh) as checker:
        wait_until(lambda: sum(e["ev"] == "released" for e in fleet.events()) >= 5, 30, what="rounds flowing")
        time.sleep(run_s)
        if wiped:
            since = time.time()
            wait_until(lambda: [e for e in fleet.events() if e["ev"] == "charge" and e["t"] > since
                                and e["id"].split(".")[2] == "0"], 15, what="a long round under way")
        before = ledger_micro(root_client(server.url), mesh)
        os.kill(server.pid, sig)
        down = time.time()
        server._proc.wait(timeout=10)
        server.restart()
        secure(server.client())  # the operator's ACL file (users are not in the data)
        if wiped:
            admin(admin_client(server.url), mesh).ops.apply_policy(policy)  # with the recovery hold
        up = time.time()
        first = wait_until(lambda: [e["t"] for e in fleet.events() if e["ev"] == "admitted" and e["t"] > up],
                           30, what="an admission after the restart")[0]
        time.sleep(run_s)
        fleet.stop()
    # a wipe takes what the outboxes were replaying with it: only the other modes drain exactly
    f, ledger = judge(fleet, checker, root_client(server.url), drained=not wiped)
    events = fleet.events()
    shed = sum(1 for e in events if e["ev"] in ("shed", "failed") and down <= e["t"] <= first + 1)
    settings = {"mode": mode, "lease_ttl_s": LEASE, "pods": 3, "threads_per_pod": 3, "run_s": run_s}
    if wiped:
        # the day's ledger went with the data: what is left is what was booked after, and replays
        after = sum(round(e["usd"] * 1e6) for e in events if e["ev"] in ("charge", "cost") and e["t"] > down)
        assert ledger <= f.expected_micro
        assert f.reasserted >= 1
        record("restart", f"ledger kept after a wipe (micro-USD, of {f.expected_micro})", ledger,
               must=f">= what was charged after the wipe ({after})", settings=settings)
        assert ledger >= after - in_flight_micro(events)
    elif sig == signal.SIGTERM:
        assert ledger == f.expected_micro, (ledger, f.expected_micro)
        record("restart", "ledger error (micro-USD)", ledger - f.expected_micro, must="0", settings=settings)
    else:
        lost = f.expected_micro - ledger
        assert 0 <= lost <= f.expected_micro - before + in_flight_micro(events), (lost, before, f.expected_micro)
        record("restart", "ledger lost to the crash (micro-USD; AOF everysec: up to 1 s of writes)", lost,
               must="only the last second's", settings=settings)
    record("restart", "admission-unavailable window (down to first admission)", round(first - down, 2), unit="s",
           settings=settings)
    record("restart", "rounds shed or failed in that window", shed, settings=settings)
    record("restart", "seats re-asserted by heartbeats", f.reasserted, settings=settings)
    record("restart", "over-admission events", f.over_admissions, must="0", settings=settings)

