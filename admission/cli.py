"""The `admission` command: apply a policy, read the census and the events, drive the clock, run
the tools.

    admission config apply FILE [--expect-version N] [--no-recovery-hold]
    admission config validate FILE          (no Redis: every error of the file at once)
    admission config diff FILE              (the live policy against FILE; exit 1 when they differ)
    admission config show [--alternatives]
    admission census [--watch 2] [--json] [--explain] [--no-sweep]
    admission events [--count 20] [--follow] [--json] [--kind K] [--pool P] [--lane L] [--pod D]
    admission events --refusals [--minutes 60] [--json]   (refusals per pool x lane x reason)
    admission tick
    admission doctor [--json]
    admission ledger [--day YYYY-MM-DD] [--json]
    admission provider close|reopen NAME --why WORD [--seconds S]
    admission budget sync                 (run the policy's budget readers once)
    admission day-rollover [--now T]      (the 00:00 UTC cron: budget readings, reopen, census)
    admission health run [--once]         (the planes' health samplers: each pool's health_url)
    admission fence-report --intents N --seed S   (faults injected at the fence; exit 1 if it leaked)
    admission simulate ... | admission demo ... | admission demo-pod ... | admission bench ...

Where: ``--url`` (default ``$ADMISSION_URL``, else redis://127.0.0.1:6379/0) and ``--mesh``
(default ``$ADMISSION_MESH``, else prod), before or after the subcommand; ``--version``.

Output is plain text (``--json`` where it says so); on a terminal ``census --watch`` redraws in
place, into a pipe or a file it prints one census after the other. An error is one line on stderr,
``admission: <what>``, and the exit code says which kind:

    0    done (config diff: no difference; doctor: the counts agree)
    1    config diff: the file differs from the live policy; doctor: problems found;
         health run --once: a sampler failed
    2    a usage error or bad input: an unknown option, a bad URL (scheme, database number,
         credentials), a policy file that cannot be read (missing, a directory, not TOML) or that
         breaks a rule, a stale --expect-version, an unknown lane, pool or provider, a name that
         would break a key; any other error Redis answers
    3    Redis unreachable (refused, timed out)
    4    no policy: the mesh has none applied (config show, config diff, census, ...), or no
         census yet (census --no-sweep)
    130  interrupted (Ctrl-C)
    141  stdout was closed early (``admission events | head``): quietly, no traceback
"""
from __future__ import annotations

import argparse
import difflib
import json
import logging
import math
import os
import re
import sys
import time
import warnings
from collections import Counter
from typing import Any, Iterator
from urllib.parse import parse_qs, urlsplit

import redis
import structlog

from . import alternatives, dayjob, doctor, health
from . import policy as policy_mod
from ._log import show
from .mesh import Mesh
from .core import UNREACHABLE, decode_census, mesh_key
from .errors import AdmissionError, NoPolicy, Unavailable, without_location
from .view import LEGEND, event_time, render_census, render_event, render_ledger, render_refusals, utc_iso

DELEGATED = {"simulate": "admission.tools.sim.cli", "demo": "admission.tools.demo", "bench": "admission.tools.bench",
             "fence-report": "admission.tools.fence_report", "fake-provider": "admission.tools.fake_provider"}

DEFAULT_URL = "redis://127.0.0.1:6379/0"
DEFAULT_MESH = "prod"
#: Exit codes (see the module's docstring).
USAGE, UNREACHABLE_EXIT, NO_POLICY, INTERRUPTED, CLOSED_PIPE = 2, 3, 4, 130, 141
#: census: expired leases swept before reading (tick calls of at most this many each, bounded)
SWEEP_LIMIT, SWEEP_CALLS = 1000, 20
#: events --follow: how long one XREAD blocks (the connection's read timeout is longer)
FOLLOW_BLOCK_MS = 5000
#: events --refusals: the minute hashes are kept a day (lua/include/events.lua)
MAX_MINUTES = 1440


class CliError(Exception):
    """An operator's mistake or a state the command cannot work with: one line, one exit code."""

    def __init__(self, message: str, code: int = USAGE):
        super().__init__(message)
        self.code = code


# -- where: the URL and the mesh ---------------------------------------------------------------------


