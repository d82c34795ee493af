"""The exact ledger under fire: 8 pod processes round, charge mid-round and release with a price
for 60 s while replies are lost after the server applied the call (a wrapper drops them) and the
server is killed and restarted once (AOF, fsync always). Every pod keeps its charges and releases
in a durable outbox when it cannot reach Redis and replays them; at the end the ledger equals
the sum of the distinct charges to the micro-dollar, per lane."""
from __future__ import annotations

import multiprocessing as mp
import os
import random
import threading
import time

import pytest
import redis

from admission import Admission, scripts
from admission.tools.servers import LocalServer

from conftest import REAL
from figures import soak

MESH, POOL, PROVIDER = "ledger", "m@p", "p"
LANES = ("reviews", "bugfix", "triage", "express")
# 10 s of load by default (the chaos suite adds lost replies per pod, failovers and restarts);
# ADMISSION_SOAK=1 or ADMISSION_LEDGER_SECONDS for the long run
PODS, THREADS = 8, 3
SECONDS = float(os.environ.get("ADMISSION_LEDGER_SECONDS", "120" if soak() else "10"))
LOSS = 0.15  # the share of release and charge replies lost after the server applied them


def _policy() -> dict:
    return {"tunables": {"seed_estimate": 512, "lease_ttl": 30, "grow_interval": 5},
            "lanes": {lane: {"floor": 0, "weight": 1, "priority": i} for i, lane in enumerate(LANES)},
            "providers": {PROVIDER: {}}, "pools": {POOL: {}}}


def pod_main(url: str, pod: str, seed: int, outbox: str, seconds: float, results) -> None:
    rng = random.Random(seed)
    real = scripts.call

    def lossy(client, command, keys, args):
        out = real(client, command, keys, args)
        if command in ("release", "charge") and rng.random() < LOSS:
            raise redis.ConnectionError("injected: the reply was lost after the server applied the call")
        return out

    scripts.call = lossy
    adm = Admission.from_url(url, mesh=MESH, pod=pod, background=True, seed=seed, outbox=outbox,
                             connect_timeout=0.2, socket_timeout=0.5)
    truth: dict[str, int] = {lane: 0 for lane in LANES}
    errors: list[str] = []
    lock = threading.Lock()
    end = time.monotonic() + seconds

    def work(k: int) -> None:
        trng, n = random.Random(seed * 1000 + k), 0
        while time.monotonic() < end:
            n += 1
            lane = LANES[trng.randrange(len(LANES))]
            try:
                with adm.round(lane=lane, model=POOL, round_id=f"{pod}/{k}/{n}", timeout=60) as r:
                    for step in range(trng.randrange(3)):
                        micro = trng.randrange(1, 5_000_000)
                        r.charge(micro / 1e6, key=f"step-{step}")
                        with lock:
                            truth[lane] += micro
                    micro = trng.randrange(0, 2_000_000)
                    r.cost_usd = micro / 1e6
                    with lock:
                        truth[lane] += micro
                    time.sleep(trng.uniform(0.0, 0.02))
            except Exception as exc:  # noqa: BLE001 - reported to the parent, which fails the test
                with lock:
                    errors.append(f"{pod}/{k}/{n}: {exc!r}")

    threads = [threading.Thread(target=work, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    deadline = time.monotonic() + 60
    while adm.flush() and time.monotonic() < deadline:  # what still waits goes out before we stop
        time.sleep(0.2)
    left = len(adm._pending)
    adm.close()
    results.put((pod, truth, errors, left))


@pytest.mark.skipif("redis" not in REAL and "valkey" not in REAL, reason="needs a real server")
def test_the_ledger_equals_the_distinct_charges_under_lost_replies_and_a_restart(tmp_path):
    engine = "redis" if "redis" in REAL else "valkey"
    with LocalServer(engine, extra_args=["--appendonly", "yes", "--appendfsync", "always"]) as srv:
        Admission.from_url(srv.url, mesh=MESH, pod="setup", background=False).ops.apply_policy(
            _policy(), recovery_hold=False)
        ctx = mp.get_context("spawn")
        results = ctx.Queue()
        procs = [ctx.Process(target=pod_main, daemon=True,
                             args=(srv.url, f"pod{i}", i + 1, str(tmp_path / f"pod{i}.outbox"), SECONDS, results))
                 for i in range(PODS)]
        started = time.monotonic()
        for p in procs:
            p.start()
        time.sleep(SECONDS / 3)
        os.kill(srv.pid, 9)                     # a crash, not a shutdown: only fsync'd writes survive
        srv.restart()
        restarted = time.monotonic() - started
        got = [results.get(timeout=SECONDS + 180) for _ in procs]
        for p in procs:
            p.join(10)
        client = srv.client()
        days = {time.strftime("%Y-%m-%d", time.gmtime(t)) for t in (time.time() - SECONDS - 300, time.time())}
        ledger: dict[str, int] = {}
        for day in days:
            for field, micro in client.hgetall(f"adm:{{{MESH}}}:spend:{day}").items():
                ledger[field.decode()] = ledger.get(field.decode(), 0) + int(micro)
    errors = [e for _, _, errs, _ in got for e in errs]
    assert not errors, errors[:5]
    assert all(left == 0 for *_, left in got), [(pod, left) for pod, *_, left in got]
    truth = {lane: sum(t[lane] for _, t, _, _ in got) for lane in LANES}
    expected = {f"{lane}|{PROVIDER}": micro for lane, micro in truth.items() if micro}
    expected[f"*|{PROVIDER}"] = sum(truth.values())
    print(f"\nledger under lost replies and a restart at {restarted:.1f} s: {PODS} pods, "
          f"{expected['*|' + PROVIDER] / 1e6:,.6f} USD booked in {len(expected) - 1} lanes, exact")
    assert ledger == expected
