"""The sans-IO core shared by the sync and asyncio clients.

It turns a call into (script, keys, args), decodes the reply, and maps error replies to
exceptions. It never talks to Redis, and it never decides: the Lua scripts do.
"""
from __future__ import annotations

import json
import math
import random
import re
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

import redis

from .alternatives import alternatives as alternatives_of
from .codes import FENCE_REASONS, OUTCOMES, REPORT_SIGNALS, UNAVAILABLE, Status
from .errors import BadArgument, BadName, ScriptError, from_reply, without_location

_MESH = re.compile(r"^[\w.\-]{1,64}$")


def mesh_key(mesh: str, *parts: Any) -> str:
    """A key of the mesh: ``adm:{<mesh>}:<part>:<part>...``, the one builder in Python, as
    ``key(...)`` is in the Lua (lua/include/util.lua): every key carries the mesh's hash tag, so a
    Redis Cluster keeps a mesh in one slot."""
    if not isinstance(mesh, str) or not _MESH.match(mesh):
        raise BadName(f"mesh {mesh!r} may only hold letters, digits, '.', '_' and '-' (1-64 characters)")
    return f"adm:{{{mesh}}}:" + ":".join(str(p) for p in parts)


@dataclass(frozen=True)
class Seat:
    """A slot held by an admitted round. Pass it back to ``report`` and ``release``."""

    id: str
    seq: int
    pool: str
    lane: str
    pod: str
    admitted_at: float


@dataclass(frozen=True)
class Decision:
    """What admission said: ``admitted`` and the rule (``reason``) behind it."""

    admitted: bool
    reason: str
    round_id: str
    lane: str
    pool: str
    seat: Seat | None = None
    estimate: float = 0.0
    running: int = 0
    slots: int = 0
    config_version: int = 0
    waiting_since: float | None = None  # refused: the waiter's place in its queue (enqueue time)
    asked: str = ""  # the pool asked for ("" = ``pool``): admitted elsewhere, the round moved
    borrowed_for: str = ""  # a borrow: the primary pool it runs for (``pool`` is the borrowed one)
    paused_for: float = 0.0  # refused with ``paused``: seconds left of the provider's Retry-After
    wait_s: float = 0.0  # refused with ``ceiling-<limit>``: seconds until that bucket covers the round
    #: the outcome counts of the alternatives the call looked at, {pool: (successes, failures,
    #: mean USD)}: what the client's next Thompson draw needs (as a release's ``stats``)
    stats: dict[str, tuple[float, float, float]] = field(default_factory=dict)

    @property
    def ceiling(self) -> str | None:
        """The rate ceiling (rpm, tpm, itpm, otpm, rpd, tpd) that refused the round, or None."""
        return self.reason[len("ceiling-"):] if not self.admitted and self.reason.startswith("ceiling-") else None

    def __bool__(self) -> bool:
        return self.admitted

    @property
    def moved_from(self) -> str | None:
        """The pool the round asked for, when it runs on one of its alternatives."""
        moved = self.admitted and self.asked and self.asked != self.pool and not self.borrowed_for
        return self.asked if moved else None

    @property
    def shed(self) -> bool:
        """Refused by the fence between planes (or for a stale revision): drop or compensate,
        never wait."""
        return not self.admitted and self.reason in FENCE_REASONS


@dataclass(frozen=True)
class Retried:
    """What ``retry`` decided for a seat's next attempt (``RETRY_DECISIONS``): ``decision``
    ``retry_same_plane`` (true: one token of the seat's plane was spent, try again there) or
    ``compensate_or_shed`` (false: none left); ``retries_left`` on that plane (None: it has no
    retry budget), ``retries``, the intent's count, and the ``plane``."""

    decision: str  # retry_same_plane | compensate_or_shed
    retries_left: float | None  # on the seat's plane (None: no retry budget set there)
    retries: int  # of the intent, persisted in Redis
    plane: str

    def __bool__(self) -> bool:
        return self.decision == "retry_same_plane"


@dataclass(frozen=True)
class Bound:
    """What ``bind`` or ``advance`` decided (``BIND_DECISIONS``) and the intent's revision
    ``watermark``; false for a ``reject_...`` decision (the result does not count)."""

    decision: str  # bound | reject_stale_revision | reject_not_admitted | advanced
    watermark: int

    def __bool__(self) -> bool:
        return not self.decision.startswith("reject_")