def shown_url(url: str) -> str:
    """The URL for a message, its password masked (whatever else is wrong with it)."""
    return re.sub(r"^([^:/]*://[^/@:]*:)[^/@]*@", r"\1***@", url)


def check_url(url: str) -> None:
    """A Redis URL the client can use: redis://, rediss:// or unix://, a whole database number.
    (redis-py ignores a database it cannot read as a number and uses 0: refused here instead.)"""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - a port that is not a number raises here
    except ValueError as exc:
        raise CliError(f"bad Redis URL {shown_url(url)}: {exc}") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise CliError(f"bad Redis URL {shown_url(url)}: the scheme must be redis://, rediss:// or unix://"
                       + (f", not {parts.scheme}://" if parts.scheme else ""))
    dbs = parse_qs(parts.query).get("db", [])
    if parts.scheme != "unix" and parts.path not in ("", "/"):
        dbs.append(parts.path.lstrip("/"))
    for db in dbs:
        if not db.isdigit():
            raise CliError(f"bad Redis URL {shown_url(url)}: the database must be a whole number, got {db!r}")


def _connect(args) -> Mesh:
    """The mesh's operator handle, with Redis known to answer: an unreachable server, a database
    that does not exist and refused credentials are one-line errors here, before any command runs."""
    check_url(args.url)
    try:
        adm = Mesh.from_url(args.url, mesh=args.mesh)
    except AdmissionError:
        raise                                    # a bad mesh name (BadName) says so itself
    except ValueError as exc:
        raise CliError(f"bad Redis URL {shown_url(args.url)}: {exc}") from None
    try:
        adm.redis.ping()
    except redis.AuthenticationError as exc:
        raise CliError(f"Redis at {shown_url(args.url)} refused the credentials: {exc}") from None
    except UNREACHABLE as exc:
        raise Unavailable(str(exc)) from None
    except redis.ResponseError as exc:
        text = without_location(str(exc))
        if "DB index" in text:
            raise CliError(f"Redis at {shown_url(args.url)} has no such database ({text})") from None
        raise CliError(f"Redis at {shown_url(args.url)} refused the connection: {text}") from None
    return adm


class Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (``admission census: unrecognized arguments: -x``)."""

    def error(self, message: str):
        self.exit(USAGE, f"{self.prog}: {message} (see `{self.prog} --help`)\n")


def _conn_args(p: argparse.ArgumentParser, *, top: bool = False) -> None:
    """--url, --mesh: on the top parser with their defaults from the environment, and again on
    each subcommand without defaults, so they go before or after it."""
    def default(value: str) -> str:
        return value if top else argparse.SUPPRESS

    p.add_argument("--url", default=default(os.environ.get("ADMISSION_URL") or DEFAULT_URL),
                   help=f"Redis URL (default $ADMISSION_URL, else {DEFAULT_URL})")
    p.add_argument("--mesh", default=default(os.environ.get("ADMISSION_MESH") or DEFAULT_MESH),
                   help=f"mesh name (default $ADMISSION_MESH, else {DEFAULT_MESH})")


def _now_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--now", type=float, default=None,
                   help="epoch seconds (only on a mesh whose policy sets clock = \"caller\"; default: Redis' clock)")


def _no_policy(mesh: str) -> CliError:
    return CliError(f"mesh {mesh} has no policy applied; run `admission config apply FILE --mesh {mesh}`",
                    NO_POLICY)


# -- config --------------------------------------------------------------------------------------------


def cmd_config(args) -> int:
    if args.action in ("apply", "validate", "diff") and not args.file:
        raise CliError(f"config {args.action}: FILE is required")
    if args.action == "validate":
        return _validate(args.file)
    if args.action == "apply":
        policy_mod.load(args.file)              # a bad file is an error before Redis is asked
        adm = _connect(args)
        version = adm.apply_policy(args.file, expected_version=args.expect_version,
                                   recovery_hold=not args.no_recovery_hold)
        hold = float(adm.redis.hget(adm.calls.config_key, "holdUntil") or 0)
        print(f"applied {args.file} to mesh {args.mesh}: version {version}"
              + (f"; new rounds wait {max(0.0, hold - time.time()):.0f} s for running rounds to re-assert"
                 if hold else ""))
        return 0
    if args.action == "diff":
        new = policy_mod.load(args.file)
        live = _live_policy(_connect(args), args.mesh)
        version = live.pop("version")
        a, b = _canonical(live), _canonical(new)
        if a == b:
            print(f"no difference: {args.file} is the live policy of mesh {args.mesh} (version {version})")
            return 0
        sys.stdout.writelines(difflib.unified_diff(a.splitlines(True), b.splitlines(True),
                                                   f"live policy of mesh {args.mesh} (version {version})",
                                                   args.file))
        return 1
    live = _live_policy(_connect(args), args.mesh)
    if args.alternatives:
        print(render_alternatives(live))
    else:
        print(json.dumps(live, indent=2))
    return 0


def _live_policy(adm: Mesh, mesh: str) -> dict[str, Any]:
    live = adm.policy()
    if not live.get("pools"):
        raise _no_policy(mesh)
    return live


def _validate(path: str) -> int:
    """Every error of the file at once (one line each), or what it declares."""
    raw = policy_mod.read(path)
    found = policy_mod.problems(raw)
    for msg in found:
        print(f"admission: {path}: {msg}", file=sys.stderr)
    if found:
        print(f"admission: {path}: {len(found)} error{'s' if len(found) > 1 else ''}; nothing applied",
              file=sys.stderr)
        return USAGE
    pol = policy_mod.validate(raw)
    print(f"{path}: a valid policy: {len(pol['lanes'])} lanes, {len(pol['providers'])} providers, "
          f"{len(pol['pools'])} pools")
    return 0


def _whole(x: Any) -> Any:
    """JSON values compared as numbers: 15.0 and 15 are the same setting."""
    if isinstance(x, float) and math.isfinite(x) and x == int(x):
        return int(x)
    if isinstance(x, dict):
        return {k: _whole(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_whole(v) for v in x]
    return x


def _canonical(pol: dict[str, Any]) -> str:
    """A normalized policy as stable JSON text (keys sorted, one value per line) for a diff."""
    return json.dumps(_whole(json.loads(json.dumps(pol))), indent=2, sort_keys=True) + "\n"


def render_alternatives(policy: dict) -> str:
    """One line per pool: `pool -> a, b` or `pool -> (none)`, `(explicit)` for an explicit entry."""
    lines = []
    for pool, alts in alternatives.alternatives(policy).items():
        explicit = " (explicit)" if alternatives.explicit_key(policy, pool) is not None else ""
        lines.append(f"{pool} -> {', '.join(alts) or '(none)'}{explicit}")
    return "\n".join(lines)


# -- census ----------------------------------------------------------------------------------------------


def sweep(adm: Mesh) -> int:
    """Run the pool clock until no expired lease is left (bounded): what the census counts is then
    what runs, not what a dead pod held. Returns the leases swept. A mesh on the caller's clock
    (tests, the simulator) is left to its caller: Redis' time is not its time."""
    if adm.redis.hget(adm.calls.config_key, "clock") == b"caller":
        return 0
    swept = 0
    for _ in range(SWEEP_CALLS):
        n = adm.tick(sweep_limit=SWEEP_LIMIT).swept
        swept += n
        if n < SWEEP_LIMIT:
            break
    return swept


def read_census(adm: Mesh, mesh: str, no_sweep: bool) -> dict[str, Any]:
    if not no_sweep:
        sweep(adm)
        return adm.census()
    raw = adm.redis.get(adm.calls.census_key)     # a read-only user: only GET
    if raw is None:
        if not adm.redis.exists(adm.calls.config_key):
            raise _no_policy(mesh)
        raise CliError(f"mesh {mesh} has no census yet (no pod's clock has run); "
                       "run `admission census` without --no-sweep", NO_POLICY)
    return decode_census(raw)


def cmd_census(args) -> int:
    if args.explain and args.json:
        raise CliError("census: --explain is a legend for the text view, not for --json")
    adm = _connect(args)
    redraw = bool(args.watch) and sys.stdout.isatty()
    while True:
        try:
            doc = read_census(adm, args.mesh, args.no_sweep)
        except NoPolicy:
            raise _no_policy(args.mesh) from None
        if args.json:
            out = json.dumps(doc, indent=None if args.watch else 2)   # --watch --json: one document a line
        else:
            out = render_census(doc) + (f"\n\n{LEGEND}" if args.explain else "")
        if redraw:
            sys.stdout.write("\x1b[2J\x1b[H" + out + "\n")
        else:
            sys.stdout.write(out + ("\n\n" if args.watch and not args.json else "\n"))
        sys.stdout.flush()
        if not args.watch:
            return 0
        time.sleep(args.watch)


