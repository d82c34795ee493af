"""The provider benchmark: ``python -m admission.tools.bench --provider`` (also ``admission bench --provider``).

One burst of rounds, three ways, side by side, against the fake provider
(``admission.tools.fake_provider``: the simulator's provider model over HTTP, with a hidden
capacity K that nobody here is told about except mode (c)). ``--rounds`` rounds, each one chat
completion of ``--tokens`` tokens, are split over ``--pods`` pod *processes*; each pod starts one
thread per round of its share and all pods start together (a start gate opened once every pod is ready: a barrier), so the whole burst
arrives at once. The same burst runs three times, one mode after another, each against a fresh
provider of the same capacity, scale and seed:

(a) **no admission** -- every round calls the plain OpenAI SDK (``max_retries=0``) and retries a
    429 itself with exponential backoff and full jitter: it sleeps uniform(0, min(cap, base·2^i))
    before attempt i + 1 (base ``--backoff-base`` 1 s real, doubling, cap ``--backoff-cap`` 30 s)
    until it succeeds. It honours nothing else (no Retry-After). This is what a fleet without
    shared admission does.
(b) **through the admission** -- the same calls through ``admission.integrations.openai.wrap``:
    every attempt is a ``round()`` of one lane on one pool (``m@fake``), so it waits for a seat,
    and a 429 that still happens releases the seat as ``rate_limited`` (the pool's estimate
    drops, its Retry-After pauses the pool for every pod) and is asked again through the
    admission (the wrapper's ``retries``, and a loop around it that never gives up before the
    bound). The admission starts cold: a pool never seen, ``seed_estimate`` 2, slow start.
(c) **a static shared semaphore set to the hidden capacity** -- a Redis list of K tokens shared by
    the pods (BLPOP takes one, RPUSH gives it back), plus mode (a)'s backoff on a 429 (the token is
    given back while it sleeps). Told the hidden K, this is the best a fixed limit can do; it is
    the yardstick, not a competitor: a real fleet does not know K, and K moves.

What is fair about it:

* the same rounds, pods, threads, start gate, provider model, capacity, scale and seed in all
  three modes (a new provider per mode, so each sees the same random sequence from the same
  virtual time 0); the same OpenAI SDK client settings (no SDK retries, the same HTTP client);
* every mode retries until every round has succeeded: nothing is dropped or counted as done
  without a 200;
* the admission gets one lane that owns the whole pool (floor 1) and **default tunables**; only the
  ones that are durations of the provider's world are scaled by ``--scale`` (the provider runs
  ``scale`` simulated seconds per real second, the admission runs on Redis' real clock):
  ``grow_interval``, ``stall_after``, ``round_cap``, ``starved_after``, ``probe_every``,
  ``closed_for`` and ``retry_after_max`` are divided by ``scale`` (clamped to their lower bound).
  The pod's own infrastructure times (``lease_ttl``, ``decision_ttl``, ``health_max_age``) and
  every count and share keep their defaults. Nothing is tuned to this scenario;
* the backoff of (a) and (c) is a real client's, in real seconds, not scaled: at ``--scale 60`` a
  1 s backoff lasts a minute of the provider's time (a round of 150 tokens takes 2.5 simulated s
  alone). That is what the brief asks for; ``--backoff-base`` / ``--backoff-cap`` change it
  (e.g. ``--backoff-base 0.0167 --backoff-cap 0.5`` is 1 s / 30 s of provider time).

What is measured, per mode:

* **drain s** -- from the first request any pod sent to the provider to the last round's 200, real s;
* **429s** -- the refusals the provider sent (its own count, ``GET /stats``);
* **peak in flight** -- the most rounds the provider served at once (its count) against K;
* **rounds/s** -- rounds / drain;
* **latency mean / p95** -- per round, from the burst's start (the gate) to its 200: waiting
  for a seat, a token or a backoff included;
* **limit** -- what bounded concurrency: nothing, the admission's slots (the most it allowed at any
  time, from its ``grew`` events and a poll of the pool; its K̂ and K at the end), the K tokens.

A mode that has not drained within the bound (20× the ideal drain of a fixed limit K with no
overhead, plus 4 backoff caps) stops the run: one line on stderr, exit 1.

The package, by section: ``settings`` (the burst, the policy, the yardsticks), ``pods`` (one pod
process: a thread per round), ``parent`` (a provider per mode, the pods, the figures), ``output``
(the table), ``cli`` (the command line); the ceilings case (``--case ceilings``: a key with rate
ceilings, no admission, the admission without and with its ceilings, a LiteLLM Router):
``ceilings_settings``, ``ceilings_pods``, ``ceilings_case``.
"""
from __future__ import annotations

from .cli import main, parser, settings_of
from .output import COLUMNS, notes, render, settings_line, table_rows
from .parent import Progress, SlotWatch, run
from .pods import Item, Job, Pods
from .settings import (LABELS, LANE, MAX_ROUNDS, MESH, MODEL, MODES, POOL, PROG, PROVIDER, SCALED_TUNABLES, NotDrained,
                       Settings, backoff_s, bench_policy, bound_s, ideal_drain_s, scaled_tunables)

__all__ = ["COLUMNS", "Item", "Job", "LABELS", "LANE", "MAX_ROUNDS", "MESH", "MODEL", "MODES", "NotDrained", "POOL",
           "PROG", "PROVIDER", "Pods", "Progress", "SCALED_TUNABLES", "Settings", "SlotWatch", "backoff_s",
           "bench_policy", "bound_s", "ideal_drain_s", "main", "notes", "parser", "render", "run", "scaled_tunables",
           "settings_line", "settings_of", "table_rows"]
