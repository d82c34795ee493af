"""``admission serve``: the census over HTTP, for Prometheus and for people.

    admission serve --url redis://127.0.0.1:6379/0 --mesh prod [--mesh staging] [--host 0.0.0.0] [--port 9464]

One process serves one mesh or several; it keeps no state of its own (run any number of
replicas). Every request reads Redis afresh: the census is rebuilt by the ``census`` script
(``Mesh.census()``) and kept for ``cache_seconds`` (1 s) per mesh, so a burst of scrapes
and page polls costs one rebuild; a failed read is kept as long, so a dead Redis is asked once
per second, not once per request.

Endpoints (each takes ``?mesh=NAME``; default the first mesh served, ``/metrics`` all of them):

``/metrics``      the Prometheus text format (OpenMetrics when the scraper asks for it), built by a
                  collector from the census and the cumulative ``totals`` hash at scrape time
``/census.json``  the census document (503 with ``{"error": ...}`` when it cannot be read)
``/healthz``      200 ``ok`` while the process is up
``/readyz``       200 when Redis answers and the mesh has a policy, else 503 with a one-line reason
``/``             the live census page: tables built by the server that a small inline script
                  refreshes every 2 s (it fetches the page again), with each pool's K̂ and K over
                  time (the history lives in the browser tab); no external assets

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

The package, one module a job: ``source`` (the census read and kept), ``metrics`` (the
Prometheus collector), ``page`` (the live page, its files in ``static/``), ``server`` (HTTP) and
``command`` (the ``serve`` subcommand). Nothing of the runtime (``import admission``) imports it.
"""
from __future__ import annotations

from .command import add_parser, run_cli
from .metrics import GAUGES, POOL_COUNTERS, TOTALS, CensusCollector, MissingExtra, metrics_text, prometheus
from .page import HISTORY_POINTS, POLL_MS, render_page
from .server import DEFAULT_HOST, DEFAULT_PORT, Handler, make_server, redact, serve
from .source import CACHE_SECONDS, CensusSource, Snapshot, totals_key

__all__ = ["add_parser", "run_cli", "GAUGES", "POOL_COUNTERS", "TOTALS", "CensusCollector", "MissingExtra",
           "metrics_text", "prometheus", "HISTORY_POINTS", "POLL_MS", "render_page", "DEFAULT_HOST",
           "DEFAULT_PORT", "Handler", "make_server", "redact", "serve", "CACHE_SECONDS", "CensusSource",
           "Snapshot", "totals_key"]