# -- events ----------------------------------------------------------------------------------------------


def _words(values: list[str] | None) -> set[str]:
    """Repeated or comma-separated option values."""
    return {w for v in values or [] for w in v.split(",") if w}


class EventFilter:
    """--kind, --pool, --lane, --pod: an event passes when it matches every filter given (any of a
    filter's values). --pool P matches where the round ran or asked (`pool`, `asked`) and the
    events of P's provider (closed, reopened, budget)."""

    def __init__(self, kinds=None, pools=None, lanes=None, pods=None):
        self.kinds, self.pools, self.lanes, self.pods = _words(kinds), _words(pools), _words(lanes), _words(pods)
        self.providers = {p.rpartition("@")[2] for p in self.pools}

    def __call__(self, f: dict[str, str]) -> bool:
        if self.kinds and f.get("kind") not in self.kinds:
            return False
        if self.pools and not (f.get("pool") in self.pools or f.get("asked") in self.pools
                               or ("pool" not in f and f.get("provider") in self.providers)):
            return False
        if self.lanes and f.get("lane") not in self.lanes:
            return False
        return not (self.pods and f.get("pod") not in self.pods)


def _text(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _entry(raw: tuple) -> tuple[str, dict[str, str]]:
    return _text(raw[0]), {_text(k): _text(v) for k, v in raw[1].items()}


def latest_events(client: redis.Redis, key: str, count: int, keep: EventFilter) -> tuple[list, str]:
    """The last ``count`` events that pass ``keep``, oldest first, and the newest id of the stream
    ('0-0' when empty): where a follow goes on from."""
    got: list[tuple[str, dict[str, str]]] = []
    top, upper = "0-0", "+"
    while len(got) < count:
        batch = [_entry(e) for e in client.xrevrange(key, max=upper, min="-", count=max(100, count))]
        if not batch:
            break
        if upper == "+":
            top = batch[0][0]
        got += [e for e in batch if keep(e[1])]
        upper = "(" + batch[-1][0]
    return got[:count][::-1], top


def follow_events(client: redis.Redis, key: str, after: str, keep: EventFilter) -> Iterator[tuple[str, dict]]:
    """The events added after ``after``, as they come (XREAD BLOCK), for ever."""
    while True:
        for _, entries in client.xread({key: after}, count=500, block=FOLLOW_BLOCK_MS) or []:
            for raw in entries:
                eid, f = _entry(raw)
                after = eid
                if keep(f):
                    yield eid, f


def _print_event(eid: str, f: dict[str, str], as_json: bool) -> None:
    if as_json:
        print(json.dumps({"id": eid, "at": event_time(eid), **f}))
    else:
        print(render_event(eid, f))


def cmd_events(args) -> int:
    if args.refusals:
        return cmd_refusals(args)
    adm = _connect(args)
    key = mesh_key(args.mesh, "events")
    keep = EventFilter(args.kind, args.pool, args.lane, args.pod_filter)
    events, top = latest_events(adm.redis, key, args.count, keep)
    for eid, f in events:
        _print_event(eid, f, args.json)
    sys.stdout.flush()
    if not args.follow:
        return 0
    # a connection of its own whose reads outlast one XREAD's block (a silent server still ends it)
    blocking = redis.Redis.from_url(args.url, socket_connect_timeout=1.0, socket_timeout=FOLLOW_BLOCK_MS / 1000 + 5)
    try:
        for eid, f in follow_events(blocking, key, top, keep):
            _print_event(eid, f, args.json)
            sys.stdout.flush()
    except UNREACHABLE as exc:
        raise Unavailable(str(exc)) from None
    finally:
        blocking.close()
    return 0


def refusal_counts(client: redis.Redis, mesh: str, now: float, minutes: int) -> tuple[list, float, float]:
    """The refusals of the last ``minutes`` (the minute of ``now`` included), summed over the
    minute hashes: rows (pool, lane, reason, count), most first within a pool; the window."""
    last = math.floor(now / 60) * 60
    pipe = client.pipeline(transaction=False)
    for i in range(minutes):
        pipe.hgetall(mesh_key(mesh, "refusals", last - 60 * i))
    counts: Counter = Counter()
    for h in pipe.execute():
        for field, n in h.items():
            counts[_text(field)] += int(n)
    rows = []
    for field, n in counts.items():
        pool, lane, reason = field.split("|", 2)
        rows.append((pool, lane, reason, n))
    rows.sort(key=lambda r: (r[0], r[1], -r[3], r[2]))
    return rows, last - 60 * (minutes - 1), last + 60


def cmd_refusals(args) -> int:
    adm = _connect(args)
    if args.now is None:
        sec, usec = adm.redis.time()
        now = sec + usec / 1e6
    else:
        now = args.now
    rows, start, end = refusal_counts(adm.redis, args.mesh, now, args.minutes)
    keep = EventFilter(None, args.pool, args.lane, None)
    rows = [r for r in rows if keep({"pool": r[0], "lane": r[1]})]
    if args.json:
        print(json.dumps({"mesh": args.mesh, "from": utc_iso(start), "to": utc_iso(end), "minutes": args.minutes,
                          "total": sum(r[3] for r in rows),
                          "refusals": [{"pool": p, "lane": l, "reason": why, "count": n} for p, l, why, n in rows]},
                         indent=2))
    else:
        print(render_refusals(rows, start, end))
    return 0


# -- the rest ----------------------------------------------------------------------------------------------


def cmd_tick(args) -> int:
    print(_connect(args).tick())
    return 0


def cmd_doctor(args) -> int:
    report = _connect(args).doctor()
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


def _delegated_first(name: str):
    def fail(_args) -> int:
        raise CliError(f"{name} takes its own options: write `admission {name} ...` with {name} first")
    return fail


def _utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(t))


