"""The latency benchmark: ``python -m admission.tools.bench`` (a benchmark, not a timed test).

It starts its own throw-away server (``--engine redis`` by default, or ``valkey``), and for
every case of a grid -- lanes in the policy x live seats held on the pool x waiter tickets on the
pool -- it runs one loop in which each iteration times, side by side on the same connection:

* **admit**   -- ``Admission.try_admit`` of a round that is admitted (the common path);
* **release** -- ``Admission.release`` of that seat (clean, priced: the spend ledger is written);
* **PING**    -- ``client.ping()``: the round trip of the cheapest command, the yardstick.

So machine noise hits the three alike. Before each measured block ``CONFIG RESETSTAT`` clears
the server's counters, and after it ``INFO commandstats`` gives the server's own microseconds per
function call (``cmdstat_fcall`` usec_per_call: admit and release together, client and network
excluded).

How a case is built (fast: pipelined, never timed):

* the policy has 1, 8 or 32 lanes (the seed's seven lanes, then filler lanes) on one pool, with a
  large ``seed_estimate`` so every seat is admitted within its lane's floor, and day-long leases
  so nothing expires while it runs;
* ``seats`` rounds are admitted round-robin over the lanes by another pod;
* ``waiters`` tickets are made in the measured lane: the estimate is briefly set to 1 so they
  are refused (the first ``full``, the rest ``behind-older``), then set back. With waiters, each
  iteration's admit is the lane's *oldest* waiter being admitted (as a woken waiter is), and
  every 100 iterations 100 newcomers queue behind the others (untimed, and their script time is
  taken out of the server figure): the lane always has between ``waiters`` and ``waiters`` + 100.
* the seats of one (lanes, seats) pair are made once; its waiter cases run on them in turn.

Targets (printed next to the figures): admit p50 within 1.5x PING p50; admit p50 flat in seats
and waiters, i.e. within 1.25x of the case with the fewest seats and waiters of the same lanes.

``--census`` runs another, small case set instead: the pool clock's read model at estimates of
10, 1,000 and 50,000 slots (``--estimates``) with 8 lanes (``--lanes``), every lane holding a seat
and one lane a waiter. It times ``census`` and ``tick`` (each tick rebuilds the census: its
``census:at`` is cleared, untimed, before it) and reports the server's µs per call: both must be
flat in the estimate (a lane's bound is computed in closed form, not one decision per newcomer).

The package, by section: ``policy`` (the bench's policy, lane, pool and targets), ``case`` (one
case built and timed), ``grid`` (the whole grid, its targets, several pod processes), ``census``
(``--census``), ``against`` (``--against``), ``output`` (the table), ``cli`` (the command line).
"""
from __future__ import annotations

from .against import render_against, run_against
from .case import FLOOR_LIBRARY, Case, Queue, add_waiters, empty_script_usec, fill_seats, floor, lane_fields, measure
from .census import CensusCase, render_census, run_census
from .cli import main, main_census, parser
from .grid import pods_throughput, run, targets
from .output import COLUMNS, render
from .policy import (BIG_ESTIMATE, CENSUS_DEFAULT, DEFAULT, LEASE_TTL, MEASURED_LANE, MESH, POOL, PROVIDER, QUICK,
                     SEED_LANES, bench_policy, lanes_table)

__all__ = ["BIG_ESTIMATE", "CENSUS_DEFAULT", "COLUMNS", "Case", "CensusCase", "DEFAULT", "FLOOR_LIBRARY", "LEASE_TTL",
           "MEASURED_LANE", "MESH", "POOL", "PROVIDER", "QUICK", "Queue", "SEED_LANES", "add_waiters", "bench_policy",
           "empty_script_usec", "fill_seats", "floor", "lane_fields", "lanes_table", "main", "main_census", "measure",
           "parser", "pods_throughput", "render", "render_against", "render_census", "run", "run_against",
           "run_census", "targets"]
