"""``admission simulate`` (also ``python -m admission.tools.sim``): run the scenarios, print the table,
optionally write the JSON and the plots."""
from __future__ import annotations

import argparse
import logging
import sys
import time

from ...scripts import library
from ..logs import logs_to_stderr

from . import report, scenarios
from .load import sizes
from .runner import ENGINES, Job, default_workers, run_jobs


def parser(prog: str = "admission simulate") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=(
        "The seed's Monte Carlo comparison on the shipped Lua: step, seed-and-grow and the oracle "
        "under the seed's provider model and measured load; provider-day, a working day on a key "
        "with a daily limit, with the provider's-day rules and without them; and provider-day-fallback, "
        "that day with the same model on a second provider, with fallback and without; and ceilings, a "
        "token-bound key with its rate ceilings in the policy and without them."))
    p.add_argument("--scenario", choices=(*scenarios.NAMES, "all"), default="all")
    p.add_argument("--runs", type=int, default=10, help="seeded runs per row (default 10)")
    p.add_argument("--seed", type=int, default=1, help="base seed (default 1)")
    p.add_argument("--capacity", type=float, default=18.0, help="carrying capacity K of the pool (default 18)")
    p.add_argument("--hours", type=float, default=10.0,
                   help="simulated horizon (default 10; the provider-day scenarios always run 08:00-00:30 UTC)")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    p.add_argument("--plots", metavar="DIR", help="write one PNG per scenario (needs matplotlib)")
    p.add_argument("--engine", choices=ENGINES, default="redis",
                   help="where the Lua runs: a redis or valkey server started here, or fakeredis")
    p.add_argument("--workers", type=int, default=default_workers(), help="processes (default: up to 2)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("-v", "--verbose", action="store_true", help="log the admission's info lines")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.runs < 1 or args.capacity < 1 or args.hours <= 0 or args.workers < 1:
        print("admission simulate: --runs, --capacity and --workers must be >= 1, --hours > 0", file=sys.stderr)
        return 2
    logs_to_stderr(logging.INFO if args.verbose else logging.WARNING)
    names = scenarios.NAMES if args.scenario == "all" else (args.scenario,)
    jobs = [Job(name, pol, run, args.seed, args.capacity, args.hours, record=bool(args.plots) and run == 0)
            for name in names for pol in scenarios.make(name, args.capacity).policies for run in range(args.runs)]
    started = time.perf_counter()
    bar = None
    if not args.no_progress:
        from tqdm import tqdm

        bar = tqdm(total=len(jobs), unit="run", desc="simulate", file=sys.stderr)
    try:
        results = run_jobs(jobs, engine=args.engine, workers=min(args.workers, len(jobs)),
                           progress=(lambda job: (bar.set_postfix_str(f"{job.scenario}/{job.policy}"), bar.update()))
                           if bar else None)
    except FileNotFoundError as exc:  # no server binary for --engine
        print(f"admission simulate: {exc}; try --engine valkey or --engine fakeredis", file=sys.stderr)
        return 2
    finally:
        if bar:
            bar.close()
    config = {"runs": args.runs, "seed": args.seed, "capacity": args.capacity, "hours": args.hours,
              "engine": args.engine, "wall_seconds": round(time.perf_counter() - started, 1), "load": sizes(),
              "lua_version": library()[1]}
    doc = report.collect(results, config=config)
    print(report.table(doc))
    if args.json:
        report.write_json(doc, args.json)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plots:
        traces: dict[str, dict] = {}
        for job, _, trace in results:
            if trace is not None:
                traces.setdefault(job.scenario, {})[job.policy] = trace
        for path in report.plots(traces, doc, args.plots):
            print(f"wrote {path}", file=sys.stderr)
    print(f"{len(jobs)} runs in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
