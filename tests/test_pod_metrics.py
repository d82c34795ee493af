"""A pod's own /metrics (admission.pod_metrics): what the census server cannot see.

On a real server, through a TCP proxy the test cuts (admission.tools.proxy.FaultProxy): a pod
with an outbox holds seats and has a waiter; Redis goes away; a release and a charge wait in
the outbox. Read over real HTTP from ``start_metrics_server``: the pending records and the
outbox's bytes grow, the held and waiting counts are the pod's book; once Redis answers again
the clock replays the outbox and the pending records are 0 again (the file back to its header).
The asyncio client is read the same way, from the server's thread, its loop untouched. Without
prometheus_client the error names the extra to install.
"""
from __future__ import annotations

import asyncio
import sys
import threading
import time
import urllib.request
from urllib.parse import urlparse

import pytest

pytest.importorskip("prometheus_client", reason="the serve extra: pip install 'admission[serve]'")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from admission import Admission, AsyncAdmission  # noqa: E402
from admission.outbox import HEADER_LEN  # noqa: E402
from admission.pod_metrics import GAUGES, PodCollector, start_metrics_server  # noqa: E402
from admission.serve.metrics import MissingExtra  # noqa: E402
from admission.tools.proxy import FaultProxy  # noqa: E402

from helpers import POOL, policy  # noqa: E402

MESH = "podm"
ONE_LANE = {"a": {"floor": 0, "weight": 1, "priority": 1}}


def scrape(url: str) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> {labels: value} of a /metrics page, fetched over HTTP."""
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
        text = r.read().decode()
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def pod_values(url: str, pod: str) -> dict[str, float]:
    """The pod's gauges (one series each, labelled with its mesh and pod)."""
    found = scrape(url)
    key = (("mesh", MESH), ("pod", pod))
    return {name: found[name][key] for name in GAUGES}


def wait_for(url: str, pod: str, what: str, ok, timeout: float = 10.0) -> dict[str, float]:
    deadline = time.monotonic() + timeout
    while True:
        v = pod_values(url, pod)
        if ok(v):
            return v
        assert time.monotonic() < deadline, f"{what}: {v}"
        time.sleep(0.05)


@pytest.fixture
def proxy(server_url):
    """A proxy in front of the test's server: the pod's Redis, cut and healed at will."""
    target = urlparse(server_url)
    with FaultProxy(target.hostname, target.port) as p:
        yield p


def apply_policy(server_url: str) -> None:
    ops = Admission.from_url(server_url, mesh=MESH, pod="ops", background=False)
    pol = policy(ONE_LANE, grow_interval=60, max_estimate=2)  # two slots, no growth
    pol["clock"] = "server"  # the background clock calls without now=
    ops.ops.apply_policy(pol, recovery_hold=False)
    ops.close()


def test_a_pod_cut_off_from_redis_shows_its_outbox_growing_then_draining(server_url, proxy, tmp_path):
    apply_policy(server_url)
    pod = Admission.from_url(proxy.url, mesh=MESH, pod="pod-1", outbox=tmp_path / "pod-1.outbox")
    metrics = start_metrics_server(pod, 0, addr="127.0.0.1")
    waiter: dict = {}
    thread = None
    try:
        assert metrics.url == f"http://127.0.0.1:{metrics.port}/metrics" and metrics.port > 0
        v = pod_values(metrics.url, "pod-1")
        assert v == {"admission_pod_pending_records": 0, "admission_pod_outbox_bytes": HEADER_LEN,
                     "admission_pod_outbox_max_bytes": pod._pending.outbox.max_bytes,
                     "admission_pod_rounds_held": 0, "admission_pod_rounds_waiting": 0}
        info = scrape(metrics.url)["admission_pod_info"]
        assert info == {(("client", "sync"), ("mesh", MESH), ("outbox", str(tmp_path / "pod-1.outbox")),
                         ("pod", "pod-1")): 1.0}

        seats = [pod.try_admit(lane="a", model=POOL, round_id=f"r{i}").seat for i in range(2)]
        assert all(seats)
        thread = threading.Thread(target=lambda: waiter.update(
            d=pod.admit_waiting(lane="a", model=POOL, round_id="r-wait", timeout=30)), daemon=True)
        thread.start()
        v = wait_for(metrics.url, "pod-1", "the third round never waited", lambda v: v["admission_pod_rounds_waiting"] == 1)
        assert v["admission_pod_rounds_held"] == 2 and v["admission_pod_pending_records"] == 0

        proxy.partition("reset")  # Redis is gone for this pod (and only for it)
        released = pod.release(seats[0], outcome="clean", seconds=1.0, cost_usd=0.5)
        assert released.queued
        v = pod_values(metrics.url, "pod-1")
        assert v["admission_pod_pending_records"] == 1 == len(pod._pending)
        assert v["admission_pod_outbox_bytes"] > HEADER_LEN
        assert (v["admission_pod_rounds_held"], v["admission_pod_rounds_waiting"]) == (1, 1)  # the book, not Redis
        first = v["admission_pod_outbox_bytes"]
        assert pod.charge(seats[1], cost_usd=0.25, key="step-1").queued
        v = pod_values(metrics.url, "pod-1")
        assert v["admission_pod_pending_records"] == 2 and v["admission_pod_outbox_bytes"] > first
        assert v["admission_pod_outbox_bytes"] == pod._pending.outbox.size_bytes
        time.sleep(1.2)  # the clock's turns meet the cut too: nothing drains
        assert pod_values(metrics.url, "pod-1")["admission_pod_pending_records"] == 2

        proxy.heal()  # the clock replays the outbox on its next turns
        # the waiter may take the seat the replayed release freed at its next ask, or still wait
        v = wait_for(metrics.url, "pod-1", "the outbox never drained",
                     lambda v: v["admission_pod_pending_records"] == 0
                     and v["admission_pod_rounds_held"] + v["admission_pod_rounds_waiting"] == 2)
        assert v["admission_pod_outbox_bytes"] == HEADER_LEN  # compacted: the header alone
        day = time.strftime("%Y-%m-%d", time.gmtime())
        assert pod.ops.ledger(day)["a"]["p"] == pytest.approx(0.75)  # both records booked once
        pod.release(seats[1], outcome="clean", seconds=1.0)  # its wake-up admits a waiter still waiting
        wait_for(metrics.url, "pod-1", "the waiter was never admitted",
                 lambda v: (v["admission_pod_rounds_held"], v["admission_pod_rounds_waiting"]) == (1, 0))
        thread.join(10)
        assert waiter["d"].admitted and list(pod._book.seats) == ["r-wait"]
        pod.release(waiter["d"].seat, outcome="clean", seconds=1.0)
        assert pod_values(metrics.url, "pod-1")["admission_pod_rounds_held"] == 0
    finally:
        proxy.heal()
        metrics.stop()
        if thread is not None:
            thread.join(10)
        pod.close()
    with pytest.raises(OSError):  # stopped: nothing listens any more
        urllib.request.urlopen(metrics.url, timeout=2)
    metrics.stop()  # idempotent