@dataclass(frozen=True)
class Released:
    """What a release or a report did: its ``status`` (``RELEASED``, ``ALREADY_RELEASED``,
    ``EXPIRED``, ``REPORTED``, ...), the ``pool``, whether its estimate ``decreased``, the ``estimate``
    after it, the pool's ``stats`` (successes, failures, mean cost in USD), and ``queued``
    when Redis could not be reached and the release waits in the pod's outbox."""

    status: Status
    pool: str
    decreased: bool
    estimate: float | None
    stats: tuple[float, float, float] | None = None  # the pool's successes, failures, mean cost (USD)
    queued: bool = False  # Redis could not apply it now: it waits in the pod's outbox (replayed once)


@dataclass(frozen=True)
class Heartbeat:
    lease_until: float
    lost: list[str]
    reasserted: list[str]
    lost_tickets: list[str]


@dataclass(frozen=True)
class Progress:
    """What a progress report did: ``points``, the reports that became a point of the pool's
    cap-line fit, and ``lost``, the seats that are not this pod's live seats (nothing written)."""

    points: int  # reports that became a point of the pool's cap-line fit
    lost: list[str]  # seats that are not this pod's live seats (nothing written for them)


@dataclass(frozen=True)
class Taken:
    """What ``take`` said of one more call of a running round (design §5.9): ``taken`` (its
    request and tokens are debited, or the pool has no ceilings), else refused by ``reason``
    (``ceiling-<limit>``) for ``wait_s`` seconds. ``already``: that call key took before
    (nothing changed); ``lost``: Redis no longer holds the seat (nothing written)."""

    taken: bool
    reason: str = ""
    wait_s: float = 0.0
    already: bool = False
    lost: bool = False

    def __bool__(self) -> bool:
        return self.taken


@dataclass(frozen=True)
class Tick:
    swept: int
    grew: dict[str, float]
    census_refreshed: bool


@dataclass(frozen=True)
class Charged:
    booked: bool  # False: this (seat, key) was booked before, or it is queued
    provider: str
    day: str
    queued: bool = False  # Redis could not apply it now: it waits in the pod's outbox


@dataclass(frozen=True)
class Rollover:
    ran: bool  # False: the roll-over of this UTC day had run already; nothing changed
    day: str
    reopened: list[str]
    at: float


@dataclass(frozen=True)
class Applied:
    version: int
    hold_until: float  # 0: no recovery hold (see apply_config.lua)


@dataclass(frozen=True)
class Usage:
    """What the provider counted of a round's call(s), sent with its release: the buckets of the
    pool's ceilings scope are refunded or charged the difference from what its admit reserved."""

    input_tokens: float = 0  # uncached input
    cache_creation_tokens: float = 0
    cache_read_tokens: float = 0
    output_tokens: float = 0

    @classmethod
    def of(cls, usage: "Usage | Mapping[str, float] | None") -> "Usage | None":
        if usage is None or isinstance(usage, Usage):
            return usage
        if not isinstance(usage, Mapping):
            raise BadArgument(f"usage must be a Usage or a mapping of token counts, got {usage!r}")
        unknown = set(usage) - {f for f in cls.__dataclass_fields__}
        if unknown:
            raise BadArgument(f"usage: unknown field(s) {', '.join(sorted(unknown))}")
        return cls(**usage)

    def args(self) -> list[str]:
        return [_received(x) for x in (self.input_tokens, self.cache_creation_tokens, self.cache_read_tokens,
                                       self.output_tokens)]


#: The rate ceilings a 429 may name as spent (``ceiling=`` with the outcome ``ceiling``).
CEILING_LIMITS = ("rpm", "tpm", "itpm", "otpm", "rpd", "tpd")
#: The longest reset a spent ceiling may carry (s): a day.
MAX_CEILING_RESET = 86400


def _ceiling_args(outcome: str, ceiling: str | None, reset_s: float | None) -> list[str]:
    """The spent ceiling of a ``ceiling`` outcome or signal: its limit and reset (s)."""
    if outcome != "ceiling":
        if ceiling is not None:
            raise BadArgument("ceiling= goes with the outcome 'ceiling'")
        return ["", ""]
    if ceiling not in CEILING_LIMITS:
        raise BadArgument(f"ceiling must be one of {', '.join(CEILING_LIMITS)}, got {ceiling!r}")
    reset = "" if reset_s is None else _seconds(reset_s, "reset_s")
    if reset and float(reset) > MAX_CEILING_RESET:
        raise BadArgument(f"reset_s must be at most {MAX_CEILING_RESET} seconds, got {reset_s!r}")
    return [ceiling, reset]


