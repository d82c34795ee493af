"""``admission serve``: the census over HTTP, for Prometheus and for people.

    admission serve --url redis://127.0.0.1:6379/0 --mesh prod [--mesh staging] [--host 0.0.0.0] [--port 9464]

One process serves one mesh or several; it keeps no state of its own (run any number of
replicas). Every request reads Redis afresh: the census is rebuilt by the ``census`` script
(``Admission.census()``) and kept for ``cache_seconds`` (1 s) per mesh, so a burst of scrapes
and page polls costs one rebuild; a failed read is kept as long, so a dead Redis is asked once
per second, not once per request.

Endpoints (each takes ``?mesh=NAME``; default the first mesh served, ``/metrics`` all of them):

``/metrics``      the Prometheus text format (OpenMetrics when the scraper asks for it), built by a
                  collector from the census and the cumulative ``totals`` hash at scrape time
``/census.json``  the census document (503 with ``{"error": ...}`` when it cannot be read)
``/healthz``      200 ``ok`` while the process is up
``/readyz``       200 when Redis answers and the mesh has a policy, else 503 with a one-line reason
``/``             the live census page: server-rendered tables that a small inline script
                  re-renders from ``/census.json`` every 2 s, with each pool's K̂ and K over time
                  (the history lives in the browser tab); no external assets

Metrics (labels: ``mesh``, ``pool``, ``provider``, ``lane`` and the reason words; never a round
id). Gauges per pool: ``admission_pool_estimate`` (K̂), ``admission_pool_carrying_capacity``
(K, 0 = never measured), ``_probing_from`` (the K an upward probe started from, 0 = none),
``_probe_backoff`` (the wait before the next probe, as a multiple: 1, or 2-8 after refusals), ``admission_pool_slots``, ``_running``, ``_waiting``, ``_free``,
``_exhausted``, ``_closed``, ``_closed_until_timestamp_seconds``, ``_paused_until_timestamp_seconds``,
``_running_moved``,
``_mean_round_seconds``, ``_mean_round_cost_usd``, ``_owed``, ``_hard_pinned_waiting``; counters
``admission_pool_moved_in_total`` / ``_moved_out_total``. Per provider with a budget today:
``admission_budget_spent_usd``, ``_limit_usd``, ``_committed_usd``. Per lane × pool:
``admission_lane_running``, ``_waiting``, ``_guaranteed``, ``_borrowed``, ``_bound``,
``_delegated``, ``_spent_today_usd``, ``_reserve_left_usd``, ``_oldest_waiting_seconds``,
``_must_yield``. Planes: ``admission_plane_depth``, ``_depth_limit``, ``_retries_left``,
``_retry_budget``, ``_health_age_seconds``, ``_health_ok``, ``_health_fresh``. Per mesh:
``admission_census_up``, ``admission_census_age_seconds``, ``admission_policy_version``,
``admission_starving{kind,pool,lane}``. Counters from ``adm:{<mesh>}:totals``:
``admission_admitted_total{pool,lane,reason}``, ``admission_refused_total{pool,lane,reason}``,
``admission_signals_total{pool,signal}``, ``admission_closures_total{provider,why}``,
``admission_reopens_total{provider,by}``, ``admission_probes_total{pool}``,
``admission_moves_total{from_pool,to_pool}``, ``admission_pauses_total{pool}``.
"""
from __future__ import annotations

import argparse
import html
import json
import secrets
import signal
import sys
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterable, Iterator
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

import redis

from ._log import get_logger
from .client import Admission, fail_fast_options
from .core import UNREACHABLE
from .errors import AdmissionError, NoPolicy, Unavailable

log = get_logger("admission.serve")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 9464  # the port Prometheus' default-port allocations list for exporters like this one
CACHE_SECONDS = 1.0
POLL_MS = 2000
HISTORY_POINTS = 900  # 30 minutes at one point per 2 s


class MissingExtra(AdmissionError):
    """``prometheus_client`` (the ``serve`` extra) is not installed."""


def _prometheus() -> Any:
    """The parts of prometheus_client this module uses; a one-line error without it."""
    try:
        from prometheus_client import CollectorRegistry
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        from prometheus_client.exposition import choose_encoder
    except ImportError as exc:
        raise MissingExtra(f"prometheus_client is not installed ({exc}); "
                           "pip install 'admission[serve]'") from None
    return argparse.Namespace(CollectorRegistry=CollectorRegistry, CounterMetricFamily=CounterMetricFamily,
                              GaugeMetricFamily=GaugeMetricFamily, choose_encoder=choose_encoder)


# -- reading ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Snapshot:
    """One read of a mesh: the census and the cumulative totals, or why they could not be read."""
    mesh: str
    fetched: float  # monotonic time of the read
    census: dict[str, Any] | None = None
    totals: dict[str, int] | None = None
    error: str | None = None  # one line: Redis unreachable, no policy, ...


def totals_key(mesh: str) -> str:
    return f"adm:{{{mesh}}}:totals"