def _usd(x: float | None) -> str:
    return "no limit" if x is None else f"${x:,.2f}"


def _minutes(s: str) -> int:
    if not s.isdigit() or not 1 <= int(s) <= MAX_MINUTES:
        raise argparse.ArgumentTypeError(f"must be a whole number 1..{MAX_MINUTES} (the minute counts are kept a "
                                         f"day), got {s!r}")
    return int(s)


def _count(s: str) -> int:
    if not s.isdigit():
        raise argparse.ArgumentTypeError(f"must be a whole number >= 0, got {s!r}")
    return int(s)


def _seconds(s: str) -> float:
    try:
        x = float(s)
    except ValueError:
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {s!r}")
    return x


def version() -> str:
    from importlib.metadata import PackageNotFoundError, version as dist_version

    try:
        return dist_version("admission")
    except PackageNotFoundError:
        return "unknown (not installed)"


def serve_parser(sub) -> argparse.ArgumentParser:
    """`admission serve` (admission/serve/: imports prometheus_client only when it runs)."""
    from . import serve

    return serve.add_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="admission", description="Shared admission for LLM agent rounds.",
                                     epilog="exit codes: 0 done, 1 a difference or problems found, 2 usage or bad "
                                            "input, 3 Redis unreachable, 4 no policy on the mesh")
    parser.add_argument("--version", action="version", version=f"admission {version()}")
    _conn_args(parser, top=True)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    p = sub.add_parser("config", help="apply, validate, diff or show the policy")
    p.add_argument("action", choices=["apply", "show", "validate", "diff"])
    p.add_argument("file", nargs="?", help="policy TOML (for apply, validate, diff)")
    p.add_argument("--expect-version", type=int, default=None, help="compare-and-set on the current version")
    p.add_argument("--no-recovery-hold", action="store_true",
                   help="a mesh known to be new: no hold for running rounds to re-assert (see README)")
    p.add_argument("--alternatives", action="store_true",
                   help="with show: each pool's alternatives (explicit, else its tier's defaults)")
    _conn_args(p)
    p.set_defaults(func=cmd_config)
    p = sub.add_parser("census", help="print the census (read model), after sweeping expired leases")
    p.add_argument("--watch", type=_seconds, default=0, metavar="SECONDS", help="print again every SECONDS")
    p.add_argument("--json", action="store_true", help="print the JSON (with --watch: one document a line)")
    p.add_argument("--explain", action="store_true", help="add a legend: K̂, K, slots, guaranteed, borrowed, ...")
    p.add_argument("--no-sweep", action="store_true",
                   help="read-only: GET the stored census as the pods' clocks last wrote it (no sweep, no rebuild)")
    _conn_args(p)
    p.set_defaults(func=cmd_census)
    p = sub.add_parser("events", help="the latest transitions (ISO-8601 UTC times), or the refusal counts")
    p.add_argument("--count", type=_count, default=20, help="how many of the latest (matching) events (default 20)")
    p.add_argument("--follow", "-f", action="store_true", help="then print new events as they come (Ctrl-C ends)")
    p.add_argument("--json", action="store_true", help="one JSON object a line (id, at, kind, fields)")
    p.add_argument("--kind", action="append", metavar="KIND",
                   help="only these kinds (repeat or comma-separate): admitted, released, expired, probe, paused, "
                        "exhausted, grew, closed, reopened, config, budget, charged, rollover")
    p.add_argument("--pool", action="append", metavar="POOL", help="only this pool (and its provider's events)")
    p.add_argument("--lane", action="append", metavar="LANE", help="only this lane")
    p.add_argument("--pod", dest="pod_filter", action="append", metavar="POD", help="only this pod")
    p.add_argument("--refusals", action="store_true",
                   help="the refusal counts instead (refusals are counted, not streamed): pool x lane x reason")
    p.add_argument("--minutes", type=_minutes, default=60, help="with --refusals: the last N minutes (default 60)")
    p.add_argument("--now", type=float, default=None,
                   help="with --refusals: the window ends at the minute of this epoch second (default: Redis' clock)")
    _conn_args(p)   # --pod filters here
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
    p = serve_parser(sub)
    p = health.add_parser(sub)
    _conn_args(p)
    p.set_defaults(func=lambda a: health.run_cli(a, _connect(a)))
    for name, module in DELEGATED.items():
        sub.add_parser(name, help=f"see `admission {name} --help`", add_help=False).set_defaults(
            func=_delegated_first(name))
    sub.add_parser("demo-pod", help="one demo pod (docker-compose)", add_help=False).set_defaults(
        func=_delegated_first("demo-pod"))
    return parser