@dataclass(frozen=True)
class Call:
    """One script call: which script, its keys and arguments, and how to decode the reply."""

    script: str
    keys: list[str]
    args: list[Any]
    decode: Any = field(repr=False)


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _now(now: float | None) -> str:
    if now is None:
        return ""
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now) or now < 0:
        raise BadArgument(f"now must be epoch seconds (a finite number >= 0), got {now!r}")
    return repr(float(now))


#: The most one call may charge (USD). Money is integer micro-dollars in Redis: this bound keeps
#: every amount and every day's ledger exact (well inside 2^53) and lets the scripts check it
#: before their first write.
MAX_COST_USD = 1_000_000


def _money(cost_usd: float | None, bound: float = MAX_COST_USD) -> str:
    """USD -> integer micro-USD (the ledger's unit), bounded; None -> '' (not given)."""
    if cost_usd is None:
        return ""
    if (isinstance(cost_usd, bool) or not isinstance(cost_usd, (int, float)) or not math.isfinite(cost_usd)
            or not 0 <= cost_usd <= bound):
        raise BadArgument(f"an amount in USD must be a finite number in [0, {bound}], got {cost_usd!r}")
    return str(round(cost_usd * 1_000_000))


#: The largest day's limit or spend a budget reading may carry (USD), like the policy's limit.
MAX_READING_USD = 1_000_000_000


def _epoch(what: str, t: float | None, required: bool = False) -> str:
    if t is None and not required:
        return ""
    if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
        raise BadArgument(f"{what} must be epoch seconds (a finite number >= 0), got {t!r}")
    return repr(float(t))


def _revision(revision: int | None, required: bool) -> str:
    """A revision: a whole number >= 0 (the fixture's R3 is 3), compared by the watermark."""
    if revision is None and not required:
        return ""
    if isinstance(revision, bool) or not isinstance(revision, int) or not 0 <= revision <= 2 ** 53:
        raise BadArgument(f"revision must be a whole number >= 0, got {revision!r}")
    return str(revision)


#: The largest round size a round may declare (tokens), as the scripts check it.
MAX_TOKENS = 1_000_000_000


def _token_count(what: str, x: float, low: int) -> str:
    """A count of tokens: a finite number in [low, 1e9]."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x) or not low <= x <= MAX_TOKENS:
        raise BadArgument(f"{what} must be a finite number in [{low}, {MAX_TOKENS:.0e}], got {x!r}")
    return repr(float(x)) if isinstance(x, float) else str(x)


def _declared(what: str, x: float | None) -> str:
    """A declared count for the ceilings ('' = not declared): a finite number in [0, 1e9]."""
    return "" if x is None else _token_count(what, x, 0)


def _tokens(tokens: float | None) -> str:
    """A round's declared size ('' = not declared): a finite number of tokens in [1, 1e9]."""
    return "" if tokens is None else _token_count("tokens", tokens, 1)


def _received(got: float) -> str:
    """Tokens a round has received (so far, or in all): a finite number in [0, 1e9]."""
    return _token_count("tokens received", got, 0)


def _received_total(tokens: float | None) -> str:
    """What a round received in all, sent with its release ('' = its declared size)."""
    return "" if tokens is None else _received(tokens)


#: What the Lua takes of a rate-limit reading (lua/include/readings.lua): its length, a limit,
#: remaining or rounding at most 1e12, a reset or retry-after at most two days, a time before 1e11.
MAX_READING_TEXT = 1000
MAX_READING_COUNT = 1e12
MAX_READING_SECONDS = 2 * 86_400.0
MAX_READING_AT = 1e11
#: progress: the marker after the groups, before one reading per group (never a seat id)
READINGS_MARKER = "~r"


