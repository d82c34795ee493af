"""The example workers (examples/worker_sync.py, examples/worker_async.py) run for real: each as a
subprocess against a real Redis and the fake provider over HTTP, taking items from a queue.

Checked for each: every item ends in ``done:<queue>`` exactly once; no seat is left (running 0
on every pool) and the successes are counted; the provider never saw more rounds in flight than
the admission allowed (the policy's ``max_estimate``, set below the provider's hidden capacity,
so there is no 429 at all); a SIGTERM in the middle of a run exits 0 with no seat or waiter
left and no item lost (the items given back run on the next start); and a SIGTERM while every
round waits for a seat exits 0 too, each worker the way its docstring says (and its
``--metrics-port`` page shows its waiters and no seat).

One engine only (the first real one): the examples are clients of the library, whose engines
the rest of the suite covers.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from admission import Admission
from admission.tools.fake_provider import FakeProviderServer
from admission.tools.servers import free_port
from conftest import REAL
from helpers import policy, pool_row

pytest.importorskip("openai")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
MESH, POOL, QUEUE = "examples", "sonnet@fake", "jobs"
MAX_ESTIMATE = 2  # what the admission allows at most ...
CAPACITY = 3      # ... below the provider's hidden capacity
LANES = ("bugfix", "reviews")
ITEMS = 12


@pytest.fixture
def mesh(server_url, real_engine):
    """The provider (fast: 200 simulated seconds a real second), the policy and the queue's items."""
    if real_engine != REAL[0]:
        pytest.skip(f"the examples run on one engine ({REAL[0]})")
    # No floors: a lane owed a slot is admitted past a full pool that was never measured
    # (`overdraft`, docs/design.md 5.4); without them the admission allows max_estimate at most.
    pol = policy(lanes={"bugfix": {"floor": 0, "weight": 1, "priority": 1},
                        "reviews": {"floor": 0, "weight": 1, "priority": 2}},
                 pools=(POOL,), max_estimate=MAX_ESTIMATE, grow_interval=1, lease_ttl=6)
    del pol["clock"]  # the server's clock, as in production
    adm = Admission.from_url(server_url, mesh=MESH, pod="test", background=False)
    adm.ops.apply_policy(pol, recovery_hold=False)
    client = redis.Redis.from_url(server_url, decode_responses=True)
    for i in range(ITEMS):
        client.lpush(f"work:{QUEUE}", json.dumps({"id": f"item-{i}", "lane": LANES[i % 2], "prompt": f"task {i}"}))
    with FakeProviderServer(capacity=CAPACITY, scale=200, seed=1).running() as provider_url:
        yield {"url": server_url, "adm": adm, "redis": client, "provider_url": provider_url}
    client.close()