class CensusSource:
    """The meshes served and their last reads, each kept ``cache_seconds`` (a failure too)."""

    def __init__(self, client: redis.Redis, meshes: Iterable[str], *, cache_seconds: float = CACHE_SECONDS,
                 clock: Callable[[], float] = time.monotonic):
        self.meshes = list(dict.fromkeys(meshes))
        if not self.meshes:
            raise ValueError("serve at least one mesh")
        self.redis = client
        # Admission validates each mesh name (BadName); no clock thread, no outbox: reads only
        self.adms = {m: Admission(client, mesh=m, pod="serve", background=False) for m in self.meshes}
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._locks = {m: threading.Lock() for m in self.meshes}
        self._cache: dict[str, Snapshot] = {}
        self._failing: dict[str, str | None] = {}

    def snapshot(self, mesh: str) -> Snapshot:
        """The mesh's census and totals, read at most once per ``cache_seconds`` (single flight:
        concurrent requests wait for one read)."""
        with self._locks[mesh]:
            hit = self._cache.get(mesh)
            if hit is not None and self.clock() - hit.fetched < self.cache_seconds:
                return hit
            snap = self._read(mesh)
            self._cache[mesh] = snap
            self._note(mesh, snap.error)
            return snap

    def _read(self, mesh: str) -> Snapshot:
        adm = self.adms[mesh]
        try:
            census = adm.census()
            raw = self.redis.hgetall(totals_key(mesh))
        except NoPolicy:
            return Snapshot(mesh, self.clock(), error=f"no policy applied to mesh {mesh}")
        except (Unavailable, *UNREACHABLE) as exc:
            return Snapshot(mesh, self.clock(), error=f"redis unreachable: {_one_line(exc)}")
        except (AdmissionError, redis.RedisError) as exc:
            return Snapshot(mesh, self.clock(), error=f"census failed: {type(exc).__name__}: {_one_line(exc)}")
        return Snapshot(mesh, self.clock(), census=census, totals=_decode_totals(raw))

    def _note(self, mesh: str, error: str | None) -> None:
        """Log a mesh's read going bad or recovering once, not on every scrape."""
        before = self._failing.get(mesh)
        if error and error != before:
            log.warning("census_unavailable", mesh=mesh, error=error)
        elif before and not error:
            log.info("census_recovered", mesh=mesh)
        self._failing[mesh] = error

    def ready(self, mesh: str) -> tuple[bool, str]:
        """Redis answers and the mesh has a policy (read now, never cached)."""
        try:
            version = self.redis.hget(self.adms[mesh].core.config_key, "version")
        except UNREACHABLE as exc:
            return False, f"redis unreachable: {_one_line(exc)}"
        except redis.RedisError as exc:
            return False, f"redis error: {_one_line(exc)}"
        if not version:
            return False, f"no policy applied to mesh {mesh}"
        return True, f"ready: mesh {mesh} policy v{int(version)}"


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _text(x: Any) -> str:
    return x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)


def _decode_totals(raw: dict[Any, Any]) -> dict[str, int]:
    out = {}
    for k, v in raw.items():
        try:
            out[_text(k)] = int(_text(v))
        except ValueError:
            log.debug("totals_field_skipped", field=_text(k), value=_text(v))
    return out


# -- metrics ------------------------------------------------------------------------------------

# totals field kind -> (metric name without _total, label names after mesh, help)
TOTALS = {
    "admitted": ("admission_admitted", ("pool", "lane", "reason"), "Rounds admitted, by pool, lane and reason."),
    "refused": ("admission_refused", ("pool", "lane", "reason"), "Admissions refused, by pool, lane and reason."),
    "signal": ("admission_signals", ("pool", "signal"), "Load signals reported, by pool and kind."),
    "closed": ("admission_closures", ("provider", "why"), "Provider closures, by provider and reason."),
    "reopened": ("admission_reopens", ("provider", "by"), "Provider reopenings, by provider and by what."),
    "probe": ("admission_probes", ("pool",), "Probe rounds admitted on a closed provider's pool."),
    "moved": ("admission_moves", ("from_pool", "to_pool"), "Rounds moved from the pool asked for to another."),
    "paused": ("admission_pauses", ("pool",), "Pauses of a pool for a provider's Retry-After."),
}

POOL = ("mesh", "pool", "provider")
LANE = ("mesh", "pool", "lane")
PLANE = ("mesh", "pool")
GAUGES: dict[str, tuple[tuple[str, ...], str]] = {
    "admission_census_up": (("mesh",), "1 when the census of the mesh could be read, else 0."),
    "admission_census_age_seconds": (("mesh",), "Seconds since the census served was built."),
    "admission_policy_version": (("mesh",), "Version of the policy applied to the mesh."),
    "admission_pool_estimate": (POOL, "The pool's estimate K-hat of rounds it can carry."),
    "admission_pool_carrying_capacity": (POOL, "The pool's carrying capacity K (0 = never measured)."),
    "admission_pool_probing_from": (POOL, "The K an upward probe started from (0 = no probe in progress)."),
    "admission_pool_probe_backoff": (POOL, "The wait before the next upward probe, as a multiple (1; 2, 4, 8 after refused probes)."),
    "admission_pool_slots": (POOL, "Slots the pool grants now."),
    "admission_pool_running": (POOL, "Rounds running on the pool."),
    "admission_pool_waiting": (POOL, "Rounds waiting for the pool."),
    "admission_pool_free": (POOL, "Free slots on the pool."),
    "admission_pool_exhausted": (POOL, "1 when the pool has been measured exhausted, else 0 (slow start)."),
    "admission_pool_closed": (POOL, "1 when the pool's provider is closed, else 0."),
    "admission_pool_closed_until_timestamp_seconds": (POOL, "When the provider's closure ends (0 = open)."),
    "admission_pool_paused_until_timestamp_seconds": (POOL, "When the pool's pause for a Retry-After ends (0 = none)."),
    "admission_pool_running_moved": (POOL, "Rounds running on the pool after a move from another."),
    "admission_pool_mean_round_seconds": (POOL, "Mean duration of the pool's clean rounds."),
    "admission_pool_mean_round_cost_usd": (POOL, "Mean cost of the pool's priced rounds."),
    "admission_pool_owed": (POOL, "Slots borrowing lanes owe to lanes below their floor."),
    "admission_pool_hard_pinned_waiting": (POOL, "Hard-pinned rounds waiting for the pool."),
    "admission_pool_cap_line": (POOL, "The cap line: most rounds in flight at which the running declared rounds end before their caps (0 = no line)."),
    "admission_budget_spent_usd": (("mesh", "provider"), "The provider's spend today (UTC)."),
    "admission_budget_limit_usd": (("mesh", "provider"), "The provider's daily limit today (UTC)."),
    "admission_budget_committed_usd": (("mesh", "provider"), "Spend committed by the provider's rounds in flight."),
    "admission_lane_running": (LANE, "The lane's rounds running on the pool (delegated included)."),
    "admission_lane_waiting": (LANE, "The lane's rounds waiting for the pool."),
    "admission_lane_guaranteed": (LANE, "Slots the lane's floor guarantees it on the pool."),
    "admission_lane_borrowed": (LANE, "The lane's rounds running above its guaranteed slots."),
    "admission_lane_bound": (LANE, "How many of the lane's rounds could run on the pool now."),
    "admission_lane_delegated": (LANE, "The lane's delegated rounds running on the pool."),
    "admission_lane_spent_today_usd": (LANE, "The lane's spend today on the pool's provider."),
    "admission_lane_reserve_left_usd": (LANE, "What the lane may still spend before its budget reserve stops it."),
    "admission_lane_oldest_waiting_seconds": (LANE, "Age of the lane's oldest waiter on the pool."),
    "admission_lane_must_yield": (LANE, "Borrowed rounds the lane yields at their next round boundary."),
    "admission_plane_depth": (PLANE, "The plane's waiting depth (its queue, or a fresher sample's)."),
    "admission_plane_depth_limit": (PLANE, "Depth at which borrows on the plane are shed."),
    "admission_plane_retries_left": (PLANE, "Retry tokens left in the plane's retry budget."),
    "admission_plane_retry_budget": (PLANE, "The plane's retry budget (tokens)."),
    "admission_plane_health_age_seconds": (PLANE, "Age of the plane's last health sample."),
    "admission_plane_health_ok": (PLANE, "1 when the plane's last health sample said ok."),
    "admission_plane_health_fresh": (PLANE, "1 when the plane's last health sample still counts."),
    "admission_starving": (("mesh", "kind", "pool", "lane"), "Starvation signals of the census, by kind."),
}
POOL_COUNTERS = {
    "admission_pool_moved_in": ("movedIn", "Rounds moved onto the pool from another, ever."),
    "admission_pool_moved_out": ("movedOut", "Rounds moved off the pool to another, ever."),
}