def _reading(reading: Any) -> str:
    """A rate-limit reading for the wire ('' = none): a ``ratelimits.Reading``, or its encoding (a
    ledger record keeps that), checked as the Lua checks it."""
    if reading is None or reading == "":
        return ""
    from . import ratelimits  # only once a reading comes: `import admission` does not load it
    if isinstance(reading, ratelimits.Reading):
        reading = ratelimits.encode(reading)
    if not isinstance(reading, str):
        raise BadArgument(f"reading must be a ratelimits.Reading, got {type(reading).__name__}")
    text = reading
    if len(text) > MAX_READING_TEXT:
        raise BadArgument(f"reading is longer than {MAX_READING_TEXT} characters")
    decoded = ratelimits.decode(text)  # what the Lua will parse (a hand-made Reading's NaN too)
    if decoded is None:
        return ""
    if not 0 <= decoded.at <= MAX_READING_AT:
        raise BadArgument(f"reading: at must be a time in Unix seconds, got {decoded.at!r}")
    if decoded.retry_after is not None and decoded.retry_after > MAX_READING_SECONDS:
        raise BadArgument(f"reading: retry_after must be at most {MAX_READING_SECONDS:g} s")
    for lim in decoded.limits.values():
        for what, v, top in (("limit", lim.limit, MAX_READING_COUNT), ("remaining", lim.remaining, MAX_READING_COUNT),
                             ("rounding", lim.rounding, MAX_READING_COUNT), ("reset_s", lim.reset_s, MAX_READING_SECONDS)):
            if v is not None and v > top:
                raise BadArgument(f"reading: {lim.kind} {what} must be at most {top:g}, got {v!r}")
    return text


def _seconds(seconds: float, what: str = "seconds") -> str:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds < 0:
        raise BadArgument(f"{what} must be a finite number >= 0, got {seconds!r}")
    return repr(float(seconds))


def _retry_after(seconds: float | None) -> str:
    """A provider's Retry-After in seconds ('' = none): finite and >= 0."""
    return "" if seconds is None else _seconds(seconds, "retry_after")


def empty_list(x: Any) -> list:
    """cjson encodes an empty array as {} on some engines: read it as []."""
    return x if isinstance(x, list) else []


def decode_ledger(raw: dict) -> dict[str, dict[str, float]]:
    """A day's ``spend:<day>`` hash -> {lane: {provider: USD}} (the `*` row: providers' totals)."""
    out: dict[str, dict[str, float]] = {}
    for name, micro in raw.items():
        lane, _, provider = _s(name).partition("|")
        out.setdefault(lane, {})[provider] = int(micro) / 1e6
    return out


def decode_census(raw: Any) -> dict[str, Any]:
    doc = json.loads(_s(raw))
    doc["pools"] = empty_list(doc.get("pools"))
    doc["starving"] = empty_list(doc.get("starving"))
    for p in doc["pools"]:
        p["lanes"] = empty_list(p.get("lanes"))
        p["mustYield"] = empty_list(p.get("mustYield"))
        p["alternatives"] = empty_list(p.get("alternatives"))
        p.setdefault("hardPinned", None)  # no hard-pinned round waits here
        p.setdefault("capLine", None)  # no declared round running holds the pool under a line
        for k in ("budgetSpentUsd", "budgetLimitUsd", "budgetAt", "committedUsd"):
            p.setdefault(k, None)  # no budget today
        for lane in p["lanes"]:
            lane.setdefault("reserveLeftUsd", None)
    return doc