def _start(example: str, m: dict, *args: str) -> subprocess.Popen:
    env = dict(os.environ, ADMISSION_URL=m["url"], ADMISSION_MESH=MESH, ADMISSION_POD="worker-1",
               OPENAI_BASE_URL=m["provider_url"] + "/v1", OPENAI_API_KEY="test-key")
    return subprocess.Popen([sys.executable, str(EXAMPLES / example), "--queue", QUEUE, "--model", "sonnet",
                             "--provider", "fake", "--threads", "4", *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(proc: subprocess.Popen, timeout: float = 30) -> str:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
        pytest.fail(f"the worker did not exit in {timeout}s:\n{out}")
    return out


def _done(client: redis.Redis) -> list[dict]:
    return [json.loads(x) for x in client.lrange(f"done:{QUEUE}", 0, -1)]


def _no_seat_left(m: dict) -> dict:
    row = pool_row(m["adm"].ops.census(), POOL)
    assert row["running"] == 0 and row["waiting"] == 0, row
    return row


def _pod_gauges(port: int) -> dict[str, float]:
    """The worker's own /metrics (``--metrics-port``): its pod gauges by name."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    return {s.name: s.value for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.labels.get("pod") == "worker-1" and s.labels.get("mesh") == MESH}


def _provider(m: dict) -> dict:
    import httpx

    return httpx.get(m["provider_url"] + "/stats", timeout=5).json()["total"]


@pytest.mark.parametrize("example", ["worker_sync.py", "worker_async.py"])
def test_every_item_runs_once_within_what_the_admission_allows(mesh, example):
    proc = _start(example, mesh, "--max-tokens", "2000", "--exit-when-empty")
    out = _finish(proc)
    assert proc.returncode == 0, out
    done = _done(mesh["redis"])
    assert sorted(d["id"] for d in done) == sorted(f"item-{i}" for i in range(ITEMS)), out
    assert all(d["ok"] and d["round_id"] == d["id"] and d["tokens"] == 2000 for d in done), done
    assert mesh["redis"].llen(f"work:{QUEUE}") == 0 and mesh["redis"].llen(f"processing:{QUEUE}:worker-1") == 0
    assert sum(": done in" in line for line in out.splitlines()) == ITEMS, out  # one line per item
    row = _no_seat_left(mesh)
    assert row["successes"] == ITEMS and row["failures"] == 0, row
    stats = _provider(mesh)
    assert stats["requests"] == stats["completions"] == ITEMS and stats["429"] == 0, stats
    assert 1 <= stats["peak_in_flight"] <= MAX_ESTIMATE, stats


@pytest.mark.parametrize("example", ["worker_sync.py", "worker_async.py"])
def test_sigterm_midway_exits_cleanly_and_loses_nothing(mesh, example):
    # slower rounds (about 0.5-0.8 s each), 4 threads for 2 seats: at the signal, rounds are in calls
    # and others wait for a seat
    proc = _start(example, mesh, "--max-tokens", "6000", "--grace", "10")
    deadline = time.monotonic() + 20
    while not _done(mesh["redis"]) or pool_row(mesh["adm"].ops.census(), POOL)["waiting"] < 1 \
            or _provider(mesh)["in_flight"] < 1:
        assert proc.poll() is None and time.monotonic() < deadline, "the worker never got going"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc)
    assert proc.returncode == 0, out
    assert "SIGTERM: finishing" in out and "stopped" in out.splitlines()[-1], out
    _no_seat_left(mesh)  # no seat, no waiter ticket: every round released, every wait withdrawn
    assert _provider(mesh)["in_flight"] == 0
    # nothing lost, nothing twice: each item is done or back on the queue, none held
    client = mesh["redis"]
    first = [d["id"] for d in _done(client)]
    back = [json.loads(x)["id"] for x in client.lrange(f"work:{QUEUE}", 0, -1)]
    assert client.llen(f"processing:{QUEUE}:worker-1") == 0
    assert sorted(first + back) == sorted(f"item-{i}" for i in range(ITEMS)), (first, back, out)
    assert 1 <= len(first) < ITEMS and back
    # the next start runs what was given back (a re-run item is a new round: <id>#<attempt>)
    proc = _start(example, mesh, "--max-tokens", "1000", "--exit-when-empty")
    out = _finish(proc)
    assert proc.returncode == 0, out
    done = _done(client)
    assert sorted(d["id"] for d in done) == sorted(f"item-{i}" for i in range(ITEMS)), out
    assert all(d["ok"] for d in done)
    _no_seat_left(mesh)
    assert _provider(mesh)["peak_in_flight"] <= MAX_ESTIMATE


@pytest.mark.parametrize("example", ["worker_sync.py", "worker_async.py"])
def test_sigterm_while_every_round_waits_for_a_seat(mesh, example):
    """The test holds both slots: every round of the worker waits. The asyncio worker cancels
    its waiters at once (their tickets withdrawn); the threaded one gives the items back at the
    end of its grace and leaves its tickets to expire with their leases (its docstring)."""
    adm, client = mesh["adm"], mesh["redis"]
    held = [adm.try_admit(lane="bugfix", model=POOL, round_id=f"hold-{i}") for i in (1, 2)]
    assert all(d.admitted for d in held)
    port = free_port()
    proc = _start(example, mesh, "--max-tokens", "1000", "--grace", "1", "--metrics-port", str(port))
    deadline = time.monotonic() + 20
    while pool_row(adm.ops.census(), POOL)["waiting"] < 2:
        assert proc.poll() is None and time.monotonic() < deadline, "the worker never asked"
        adm.heartbeat()  # the held seats' leases
        time.sleep(0.05)
    # --metrics-port: the worker's own gauges say the same from its side (its book)
    gauges = _pod_gauges(port)
    assert gauges["admission_pod_rounds_held"] == 0 and gauges["admission_pod_rounds_waiting"] >= 2, gauges
    assert gauges["admission_pod_pending_records"] == 0, gauges
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    out = _finish(proc)
    took = time.monotonic() - started
    assert proc.returncode == 0, out
    row = pool_row(adm.ops.census(), POOL)
    assert row["running"] == 2 and _provider(mesh)["requests"] == 0  # only the test's seats
    if example == "worker_async.py":
        assert row["waiting"] == 0 and took < 1.5, (row, took, out)
        assert "cancelled in round()" in out
    else:
        assert took >= 1.0 and "grace over" in out, (took, out)
    # every item is back on the queue, none held, none done
    assert client.llen(f"work:{QUEUE}") == ITEMS and client.llen(f"processing:{QUEUE}:worker-1") == 0
    assert not _done(client)
    for d in held:
        adm.release(d.seat)