def _num(x: Any) -> float:
    if isinstance(x, bool):
        return 1.0 if x else 0.0
    try:
        return float(x)
    except (TypeError, ValueError):
        return 0.0


class CensusCollector:
    """A prometheus_client collector over the census: every sample is read at scrape time from
    Redis (through the source's cache); nothing is counted in this process."""

    def __init__(self, source: CensusSource, meshes: list[str]):
        self.source, self.meshes = source, meshes
        self.prom = _prometheus()

    def collect(self) -> Iterator[Any]:
        P = self.prom
        gauges = {name: P.GaugeMetricFamily(name, doc, labels=list(labels)) for name, (labels, doc) in GAUGES.items()}
        pool_counters = {name: P.CounterMetricFamily(name, doc, labels=list(POOL))
                         for name, (_field, doc) in POOL_COUNTERS.items()}
        totals = {kind: P.CounterMetricFamily(name, doc, labels=["mesh", *labels])
                  for kind, (name, labels, doc) in TOTALS.items()}
        for mesh in self.meshes:
            snap = self.source.snapshot(mesh)
            gauges["admission_census_up"].add_metric([mesh], 0.0 if snap.census is None else 1.0)
            if snap.census is None:
                continue
            gauges["admission_census_age_seconds"].add_metric(
                [mesh], max(0.0, self.source.clock() - snap.fetched))
            self._census(mesh, snap.census, gauges, pool_counters)
            for field, count in sorted((snap.totals or {}).items()):
                kind, _, rest = field.partition("|")
                family = totals.get(kind)
                if family is None:
                    continue
                values = rest.split("|")
                if len(values) != len(TOTALS[kind][1]) or not all(values):
                    log.debug("totals_field_skipped", mesh=mesh, field=field)
                    continue
                family.add_metric([mesh, *values], float(count))
        yield from gauges.values()
        yield from pool_counters.values()
        yield from totals.values()

    @staticmethod
    def _census(mesh: str, doc: dict[str, Any], g: dict[str, Any], c: dict[str, Any]) -> None:
        g["admission_policy_version"].add_metric([mesh], _num(doc.get("configVersion")))
        budgets: dict[str, dict[str, Any]] = {}
        for p in doc.get("pools", []):
            pool, provider = str(p["pool"]), str(p.get("provider", ""))
            labels = [mesh, pool, provider]
            closed = bool(p.get("closedUntil"))
            for name, value in (("estimate", p.get("capacity")), ("carrying_capacity", p.get("carryingCapacity")),
                                ("probing_from", p.get("probingFrom") or 0), ("probe_backoff", p.get("probeBackoff") or 1),
                                ("slots", p.get("slots")), ("running", p.get("running")),
                                ("waiting", p.get("waiting")), ("free", p.get("free")),
                                ("exhausted", bool(p.get("exhausted"))), ("closed", closed),
                                ("closed_until_timestamp_seconds", p.get("closedUntil") or 0),
                                ("paused_until_timestamp_seconds", p.get("pausedUntil") or 0),
                                ("running_moved", p.get("moved")), ("mean_round_seconds", p.get("meanSeconds")),
                                ("mean_round_cost_usd", p.get("meanCostUsd")), ("owed", p.get("owed")),
                                ("hard_pinned_waiting", (p.get("hardPinned") or {}).get("waiting", 0)),
                                ("cap_line", p.get("capLine") or 0)):
                g[f"admission_pool_{name}"].add_metric(labels, _num(value))
            for name, (field, _doc) in POOL_COUNTERS.items():
                c[name].add_metric(labels, _num(p.get(field)))
            if p.get("budgetLimitUsd") is not None and provider not in budgets:
                budgets[provider] = p  # the provider's figures, the same on each of its pools
            yielding = {y["lane"]: y.get("borrowed", 0) for y in p.get("mustYield", [])}
            for lane in p.get("lanes", []):
                ll = [mesh, pool, str(lane["lane"])]
                for name in ("running", "waiting", "guaranteed", "borrowed", "bound", "delegated"):
                    g[f"admission_lane_{name}"].add_metric(ll, _num(lane.get(name)))
                g["admission_lane_spent_today_usd"].add_metric(ll, _num(lane.get("spentTodayUsd")))
                if lane.get("reserveLeftUsd") is not None:
                    g["admission_lane_reserve_left_usd"].add_metric(ll, _num(lane["reserveLeftUsd"]))
                since = lane.get("oldestWaitingSince")
                g["admission_lane_oldest_waiting_seconds"].add_metric(
                    ll, max(0.0, _num(doc.get("at")) - _num(since)) if since else 0.0)
                g["admission_lane_must_yield"].add_metric(ll, _num(yielding.get(lane["lane"], 0)))
            plane = p.get("plane")
            if plane:
                pl = [mesh, pool]
                g["admission_plane_depth"].add_metric(pl, _num(plane.get("depth")))
                for name, field in (("depth_limit", "depthLimit"), ("retries_left", "retriesLeft"),
                                    ("retry_budget", "retryBudget"), ("health_age_seconds", "healthAgeSeconds"),
                                    ("health_ok", "healthOk"), ("health_fresh", "healthFresh")):
                    if plane.get(field) is not None:
                        g[f"admission_plane_{name}"].add_metric(pl, _num(plane[field]))
        for provider, p in sorted(budgets.items()):
            g["admission_budget_spent_usd"].add_metric([mesh, provider], _num(p.get("budgetSpentUsd")))
            g["admission_budget_limit_usd"].add_metric([mesh, provider], _num(p.get("budgetLimitUsd")))
            g["admission_budget_committed_usd"].add_metric([mesh, provider], _num(p.get("committedUsd")))
        starving: dict[tuple[str, str, str], int] = {}
        for s in doc.get("starving", []):
            k = (str(s.get("kind", "")), str(s.get("pool", "")), str(s.get("lane", "")))
            starving[k] = starving.get(k, 0) + 1
        for (kind, pool, lane), n in sorted(starving.items()):
            g["admission_starving"].add_metric([mesh, kind, pool, lane], float(n))


