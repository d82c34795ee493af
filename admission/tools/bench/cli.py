"""``python -m admission.tools.bench`` (``admission bench``): the command line."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Sequence

from .. import write_json
from ..logs import quiet_logs
from ..servers import ENGINES
from .against import render_against, run_against
from .census import render_census, run_census
from .grid import run
from .output import render
from .policy import BIG_ESTIMATE, CENSUS_DEFAULT, DEFAULT, PODS_SECONDS, QUICK

DESCRIPTION = sys.modules[__package__].__doc__.split("\n\n")[0]


def _ints(text: str) -> list[int]:
    try:
        values = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers >= 0, got {text!r}")
    return values


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m admission.tools.bench", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engine", choices=ENGINES, default="redis", help="server to start (default redis)")
    p.add_argument("--quick", action="store_true",
                   help=f"smaller run: lanes {QUICK['lanes']}, seats {QUICK['seats']}, waiters "
                        f"{QUICK['waiters']}, {QUICK['iterations']} iterations")
    p.add_argument("--lanes", type=_ints, help=f"lanes in the policy (default {DEFAULT['lanes']})")
    p.add_argument("--seats", type=_ints, help=f"live seats held on the pool (default {DEFAULT['seats']})")
    p.add_argument("--waiters", type=_ints, help=f"waiter tickets on the pool (default {DEFAULT['waiters']})")
    p.add_argument("--iterations", type=int, help=f"timed iterations per case (default {DEFAULT['iterations']})")
    p.add_argument("--pods", type=int, help=f"then this many pod processes for {PODS_SECONDS:.0f} s: decisions "
                                            f"per second (default {DEFAULT['pods']}; 0 = skip)")
    p.add_argument("--census", action="store_true",
                   help=f"instead of the admit grid: time census and tick at estimates {CENSUS_DEFAULT['estimates']} "
                        f"with {CENSUS_DEFAULT['lanes']} lanes, {CENSUS_DEFAULT['iterations']} calls each")
    p.add_argument("--estimates", type=_ints, help="with --census: the pool estimates (slots)")
    p.add_argument("--against", metavar="LUA_DIR",
                   help="instead: this checkout's Lua against another Lua folder (e.g. of `git worktree add "
                        "/tmp/base HEAD~1`: /tmp/base/lua), side by side in one server, server µs per admit "
                        "and release (--lanes, default 7,32)")
    p.add_argument("--ceilings", action="store_true",
                   help="with --against: the pool has a scope of six rate ceilings (rpm, tpm, itpm, otpm, rpd, "
                        "tpd; never refusing): each admit checks and debits six buckets, each release "
                        "reconciles them")
    p.add_argument("--json", metavar="FILE", help="also save the figures as JSON")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the README)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--provider", action="store_true",
                   help="instead: one burst on the fake provider with no admission, through the admission and "
                        "with a static semaphore, side by side (admission.tools.provider_bench; its own options "
                        "follow: --provider --help)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--provider" in argv:  # the provider bench parses the rest itself
        from .. import provider_bench

        argv.remove("--provider")
        return provider_bench.main(argv)
    args = parser().parse_args(argv)
    if args.census:
        return main_census(args)
    if args.against:
        other = Path(args.against)
        if not (other / "admit.lua").is_file():
            parser().error(f"--against: {other} holds no admit.lua")
        with quiet_logs():
            result = run_against(args.engine, other, args.lanes or [7, 32], 30 if not args.quick else 6,
                                 200 if not args.quick else 50, progress=False if args.no_progress else None,
                                 ceilings=args.ceilings)
        print(render_against(result, markdown=args.markdown), flush=True)
        if args.json:
            write_json(args.json, result)
        return 0
    base = QUICK if args.quick else DEFAULT
    lanes = args.lanes or base["lanes"]
    if 0 in lanes:
        parser().error("--lanes: a policy needs at least one lane")
    if args.seats and min(args.seats) < 1:
        parser().error("--seats: at least 1 (the measured lane holds a seat while waiters are made)")
    if args.iterations is not None and args.iterations < 1:
        parser().error("--iterations: at least 1")
    iterations = args.iterations or base["iterations"]
    with quiet_logs():
        if args.pods is not None and args.pods < 0:
            parser().error("--pods: 0 or more")
        result = run(args.engine, lanes, args.seats or base["seats"], args.waiters or base["waiters"],
                     iterations, progress=False if args.no_progress else None,
                     pods=base["pods"] if args.pods is None else args.pods)
    print(render(result, markdown=args.markdown), flush=True)
    if args.json:
        write_json(args.json, result)
    return 0


def main_census(args: argparse.Namespace) -> int:
    lanes = args.lanes or CENSUS_DEFAULT["lanes"]
    estimates = args.estimates or CENSUS_DEFAULT["estimates"]
    if 0 in lanes:
        parser().error("--lanes: a policy needs at least one lane")
    if 0 in estimates or max(estimates) > BIG_ESTIMATE:
        parser().error(f"--estimates: whole numbers in 1..{BIG_ESTIMATE:,}")
    if args.iterations is not None and args.iterations < 1:
        parser().error("--iterations: at least 1")
    with quiet_logs():
        result = run_census(args.engine, lanes, estimates, args.iterations or CENSUS_DEFAULT["iterations"],
                            progress=False if args.no_progress else None)
    print(render_census(result, markdown=args.markdown), flush=True)
    if args.json:
        write_json(args.json, result)
    return 0
