"""``admission fence-report`` (also ``python -m admission.tools.fence_report``): the command line."""
from __future__ import annotations

import argparse
import logging
import sys
from typing import Sequence

import redis

from .. import write_json
from ..logs import quiet_logs
from ..servers import ENGINES
from .output import render
from .planes import DEFAULT_SHARE, FAULTS
from .report import run

DESCRIPTION = sys.modules[__package__].__doc__.split("\n\n")[0]


def _arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--intents", type=int, default=100, help="intents per fault (default %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="the seed of every draw (default %(default)s)")
    p.add_argument("--engine", choices=("fakeredis", *ENGINES), default=None,
                   help="the server to start (default: redis-server when on PATH, else valkey)")
    p.add_argument("--url", default=None,
                   help="use this server instead of starting one (meshes fence-<fault> are wiped and left there)")
    p.add_argument("--share", type=float, default=DEFAULT_SHARE,
                   help="share of the intents with the fault injected (default %(default)s; "
                        "redis-unreachable injects every intent)")
    p.add_argument("--fault", action="append", choices=FAULTS, default=None,
                   help="run only this fault (repeatable; default: all)")
    p.add_argument("--json", metavar="FILE", help="also save the report as JSON")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown (for the docs)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    return p


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add ``fence-report`` to the ``admission`` command's subparsers (``func`` = ``run_cli``)."""
    p = sub.add_parser("fence-report", help="inject faults at the fence between planes and check that a shed "
                                            "borrow leaves the primary unchanged (exit 1 if not)",
                       description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    _arguments(p)
    p.set_defaults(func=run_cli)
    return p


def run_cli(args: argparse.Namespace) -> int:
    """Run the report from parsed arguments: 0 every check held, 1 a check failed, 2 bad usage/setup."""
    if args.intents < 1:
        print("admission fence-report: --intents must be >= 1", file=sys.stderr)
        return 2
    if not 0 < args.share <= 1:
        print("admission fence-report: --share must be in (0, 1]", file=sys.stderr)
        return 2
    try:
        with quiet_logs(logging.ERROR):  # the client's warnings (every unreachable ask) would drown the table
            report = run(args.intents, args.seed, engine=args.engine, url=args.url, faults=args.fault or FAULTS,
                         share=args.share, progress=False if args.no_progress else None)
    except (FileNotFoundError, redis.ConnectionError, RuntimeError) as exc:
        print(f"admission fence-report: {exc}", file=sys.stderr)
        return 2
    print(render(report, markdown=args.markdown), flush=True)
    if args.json:
        write_json(args.json, report)
    return 0 if report["ok"] else 1


def main(argv: Sequence[str] | None = None) -> int:
    p = _arguments(argparse.ArgumentParser(prog="admission fence-report",
                                           description=DESCRIPTION))
    return run_cli(p.parse_args(argv))