def metrics_text(source: CensusSource, meshes: list[str], accept: str | None = None) -> tuple[bytes, str]:
    """The exposition for ``meshes`` and its content type (OpenMetrics when ``accept`` asks)."""
    P = _prometheus()
    registry = P.CollectorRegistry(auto_describe=False)
    registry.register(CensusCollector(source, meshes))
    encoder, content_type = P.choose_encoder(accept or "")
    return encoder(registry), content_type


# -- the page -----------------------------------------------------------------------------------


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x), quote=True)


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        return str(int(x)) if x == int(x) else f"{x:.1f}"
    return str(x)


def _usd(x: Any) -> str:
    return "–" if x is None else f"${_num(x):,.2f}"


def _utc(t: Any, fmt: str = "%H:%M:%S") -> str:
    return time.strftime(fmt, time.gmtime(_num(t))) + "Z" if t else "–"


def _ago(now: Any, since: Any) -> str:
    return f"{max(0.0, _num(now) - _num(since)):.0f}s" if since else "–"


def _pool_state(p: dict[str, Any]) -> str:
    state = f"exhausted ({p.get('why') or '?'})" if p.get("exhausted") else "slow start"
    return f"paused until {_utc(p['pausedUntil'])} (Retry-After), {state}" if p.get("pausedUntil") else state


def _closed(p: dict[str, Any]) -> str:
    if not p.get("closedUntil"):
        return "open"
    return f"closed ({p.get('closedWhy') or '?'}) until {_utc(p['closedUntil'], '%Y-%m-%d %H:%M')}"


def _budget(p: dict[str, Any]) -> str:
    if p.get("budgetLimitUsd") is None:
        return "no budget today"
    left = _num(p["budgetLimitUsd"]) - _num(p.get("budgetSpentUsd")) - _num(p.get("committedUsd"))
    return (f"{_usd(p.get('budgetSpentUsd'))} + {_usd(p.get('committedUsd'))} in flight of "
            f"{_usd(p['budgetLimitUsd'])} (left {_usd(left)})")


def _plane(p: dict[str, Any]) -> str:
    pl = p.get("plane")
    if not pl:
        return "–"
    parts = [f"depth {_fmt(pl.get('depth'))}" + (f"/{_fmt(pl['depthLimit'])}" if pl.get("depthLimit") else "")]
    if pl.get("retryBudget") is not None:
        parts.append(f"retries {_fmt(pl.get('retriesLeft'))}/{_fmt(pl['retryBudget'])}")
    if pl.get("healthAgeSeconds") is not None:
        state = "fresh" if pl.get("healthFresh") else ("not ok" if not pl.get("healthOk") else "stale")
        parts.append(f"health {_num(pl['healthAgeSeconds']):.0f}s ({state})")
    elif pl.get("healthRequired"):
        parts.append("health: no sample")
    return ", ".join(parts)


def _starving_text(s: dict[str, Any]) -> str:
    kind = s.get("kind")
    if kind == "provider-closed":
        return (f"provider {s.get('provider')} closed ({s.get('why')}) with {s.get('waiting')} waiting on "
                f"{s.get('pool')} until {_utc(s.get('closedUntil'), '%Y-%m-%d %H:%M')}")
    if kind == "pinned":
        return (f"{s.get('waiting')} hard-pinned round(s) waiting for {s.get('pool')} since "
                f"{_utc(s.get('waitingSince'))}")
    return f"{kind}: lane {s.get('lane')} on {s.get('pool')} waiting since {_utc(s.get('waitingSince'))}"


def _attrs(**kv: Any) -> str:
    return "".join(f' {k.replace("_", "-")}="{_e(v)}"' for k, v in kv.items() if v is not None)


def _rows_pools(doc: dict[str, Any]) -> str:
    rows = []
    for p in doc.get("pools", []):
        cells = [p.get("pool"), p.get("provider"), _fmt(p.get("capacity")),
                 _fmt(p.get("carryingCapacity")) if p.get("carryingCapacity") else "–", _fmt(p.get("slots")),
                 _fmt(p.get("running")), _fmt(p.get("waiting")), _fmt(p.get("free")), _pool_state(p),
                 _closed(p), _budget(p), _plane(p)]
        klass = "closed" if p.get("closedUntil") else ("exhausted" if p.get("exhausted") else "")
        rows.append(f"<tr{_attrs(data_pool=p.get('pool'), **{'class': klass or None})}>"
                    + "".join(f"<td>{_e(c)}</td>" for c in cells)
                    + f'<td><svg class="spark"{_attrs(data_pool=p.get("pool"))} width="180" height="36" '
                      f'viewBox="0 0 180 36" role="img" aria-label="K-hat and K over time"></svg></td></tr>')
    return "".join(rows) or '<tr class="none"><td colspan="13">no pools</td></tr>'


