"""``/metrics``: a Prometheus collector over the census and the cumulative ``totals`` hash, read
at scrape time through the source's cache (nothing is counted in this process). Metric names and
labels: see the package's docstring."""
from __future__ import annotations

import argparse
from typing import Any, Iterator

from .._log import get_logger
from ..errors import AdmissionError
from .source import CensusSource, number as _num

log = get_logger("admission.serve")


class MissingExtra(AdmissionError):
    """``prometheus_client`` (the ``serve`` extra) is not installed."""


def prometheus() -> Any:
    """The parts of prometheus_client this package uses; a one-line error without it."""
    try:
        from prometheus_client import CollectorRegistry
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
        from prometheus_client.exposition import choose_encoder
    except ImportError as exc:
        raise MissingExtra(f"prometheus_client is not installed ({exc}); "
                           "pip install 'admission[serve]'") from None
    return argparse.Namespace(CollectorRegistry=CollectorRegistry, CounterMetricFamily=CounterMetricFamily,
                              GaugeMetricFamily=GaugeMetricFamily, choose_encoder=choose_encoder)


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
SCOPE = ("mesh", "scope")
CEIL = ("mesh", "scope", "limit")
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
    "admission_ceiling_limit": (("mesh", "scope", "limit", "source"), "A rate ceiling per minute or per day: configured, learned from the provider's headers, or effective (min of both x headroom)."),
    "admission_ceiling_level": (CEIL, "Requests or tokens left in the ceiling's bucket now (below 0: a debt that refills)."),
    "admission_ceiling_capacity": (CEIL, "Most the ceiling's bucket holds."),
    "admission_ceiling_outside_per_second": (CEIL, "Requests or tokens a second the fresh readings say a client outside the mesh takes from the ceiling (0: none learned)."),
    "admission_ceiling_held": (CEIL, "1 while the provider's 429 holds the ceiling's bucket empty until its reset, else 0."),
    "admission_ceiling_reserved": (("mesh", "scope", "unit"), "Requests and tokens reserved by the scope's rounds in flight."),
    "admission_ceiling_used_last_minute": (("mesh", "scope", "unit"), "Requests and tokens the provider counted over the last minute, for the calls whose rounds ended in it."),
    "admission_ceiling_wait_seconds": (SCOPE, "Seconds until a one-request round of the scope's mean size could pass (0: now)."),
    "admission_ceiling_closed": (SCOPE, "1 while a daily ceiling closes the scope's pools until midnight UTC, else 0."),
    "admission_ceiling_reading_age_seconds": (SCOPE, "Age of the last reading of the provider's rate-limit headers (absent: none)."),
    "admission_ceiling_reservation_accuracy": (("mesh", "scope", "quantile"), "Counted / reserved tokens of the scope's recent releases, by quantile (0.5, 0.95)."),
    "admission_ceiling_reservation_samples": (SCOPE, "Releases the reservation accuracy is measured over."),
}
CEILING_REFUSALS = ("admission_ceiling_refusals", "Rounds refused on a rate ceiling of the scope, by ceiling, ever.")
POOL_COUNTERS = {
    "admission_pool_moved_in": ("movedIn", "Rounds moved onto the pool from another, ever."),
    "admission_pool_moved_out": ("movedOut", "Rounds moved off the pool to another, ever."),
}


class CensusCollector:
    """A prometheus_client collector over the census: every sample is read at scrape time from
    Redis (through the source's cache); nothing is counted in this process."""

    def __init__(self, source: CensusSource, meshes: list[str]):
        self.source, self.meshes = source, meshes
        self.prom = prometheus()

    def collect(self) -> Iterator[Any]:
        P = self.prom
        gauges = {name: P.GaugeMetricFamily(name, doc, labels=list(labels)) for name, (labels, doc) in GAUGES.items()}
        pool_counters = {name: P.CounterMetricFamily(name, doc, labels=list(POOL))
                         for name, (_field, doc) in POOL_COUNTERS.items()}
        totals = {kind: P.CounterMetricFamily(name, doc, labels=["mesh", *labels])
                  for kind, (name, labels, doc) in TOTALS.items()}
        refusals = P.CounterMetricFamily(CEILING_REFUSALS[0], CEILING_REFUSALS[1], labels=["mesh", "scope", "ceiling"])
        for mesh in self.meshes:
            snap = self.source.snapshot(mesh)
            gauges["admission_census_up"].add_metric([mesh], 0.0 if snap.census is None else 1.0)
            if snap.census is None:
                continue
            gauges["admission_census_age_seconds"].add_metric(
                [mesh], max(0.0, self.source.clock() - snap.fetched))
            self._census(mesh, snap.census, gauges, pool_counters)
            _ceilings(mesh, snap.census, gauges, refusals)
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
        yield refusals
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


def _ceilings(mesh: str, doc: dict[str, Any], g: dict[str, Any], refusals: Any) -> None:
    """The rate-ceiling scopes of the census (ceilcensus.lua)."""
    for c in doc.get("ceilings") or []:
        scope = str(c.get("scope"))
        sl = [mesh, scope]
        for lim in c.get("limits") or []:
            name = str(lim.get("limit"))
            for source in ("configured", "learned", "effective"):
                if lim.get(source) is not None:
                    g["admission_ceiling_limit"].add_metric([mesh, scope, name, source], _num(lim[source]))
            if lim.get("level") is not None:
                g["admission_ceiling_level"].add_metric([mesh, scope, name], _num(lim["level"]))
                g["admission_ceiling_capacity"].add_metric([mesh, scope, name], _num(lim.get("capacity")))
                g["admission_ceiling_held"].add_metric([mesh, scope, name], 1.0 if lim.get("heldUntil") else 0.0)
                g["admission_ceiling_outside_per_second"].add_metric([mesh, scope, name],
                                                                    _num(lim.get("outsidePerSecond") or 0))
        used = c.get("usedLastMinute") or {}
        for unit, reserved, last in (("requests", c.get("reservedRequests"), used.get("requests")),
                                     ("tokens", c.get("reservedTokens"), used.get("tokens"))):
            g["admission_ceiling_reserved"].add_metric([*sl, unit], _num(reserved))
            g["admission_ceiling_used_last_minute"].add_metric([*sl, unit], _num(last))
        g["admission_ceiling_wait_seconds"].add_metric(sl, _num(c.get("waitSeconds")))
        g["admission_ceiling_closed"].add_metric(sl, 1.0 if c.get("closedUntil") else 0.0)
        if c.get("reading"):
            g["admission_ceiling_reading_age_seconds"].add_metric(sl, _num(c["reading"].get("ageSeconds")))
        acc = c.get("accuracy")
        if acc:
            g["admission_ceiling_reservation_accuracy"].add_metric([*sl, "0.5"], _num(acc.get("median")))
            g["admission_ceiling_reservation_accuracy"].add_metric([*sl, "0.95"], _num(acc.get("p95")))
            g["admission_ceiling_reservation_samples"].add_metric(sl, _num(acc.get("samples")))
        for reason, n in sorted((c.get("refusals") or {}).items()):
            refusals.add_metric([*sl, str(reason).removeprefix("ceiling-")], _num(n))


def metrics_text(source: CensusSource, meshes: list[str], accept: str | None = None) -> tuple[bytes, str]:
    """The exposition for ``meshes`` and its content type (OpenMetrics when ``accept`` asks)."""
    P = prometheus()
    registry = P.CollectorRegistry(auto_describe=False)
    registry.register(CensusCollector(source, meshes))
    encoder, content_type = P.choose_encoder(accept or "")
    return encoder(registry), content_type