class MeshCalls:
    """Argument building and reply decoding for a mesh's own commands (the policy, the read
    model, the clock's step, the provider's day, the roll-over): what an operator's ``Mesh``
    sends. A pod's ``Core`` adds its rounds' calls."""

    def __init__(self, mesh: str):
        self.config_key = mesh_key(mesh, "config")
        self.mesh = mesh
        self.census_key = mesh_key(mesh, "census")
        self.wake_channel = mesh_key(mesh, "wake")

    def _call(self, script: str, args: list[Any], decode) -> Call:
        return Call(script, [self.config_key], args, decode)

    # -- the provider's day --------------------------------------------------------------------
    def budget(self, *, provider: str, limit_usd: float | None, spent_usd: float | None, at: float,
               now: float | None = None) -> Call:
        """A budget reader's reading of a provider's day."""
        args = [provider, _money(limit_usd, MAX_READING_USD), _money(spent_usd, MAX_READING_USD),
                _epoch("at", at, required=True), _now(now)]
        return self._call("budget", args, lambda r: {"day": _s(r[1]), "closed_until": float(_s(r[2]))})

    def closure(self, *, action: str, provider: str, why: str, seconds: float | None = None,
                now: float | None = None) -> Call:
        if action not in ("close", "reopen"):
            raise BadArgument(f"action must be close or reopen, got {action!r}")
        args = [action, provider, why, "" if seconds is None else _seconds(seconds), _now(now)]
        return self._call("closure", args, lambda r: float(_s(r[1])))

    def rollover(self, now: float | None = None) -> Call:
        def decode(r):
            return Rollover(bool(int(r[1])), _s(r[2]), [_s(x) for x in empty_list(r[3])], float(_s(r[4])))

        return self._call("rollover", [_now(now)], decode)

    # -- the pool clock's step -----------------------------------------------------------------
    def tick(self, now: float | None = None, sweep_limit: int = 100) -> Call:
        def decode(r):
            grew = {_s(r[2][i]): float(_s(r[2][i + 1])) for i in range(0, len(r[2]), 2)}
            return Tick(int(r[1]), grew, bool(int(r[3])))

        return self._call("tick", [_now(now), str(sweep_limit)], decode)

    # -- reading -----------------------------------------------------------------------------
    def census(self, now: float | None = None) -> Call:
        return self._call("census", [_now(now)], decode_census)

    # -- the policy ----------------------------------------------------------------------------
    def apply(self, policy: dict[str, Any], expected_version: int | None = None, *,
              recovery_hold: bool = True, now: float | None = None) -> Call:
        token = uuid.uuid4().hex  # a new policy is new to every cache, even after a wipe
        args = ["" if expected_version is None else str(expected_version), json.dumps(policy), token,
                _now(now), "1" if recovery_hold else "0", json.dumps(alternatives_of(policy))]
        return self._call("apply_config", args, lambda r: Applied(int(r[1]), float(_s(r[2]))))

    # -- errors ------------------------------------------------------------------------------
    @staticmethod
    def translate(exc: redis.ResponseError) -> Exception:
        """Every error reply becomes one of the package's exceptions: no raw ResponseError
        leaves the client."""
        return from_reply(str(exc)) or ScriptError(f"redis refused the call: {without_location(str(exc))}")


