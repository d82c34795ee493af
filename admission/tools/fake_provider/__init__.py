"""A fake LLM provider over HTTP: ``admission fake-provider`` (also ``python -m admission.tools.fake_provider``).

It speaks the OpenAI and the Anthropic protocols well enough for their real SDKs, and serves
every request through the simulator's provider model (``admission.tools.sim.model``), which is
its one source: no formula or constant of the model is copied here, and the model's functions
are looked up on the module at call time (a test that patches ``model.p_rate_limited`` changes
the server's refusals).

The model, per pool (one pool per ``model`` name, capacity K from ``--model NAME=K`` else
``--capacity``):

* a request that passes is a round of ``max_tokens`` tokens served by ``model.ProviderPool``:
  processor sharing, every round of the pool progresses at ``model.rate(n, K)`` tokens/s while n
  rounds are served. One scheduler task per pool sleeps until the pool's ``next_finish()`` or until
  n changes (an ``asyncio.Event``), pops the finished rounds and wakes their requests: no polling;
* a new request with n in flight (itself included) is refused with probability
  ``model.p_rate_limited(n, K)`` (a seeded ``random.Random``); the refusal arrives after
  uniform(0, ``RATE_LIMIT_WITHIN``) and the refused request takes no share meanwhile. The refusal
  is a 429 with ``retry-after``/``retry-after-ms``: the real time until the pool's next completion
  at its current load (the provider says when a slot frees up), capped at ``--retry-after-max``.
  A share ``--overloaded-share`` of these refusals is a 529 "Overloaded" instead (no retry-after);
* a round still unfinished ``ROUND_CAP`` after it started is cut: 504;
* the daily key limit is one ``model.ProviderKey`` per API key (``--key-limit-usd``, price
  ``--price-per-1k``): a completed request bills its ``total_tokens`` (prompt + completion, as
  its usage says) on the real ``time.time()`` day; once the key's count reached the limit, every
  request on that key gets ``KEY_LIMIT_STATUS`` with ``KEY_LIMIT_MESSAGE`` within
  ``KEY_REFUSAL_WITHIN``;
* the rate ceilings (``admission.tools.sim.ceilings``; ``--rpm --tpm --itpm --otpm --rpd --tpd``,
  none by default: then no ceiling and no rate-limit header) are one set of buckets per API key
  and model, counted in ``--style`` openai or anthropic (per-minute buckets refilled
  continuously, daily ones per UTC day of the provider's clock, ``--clock-start``), with
  ``--outside-tpm`` / ``--outside-rpm`` spent on every key from outside the mesh and
  ``--rpm-burst-s`` the request bucket's depth. They are checked after the key limit and before
  the faults: a request that does not fit is answered at once with a 429 in the style's words
  naming the ceiling, ``retry-after`` / ``retry-after-ms`` the real time until it would fit (none
  when it never can); a refused request counts nothing. ``--cache-read-share`` /
  ``--cache-write-share`` split each prompt for the counting and the usage (OpenAI
  ``prompt_tokens_details.cached_tokens``; Anthropic ``input_tokens`` then the uncached part,
  ``cache_read_input_tokens``, ``cache_creation_input_tokens``). Every answer of a chat route
  (200, 429, 403, faults, 504) carries the style's rate-limit headers (``rate_headers``): limits
  per minute or day of provider time, resets and retry-after in real time;
* injected faults (``--fault STATUS=P``, statuses 402, 500, 502, 503, 529) are drawn per request
  after the key check and before the capacity check, answered after 0.05 s.

Time is scaled: ``scale`` simulated seconds pass per real second. Every time of the model is in
simulated seconds; the virtual clock is ``(time.monotonic() - start) * scale`` and real sleeps
are simulated seconds / scale. The day clock of the keys is real wall time; the ceilings' clock is
``clock_start + virtual clock`` (``provider_now()``).

Routes:

* ``POST /v1/chat/completions`` (OpenAI; ``stream`` and ``stream_options.include_usage``);
* ``POST /v1/messages`` (Anthropic; ``stream``);
* ``GET /v1/models`` (OpenAI's list shape), ``GET /healthz`` ("ok"), ``GET /stats`` (JSON);
* ``POST /admin/faults`` ``{"faults": {"529": 0.2}, "key_limit_usd": 1, "capacity": {"m": 6} | 6,
  "overloaded_share": 0.1, "ceilings": {"tpm": 50000, "rpm": null}, "outside": {"tpm": 3000},
  "style": "anthropic"}`` (each key optional; ``faults`` replaces the faults; ``ceilings`` and
  ``outside`` change the kinds they name, ``null`` removes a ceiling, a lowered limit is in force
  from the next request), ``POST /admin/reset`` (zeroes the statistics; ``{"keys": true}`` also
  forgets the keys' spend and fills their buckets).

``GET /stats`` (and ``FakeProviderServer.stats()``): ``{"models": {name: POOL}, "total": POOL,
"keys": {key[:8]: {"spent_usd", "limit_usd"}}, "rejected": {"400": n, "401": n, ...}, "scale",
"uptime_s", "default_capacity", "faults", "overloaded_share", "key_limit_usd", "price_per_1k"}``
where POOL is ``{"capacity", "in_flight", "peak_in_flight", "requests", "completions", "200",
"429", "529", "403", "402", "5xx", "504", ("499", ...), "tokens", "over_capacity_s",
"timeline": [[real s since start, in_flight], ...]}``. The total sums the pools (its
``over_capacity_s`` is the pools' sum) and tracks its own in-flight peak and timeline;
``rejected`` counts the requests answered before a pool was chosen. With ceilings, ``"ceilings":
{"style", "limits": {kind: limit}, "outside_per_minute", "rpm_burst_s", "cache_read_share",
"cache_write_share", "clock_start", "provider_minute" (the minute of the run now),
"real_s_per_minute", "429": {kind: n}, "used": {kind: {"total", "per_minute": [counted in minute
0, 1, ...]}}, "scopes": {"key[:8]/model": {"state": {kind: {"limit", "remaining", "reset_s"}},
"used", "429"}}}``: ``used`` is what the mesh's requests counted (the outside traffic is not in it),
by provider minute since the start, summed over the scopes; a ceiling's 429s count in the pool's
``"429"`` too.

The ``/v1`` prefix is optional. Errors come in the shape of the route's protocol (OpenAI
``{"error": {...}}``, Anthropic ``{"type": "error", "error": {...}}``). A stream is sent whole
when its round completes (the status is only known then), with a Content-Length like any other
answer: HTTP/1.1 with keep-alive, plain asyncio streams, no dependency; a chunked request body is
refused with 411. A client that hangs up during its round takes its round out of the pool
(counted as "499"). No key is needed for the GET routes and the admin routes.

The package, by section: ``statuses`` (the statuses and their errors), ``pools`` (the model:
pools, keys, statistics, and the configuration checks), ``protocols`` (request bodies in,
answers out), ``rate_headers`` (the ceilings' headers), ``wire`` (HTTP/1.1 over asyncio streams), ``server`` (FakeProviderServer), ``cli``
(the command line).
"""
from __future__ import annotations

from .cli import main, server_from_args
from .pools import (FAULT_DELAY, MAX_TOKENS, TIMELINE_POINTS, FakeProvider, Outcome, check_capacities,
                    check_ceilings, check_faults, check_key_limit, retry_headers)
from .protocols import Ask, BadRequest, anthropic_answer, error_body, filler, openai_answer, parse_ask
from .rate_headers import rate_headers
from .server import FakeProviderServer
from .statuses import ERRORS, FAULT_STATUSES, STATUS_KEYS
from .wire import MAX_BODY, MAX_HEAD, Request, Response, encode_response, read_request

__all__ = ["Ask", "BadRequest", "ERRORS", "FAULT_DELAY", "FAULT_STATUSES", "FakeProvider", "FakeProviderServer",
           "MAX_BODY", "MAX_HEAD", "MAX_TOKENS", "Outcome", "Request", "Response", "STATUS_KEYS", "TIMELINE_POINTS",
           "anthropic_answer", "check_capacities", "check_ceilings", "check_faults", "check_key_limit", "encode_response",
           "error_body", "filler", "main", "openai_answer", "parse_ask", "rate_headers", "read_request", "retry_headers",
           "server_from_args"]
