"""``python -m admission.tools.bench --provider`` (``admission bench --provider``): the command line."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Sequence

from .. import write_json
from ..arguments import OneLineParser, UsageError, positive_float, positive_int
from ..servers import ENGINES, find_server
from . import ceilings_case
from .ceilings_settings import CONTENDERS, DEFAULT_CONTENDERS, KEYS, WARMUP_MINUTES, CeilingSettings
from .output import render
from .parent import run
from .settings import MAX_ROUNDS, PROG, NotDrained, Settings

CASES = ("burst", "ceilings")

DESCRIPTION = sys.modules[__package__].__doc__.split("\n\n")[0]


def parser() -> argparse.ArgumentParser:
    d = Settings()
    p = OneLineParser(prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=positive_int, default=d.rounds, help=f"rounds in the burst (default {d.rounds})")
    p.add_argument("--pods", type=positive_int, default=d.pods, help=f"pod processes (default {d.pods})")
    p.add_argument("--capacity", type=positive_int, default=d.capacity,
                   help=f"the provider's hidden capacity K (default {d.capacity})")
    p.add_argument("--scale", type=positive_float, default=None,
                   help=f"provider's simulated seconds per real second (default {d.scale:g}; "
                        f"the ceilings case: {CeilingSettings().scale:g})")
    p.add_argument("--tokens", type=positive_int, default=d.tokens, help=f"tokens per round (default {d.tokens})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"provider and backoff seed (default {d.seed})")
    p.add_argument("--engine", choices=ENGINES, default=d.engine, help="server to start (default redis)")
    p.add_argument("--backoff-base", type=positive_float, default=d.backoff_base,
                   help=f"(a), (c): first backoff cap, real s (default {d.backoff_base:g})")
    p.add_argument("--backoff-cap", type=positive_float, default=d.backoff_cap,
                   help=f"(a), (c): largest backoff, real s (default {d.backoff_cap:g})")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE",
                   help="print the figures as JSON instead of the table (FILE: save them there, print the table)")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown (for the docs)")
    p.add_argument("--no-progress", action="store_true", help="no progress display on stderr")
    c = p.add_argument_group("the ceilings case (--case ceilings: a key with rate ceilings, contender after "
                             "contender; docs/benchmark.md)")
    p.add_argument("--case", choices=CASES, default="burst",
                   help="burst (default: one burst, three modes) or ceilings")
    e = CeilingSettings()
    c.add_argument("--key", action="append", choices=tuple(KEYS), default=None, dest="keys",
                   help=f"the key(s) to run (repeatable; default all: {', '.join(KEYS)})")
    c.add_argument("--minutes", type=positive_float, default=e.minutes,
                   help=f"provider minutes per contender (default {e.minutes:g})")
    c.add_argument("--workers", type=positive_int, default=e.workers, help=f"threads per pod (default {e.workers})")
    c.add_argument("--contender", action="append", choices=CONTENDERS, default=None, dest="contenders",
                   help=f"the contender(s) to run (repeatable; default {', '.join(DEFAULT_CONTENDERS)})")
    return p


def ceiling_settings_of(args: argparse.Namespace) -> CeilingSettings:
    d = CeilingSettings()
    if args.minutes < WARMUP_MINUTES + 1:
        raise UsageError(f"--minutes must be at least {WARMUP_MINUTES + 1} (the window starts at minute "
                         f"{WARMUP_MINUTES})")
    contenders = tuple(args.contenders or DEFAULT_CONTENDERS)
    return CeilingSettings(keys=tuple(dict.fromkeys(args.keys or d.keys)), contenders=tuple(dict.fromkeys(contenders)),
                           pods=args.pods, workers=args.workers, minutes=args.minutes,
                           scale=args.scale or d.scale, seed=args.seed, engine=args.engine)


def settings_of(args: argparse.Namespace) -> Settings:
    if args.pods > args.rounds:
        raise UsageError(f"--pods ({args.pods}) must be at most --rounds ({args.rounds})")
    if args.rounds > MAX_ROUNDS:
        raise UsageError(f"--rounds must be at most {MAX_ROUNDS:,} (one thread per round)")
    if args.tokens > 100_000:
        raise UsageError("--tokens must be at most 100,000")
    if args.backoff_cap < args.backoff_base:
        raise UsageError("--backoff-cap must be >= --backoff-base")
    return Settings(rounds=args.rounds, pods=args.pods, capacity=args.capacity, scale=args.scale or Settings().scale,
                    tokens=args.tokens,
                    seed=args.seed, engine=args.engine, backoff_base=args.backoff_base, backoff_cap=args.backoff_cap)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parser().parse_args(argv)
        s = ceiling_settings_of(args) if args.case == "ceilings" else settings_of(args)
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    if args.case == "ceilings":
        return _ceilings(args, s)
    return _run_and_print(args, s.engine, lambda progress: run(s, progress=progress), render, NotDrained)


def _run_and_print(args: argparse.Namespace, engine: str, run_case: Any, render_case: Any,
                   failure: type[BaseException]) -> int:
    """One case, end to end: its server binary checked, run, printed (or its JSON), a run that
    fails with ``failure`` a one-line error."""
    if find_server(engine) is None:
        print(f"{PROG}: error: no {engine} server binary found", file=sys.stderr)
        return 2
    try:
        result = run_case(progress=not args.no_progress)
    except failure as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    if args.json == "-":
        print(json.dumps(result, indent=2), flush=True)
        return 0
    print(render_case(result, markdown=args.markdown), flush=True)
    if args.json:
        write_json(args.json, result)
    return 0


def _ceilings(args: argparse.Namespace, s: CeilingSettings) -> int:
    return _run_and_print(args, s.engine, lambda progress: ceilings_case.run(s, progress=progress),
                          ceilings_case.render, RuntimeError)
