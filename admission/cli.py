"""The `admission` command: apply a policy, read the census, drive the clock, run the tools.

    admission config apply deploy/policy.example.toml --url redis://127.0.0.1:6379/0 --mesh prod
    admission config show --url ... --mesh prod [--alternatives]
    admission census --url ... --mesh prod [--watch 2] [--json]
    admission events --url ... --mesh prod [--count 20]
    admission tick --url ... --mesh prod
    admission doctor --url ... --mesh prod [--json]   (exit 0 ok, 1 problems found, 2 error)
    admission ledger --url ... --mesh prod [--day YYYY-MM-DD] [--json]
    admission provider close|reopen NAME --why WORD [--seconds S]
    admission budget sync                 (run the policy's budget readers once)
    admission day-rollover [--now T]      (the 00:00 UTC cron: budget readings, reopen, census)
    admission health run [--once]         (the planes' health samplers: each pool's health_url)
    admission fence-report --intents N --seed S   (faults injected at the fence; exit 1 if it leaked)
    admission simulate ... | admission demo ... | admission demo-pod ... | admission bench ...
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import structlog

from . import alternatives, dayjob, doctor, health
from ._log import show
from .client import Admission
from .errors import AdmissionError, Unavailable
from .view import render_census, render_ledger

DELEGATED = {"simulate": "admission.sim.cli", "demo": "admission.demo", "bench": "admission.bench",
             "fence-report": "admission.fence_report"}


def _connect(args) -> Admission:
    return Admission.from_url(args.url, mesh=args.mesh, pod=args.pod, background=False)


def _conn_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="redis://127.0.0.1:6379/0", help="Redis URL (default %(default)s)")
    p.add_argument("--mesh", default="prod", help="mesh name (default %(default)s)")
    p.add_argument("--pod", default="cli", help=argparse.SUPPRESS)


def _now_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--now", type=float, default=None,
                   help="epoch seconds (only on a mesh whose policy sets clock = \"caller\"; default: Redis' clock)")


def cmd_config(args) -> int:
    adm = _connect(args)
    if args.action == "apply":
        version = adm.apply_policy(args.file, expected_version=args.expect_version,
                                   recovery_hold=not args.no_recovery_hold)
        hold = float(adm.redis.hget(adm.core.config_key, "holdUntil") or 0)
        print(f"applied {args.file} to mesh {args.mesh}: version {version}"
              + (f"; new rounds wait {max(0.0, hold - time.time()):.0f} s for running rounds to re-assert"
                 if hold else ""))
    elif args.alternatives:
        policy = adm.policy()
        if not policy.get("pools"):
            print(f"admission: mesh {args.mesh} has no policy applied", file=sys.stderr)
            return 1
        print(render_alternatives(policy))
    else:
        print(json.dumps(adm.policy(), indent=2))
    return 0


def render_alternatives(policy: dict) -> str:
    """One line per pool: `pool -> a, b` or `pool -> (none)`, `(explicit)` for an explicit entry."""
    lines = []
    for pool, alts in alternatives.alternatives(policy).items():
        explicit = " (explicit)" if alternatives.explicit_key(policy, pool) is not None else ""
        lines.append(f"{pool} -> {', '.join(alts) or '(none)'}{explicit}")
    return "\n".join(lines)


def cmd_census(args) -> int:
    adm = _connect(args)
    while True:
        doc = adm.census()
        out = json.dumps(doc, indent=2) if args.json else render_census(doc)
        if args.watch:
            sys.stdout.write("\x1b[2J\x1b[H" + out + "\n")
            sys.stdout.flush()
            time.sleep(args.watch)
        else:
            print(out)
            return 0


def cmd_events(args) -> int:
    adm = _connect(args)
    for event_id, fields in reversed(adm.redis.xrevrange(f"adm:{{{args.mesh}}}:events", count=args.count)):
        f = {k.decode(): v.decode() for k, v in fields.items()}
        print(event_id.decode(), " ".join(f"{k}={v}" for k, v in f.items()))
    return 0


def cmd_tick(args) -> int:
    print(_connect(args).tick())
    return 0


def cmd_doctor(args) -> int:
    report = doctor.check(_connect(args).redis, args.mesh)
    print(json.dumps(report.as_dict(), indent=2) if args.json else doctor.render(report, args.mesh))
    return 0 if report.ok else 1


def cmd_ledger(args) -> int:
    adm = _connect(args)
    day = args.day or time.strftime("%Y-%m-%d", time.gmtime())
    ledger = adm.ledger(day)
    if args.json:
        print(json.dumps({"day": day, "ledger": ledger}, indent=2, sort_keys=True))
    else:
        print(render_ledger(day, ledger))
    return 0


def cmd_provider(args) -> int:
    adm = _connect(args)
    if args.action == "close":
        until = adm.close_provider(args.name, why=args.why, seconds=args.seconds, now=args.now)
        print(f"closed {args.name} ({args.why}) until {_utc(until)}")
    else:
        adm.reopen_provider(args.name, why=args.why, now=args.now)
        print(f"reopened {args.name} ({args.why})")
    return 0


def cmd_budget(args) -> int:
    readings = dayjob.sync_budgets(_connect(args), now=args.now)
    for r in readings:
        print(f"{r.provider}: spent {_usd(r.spent_usd)} of {_usd(r.limit_usd)} on {r.day} (read {_utc(r.at)})")
    if not readings:
        print("no budget readings (no provider names a budget_reader with its key in the environment)")
    return 0


def cmd_rollover(args) -> int:
    done, readings = dayjob.day_rollover(_connect(args), now=args.now)
    read = f"; {len(readings)} budget reading(s) stored" if readings else ""
    if done.ran:
        reopened = ", ".join(done.reopened) or "none"
        print(f"rolled over to {done.day}: reopened {reopened}; census written{read}")
    else:
        print(f"{done.day} was rolled over already at {_utc(done.at)}; nothing done{read}")
    return 0


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))


def _usd(x: float | None) -> str:
    return "no limit" if x is None else f"${x:,.2f}"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="admission", description="Shared admission for LLM agent rounds.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("config", help="apply or show the policy")
    p.add_argument("action", choices=["apply", "show"])
    p.add_argument("file", nargs="?", help="policy TOML (for apply)")
    p.add_argument("--expect-version", type=int, default=None, help="compare-and-set on the current version")
    p.add_argument("--no-recovery-hold", action="store_true",
                   help="a mesh known to be new: no hold for running rounds to re-assert (see README)")
    p.add_argument("--alternatives", action="store_true",
                   help="with show: each pool's alternatives (explicit, else its tier's defaults)")
    _conn_args(p)
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("census", help="print the census (read model)")
    p.add_argument("--watch", type=float, default=0, help="redraw every N seconds")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    _conn_args(p)
    p.set_defaults(func=cmd_census)
    p = sub.add_parser("events", help="print the latest decisions and transitions")
    p.add_argument("--count", type=int, default=20)
    _conn_args(p)
    p.set_defaults(func=cmd_events)
    p = sub.add_parser("tick", help="run the pool clock once")
    _conn_args(p)
    p.set_defaults(func=cmd_tick)
    p = sub.add_parser("doctor", help="check that the counts agree with the live records (read-only; "
                                      "exit 1 when problems are found)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    _conn_args(p)
    p.set_defaults(func=cmd_doctor)
    p = sub.add_parser("ledger", help="the spend ledger of a UTC day, lane x provider")
    p.add_argument("--day", help="YYYY-MM-DD (default: today, UTC)")
    p.add_argument("--json", action="store_true", help="print the ledger as JSON")
    _conn_args(p)
    p.set_defaults(func=cmd_ledger)
    p = sub.add_parser("provider", help="close or reopen a provider by hand (audited in events)")
    p.add_argument("action", choices=["close", "reopen"])
    p.add_argument("name", help="the provider, as declared in the policy")
    p.add_argument("--why", required=True, help="a word for the audit trail (e.g. maintenance)")
    p.add_argument("--seconds", type=float, default=None, help="close for this long (default: until 00:00 UTC)")
    _now_arg(p)
    _conn_args(p)
    p.set_defaults(func=cmd_provider)
    p = sub.add_parser("budget", help="budget readers: `budget sync` reads every provider's key once")
    p.add_argument("action", choices=["sync"])
    _now_arg(p)
    _conn_args(p)
    p.set_defaults(func=cmd_budget)
    p = sub.add_parser("day-rollover", help="the 00:00 UTC job: refresh budget readings, reopen expired "
                                            "closures, wake waiters, write the census (idempotent per day)")
    _now_arg(p)
    _conn_args(p)
    p.set_defaults(func=cmd_rollover)
    p = health.add_parser(sub)
    _conn_args(p)
    p.set_defaults(func=lambda a: health.run_cli(a, _connect(a)))
    for name, module in DELEGATED.items():
        sub.add_parser(name, help=f"see `admission {name} --help`", add_help=False)
    sub.add_parser("demo-pod", help="one demo pod (docker-compose)", add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        return importlib.import_module(DELEGATED[argv[0]]).main(argv[1:]) or 0
    if argv and argv[0] == "demo-pod":
        from .demo import pod_cli

        return pod_cli(argv[1:]) or 0
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings and up
    show(logging.WARNING)
    args = build_parser().parse_args(argv)
    if args.command == "config" and args.action == "apply" and not args.file:
        print("admission config apply: FILE is required", file=sys.stderr)
        return 2
    try:
        return args.func(args)
    except Unavailable as exc:
        print(f"admission: Redis unreachable at {args.url}: {exc}", file=sys.stderr)
        return 3
    except AdmissionError as exc:
        print(f"admission: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
