"""Fuzzing every script's ARGV: the busy mesh, the properties, and the atheris harness.

    python tests/fuzz_atheris.py --runs 2000                      # starts its own redis-server
    python tests/fuzz_atheris.py --runs 2000 --url redis://127.0.0.1:6379/0 --engine valkey

The properties (issue 12), checked on every call by ``Fuzzer.call``:

* a reply is a success, or an error whose message starts with an ``ADM_`` code: never a raw Lua
  error (``user_script:…``, ``attempt to …``, ``bad argument …``);
* an error reply leaves the state byte-for-byte unchanged (every key, type, value and TTL flag);
* a call returns within a bound (0.25 s wall), whatever the input;
* a success never corrupts the counts: the doctor (lua/doctor.lua) finds them consistent.

``tests/test_fuzz.py`` drives the same ``Fuzzer`` with hypothesis; this file drives it with
atheris (libFuzzer mutating the bytes a ``FuzzedDataProvider`` turns into a command and its
ARGV). A property violation raises, so the harness exits non-zero (libFuzzer writes the input
under ``--artifacts``). The summary (inputs tried per command, violations, slowest call) is
written as JSON to ``--summary`` after every input, and printed at the end.

This module holds no pytest: the harness imports it standalone, the test imports it too.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import zlib
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # run as a script: helpers sits beside it
    sys.path.insert(0, str(HERE))

from admission import Admission, scripts  # noqa: E402
from admission.alternatives import alternatives as alternatives_of  # noqa: E402
from admission.client import policy_of  # noqa: E402
from admission.codes import ERRORS  # noqa: E402
from admission.errors import without_location  # noqa: E402

from helpers import T0  # noqa: E402

#: The wall-clock bound of one call (a generous multiple of the slowest call seen on a busy mesh).
CALL_BOUND_S = 0.25
CODES = frozenset(ERRORS.values())
NOW = repr(T0 + 5)

#: The busy mesh's policy (TOML shape): two lanes (one with its own pools), three pools of two
#: providers, a daily budget, a plane with a fence, alternatives, an agent's lane and a pin.
POLICY: dict[str, Any] = {
    "clock": "caller",
    "tunables": {"lease_ttl": 10_000},
    "lanes": {"a": {"floor": 0.5, "weight": 1, "priority": 2, "pools": ["m@p", "n@p"]},
              "b": {"floor": 0.3, "weight": 2, "priority": 1}},
    "providers": {"p": {"daily_limit_usd": 100}, "q": {}},
    "pools": {"m@p": {}, "n@p": {"depth_limit": 5, "retry_budget": 3, "retry_refill_per_s": 0.1}, "o@q": {}},
    "alternatives": {"m@p": ["n@p", "o@q"]},
    "agents": {"rev": "a"},
    "pins": {"agents": ["pinned"]},
}

#: Values that broke (or could break) a parser somewhere: numbers Lua's tonumber reads oddly,
#: names with the characters a key or a field cannot hold, the words the scripts know.
NASTY: tuple[bytes, ...] = (
    b"", b" ", b"0", b"-0", b"1", b"-1", b"2", b"0.5", b"1.5", b"0.99999999999999999", b"nan", b"NaN", b"-nan",
    b"inf", b"-inf", b"Infinity", b"1e309", b"-1e309", b"1e308", b"1.7976931348623157e308", b"4.9e-324",
    b"1e-320", b"1e300", b"1e9", b"1000000000", b"1e18", b"4294967296", b"9007199254740993", b"1e11", b"100000000001",
    b"18446744073709551616", b"99999999999999999999999", b"0x10", b"0x", b"0X1p4", b"1e", b".", b"-", b"+1",
    b" 1", b"1 ", b"\t2\n", b"1,5", b"1_000", b"0b1", b"1800000000", b"1800000005.5", b"3600000000",
    b"{x}", b"{", b"}", b"a|b", b"|", b"a b", b"a\x00b", b"\x00", b"\x07", b"\r\n", b"\xff\xfe", "é".encode(),
    b"\xc3", b"x" * 200, b"x" * 201, b"y" * 5000, b"%s%d%n", b"%q", b"..", b"/", b":", b"@", b"*", b"#",
    b"adm:{fz}:config", b"m@p", b"n@p", b"o@q", b"x@y", b"m@", b"@p", b"a", b"b", b"c", b"pod-a", b"pod-b",
    b"s1", b"s2", b"child", b"waiter", b"rev", b"pinned", b"p", b"q", b"close", b"reopen", b"bind",
    b"advance", b"clean", b"stall", b"rate_limited", b"round_cap", b"error", b"key_daily_limit",
    b"budget_reached", b"credit", b"key_rejected", b"true", b"null", b"[]", b"{}", b'{"a":1}', b"[1,2]",
)


def lua_policy() -> dict[str, Any]:
    """The busy policy as apply_config.lua takes it (validated and normalized)."""
    return policy_of(POLICY)


@dataclass
class Busy:
    """What the busy mesh holds: its seats (by round id), its policy token, and one or more
    valid ARGV per command (bytes)."""

    seats: dict[str, Any]
    token: bytes
    templates: dict[str, list[list[bytes]]]


def build_busy(client: redis.Redis, mesh: str) -> Busy:
    """A mesh with a policy, three seats (one delegated), a pinned waiter, spend, a reported
    stall, a health sample, a budget reading, a closed provider and an intent watermark: built
    with the public client, at the fixed clock T0."""
    a = Admission(client, mesh=mesh, pod="pod-a", background=False, seed=1)
    a.ops.apply_policy(POLICY, recovery_hold=False)
    now = T0
    seats = {}
    for rid, lane, tokens in (("s1", "a", 5000), ("s2", "b", None)):  # s1 declares its size (the cap line)
        d = a.try_admit(lane=lane, model="m@p", round_id=rid, now=now, draw=0.0, alternatives=[], tokens=tokens)
        assert d.admitted, d
        seats[rid] = d.seat
    d = a.try_admit(lane="a", model="m@p", round_id="child", parent="s1", now=now, draw=0.0, alternatives=[])
    assert d.admitted and d.reason == "delegated", d
    seats["child"] = d.seat
    d = a.try_admit(lane="a", model="m@p", round_id="waiter", agent="pinned", now=now, draw=0.99, wait=True)
    assert not d.admitted, d
    d = a.try_admit(lane="b", model="o@q", round_id="done", now=now, draw=0.0, alternatives=[])
    assert d.admitted, d
    a.release(d.seat, outcome="clean", seconds=3.0, cost_usd=0.5, now=now + 1)
    a.charge(seats["s1"], cost_usd=0.25, key="k1", now=now + 1)
    a.report(seats["s2"], signal="stall", now=now + 2)
    a.report_health("n@p", depth=1, running=0, ok=True, now=now + 2)
    # the reading straight to the script: budget.Reading refuses a time ahead of this host's clock
    a._exec_or_raise(a.core.budget(provider="p", limit_usd=80.0, spent_usd=0.75, at=now + 2, now=now + 2))
    a.ops.close_provider("q", why="maintenance", seconds=3600, now=now + 3)
    a.advance("s1", 3, now=now + 3)
    token = client.hget(f"adm:{{{mesh}}}:config", "token")
    return Busy(seats, token, _templates(seats))


#: a provider's rate-limit reading (admission/ratelimits.py encode): release ARGV[17], progress after ~r
READING = f"v=1;at={NOW};sp=tpm;tpm=100000,5000,6,0;rpm=60,,1,0;otpm=8000,2000,30.5,1000"


def _templates(seats: dict[str, Any]) -> dict[str, list[list[bytes]]]:
    s1, s2, child = seats["s1"], seats["s2"], seats["child"]

    def seat(s):
        return [s.id, str(s.seq), s.pod]

    def hb(s):
        return [s.id, str(s.seq), s.lane, s.pool, repr(s.admitted_at)]

    pol = lua_policy()
    out = {
        "admit": [["fresh", "a", "m@p", "pod-a", "", NOW, "0.5", "1", "", "", "", "", "", "", "n@p", "o@q"],
                  ["kid", "", "m@p", "pod-b", "rev", NOW, "0.1", "0", "s1", "4", ""],
                  ["brw", "b", "m@p", "pod-a", "", NOW, "0.9", "0", "", "2", "n@p"],
                  ["big", "a", "m@p", "pod-a", "", NOW, "0.2", "1", "", "", "", "40000"]],
        "release": [[*seat(s1), "clean", "1.5", "20000", NOW, "", "", "4200"],
                    [*seat(s2), "rate_limited", "3", "", NOW, NOW, "30"],
                    [*seat(child), "key_rejected", "0", "0", NOW, "", ""],
                    [*seat(s1), "clean", "1", "", NOW, "", "", "", "100", "", "", "50", "", "", READING]],
        "report": [[*seat(s1), "stall", NOW, ""], [*seat(s2), "rate_limited", NOW, "20"]],
        "heartbeat": [["pod-a", NOW, "3", *hb(s1), *hb(s2), *hb(child), "waiter"], ["pod-a", NOW, "0"]],
        "tick": [[NOW, "100"], [repr(T0 + 60), ""]],
        "census": [[NOW]],
        "plan": [["a", "3", NOW, "", "n@p o@q", "*"], ["", "2", NOW, "rev", "n@p", "m@p", "n@p"]],
        "apply_config": [["", json.dumps(pol), "tok-fz", NOW, "0", json.dumps(alternatives_of(pol))]],
        "withdraw": [["waiter", "pod-a"]],
        "doctor": [[]],
        "charge": [[*seat(s1), "a", "m@p", "5000", "k2", "", NOW]],
        "budget": [["p", "100000000", "5000", NOW, NOW]],
        "closure": [["close", "q", "maintenance", "60", NOW], ["reopen", "q", "done", "", NOW]],
        "rollover": [[repr(T0 + 86400)]],
        "retry": [[*seat(s1), NOW, "att-1"]],
        "bind": [["bind", "s1", "3", NOW], ["advance", "s2", "9", NOW]],
        "health": [["n@p", "2", "1", "1", "", NOW], ["o@q", "0", "", "0", NOW, NOW]],
        "progress": [["pod-a", NOW, s1.id, str(s1.seq), "500", s2.id, str(s2.seq), "0"],
                     [s1.pod, "", child.id, str(child.seq), "120.5"],
                     ["pod-a", NOW, s1.id, str(s1.seq), "600", s2.id, str(s2.seq), "0", "~r", READING, ""]],
        "take": [[*seat(s1), "call-2", "1200", "1024", NOW], [*seat(s2), "call-2", "", "", NOW],
                 [*seat(child), "call-3", "0", "", ""]],
    }
    assert set(out) == set(scripts.COMMANDS), set(scripts.COMMANDS) ^ set(out)
    return {c: [[x.encode() if isinstance(x, str) else x for x in t] for t in ts] for c, ts in out.items()}


class Violation(AssertionError):
    """A property broke: the message names it, the command and the ARGV."""


@dataclass
class Stats:
    tried: Counter = field(default_factory=Counter)  # per command
    replies: Counter = field(default_factory=Counter)  # (command, "ok" | ADM code | "raw")
    raw_errors: int = 0
    state_changes: int = 0  # on an error reply
    slow_calls: int = 0  # past the bound, confirmed
    doctor_problems: int = 0  # after a success
    slowest_s: float = 0.0
    slowest: str = ""
    rebuilds: int = 0

    @property
    def total(self) -> int:
        return sum(self.tried.values())

    @property
    def violations(self) -> int:
        return self.raw_errors + self.state_changes + self.slow_calls + self.doctor_problems

    def as_dict(self) -> dict[str, Any]:
        return {"tried": dict(self.tried), "total": self.total, "raw_errors": self.raw_errors,
                "state_changes": self.state_changes, "slow_calls": self.slow_calls,
                "doctor_problems": self.doctor_problems, "slowest_ms": round(self.slowest_s * 1000, 3),
                "slowest": self.slowest, "rebuilds": self.rebuilds,
                "replies": {f"{c} {k}": n for (c, k), n in sorted(self.replies.items())}}


def snapshot(client: redis.Redis) -> dict:
    """tests/helpers.py ``snapshot`` in three round trips: every key with its type, its full value
    and whether it has a TTL. Equal snapshots mean byte-for-byte equal state."""
    keys = sorted(client.keys("*"))
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.type(k)
    types = [t.decode() if isinstance(t, bytes) else t for t in pipe.execute()]
    for k, t in zip(keys, types):
        if t == "string":
            pipe.get(k)
        elif t == "hash":
            pipe.hgetall(k)
        elif t == "zset":
            pipe.zrange(k, 0, -1, withscores=True)
        elif t == "set":
            pipe.smembers(k)
        elif t == "list":
            pipe.lrange(k, 0, -1)
        elif t == "stream":
            pipe.xrange(k)
        else:
            pipe.type(k)
        pipe.ttl(k)
    raw = pipe.execute()
    out = {}
    for i, (k, t) in enumerate(zip(keys, types)):
        v, ttl = raw[2 * i], raw[2 * i + 1]
        if t == "hash":
            v = sorted(v.items())
        elif t == "set":
            v = sorted(v)
        out[k] = (t, v, ttl > 0)
    return out


def _show(args: list[bytes]) -> str:
    shown = ", ".join(repr(a if len(a) <= 60 else a[:60] + b"...") for a in args[:16])
    return f"[{shown}{f', ... ({len(args)} arguments)' if len(args) > 16 else ''}]"


class Fuzzer:
    """Calls one command with an ARGV on a busy mesh and checks every property; raises
    ``Violation`` (after counting it in ``stats``) when one breaks."""

    def __init__(self, client: redis.Redis, mesh: str = "fz", bound_s: float = CALL_BOUND_S,
                 stats: Stats | None = None):
        self.state: dict = {}  # the snapshot of the state the next call starts from
        self.last: tuple[Any, str | None] = (None, None)  # the last call's (reply, error message)
        self.client, self.mesh, self.bound_s = client, mesh, bound_s
        self.config = f"adm:{{{mesh}}}:config"
        self.stats = stats or Stats()
        scripts.load(client)
        self.functions = {c: scripts.function_name(c) for c in scripts.COMMANDS}
        self.busy = self.rebuild()

    # -- the mesh --------------------------------------------------------------------------
    def wipe(self) -> None:
        keys = list(self.client.scan_iter(match=f"adm:{{{self.mesh}}}:*", count=1000))
        for i in range(0, len(keys), 500):
            self.client.delete(*keys[i:i + 500])

    def rebuild(self) -> Busy:
        self.wipe()
        self.busy = build_busy(self.client, self.mesh)
        self.stats.rebuilds += 1
        self.state = snapshot(self.client)
        return self.busy

    def still_busy(self) -> bool:
        """The busy mesh as built: its policy, its seats, its waiter, the closed provider."""
        m = f"adm:{{{self.mesh}}}:"
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.config, "token")
        for rid in self.busy.seats:
            pipe.exists(m + "seat:" + rid)
        pipe.exists(m + "ticket:waiter")
        pipe.hget(m + "provider:q", "closedUntil")
        token, *present, closed = pipe.execute()
        return token == self.busy.token and all(present) and closed not in (None, b"0")

    # -- one call --------------------------------------------------------------------------
    def _fcall(self, command: str, args: list[bytes]) -> tuple[Any, str | None, float]:
        t0 = time.perf_counter()
        try:
            reply, err = self.client.execute_command("FCALL", self.functions[command], 1, self.config, *args), None
        except redis.ResponseError as exc:
            reply, err = None, str(exc)
        return reply, err, time.perf_counter() - t0

    def call(self, command: str, args: list[bytes], *, follow_up: bool = True) -> str:
        """One checked call; returns "ok" or the ADM_ code. ``follow_up``: after a successful
        apply_config, every command's templates run (checked) on the new policy, then the busy
        mesh is rebuilt; after any other success that left the mesh less busy, it is rebuilt."""
        self.stats.tried[command] += 1
        before = self.state  # what the last call (or build) left: one snapshot per call
        reply, err, took = self._fcall(command, args)
        self.last = (reply, err)
        where = f"{command} {_show(args)}"
        if took > self.stats.slowest_s:
            self.stats.slowest_s, self.stats.slowest = took, where[:300]
        code = "ok"
        if err is not None:
            code = without_location(err).partition(" ")[0]
            if code not in CODES:
                self.stats.replies[command, "raw"] += 1
                self.stats.raw_errors += 1
                raise Violation(f"raw error reply from {where}: {err}")
            after = self.state = snapshot(self.client)
            if after != before:
                self.stats.state_changes += 1
                changed = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
                raise Violation(f"error reply {err!r} from {where} changed the state: keys {changed[:10]}")
        self.stats.replies[command, code] += 1
        if err is None:
            self.state = snapshot(self.client)
        if took > self.bound_s:
            self._confirm_slow(command, args, err is None, took, where)
        if err is None:
            self._check_success(command, args, where, follow_up)
        return code

    def _confirm_slow(self, command: str, args: list[bytes], succeeded: bool, took: float, where: str) -> None:
        """A call past the bound is timed again (a loaded machine may stall once): an error
        reply on the unchanged state; a success on a fresh busy mesh."""
        if succeeded:
            self.rebuild()
        again = self._fcall(command, args)[2]
        if min(took, again) > self.bound_s:
            self.stats.slow_calls += 1
            raise Violation(f"{where} took {took * 1000:.0f} ms and {again * 1000:.0f} ms (bound "
                            f"{self.bound_s * 1000:.0f} ms)")
        if succeeded:
            self.rebuild()

    def _check_success(self, command: str, args: list[bytes], where: str, follow_up: bool) -> None:
        """The doctor after every success; then (``follow_up``) a policy just applied meets every
        command, and a mesh that is no longer busy is built again."""
        if command != "doctor":
            report = self.doctor()
            if report is not None:
                self.stats.doctor_problems += 1
                raise Violation(f"after {where} the doctor found: {report}")
        if not follow_up:
            return
        if command == "apply_config":
            self.sweep_templates(f"the policy of {where[:300]}")
            self.rebuild()
        elif not self.still_busy():
            self.rebuild()

    def doctor(self) -> str | None:
        raw = self.client.execute_command("FCALL", self.functions["doctor"], 1, self.config)
        doc = json.loads(raw)
        problems = doc.get("problems") or []
        return None if doc.get("ok") and not problems else json.dumps(problems)[:1000]

    def sweep_templates(self, why: str) -> None:
        """Every command's valid ARGV on the mesh as it is now (a policy just applied): what a
        policy the script accepted must never make a later call fail raw."""
        for command, templates in self.busy.templates.items():
            if command == "apply_config":
                continue
            for t in templates:
                try:
                    self.call(command, t, follow_up=False)
                except Violation as exc:
                    raise Violation(f"{exc} (on {why})") from None


# -- the atheris harness ---------------------------------------------------------------------

_WORD = re.compile(rb"[A-Za-z_][A-Za-z_-]+|\d")


def reply_class(command: str, reply: Any, err: str | None) -> bytes:
    """What kind of answer a call got: the command, and the words of the error message (its
    ADM_ code, which check) or of the success's status and reason, without numbers and without
    the fuzzed names (most of them are not plain words)."""
    if err is not None:
        text = without_location(err).encode()
    elif isinstance(reply, list):
        text = b" ".join(x if isinstance(x, bytes) else str(x).encode() for x in reply[:2] if not isinstance(x, list))
        text = b"ok " + text
    else:
        text = b"doc" if isinstance(reply, bytes) else str(type(reply)).encode()
    words = [w for w in text.split() if _WORD.fullmatch(w)]
    return command.encode() + b" " + b" ".join(words[:8])


def feedback_function(atheris: Any, buckets: int = 1024, per_function: int = 32) -> Any:
    """A branch per bucket, instrumented: libFuzzer's coverage sees which reply classes an input
    reached, so an input that meets a new check (a deeper Lua path) is kept in its corpus and
    mutated further. The Lua itself is not instrumented: its replies stand in for its coverage.
    (Small functions: atheris takes seconds to instrument one with a thousand branches.)"""
    def tree(lo: int, hi: int, indent: str) -> list[str]:  # a binary search: a few tests a call
        if hi - lo == 1:
            return [f"{indent}return {lo}"]
        mid = (lo + hi) // 2
        return [f"{indent}if h < {mid}:", *tree(lo, mid, indent + " "), f"{indent}else:", *tree(mid, hi, indent + " ")]

    parts = []
    for first in range(0, buckets, per_function):
        namespace: dict[str, Any] = {}
        source = "\n".join(["def feedback(h):", *tree(first, first + per_function, " ")])
        exec(compile(source, f"<feedback {first}>", "exec"), namespace)
        parts.append(atheris.instrument_func(namespace["feedback"]))

    def feedback(h: int) -> int:
        return parts[h // per_function](h)

    return feedback


def argv_from(fdp: Any, command: str, templates: list[list[bytes]]) -> list[bytes]:
    """An ARGV from the fuzzer's bytes: pure bytes, or a valid template with positions replaced
    (by a NASTY value or by bytes), cut short or extended."""
    mode = fdp.ConsumeIntInRange(0, 4)
    if mode == 0:
        return [fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 48)) for _ in range(fdp.ConsumeIntInRange(0, 14))]
    args = list(templates[fdp.ConsumeIntInRange(0, len(templates) - 1)])
    for _ in range(1 + (mode == 2) * fdp.ConsumeIntInRange(1, 3)):
        if not args:
            break
        i = fdp.ConsumeIntInRange(0, len(args) - 1)
        args[i] = (NASTY[fdp.ConsumeIntInRange(0, len(NASTY) - 1)] if fdp.ConsumeBool()
                   else fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 48)))
    if mode == 3:
        args = args[:fdp.ConsumeIntInRange(0, len(args))]
    elif mode == 4:
        args += [NASTY[fdp.ConsumeIntInRange(0, len(NASTY) - 1)] for _ in range(fdp.ConsumeIntInRange(1, 6))]
    return args


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=2000, help="inputs to try (default 2000)")
    ap.add_argument("--seconds", type=float, default=0, help="stop after this long (0: no limit)")
    ap.add_argument("--url", help="a Redis/Valkey to fuzz (default: start a local server)")
    ap.add_argument("--engine", default="redis", choices=("redis", "valkey"),
                    help="the server to start without --url; the label of the figures with it")
    ap.add_argument("--mesh", default="fz-atheris")
    ap.add_argument("--seed", type=int, default=1, help="libFuzzer's seed (reproducible runs)")
    ap.add_argument("--bound-ms", type=float, default=CALL_BOUND_S * 1000)
    ap.add_argument("--summary", help="write the summary JSON here (after every input)")
    ap.add_argument("--artifacts", default=tempfile.gettempdir(), help="where libFuzzer writes a crashing input")
    opts, rest = ap.parse_known_args(argv)

    import atheris  # only the harness needs it (x86_64 Linux wheels)

    server = None
    if opts.url:
        url = opts.url
    else:
        from admission.tools.servers import LocalServer
        server = LocalServer(opts.engine).start()
        url = server.url
    client = redis.Redis.from_url(url, decode_responses=False)
    fz = Fuzzer(client, mesh=opts.mesh, bound_s=opts.bound_ms / 1000)
    commands = list(scripts.COMMANDS)
    started = time.monotonic()
    state = {"n": 0, "violation": None}
    feedback, classes = feedback_function(atheris), set()

    def write_summary() -> dict[str, Any]:
        doc = {"engine": opts.engine, "runs": state["n"], "seconds": round(time.monotonic() - started, 3),
               "server_pid": server.pid if server is not None else None,
               "violation": state["violation"], "reply_classes": len(classes), **fz.stats.as_dict()}
        if opts.summary:
            tmp = opts.summary + ".tmp"
            Path(tmp).write_text(json.dumps(doc, sort_keys=True))
            os.replace(tmp, opts.summary)
        return doc

    def finish(code: int) -> None:
        doc = write_summary()
        try:
            fz.wipe()
            client.close()
        finally:
            if server is not None:
                server.stop()
        print("fuzz summary: " + json.dumps({k: doc[k] for k in ("engine", "runs", "total", "raw_errors",
                                                                   "state_changes", "slow_calls", "doctor_problems",
                                                                   "slowest_ms", "seconds")}), flush=True)
        if code == 0:
            os._exit(0)  # libFuzzer's own exit skips Python's cleanup; this run is done

    def one_input(data: bytes) -> None:
        fdp = atheris.FuzzedDataProvider(data)
        command = commands[fdp.ConsumeIntInRange(0, len(commands) - 1)]
        args = argv_from(fdp, command, fz.busy.templates[command])
        try:
            fz.call(command, args)
        except Exception as exc:  # a Violation, or the harness itself broke: either way a crash
            state["violation"] = f"{type(exc).__name__}: {exc}"[:2000]
            finish(1)
            raise  # libFuzzer: a crash, the input written under --artifacts, a non-zero exit
        state["n"] += 1
        cls = reply_class(command, *fz.last)
        classes.add(cls)
        feedback(zlib.crc32(cls) % 1024)
        write_summary()
        if state["n"] >= opts.runs or (opts.seconds and time.monotonic() - started > opts.seconds):
            finish(0)

    artifacts = os.path.join(opts.artifacts, "")
    atheris.Setup([sys.argv[0], f"-seed={opts.seed}", f"-runs={opts.runs + 100}", "-max_len=512", "-len_control=0",
                   f"-artifact_prefix={artifacts}", "-print_final_stats=0", *rest], one_input)
    atheris.Fuzz()
    return 0  # not reached: Fuzz() exits


if __name__ == "__main__":
    sys.exit(main())