def _error_line(exc: BaseException, args: Any) -> tuple[str, int]:
    """The one line and the exit code of an error a command raised."""
    if isinstance(exc, CliError):
        return str(exc), exc.code
    if isinstance(exc, Unavailable):
        return f"Redis unreachable at {shown_url(getattr(args, 'url', '?'))}: {exc}", UNREACHABLE_EXIT
    if isinstance(exc, NoPolicy):
        return str(_no_policy(getattr(args, "mesh", "?"))), NO_POLICY
    if isinstance(exc, AdmissionError):
        return f"{type(exc).__name__}: {without_location(str(exc))}", USAGE
    if isinstance(exc, redis.AuthenticationError):
        return f"Redis at {shown_url(getattr(args, 'url', '?'))} refused the credentials: {exc}", USAGE
    if isinstance(exc, UNREACHABLE):
        return f"Redis unreachable at {shown_url(getattr(args, 'url', '?'))}: {exc}", UNREACHABLE_EXIT
    return f"Redis refused the command: {without_location(str(exc))}", USAGE


def _stdout_closed() -> int:
    """stdout's reader went away (a pipe into head): leave quietly, also at the interpreter's exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return CLOSED_PIPE


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DELEGATED:
        import importlib

        try:
            tool = importlib.import_module(DELEGATED[argv[0]])
        except ModuleNotFoundError as exc:  # a tool's extra is not installed
            print(f"admission {argv[0]}: needs {exc.name}: pip install 'admission[tools,plots]'", file=sys.stderr)
            return 2
        return tool.main(argv[1:]) or 0
    if argv and argv[0] == "demo-pod":
        from .tools.demo import pod_cli

        return pod_cli(argv[1:]) or 0
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings and up
    show(logging.WARNING)
    logging.getLogger("admission.policy").setLevel(logging.ERROR)  # a policy's mistakes are the error line
    warnings.simplefilter("ignore")
    args = None
    try:
        args = build_parser().parse_args(argv)
        code = args.func(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        return _stdout_closed()
    except KeyboardInterrupt:
        return INTERRUPTED
    except (CliError, AdmissionError, redis.RedisError) as exc:
        line, code = _error_line(exc, args)
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            _stdout_closed()
        print(f"admission: {line}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