def test_an_asyncio_pod_is_read_from_the_server_thread_without_its_loop(server_url, proxy, tmp_path):
    apply_policy(server_url)

    async def main() -> None:
        pod = AsyncAdmission.from_url(proxy.url, mesh=MESH, pod="pod-a", outbox=tmp_path / "pod-a.outbox")
        with start_metrics_server(pod, 0, addr="127.0.0.1") as metrics:
            try:
                d = await pod.try_admit(lane="a", model=POOL, round_id="a1")
                assert d.admitted
                # fetched from another thread while this loop awaits: the collector needs no loop
                v = await asyncio.to_thread(pod_values, metrics.url, "pod-a")
                assert (v["admission_pod_rounds_held"], v["admission_pod_pending_records"]) == (1, 0)
                info = await asyncio.to_thread(scrape, metrics.url)
                assert [dict(k)["client"] for k in info["admission_pod_info"]] == ["asyncio"]
                proxy.partition("reset")
                assert (await pod.release(d.seat, outcome="clean", seconds=1.0, cost_usd=0.1)).queued
                v = await asyncio.to_thread(pod_values, metrics.url, "pod-a")
                assert v["admission_pod_pending_records"] == 1 and v["admission_pod_outbox_bytes"] > HEADER_LEN
                assert v["admission_pod_rounds_held"] == 0
                proxy.heal()
                assert await pod.flush() == 0
                v = await asyncio.to_thread(pod_values, metrics.url, "pod-a")
                assert v["admission_pod_pending_records"] == 0 and v["admission_pod_outbox_bytes"] == HEADER_LEN
            finally:
                proxy.heal()
                await pod.close()

    asyncio.run(main())


def test_without_an_outbox_the_records_wait_in_memory_and_the_file_is_0_bytes(server_url, proxy):
    apply_policy(server_url)
    pod = Admission.from_url(proxy.url, mesh=MESH, pod="pod-m", background=False)
    try:
        collector = PodCollector(pod)
        d = pod.try_admit(lane="a", model=POOL, round_id="m1")
        proxy.partition("reset")
        assert pod.release(d.seat, outcome="clean", seconds=1.0).queued
        assert collector.values() == {"admission_pod_pending_records": 1, "admission_pod_outbox_bytes": 0,
                                      "admission_pod_outbox_max_bytes": 0, "admission_pod_rounds_held": 0,
                                      "admission_pod_rounds_waiting": 0}
        families = {f.name: f for f in collector.collect()}
        assert set(families) == {*GAUGES, "admission_pod"}
        assert families["admission_pod_outbox_bytes"].unit == "bytes"
        proxy.heal()
        assert pod.flush() == 0 and collector.values()["admission_pod_pending_records"] == 0
    finally:
        proxy.heal()
        pod.close()


def test_without_prometheus_client_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import prometheus_client fails
    import fakeredis

    pod = Admission(fakeredis.FakeRedis(), mesh=MESH, pod="p", background=False)
    with pytest.raises(MissingExtra, match=r"pip install 'admission\[serve\]'"):
        start_metrics_server(pod, 0)
    with pytest.raises(MissingExtra):
        PodCollector(pod)
