"""``/metrics`` of one pod: what only the pod knows, for Prometheus.

    from admission.pod_metrics import start_metrics_server
    metrics = start_metrics_server(adm, 9465)      # adm: an Admission or an AsyncAdmission
    ...
    metrics.stop()

The census server (``admission serve``) sees what Redis holds. It cannot see a pod's outbox:
the ledger records (releases and charges) that met an unreachable Redis wait in the pod's own
file, or in its memory without one, until the pod replays them. These gauges show that queue,
and the pod's own book, labelled ``mesh`` and ``pod``:

``admission_pod_pending_records``  ledger records waiting to be applied (memory and outbox)
``admission_pod_outbox_bytes``     size of the outbox file (its 16-byte header when empty;
                                   0 without an outbox)
``admission_pod_outbox_max_bytes`` the outbox's bound (0 without an outbox)
``admission_pod_rounds_held``      seats this pod holds
``admission_pod_rounds_waiting``   rounds of this pod waiting for a seat
``admission_pod_info``             1, with the labels ``client`` (``sync`` or ``asyncio``) and
                                   ``outbox`` (its path, "" without one)

Every sample is read at scrape time from the client's memory: no Redis call, no lock of the
client's (an asyncio client's loop is never touched; the server is a thread of its own). The
metrics server is ``prometheus_client``'s, the ``serve`` extra: ``pip install 'admission[serve]'``.
"""
from __future__ import annotations

from typing import Any, Iterator

from .outbox import OutboxError
from .serve.metrics import MissingExtra

__all__ = ["PodCollector", "PodMetricsServer", "start_metrics_server", "GAUGES", "INFO"]

LABELS = ("mesh", "pod")
#: name -> (labels, help), in the order they are exported (the shape of admission.serve's GAUGES)
GAUGES: dict[str, tuple[tuple[str, ...], str]] = {
    "admission_pod_pending_records": (LABELS, "Ledger records (releases, charges) waiting for Redis, in memory and in the outbox."),
    "admission_pod_outbox_bytes": (LABELS, "Size of the pod's outbox file (0 without an outbox)."),
    "admission_pod_outbox_max_bytes": (LABELS, "The bound of the pod's outbox file (0 without an outbox)."),
    "admission_pod_rounds_held": (LABELS, "Seats this pod holds."),
    "admission_pod_rounds_waiting": (LABELS, "Rounds of this pod waiting for a seat."),
}
#: the info metric (stored as ``admission_pod_info``): its labels beside ``LABELS``, and its help
INFO = ("admission_pod", ("client", "outbox"), "The pod's admission client: sync or asyncio, and its outbox's path.")


def _prometheus() -> Any:
    try:
        from prometheus_client import CollectorRegistry, start_http_server
        from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily
    except ImportError as exc:
        raise MissingExtra(f"prometheus_client is not installed ({exc}); "
                           "pip install 'admission[serve]'") from None
    return CollectorRegistry, start_http_server, GaugeMetricFamily, InfoMetricFamily


class PodCollector:
    """A prometheus_client collector over one client (``Admission`` or ``AsyncAdmission``): its
    pending ledger records, its outbox file and its book, read from memory at scrape time."""

    def __init__(self, adm: Any):
        self.adm = adm
        _, _, self._gauge, self._info = _prometheus()

    def values(self) -> dict[str, float]:
        """The gauges' values now (the samples ``collect`` exports)."""
        adm = self.adm
        pending, outbox = adm._pending, adm._pending.outbox
        records = len(pending.memory)
        size = bound = 0
        if outbox is not None:
            try:
                records += len(outbox)
            except OutboxError:  # closed: the client is shutting down
                pass
            size, bound = outbox.size_bytes, outbox.max_bytes
        book = adm._book  # len() of a dict is atomic: no lock, from any thread
        return {"admission_pod_pending_records": float(records), "admission_pod_outbox_bytes": float(size),
                "admission_pod_outbox_max_bytes": float(bound), "admission_pod_rounds_held": float(len(book.seats)),
                "admission_pod_rounds_waiting": float(len(book.waiters))}

    def collect(self) -> Iterator[Any]:
        adm = self.adm
        labels = [adm.mesh, adm.pod]
        for name, value in self.values().items():
            names, doc = GAUGES[name]
            family = self._gauge(name, doc, labels=list(names), unit="bytes" if name.endswith("_bytes") else "")
            family.add_metric(labels, value)
            yield family
        outbox = adm._pending.outbox
        info = self._info(INFO[0], INFO[2], labels=list(LABELS))
        info.add_metric(labels, {"client": "asyncio" if _is_async(adm) else "sync",
                                 "outbox": "" if outbox is None else outbox.path})
        yield info


def _is_async(adm: Any) -> bool:
    from .aio import AsyncAdmission

    return isinstance(adm, AsyncAdmission)


class PodMetricsServer:
    """The running metrics server of ``start_metrics_server``: ``url`` (of ``/metrics``),
    ``port`` (the one bound: a port of 0 picks a free one), ``stop()``."""

    def __init__(self, httpd: Any, thread: Any, registry: Any):
        self.httpd, self.thread, self.registry = httpd, thread, registry
        self.addr, self.port = httpd.server_address[:2]
        host = self.addr if ":" not in self.addr else f"[{self.addr}]"
        self.url = f"http://{host}:{self.port}/metrics"

    def stop(self, timeout: float = 5.0) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self.thread is None:
            return
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout)
        self.thread = None

    def __enter__(self) -> PodMetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_metrics_server(adm: Any, port: int, addr: str = "0.0.0.0") -> PodMetricsServer:
    """Serve this pod's gauges (``PodCollector`` on a registry of its own) on
    ``http://addr:port/metrics``, from a daemon thread; returns the server (``stop()`` ends it).
    Raises ``MissingExtra`` without prometheus_client (``pip install 'admission[serve]'``)."""
    registry_cls, start_http_server, _, _ = _prometheus()
    registry = registry_cls()
    registry.register(PodCollector(adm))
    started = start_http_server(port, addr=addr, registry=registry)
    if not isinstance(started, tuple):  # before 0.17 the server was not handed back
        raise MissingExtra("prometheus_client is too old to stop its metrics server; "
                           "pip install -U 'admission[serve]'")
    return PodMetricsServer(*started, registry)