class Core(MeshCalls):
    """Argument building and reply decoding for one pod of one mesh."""

    def __init__(self, mesh: str, pod: str, seed: int | None = None):
        super().__init__(mesh)
        self.pod = pod
        self._uniform = random.Random(seed).random  # the one draw per admit: 10x cheaper than numpy's

    """Argument building and reply decoding for one pod of one mesh."""

    # -- admission -------------------------------------------------------------------------
    def admit(self, *, lane: str | None, model: str, round_id: str, agent: str | None = None,
              now: float | None = None, draw: float | None = None, wait: bool = True,
              parent: str | None = None, revision: int | None = None, borrow: str | None = None,
              alternatives: Iterable[str] = (), tokens: float | None = None,
              input_tokens: float | None = None, max_tokens: float | None = None) -> Call:
        """``alternatives``: the pool's alternatives, best first (``Thompson.rank``); the
        decision's ``stats`` are their outcome counts as the script saw them.
        ``borrow``: run on this pool for ``model`` (the primary), behind the fence. ``tokens``:
        the round's size as the worker knows it (the cap line plans it to end before its cap).
        ``input_tokens`` and ``max_tokens``: what its call will count against the pool's rate
        ceilings (its prompt and answer budget; None: the scope's learned mean per call)."""
        if draw is None:
            draw = self._uniform()
        elif isinstance(draw, bool) or not isinstance(draw, (int, float)) or not 0 <= draw < 1:
            raise BadArgument(f"draw must be a number in [0, 1), got {draw!r}")
        # the declarations, then the ranking; with neither the call stops at ARGV[12], the call an
        # older library takes too (bench --against)
        tail = [_declared("input_tokens", input_tokens), _declared("max_tokens", max_tokens),
                *(() if borrow else alternatives)]
        args = [round_id, lane or "", model, self.pod, agent or "", _now(now), repr(float(draw)),
                "1" if wait and not borrow else "0", parent or "", _revision(revision, required=False),
                borrow or "", _tokens(tokens), *(tail if any(tail) else ())]

        def decode(r):
            status, reason, pool, rid, seq, lane_, est, running, slots, version, at, holder, asked, stats = r[:14]
            paused_for = float(r[14]) if len(r) > 14 and r[14] else 0.0
            wait_s = float(r[15]) if len(r) > 15 and r[15] else 0.0
            admitted, at = int(status) == Status.ADMITTED, float(at)  # float() and int() take bytes
            rid, pool, lane_ = _s(rid), _s(pool), _s(lane_)
            counts = {_s(stats[i]): (float(stats[i + 1]), float(stats[i + 2]), float(stats[i + 3]) / 1e6)
                      for i in range(0, len(stats or ()), 4)}
            # same-intent from another pod: the seat is that pod's (this pod must not run the round)
            seat = Seat(rid, int(seq), pool, lane_, _s(holder), at) if admitted else None
            return Decision(admitted, _s(reason), rid, lane_, pool, seat, float(est), int(running), int(slots),
                            int(version), None if admitted else at, _s(asked), model if borrow else "", paused_for,
                            wait_s, counts)

        return self._call("admit", args, decode)

    def unavailable(self, *, lane: str | None, model: str, round_id: str, borrow: str | None = None,
                    **_: Any) -> Decision:
        """The shed decision when Redis cannot be reached: never a silent admit (a borrow too)."""
        return Decision(False, UNAVAILABLE, round_id, lane or "", borrow or model, asked=model,
                        borrowed_for=model if borrow else "")

    # -- the fence between planes --------------------------------------------------------------
    def retry(self, seat: Seat, now: float | None = None, attempt: str | None = None) -> Call:
        def decode(r):
            left = _s(r[2])
            return Retried(_s(r[1]), float(left) if left else None, int(r[3]), _s(r[4]))

        return self._call("retry", [seat.id, str(seat.seq), self.pod, _now(now), attempt or ""], decode)

    def bind(self, *, action: str, round_id: str, revision: int, now: float | None = None) -> Call:
        if action not in ("bind", "advance"):
            raise BadArgument(f"action must be bind or advance, got {action!r}")
        args = [action, round_id, _revision(revision, required=True), _now(now)]
        return self._call("bind", args, lambda r: Bound(_s(r[1]), int(float(_s(r[2])))))

    def health(self, *, pool: str, depth: int, running: int | None = None, ok: bool = True,
               at: float | None = None, now: float | None = None) -> Call:
        for what, v in (("depth", depth), ("running", running)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1_000_000_000):
                raise BadArgument(f"{what} must be a whole number in [0, 1e9], got {v!r}")
        args = [pool, str(depth), "" if running is None else str(running), "1" if ok else "0", _epoch("at", at), _now(now)]
        return self._call("health", args, lambda r: float(_s(r[1])))

    def release(self, seat: Seat, *, outcome: str = "clean", seconds: float = 0.0,
                cost_usd: float | None = None, now: float | None = None, at: float | None = None,
                retry_after: float | None = None, received: float | None = None,
                usage: "Usage | Mapping[str, float] | None" = None, ceiling: str | None = None,
                reset_s: float | None = None, reading: Any = None) -> Call:
        """``at``: when the round ended (its cost's UTC day; a replay from the outbox keeps it).
        ``retry_after``: the provider's Retry-After (s) with a rate_limited outcome: pauses the pool.
        ``received``: the tokens the round received in all (a declared round's last point of the
        cap line's fit measures with it instead of the declared size). ``usage``: what the provider
        counted (``Usage``): the ceilings' buckets are reconciled with the reservation, once.
        ``ceiling``/``reset_s``: with the outcome ``ceiling`` (a 429 naming a spent rate ceiling),
        the limit spent and the seconds until it resets: that bucket is empty until then, and the
        estimate is left alone. ``reading``: the provider's rate-limit headers of the round's last
        response (``ratelimits.Reading``, or its encoding): the pool's scope learns from it
        (ARGV[17], design §5.9)."""
        if outcome not in OUTCOMES:
            raise BadArgument(f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}")
        u = Usage.of(usage)
        text = _reading(reading)
        args = [seat.id, str(seat.seq), self.pod, outcome, _seconds(seconds), _money(cost_usd), _now(now),
                _epoch("at", at), _retry_after(retry_after), _received_total(received),
                *(u.args() if u else ["", "", "", ""]), *_ceiling_args(outcome, ceiling, reset_s)]
        if text:  # ARGV[17]; a release without a reading is the call an older library takes
            args.append(text)

        def decode(r):
            stats = (float(r[4]), float(r[5]), float(r[6]) / 1e6) if r[4] else None
            return Released(Status(int(r[0])), _s(r[1]), bool(int(r[2])), float(r[3]) if r[3] else None, stats)

        return self._call("release", args, decode)

    def report(self, seat: Seat, *, signal: str, now: float | None = None,
               retry_after: float | None = None, ceiling: str | None = None, reset_s: float | None = None) -> Call:
        if signal not in REPORT_SIGNALS:
            raise BadArgument(f"signal must be one of {', '.join(REPORT_SIGNALS)}, got {signal!r}")
        args = [seat.id, str(seat.seq), self.pod, signal, _now(now), _retry_after(retry_after),
                *_ceiling_args(signal, ceiling, reset_s)]

        def decode(r):
            return Released(Status(int(r[0])), _s(r[1]), bool(int(r[2])), float(_s(r[3])))

        return self._call("report", args, decode)

    def charge(self, seat: Seat, *, cost_usd: float, key: str, at: float | None = None,
               now: float | None = None) -> Call:
        """Book ``cost_usd`` to the ledger once per (seat, key)."""
        if cost_usd is None:
            raise BadArgument("cost_usd is required")
        args = [seat.id, str(seat.seq), self.pod, seat.lane, seat.pool, _money(cost_usd), key, _epoch("at", at),
                _now(now)]

        def decode(r):
            return Charged(Status(int(r[0])) == Status.CHARGED, _s(r[1]), _s(r[2]))

        return self._call("charge", args, decode)

    def take(self, seat: Seat, *, key: str, input_tokens: float | None = None,
             max_tokens: float | None = None, now: float | None = None) -> Call:
        """One more call of the round ``seat`` takes its request and tokens (``input_tokens``, the
        answer budget ``max_tokens``; undeclared: the scope's learned mean) from its scope's
        buckets, once per call ``key`` (take.lua)."""
        args = [seat.id, str(seat.seq), self.pod, key, _declared("input_tokens", input_tokens),
                _declared("max_tokens", max_tokens), _now(now)]

        def decode(r):
            status = Status(int(r[0]))
            return Taken(status in (Status.TAKEN, Status.ALREADY_TAKEN), _s(r[1]), float(_s(r[2])),
                         already=status == Status.ALREADY_TAKEN, lost=status == Status.SEAT_LOST)

        return self._call("take", args, decode)

    def withdraw(self, round_id: str) -> Call:
        return self._call("withdraw", [round_id, self.pod], lambda r: bool(int(r[1])))

    # -- the clock ---------------------------------------------------------------------------
    def heartbeat(self, seats: Iterable[Seat], tickets: Iterable[str], now: float | None = None) -> Call:
        seats = list(seats)
        args: list[Any] = [self.pod, _now(now), str(len(seats))]
        for s in seats:
            args += [s.id, str(s.seq), s.lane, s.pool, repr(s.admitted_at)]
        args += list(tickets)

        def decode(r):
            return Heartbeat(float(_s(r[1])), [_s(x) for x in r[2]], [_s(x) for x in r[3]], [_s(x) for x in r[4]])

        return self._call("heartbeat", args, decode)

    def progress(self, received: Iterable[tuple[Any, ...]], now: float | None = None) -> Call:
        """The tokens each running round has received so far (the cap line's fit, capline.lua):
        (seat, tokens) pairs, or (seat, tokens, reading) with the provider's rate-limit headers
        of its last response (a ``ratelimits.Reading`` or None): the round's scope learns from
        it as from a release's (sent after the marker ``~r``, one per round)."""
        args: list[Any] = [self.pod, _now(now)]
        readings = []
        for item in received:
            seat, got, *rest = item
            args += [seat.id, str(seat.seq), _received(got)]
            readings.append(_reading(rest[0]) if rest else "")
        if any(readings):  # without one it is the call an older library takes
            args += [READINGS_MARKER, *readings]

        def decode(r):
            return Progress(int(r[1]), [_s(x) for x in empty_list(r[2])])

        return self._call("progress", args, decode)

    def plan(self, *, lane: str | None, pools: list[str] | None, wanted: int, now: float | None = None,
             agent: str | None = None, moves: Iterable[str] = ()) -> Call:
        """``moves``: the pools the caller can move to (none: plan counts only the pools asked for)."""
        if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 0:
            raise BadArgument(f"wanted must be a whole number >= 0, got {wanted!r}")
        args = [lane or "", str(wanted), _now(now), agent or "", " ".join(moves),
                *(pools if pools is not None else ["*"])]

        def decode(r):
            return {_s(r[i]): int(r[i + 1]) for i in range(1, len(r), 2)}

        return self._call("plan", args, decode)

#: What the clients treat as "Redis cannot be reached".
UNREACHABLE = (redis.ConnectionError, redis.TimeoutError)