def _rows_lanes(doc: dict[str, Any]) -> str:
    rows = []
    for p in doc.get("pools", []):
        for l in p.get("lanes", []):
            cells = [p.get("pool"), l.get("lane"), _fmt(l.get("running")), _fmt(l.get("waiting")),
                     _fmt(l.get("guaranteed")), _fmt(l.get("borrowed")), _fmt(l.get("bound")),
                     _fmt(l.get("delegated")), _usd(l.get("spentTodayUsd")), _usd(l.get("reserveLeftUsd")),
                     _ago(doc.get("at"), l.get("oldestWaitingSince"))]
            rows.append(f"<tr{_attrs(data_pool=p.get('pool'), data_lane=l.get('lane'))}>"
                        + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return "".join(rows) or '<tr class="none"><td colspan="11">no lane has work</td></tr>'


def _providers(doc: dict[str, Any]) -> list[tuple[str, list[str], dict[str, Any]]]:
    seen: dict[str, tuple[list[str], dict[str, Any]]] = {}
    for p in doc.get("pools", []):
        pools, _first = seen.setdefault(str(p.get("provider")), ([], p))
        pools.append(str(p.get("pool")))
    return [(name, pools, first) for name, (pools, first) in seen.items()]


def _rows_providers(doc: dict[str, Any]) -> str:
    rows = []
    for name, pools, p in _providers(doc):
        cells = [name, ", ".join(pools), _closed(p), _budget(p),
                 _utc(p.get("budgetAt"), "%H:%M") if p.get("budgetAt") else "–"]
        rows.append(f"<tr{_attrs(data_provider=name, **{'class': 'closed' if p.get('closedUntil') else None})}>"
                    + "".join(f"<td>{_e(c)}</td>" for c in cells) + "</tr>")
    return "".join(rows) or '<tr class="none"><td colspan="5">no providers</td></tr>'


def _items_starving(doc: dict[str, Any]) -> str:
    items = [f"<li{_attrs(data_kind=s.get('kind'), data_pool=s.get('pool'), data_lane=s.get('lane'), data_provider=s.get('provider'))}>"
             f"{_e(_starving_text(s))}</li>" for s in doc.get("starving", [])]
    return "".join(items) or '<li class="none">nobody is starving</li>'


def _items_must_yield(doc: dict[str, Any]) -> str:
    items = []
    for p in doc.get("pools", []):
        for y in p.get("mustYield", []):
            items.append(f"<li{_attrs(data_pool=p.get('pool'), data_lane=y.get('lane'))}>"
                         f"{_e(y.get('lane'))} on {_e(p.get('pool'))}: {_e(_fmt(y.get('borrowed')))} borrowed, "
                         f"yields at its next round (pool owes {_e(_fmt(p.get('owed')))})</li>")
    return "".join(items) or '<li class="none">no lane must yield</li>'


def _updated(doc: dict[str, Any] | None, error: str | None) -> str:
    if doc is None:
        return f"census unavailable: {error}"
    return f"census of {_utc(doc.get('at'))} (policy v{_fmt(doc.get('configVersion'))})"


def _script_json(x: Any) -> str:
    """JSON safe inside a <script> element."""
    return (json.dumps(x).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_page(mesh: str, meshes: list[str], doc: dict[str, Any] | None, error: str | None = None,
                nonce: str = "") -> str:
    """The live census page: every table rendered here, and again by the script on each poll."""
    nav = ""
    if len(meshes) > 1:
        links = [f'<a href="?mesh={_e(quote(m, safe=""))}"{_attrs(aria_current="page" if m == mesh else None)}>'
                 f'{_e(m)}</a>' for m in meshes]
        nav = "<nav>meshes: " + " ".join(links) + "</nav>"
    d = doc or {"pools": [], "starving": []}
    n = _attrs(nonce=nonce or None)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>admission census: {_e(mesh)}</title>
<style{n}>{_CSS}</style></head>
<body data-mesh="{_e(mesh)}">
<header><h1>admission census <span class="mesh">{_e(mesh)}</span></h1>{nav}
<p><span id="updated" data-source="server"{_attrs(data_at=d.get("at"), **{"class": "stale" if doc is None else None})}>{_e(_updated(doc, error))}</span>
· refreshes every {POLL_MS // 1000} s · <a href="census.json?mesh={_e(quote(mesh, safe=""))}">census.json</a>
· <a href="metrics?mesh={_e(quote(mesh, safe=""))}">metrics</a></p></header>
<main>
<section><h2>Pools</h2>
<table id="pools" data-source="server"><thead><tr><th>pool</th><th>provider</th><th title="estimate">K̂</th>
<th title="carrying capacity">K</th><th>slots</th><th>running</th><th>waiting</th><th>free</th><th>state</th>
<th>provider closed</th><th>budget today</th><th>plane</th>
<th>K̂ <span class="k-est">━</span> and K <span class="k-cap">┅</span> over time</th></tr></thead>
<tbody>{_rows_pools(d)}</tbody></table></section>
<section class="lists"><div><h2>Starving</h2><ul id="starving" data-source="server">{_items_starving(d)}</ul></div>
<div><h2>Must yield</h2><ul id="must-yield" data-source="server">{_items_must_yield(d)}</ul></div></section>
<section><h2>Lanes × pools</h2>
<table id="lanes" data-source="server"><thead><tr><th>pool</th><th>lane</th><th>running</th><th>waiting</th>
<th>guaranteed</th><th>borrowed</th><th>bound</th><th>delegated</th><th>spent today</th><th>reserve left</th>
<th>oldest waiting</th></tr></thead><tbody>{_rows_lanes(d)}</tbody></table></section>
<section><h2>Closures and budgets</h2>
<table id="providers" data-source="server"><thead><tr><th>provider</th><th>pools</th><th>closed</th>
<th>budget today (UTC)</th><th>reading</th></tr></thead><tbody>{_rows_providers(d)}</tbody></table></section>
</main>
<script id="initial" type="application/json"{n}>{_script_json({"mesh": mesh, "census": doc, "pollMs": POLL_MS, "historyPoints": HISTORY_POINTS})}</script>
<script{n}>{_SCRIPT}</script>
</body></html>
"""


_CSS = """
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;margin:1.2em 2em;color:#1b1f24;background:#fbfbfc}
h1{font-size:1.4em;margin:0 0 .2em}h1 .mesh{color:#0b5cad}h2{font-size:1.1em;margin:1.2em 0 .4em}
nav a{margin-right:.6em}nav a[aria-current]{font-weight:bold;text-decoration:none}
table{border-collapse:collapse;width:100%;background:#fff}th,td{border:1px solid #d8dde3;padding:3px 7px;text-align:left}
th{background:#eef1f5;font-weight:600;white-space:nowrap}td{font-variant-numeric:tabular-nums}
tr.closed td{background:#fdecec}tr.exhausted td:nth-child(9){color:#9a5b00}tr.none td{color:#777}
#updated.stale{color:#b00020;font-weight:bold}.lists{display:flex;gap:3em}.lists>div{flex:1}
ul{margin:0;padding-left:1.2em}li.none{color:#777;list-style:none;margin-left:-1.2em}
li[data-kind="provider-closed"]{color:#b00020}.k-est{color:#0b5cad}.k-cap{color:#d9822b}
svg.spark{display:block;background:#f6f8fa}
"""

# The page's script: polls census.json, keeps each pool's K-hat and K in the tab (sessionStorage,
# so a reload keeps the curve), re-renders every table with DOM calls (textContent: no markup
# from the data is ever parsed) and draws the sparklines.
_SCRIPT = r"""
(function () {
  "use strict";
  const init = JSON.parse(document.getElementById("initial").textContent);
  const mesh = init.mesh, storeKey = "admission-history:" + mesh;
  let history = {}, polls = 0, lastAt = null;
  try { history = JSON.parse(sessionStorage.getItem(storeKey) || "{}") || {}; } catch (e) { history = {}; }

  function el(tag, attrs, ...kids) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined && v !== "") n.setAttribute(k, String(v));
    for (const k of kids) n.append(k instanceof Node ? k : document.createTextNode(String(k)));
    return n;
  }
  const num = (x) => (typeof x === "number" && isFinite(x)) ? x : Number(x) || 0;
  function fmt(x) {
    if (x === null || x === undefined) return "–";
    if (typeof x === "boolean") return x ? "yes" : "no";
    if (typeof x === "number") return Number.isInteger(x) ? String(x) : x.toFixed(1);
    return String(x);
  }
  function usd(x) {
    if (x === null || x === undefined) return "–";
    return "$" + num(x).toLocaleString("en-US", {minimumFractionDigits: 2, maximumFractionDigits: 2});
  }
  function utc(t, withDay) {
    if (!t) return "–";
    const s = new Date(num(t) * 1000).toISOString();
    return (withDay ? s.slice(0, 10) + " " + s.slice(11, 16) : s.slice(11, 19)) + "Z";
  }
  const ago = (now, since) => since ? Math.max(0, num(now) - num(since)).toFixed(0) + "s" : "–";
  const poolState = (p) => (p.pausedUntil ? "paused until " + utc(p.pausedUntil) + " (Retry-After), " : "") +
    (p.exhausted ? "exhausted (" + (p.why || "?") + ")" : "slow start");
  const closed = (p) => p.closedUntil ? "closed (" + (p.closedWhy || "?") + ") until " + utc(p.closedUntil, true) : "open";
  function budget(p) {
    if (p.budgetLimitUsd === null || p.budgetLimitUsd === undefined) return "no budget today";
    const left = num(p.budgetLimitUsd) - num(p.budgetSpentUsd) - num(p.committedUsd);
    return usd(p.budgetSpentUsd) + " + " + usd(p.committedUsd) + " in flight of " + usd(p.budgetLimitUsd) + " (left " + usd(left) + ")";
  }
  function plane(p) {
    const pl = p.plane;
    if (!pl) return "–";
    const parts = ["depth " + fmt(pl.depth) + (pl.depthLimit ? "/" + fmt(pl.depthLimit) : "")];
    if (pl.retryBudget !== null && pl.retryBudget !== undefined) parts.push("retries " + fmt(pl.retriesLeft) + "/" + fmt(pl.retryBudget));
    if (pl.healthAgeSeconds !== null && pl.healthAgeSeconds !== undefined) {
      const state = pl.healthFresh ? "fresh" : (!pl.healthOk ? "not ok" : "stale");
      parts.push("health " + num(pl.healthAgeSeconds).toFixed(0) + "s (" + state + ")");
    } else if (pl.healthRequired) parts.push("health: no sample");
    return parts.join(", ");
  }
  function starvingText(s) {
    if (s.kind === "provider-closed") return "provider " + s.provider + " closed (" + s.why + ") with " + s.waiting +
      " waiting on " + s.pool + " until " + utc(s.closedUntil, true);
    if (s.kind === "pinned") return s.waiting + " hard-pinned round(s) waiting for " + s.pool + " since " + utc(s.waitingSince);
    return s.kind + ": lane " + s.lane + " on " + s.pool + " waiting since " + utc(s.waitingSince);
  }
  const arr = (x) => Array.isArray(x) ? x : [];  // cjson encodes an empty array as {}
  const row = (attrs, cells) => el("tr", attrs, ...cells.map((c) => el("td", {}, c)));
  const none = (span, text) => el("tr", {class: "none"}, el("td", {colspan: span}, text));

  function remember(doc) {
    if (doc.at === lastAt) return;
    lastAt = doc.at;
    for (const p of arr(doc.pools)) {
      const h = history[p.pool] = arr(history[p.pool]);
      if (h.length && h[h.length - 1][0] >= doc.at) continue;
      h.push([doc.at, num(p.capacity), num(p.carryingCapacity)]);
      if (h.length > init.historyPoints) h.splice(0, h.length - init.historyPoints);
    }
    try { sessionStorage.setItem(storeKey, JSON.stringify(history)); } catch (e) { /* full or disabled */ }
  }
  const SVG = "http://www.w3.org/2000/svg";
  function spark(pool) {
    const W = 180, H = 36, pad = 3;
    const svg = document.createElementNS(SVG, "svg");
    for (const [k, v] of Object.entries({class: "spark", "data-pool": pool, width: W, height: H, viewBox: "0 0 " + W + " " + H,
      role: "img"})) svg.setAttribute(k, v);
    const h = arr(history[pool]);
    const last = h.length ? h[h.length - 1] : null;
    svg.setAttribute("aria-label", last ? "K-hat " + fmt(last[1]) + ", K " + fmt(last[2]) + " over " + h.length + " points" : "no history yet");
    const title = document.createElementNS(SVG, "title");
    title.textContent = last ? "K̂ " + fmt(last[1]) + "  K " + fmt(last[2]) + "  (" + h.length + " points since " + utc(h[0][0]) + ")" : "no history yet";
    svg.append(title);
    if (!h.length) return svg;
    const t0 = h[0][0], t1 = Math.max(h[h.length - 1][0], t0 + 1);
    const top = Math.max(1, ...h.map((x) => Math.max(x[1], x[2])));
    const X = (t) => pad + (W - 2 * pad) * (h.length === 1 ? 1 : (t - t0) / (t1 - t0));
    const Y = (v) => H - pad - (H - 2 * pad) * v / top;
    for (const [i, color, dash] of [[2, "#d9822b", "3 2"], [1, "#0b5cad", ""]]) {
      const pts = h.filter((x) => i === 1 || x[2] > 0).map((x) => X(x[0]).toFixed(1) + "," + Y(x[i]).toFixed(1));
      if (!pts.length) continue;
      if (pts.length === 1) pts.unshift((pad).toFixed(1) + "," + pts[0].split(",")[1]);
      const line = document.createElementNS(SVG, "polyline");
      for (const [k, v] of Object.entries({points: pts.join(" "), fill: "none", stroke: color, "stroke-width": 1.6,
        "stroke-dasharray": dash, class: i === 1 ? "k-est" : "k-cap"})) if (v !== "") line.setAttribute(k, v);
      svg.append(line);
    }
    return svg;
  }
  function fill(id, kids) {
    const host = document.getElementById(id);
    const target = host.tBodies && host.tBodies.length ? host.tBodies[0] : host;
    target.replaceChildren(...kids);
    host.setAttribute("data-source", "script");
  }
  function render(doc) {
    const pools = arr(doc.pools), starving = arr(doc.starving);
    fill("pools", pools.length ? pools.map((p) => row({"data-pool": p.pool, class: p.closedUntil ? "closed" : (p.exhausted ? "exhausted" : "")}, [
      p.pool, p.provider, fmt(p.capacity), p.carryingCapacity ? fmt(p.carryingCapacity) : "–", fmt(p.slots), fmt(p.running),
      fmt(p.waiting), fmt(p.free), poolState(p), closed(p), budget(p), plane(p), spark(p.pool)])) : [none(13, "no pools")]);
    const lanes = [];
    for (const p of pools) for (const l of arr(p.lanes)) lanes.push(row({"data-pool": p.pool, "data-lane": l.lane}, [
      p.pool, l.lane, fmt(l.running), fmt(l.waiting), fmt(l.guaranteed), fmt(l.borrowed), fmt(l.bound), fmt(l.delegated),
      usd(l.spentTodayUsd), usd(l.reserveLeftUsd), ago(doc.at, l.oldestWaitingSince)]));
    fill("lanes", lanes.length ? lanes : [none(11, "no lane has work")]);
    const providers = new Map();
    for (const p of pools) {
      if (!providers.has(p.provider)) providers.set(p.provider, {first: p, pools: []});
      providers.get(p.provider).pools.push(p.pool);
    }
    fill("providers", providers.size ? [...providers].map(([name, v]) => row({"data-provider": name, class: v.first.closedUntil ? "closed" : ""}, [
      name, v.pools.join(", "), closed(v.first), budget(v.first), v.first.budgetAt ? utc(v.first.budgetAt).slice(0, 5) + "Z" : "–"]))
      : [none(5, "no providers")]);
    fill("starving", starving.length ? starving.map((s) => el("li", {"data-kind": s.kind, "data-pool": s.pool, "data-lane": s.lane,
      "data-provider": s.provider}, starvingText(s))) : [el("li", {class: "none"}, "nobody is starving")]);
    const yields = [];
    for (const p of pools) for (const y of arr(p.mustYield)) yields.push(el("li", {"data-pool": p.pool, "data-lane": y.lane},
      y.lane + " on " + p.pool + ": " + fmt(y.borrowed) + " borrowed, yields at its next round (pool owes " + fmt(p.owed) + ")"));
    fill("must-yield", yields.length ? yields : [el("li", {class: "none"}, "no lane must yield")]);
    const up = document.getElementById("updated");
    up.textContent = "census of " + utc(doc.at) + " (policy v" + fmt(doc.configVersion) + ")";
    up.classList.remove("stale");
    up.setAttribute("data-at", doc.at);
  }
  function stale(why) {
    const up = document.getElementById("updated");
    up.textContent = "census unavailable: " + why + (lastAt ? " (last " + utc(lastAt) + ")" : "");
    up.classList.add("stale");
  }
  async function poll() {
    try {
      const res = await fetch("census.json?mesh=" + encodeURIComponent(mesh), {cache: "no-store"});
      const body = await res.json().catch(() => ({error: "HTTP " + res.status}));
      if (!res.ok || body.error) stale(body.error || "HTTP " + res.status);
      else { remember(body); render(body); }
    } catch (e) { stale(String(e && e.message || e)); }
    polls += 1;
    const up = document.getElementById("updated");
    up.setAttribute("data-source", "script");
    up.setAttribute("data-polls", polls);
    setTimeout(poll, init.pollMs);
  }
  if (init.census) { remember(init.census); render(init.census); }
  poll();
})();
"""


# -- HTTP ---------------------------------------------------------------------------------------


class Handler(BaseHTTPRequestHandler):
    server_version = "admission-serve"
    source: CensusSource  # set on the subclass make_server builds

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        log.debug("http_access", client=self.client_address[0], line=format % args)

    def do_HEAD(self) -> None:  # noqa: N802
        self._route(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._route(head=False)

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        query = parse_qs(url.query)
        path = url.path.rstrip("/") or "/"
        try:
            if path == "/healthz":
                return self._send(200, b"ok\n", "text/plain; charset=utf-8", head)
            if path not in ("/", "/index.html", "/metrics", "/census.json", "/readyz"):
                return self._send(404, b"not found\n", "text/plain; charset=utf-8", head)
            asked = query.get("mesh") or []
            unknown = [m for m in asked if m not in self.source.adms]
            if unknown:
                return self._send(404, f"unknown mesh {unknown[0]!r}; serving {', '.join(self.source.meshes)}\n"
                                  .encode(), "text/plain; charset=utf-8", head)
            mesh = asked[0] if asked else self.source.meshes[0]
            if path == "/metrics":
                body, ctype = metrics_text(self.source, list(dict.fromkeys(asked)) or self.source.meshes,
                                           self.headers.get("Accept"))
                return self._send(200, body, ctype, head)
            if path == "/readyz":
                ok, why = self.source.ready(mesh)
                return self._send(200 if ok else 503, (why + "\n").encode(), "text/plain; charset=utf-8", head)
            snap = self.source.snapshot(mesh)
            if path == "/census.json":
                doc = snap.census if snap.census is not None else {"error": snap.error, "mesh": mesh}
                return self._send(200 if snap.census is not None else 503, json.dumps(doc).encode(),
                                  "application/json", head)
            nonce = secrets.token_urlsafe(16)
            page = render_page(mesh, self.source.meshes, snap.census, snap.error, nonce=nonce)
            csp = (f"default-src 'none'; script-src 'nonce-{nonce}'; style-src 'nonce-{nonce}'; connect-src 'self'; "
                   "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
            return self._send(200, page.encode(), "text/html; charset=utf-8", head, {"Content-Security-Policy": csp})
        except (BrokenPipeError, ConnectionResetError):
            return None
        except Exception as exc:  # one bad request never stops the server
            log.error("serve_request_failed", path=url.path, error=f"{type(exc).__name__}: {_one_line(exc)}")
            try:
                return self._send(500, b"internal error\n", "text/plain; charset=utf-8", head)
            except OSError:
                return None

    def _send(self, status: int, body: bytes, ctype: str, head: bool, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)


def make_server(redis_or_url: redis.Redis | str, meshes: Iterable[str], host: str = DEFAULT_HOST,
                port: int = DEFAULT_PORT, *, cache_seconds: float = CACHE_SECONDS) -> ThreadingHTTPServer:
    """A bound server (port 0: any free port, see ``server.server_address``); run it with
    ``serve_forever()`` and stop it with ``shutdown()`` then ``server_close()``. Its ``source``
    attribute is the CensusSource."""
    _prometheus()  # a missing extra fails here, not at the first scrape
    client = (redis.Redis.from_url(redis_or_url, **fail_fast_options()) if isinstance(redis_or_url, str)
              else redis_or_url)
    source = CensusSource(client, meshes, cache_seconds=cache_seconds)
    handler = type("CensusHandler", (Handler,), {"source": source})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    server.source = source  # type: ignore[attr-defined]
    return server


def serve(url: str, meshes: Iterable[str], host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> None:
    """Serve until interrupted (KeyboardInterrupt propagates; the socket is closed)."""
    server = make_server(url, meshes, host, port)
    log.info("serving", host=server.server_address[0], port=server.server_address[1],
             meshes=server.source.meshes, redis=redact(url))  # type: ignore[attr-defined]
    try:
        server.serve_forever()
    finally:
        server.server_close()


def redact(url: str) -> str:
    """The URL without its password."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rpartition("@")
    user = parts.username or ""
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[2]}"))


# -- the command --------------------------------------------------------------------------------


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``serve`` subcommand on ``sub`` (an argparse subparsers object), with all its arguments
    (--url, --mesh repeatable, --host, --port) and ``func=run_cli``: add no connection arguments."""
    p = sub.add_parser("serve", help="serve the census over HTTP: /metrics (Prometheus), /census.json, "
                                     "/healthz, /readyz and a live page at /")
    # SUPPRESS: the global --url/--mesh (and $ADMISSION_URL, $ADMISSION_MESH) apply unless given here
    p.add_argument("--url", default=argparse.SUPPRESS, help="Redis URL (default: the global --url)")
    p.add_argument("--mesh", dest="mesh", action="extend", nargs="+", default=argparse.SUPPRESS, metavar="MESH",
                   help="mesh(es) to serve, the first being the default of every endpoint (repeatable; default prod)")
    p.add_argument("--host", default=DEFAULT_HOST, help="address to listen on (default %(default)s)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on (default %(default)s)")
    p.set_defaults(func=run_cli)
    return p


def run_cli(args: argparse.Namespace) -> int:
    """``admission serve``: 0 on Ctrl-C or SIGTERM; 2 with a one-line error (missing extra, bad
    mesh name, address in use). A Redis that does not answer yet is no error: /readyz says so."""
    mesh = getattr(args, "mesh", None) or ["prod"]
    meshes = [mesh] if isinstance(mesh, str) else list(mesh)  # the global --mesh is one name
    args.url = getattr(args, "url", None) or "redis://127.0.0.1:6379/0"
    try:
        server = make_server(args.url, meshes, args.host, args.port)
    except MissingExtra as exc:
        print(f"admission serve: {exc}", file=sys.stderr)
        return 2
    except AdmissionError as exc:
        print(f"admission serve: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except (OSError, ValueError, OverflowError) as exc:
        print(f"admission serve: cannot listen on {args.host}:{args.port}: {_one_line(exc)}", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    shown = f"[{host}]" if ":" in str(host) else host
    print(f"admission serve: http://{shown}:{port}/ (meshes {', '.join(meshes)}; redis {redact(args.url)})",
          flush=True)
    log.info("serving", host=host, port=port, meshes=meshes, redis=redact(args.url))

    def stop(_signum: int, _frame: Any) -> None:
        raise KeyboardInterrupt

    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return 0
