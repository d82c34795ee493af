"""The fence's fault-injection report: ``admission fence-report --intents N --seed S``
(also ``python -m admission.tools.fence_report``).

For each fault below it drives N intents (a seeded ``random.Random(seed)``) through the real
scripts and the real client, against a server it starts itself (an embedded redis-server, else
valkey-server, from ``servers.py``; ``--engine fakeredis|redis|valkey``, or ``--url`` for a
server of your own, where it uses throw-away meshes named ``fence-<fault>``). Every intent is an
``Admission.try_admit(..., borrow="borrowed@q")`` for the primary ``primary@p``, on a caller
clock that moves one second per intent. A seeded share of the intents (``--share``, default
0.5) has the fault injected, the others are healthy baseline intents; ``redis-unreachable``
injects every intent. Around the borrows a sampler writes fresh health samples of both planes,
and a primary pod holds rounds on the primary and spends the primary's retry budget (so the
budget the invariant watches is a live one).

Faults (docs/fence.md says what each one shows):

* ``stale-borrowed-health``: the borrowed plane's sample is absent (the first intent), older
  than health_max_age (its sampler stalled: the clock jumps past the max age), or says the plane
  did not answer;
* ``borrowed-depth``: the borrowed plane at its depth limit, by real waiters on the pool (it is
  filled by another pod first) or by a fresh health sample whose depth says so;
* ``primary-saturation``: the primary at its depth limit (real waiters, or a fresh sample) while
  the borrower is idle and fresh;
* ``late-score``: a borrow admitted for revision R, the intent advanced to R+1, then the late
  score ``bind(seat, R)``; a borrow asked for R after the intent moved to R+1 (a stale-revision
  shed) and its late score; and a late score after a fence shed (the borrowed plane down);
* ``redis-unreachable``: the client pointed at a closed port;
* ``lost-replies``: the reply to an admit, to a retry, or to both is lost after the server
  applied the call (a client wrapper raises ConnectionError after executing it); the intent
  asks again with the same round id, and a lost retry is read back from the intent's record;
* ``pod-killed``: a borrow admitted and retried once, then its pod dies: a pod restarted with
  the same name asks again (same intent) and retries, or another pod asks again, cannot retry
  the dead pod's seat, waits out its lease and is admitted anew and retries.

What is checked, for every intent (the invariant, docs/design.md §8): across every borrow that is
refused or shed, each key of the primary -- ``pool:``, ``lanes:``, ``plane:``, ``pinned:`` and
every lane's ``wait:`` of ``primary@p`` -- is byte-for-byte unchanged (``DUMP`` and ``PTTL`` on a
real server; a structural snapshot on fakeredis, whose DUMP is not Redis' format), and the
primary's retry budget as the census shows it (``retriesLeft``, read at the same caller time) is
unchanged; so is the borrower's. Also: an admitted borrow and everything done with its seat
(retry, bind, advance, release) leave the primary untouched; a retry spends exactly one token of
its own plane; each fault's own expectation (the reason it must give, one decision per intent,
retries spent once, the retry count surviving the pod); and ``doctor`` finds the counts in
agreement with the records after each fault. The exit code is 0 when every check held in every
case, 1 otherwise (the failed checks are printed), 2 on a usage or setup error.
"""
from __future__ import annotations

import argparse
import contextlib
import logging
import platform
import random
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import redis

from .. import doctor
from .logs import quiet_logs
from .progress import progress_bar
from ..client import Admission, fail_fast_options
from ..codes import FENCE_REASONS, UNAVAILABLE
from ..core import Decision, Seat
from ..errors import NotYourSeat, Unavailable
from .servers import ENGINES, LocalServer, find_server, free_port
from . import write_json

#: The faults, in the order they run and print.
FAULTS = ("stale-borrowed-health", "borrowed-depth", "primary-saturation", "late-score", "redis-unreachable",
          "lost-replies", "pod-killed")
#: What each fault shows (the table's footnotes and docs/fence.md).
FAULT_TEXT = {
    "stale-borrowed-health": "borrowed sample absent, older than health_max_age, or not ok",
    "borrowed-depth": "borrowed plane at its depth limit (waiters there, or a sample's depth)",
    "primary-saturation": "primary at its depth limit while the borrower is idle and fresh",
    "late-score": "a late score for R after the intent moved to R+1; a late score after a shed",
    "redis-unreachable": "the client points at a closed port (every intent)",
    "lost-replies": "the reply to an admit and/or a retry lost after the server applied it",
    "pod-killed": "the pod dies between admit and retry; restarted, or another pod takes over",
}
#: The refusals that count as shed decisions: the fence's reasons and absence.
SHED_REASONS = (*FENCE_REASONS, UNAVAILABLE)

PRIMARY = "primary@p"
BORROWED = "borrowed@q"
LANES = ("a", "b")
T0 = 1_800_000_000.0  # the caller clock's start (2027-01-15 08:00 UTC), for every fault
STEP = 1.0  # seconds of caller time per intent
LEASE_TTL = 60.0
HEALTH_MAX_AGE = 5.0
DEPTH_LIMIT = {PRIMARY: 4, BORROWED: 2}
RETRY_BUDGET = {PRIMARY: 5, BORROWED: 10}
REFILL = {PRIMARY: 0.5, BORROWED: 2.0}
SEED_ESTIMATE = 4  # slots of either pool (no tick runs, so the estimates stay)
PRIMARY_HELD = 2  # primary rounds the primary pod holds (saturation: the whole pool)
PRIMARY_RETRY_P = 0.2  # per intent: the primary pod retries one of its rounds
BORROW_RETRY_P = 0.3  # an admitted baseline borrow retries once
DEFAULT_SHARE = 0.5
MAX_DETAILS = 20  # failure details kept per fault


def fence_policy() -> dict[str, Any]:
    """Two planes with every fence setting: the primary and the plane it borrows."""
    pools = {p: {"depth_limit": DEPTH_LIMIT[p], "retry_budget": RETRY_BUDGET[p], "retry_refill_per_s": REFILL[p],
                 "health_required": True, "health_max_age": HEALTH_MAX_AGE} for p in (PRIMARY, BORROWED)}
    return {"tunables": {"lease_ttl": LEASE_TTL, "seed_estimate": SEED_ESTIMATE, "health_max_age": HEALTH_MAX_AGE,
                         "decision_ttl": 30},
            "lanes": {"a": {"floor": 0.5, "weight": 1, "priority": 2}, "b": {"floor": 0.3, "weight": 1, "priority": 1}},
            "providers": {"p": {}, "q": {}}, "pools": pools, "clock": "caller"}


def unchanged(before: Any, after: Any) -> bool:
    """The invariant's comparison of two snapshots of the primary's keys (byte-for-byte)."""
    return before == after


# -- results ---------------------------------------------------------------------------------------


@dataclass
class Check:
    held: int = 0
    cases: int = 0
    invariant: bool = False  # one of the fence's promises about the primary (the headline)

    @property
    def ok(self) -> bool:
        return self.held == self.cases


@dataclass
class FaultResult:
    fault: str
    intents: int = 0
    injected: int = 0
    injected_shed: int = 0  # shed decisions of injected intents (the design's denominator)
    admitted: int = 0
    reasons: Counter = field(default_factory=Counter)  # the server's decision of each intent's first ask
    calls: Counter = field(default_factory=Counter)  # follow-ups: retries, binds, lost replies, re-asks
    checks: dict[str, Check] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)  # the first failures, with their keys
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    headline: Check = field(default_factory=lambda: Check(invariant=True))  # keys and budget, per shed

    @property
    def shed(self) -> int:
        return sum(n for r, n in self.reasons.items() if r in SHED_REASONS)

    @property
    def shed_per_100(self) -> float:
        return 100.0 * self.shed / self.intents if self.intents else 0.0

    @property
    def shed_per_100_injected(self) -> float:
        return 100.0 * self.injected_shed / self.injected if self.injected else 0.0

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks.values())

    def as_dict(self) -> dict[str, Any]:
        inv = self.headline
        return {"fault": self.fault, "what": FAULT_TEXT[self.fault], "intents": self.intents,
                "injected": self.injected, "admitted": self.admitted, "shed": self.shed,
                "shedPer100": round(self.shed_per_100, 2), "injectedShed": self.injected_shed,
                "shedPer100Injected": round(self.shed_per_100_injected, 2),
                "reasons": dict(self.reasons.most_common()),
                "calls": dict(sorted(self.calls.items())),
                "invariant": {"held": inv.held, "cases": inv.cases, "ok": inv.ok},
                "checks": {k: {"held": c.held, "cases": c.cases, "ok": c.ok, "invariant": c.invariant}
                           for k, c in sorted(self.checks.items(), key=lambda kc: _rank(kc[0]))},
                "ok": self.ok, "failures": self.details, "notes": self.notes, "seconds": round(self.seconds, 3)}


def _rank(check: str) -> int:
    """The order checks print in: the invariant first, the doctor last."""
    for i, prefix in enumerate(("shed:", "borrow:", "retry:", "injected:")):
        if check.startswith(prefix):
            return i
    return 9 if check.startswith("doctor:") else 5


# -- the clients -----------------------------------------------------------------------------------


class LossyRedis:
    """A client that loses the reply of the next FCALL of an armed command: the server applies the
    call, then the caller sees a ConnectionError (a reply lost on the way back). The reply that was
    lost is kept in ``lost_reply``."""

    def __init__(self, inner: Any):
        self._inner = inner
        self.armed: set[str] = set()  # commands (admit, retry, ...) whose next reply is lost
        self.lost_reply: Any = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = self._inner.execute_command(*args, **options)
        if args and args[0] == "FCALL":
            command = str(args[1]).split("_")[1] if str(args[1]).startswith("adm_") else ""
            if command in self.armed:
                self.armed.discard(command)
                self.lost_reply = reply
                raise redis.ConnectionError(f"reply to {command} lost (injected): the server applied it")
        return reply


@dataclass
class State:
    """What the invariant compares across one call: the primary's keys and both retry budgets."""
    primary: dict[str, Any]
    left: dict[str, Any]  # census retriesLeft per plane, at the call's caller time


# -- one fault on one mesh -------------------------------------------------------------------------


class FaultRun:
    def __init__(self, client: Any, fault: str, intents: int, rng: random.Random, *, share: float,
                 dump: bool, closed_url: str):
        self.client, self.fault, self.n, self.rng, self.share = client, fault, intents, rng, share
        self.dump, self.closed_url = dump, closed_url
        self.mesh = f"fence-{fault}"
        self.res = FaultResult(fault)
        self.t = T0
        self.pods: dict[str, Admission] = {}
        self.live: list[Admission] = []  # pods that hold leases: their heartbeat runs as the clock moves
        self.last_beat = T0
        self.primary_seats: list[Seat] = []
        self.base_waiters = 0
        self.injected = False  # the current intent's
        p = f"adm:{{{self.mesh}}}"
        self.primary_keys = [f"{p}:pool:{PRIMARY}", f"{p}:lanes:{PRIMARY}", f"{p}:plane:{PRIMARY}",
                             f"{p}:pinned:{PRIMARY}", *(f"{p}:wait:{PRIMARY}:{lane}" for lane in LANES)]
        self.zsets = {k for k in self.primary_keys if ":wait:" in k or ":pinned:" in k}

    # -- plumbing --------------------------------------------------------------------------------
    def pod(self, name: str, client: Any = None) -> Admission:
        if name not in self.pods:
            self.pods[name] = Admission(client if client is not None else self.client, mesh=self.mesh, pod=name,
                                        background=False, seed=self.rng.randrange(2 ** 31))
        return self.pods[name]

    def fresh_pod(self, name: str, client: Any = None) -> Admission:
        """A new process with this pod name (a restart): no book, nothing held."""
        self.pods.pop(name, None)
        return self.pod(name, client)

    def check(self, name: str, held: bool, detail: str | Callable[[], str] = "", invariant: bool = False) -> bool:
        c = self.res.checks.setdefault(name, Check(invariant=invariant))
        c.cases += 1
        if held:
            c.held += 1
        elif len(self.res.details) < MAX_DETAILS:
            text = detail() if callable(detail) else detail
            self.res.details.append(f"{self.fault} {name}: {text}")
        return held

    def advance(self, dt: float) -> None:
        """Move the caller clock; the live pods renew their leases on the way (as their clocks would)."""
        end = self.t + dt
        while self.t < end:
            self.t = min(end, self.t + LEASE_TTL / 4)
            self.beat()

    def beat(self, force: bool = False) -> None:
        if force or self.t - self.last_beat >= LEASE_TTL / 4:
            for a in self.live:
                a.heartbeat(now=self.t)
            self.last_beat = self.t

    def sample(self, pool: str, depth: int = 0, ok: bool = True) -> None:
        self.pod("sampler").report_health(pool, depth=depth, running=0, ok=ok, at=self.t, now=self.t)

    def state(self) -> State:
        pipe = self.client.pipeline(transaction=False)
        for k in self.primary_keys:
            if self.dump:
                pipe.dump(k)
            elif k in self.zsets:
                pipe.zrange(k, 0, -1, withscores=True)
            else:
                pipe.hgetall(k)
            pipe.pttl(k)
        raw = pipe.execute(raise_on_error=False)
        primary = {k: (raw[2 * i], raw[2 * i + 1]) for i, k in enumerate(self.primary_keys)}
        pools = {row["pool"]: row for row in self.pod("sampler").census(now=self.t)["pools"]}
        left = {p: (pools.get(p) or {}).get("plane", {}).get("retriesLeft") for p in (PRIMARY, BORROWED)}
        return State(primary, left)

    def diff(self, before: State, after: State) -> str:
        prefix = f"adm:{{{self.mesh}}}:"
        out = [f"{k[len(prefix):]}: {before.primary[k]!r} -> {after.primary[k]!r}"
               for k in self.primary_keys if before.primary[k] != after.primary[k]]
        if before.left != after.left:
            out.append(f"retriesLeft {before.left} -> {after.left}")
        return "; ".join(out) or "(the comparison reported a change)"

    # -- the calls, each one checked --------------------------------------------------------------
    def ask(self, adm: Admission, rid: str, *, lane: str, rev: int | None = None, first: bool = True,
            lost_admit: bool = False) -> Decision:
        """A borrow of BORROWED for PRIMARY, with the invariant checked across it. ``first``: the
        intent's first ask (its decision is counted in the reasons)."""
        before = self.state()
        if lost_admit:
            adm.redis.armed.add("admit")
        d = adm.try_admit(lane=lane, model=PRIMARY, round_id=rid, borrow=BORROWED, revision=rev, now=self.t,
                          draw=self.rng.random())
        after = self.state()
        applied = self.applied(rid) if lost_admit else (d.admitted, d.reason)
        if first:
            self.res.reasons[applied[1]] += 1
            self.res.admitted += applied[0]
            self.res.injected_shed += self.injected and applied[1] in SHED_REASONS
        # what the server did: a refusal, or (a lost reply) what the client could not see
        if not applied[0]:
            keys = self.check("shed: primary keys unchanged", unchanged(before.primary, after.primary),
                              lambda: f"intent {rid} ({applied[1]}): {self.diff(before, after)}", invariant=True)
            budget = self.check("shed: primary retry budget unchanged",
                                before.left[PRIMARY] == after.left[PRIMARY],
                                lambda: f"intent {rid} ({applied[1]}): primary retriesLeft "
                                        f"{before.left[PRIMARY]} -> {after.left[PRIMARY]}", invariant=True)
            self.res.headline.cases += 1
            self.res.headline.held += keys and budget
            self.check("shed: borrower's retry budget unchanged", before.left[BORROWED] == after.left[BORROWED],
                       lambda: f"intent {rid} ({applied[1]}): borrowed retriesLeft {before.left[BORROWED]} -> "
                               f"{after.left[BORROWED]}", invariant=True)
        else:
            self.untouched(f"admit {rid} ({applied[1]})", before, after)
        return d

    def applied(self, rid: str) -> tuple[bool, str]:
        """What the server decided for a lost admit reply: read from the reply the wrapper kept."""
        reply = self.pods["pod-l"].redis.lost_reply
        return int(reply[0]) == 1, reply[1].decode() if isinstance(reply[1], bytes) else str(reply[1])

    def untouched(self, what: str, before: State, after: State) -> None:
        self.check("borrow: primary untouched (admit, retry, bind, release)",
                   unchanged(before.primary, after.primary) and before.left[PRIMARY] == after.left[PRIMARY],
                   lambda: f"{what}: {self.diff(before, after)}", invariant=True)

    def around(self, what: str, fn: Callable[[], Any]) -> tuple[Any, State, State]:
        """Run one call made with a borrowed seat; the primary must not change across it."""
        before = self.state()
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - the caller looks at it
            out = exc
        after = self.state()
        self.untouched(what, before, after)
        return out, before, after

    def retry(self, adm: Admission, seat: Seat, *, lost: bool = False) -> Any:
        """One retry of a borrowed attempt: one token of the borrowed plane, none of the primary's."""
        if lost:
            adm.redis.armed.add("retry")
        was = self.retries_of(seat.id)
        r, before, after = self.around(f"retry {seat.id}", lambda: adm.retry(seat, now=self.t))
        if isinstance(r, NotYourSeat):
            self.res.calls["retry: not your seat"] += 1
            self.check("retry: another pod cannot spend a live seat's retry", before.left == after.left,
                       f"{seat.id}: {before.left} -> {after.left}")
            return r
        if isinstance(r, Unavailable) and lost:
            # the reply was lost: the count beside the intent says whether the server applied it
            self.res.calls["retry reply lost"] += 1
            now_count = self.retries_of(seat.id)
            self.check("lost-replies: a lost retry is read back and spent once",
                       now_count == was + 1 and before.left[BORROWED] - after.left[BORROWED] == 1,
                       f"{seat.id}: intent retries {was} -> {now_count}, borrowed retriesLeft "
                       f"{before.left[BORROWED]} -> {after.left[BORROWED]}")
            return r
        if isinstance(r, Exception):
            raise r
        self.res.calls[f"retry: {r.decision}"] += 1
        spent = 1 if r.decision == "retry_same_plane" else 0
        self.check("retry: spends one token of its own plane",
                   r.plane == seat.pool and before.left[BORROWED] - after.left[BORROWED] == spent
                   and r.retries == was + spent,
                   f"{seat.id}: {r} borrowed retriesLeft {before.left[BORROWED]} -> {after.left[BORROWED]}, "
                   f"intent retries {was} -> {r.retries}")
        return r

    def retries_of(self, rid: str) -> int:
        return int(self.client.hget(f"adm:{{{self.mesh}}}:intent:{rid}", "retries") or 0)

    def bind(self, adm: Admission, rid: str, rev: int, label: str = "bind") -> Any:
        b, _, _ = self.around(f"bind {rid} r{rev}", lambda: adm.bind(rid, rev, now=self.t))
        if isinstance(b, Exception):
            raise b
        self.res.calls[f"{label}: {b.decision}"] += 1
        return b

    def advance_rev(self, adm: Admission, rid: str, rev: int) -> None:
        b, _, _ = self.around(f"advance {rid} r{rev}", lambda: adm.advance(rid, rev, now=self.t))
        if isinstance(b, Exception):
            raise b
        self.res.calls["advance"] += 1

    def release(self, adm: Admission, seat: Seat) -> None:
        out, _, _ = self.around(f"release {seat.id}", lambda: adm.release(seat, outcome="clean", seconds=1,
                                                                           now=self.t))
        if isinstance(out, Exception):
            raise out

    def expect(self, name: str, d: Decision | None, reasons: Sequence[str], rid: str) -> None:
        got = d.reason if d is not None else "(none)"
        self.check(name, d is not None and got in reasons and not d.admitted,
                   f"intent {rid}: expected {'/'.join(reasons)}, got {got}"
                   + (" (admitted)" if d is not None and d.admitted else ""))

    # -- the run ---------------------------------------------------------------------------------
    def setup(self) -> None:
        stale = list(self.client.scan_iter(match=f"adm:{{{self.mesh}}}:*", count=1000))
        if stale:  # the report's own throw-away mesh, from an earlier run on this server
            self.client.delete(*stale)
        self.pod("sampler").apply_policy(fence_policy(), recovery_hold=False, now=self.t)
        self.sample(PRIMARY)
        primary = self.pod("pod-p")
        self.live.append(primary)
        held = SEED_ESTIMATE if self.fault == "primary-saturation" else PRIMARY_HELD
        for i in range(held):
            d = primary.try_admit(lane=LANES[i % 2], model=PRIMARY, round_id=f"P{i}", now=self.t, draw=0.0,
                                  alternatives=[])
            if not d.admitted:
                raise RuntimeError(f"setup: primary round P{i} refused ({d.reason})")
            self.primary_seats.append(d.seat)
        if self.fault == "primary-saturation":  # a full primary with waiters below its depth limit
            self.base_waiters = DEPTH_LIMIT[PRIMARY] - 2
            for i in range(self.base_waiters):
                d = primary.try_admit(lane="b", model=PRIMARY, round_id=f"PW{i}", now=self.t, draw=0.0,
                                      alternatives=[], wait=True)
                if d.admitted:
                    raise RuntimeError("setup: the primary is not full")

    def run(self, progress: Any) -> FaultResult:
        started = time.perf_counter()
        self.setup()
        every = self.fault == "redis-unreachable"
        for i in range(self.n):
            self.t += STEP
            self.beat()
            injected = every or self.rng.random() < self.share or (self.fault == "stale-borrowed-health" and i == 0)
            self.res.intents += 1
            self.res.injected += injected
            self.injected = injected
            getattr(self, "intent_" + self.fault.replace("-", "_"))(i, f"I{i}", injected)
            progress.update(1)
        self.finish()
        self.res.seconds = time.perf_counter() - started
        return self.res

    def finish(self) -> None:
        self.t += STEP
        if self.fault == "lost-replies":
            self.probe_resent_retry()
        report = doctor.check(self.client, self.mesh)
        self.check("doctor: the counts agree with the records", report.ok,
                   lambda: doctor.render(report, self.mesh))

    def probe_resent_retry(self) -> None:
        """Outside the counts: what a caller that re-sends a retry after a lost reply gets (a note)."""
        self.housekeeping()
        lossy = self.pod("pod-l", LossyRedis(self.client))
        d = lossy.try_admit(lane="a", model=PRIMARY, round_id="probe", borrow=BORROWED, now=self.t, draw=0.0)
        if not d.admitted:
            return
        before = self.state()
        lossy.redis.armed.add("retry")
        with contextlib.suppress(Unavailable):
            lossy.retry(d.seat, now=self.t, attempt="a1")
        r = lossy.retry(d.seat, now=self.t, attempt="a1")  # re-sent with its attempt key
        after = self.state()
        spent = before.left[BORROWED] - after.left[BORROWED]
        self.check("probe: a retry re-sent with its attempt key after a lost reply spends once",
                   spent == 1 and r.retries == 1, f"{spent:g} tokens spent, intent retries {r.retries}")
        self.res.notes.append(f"probe: a retry re-sent after its reply was lost (same attempt key) spent "
                              f"{spent:g} token (retries {r.retries})")
        self.check("probe: the re-sent retry left the primary untouched",
                   unchanged(before.primary, after.primary) and before.left[PRIMARY] == after.left[PRIMARY],
                   lambda: self.diff(before, after), invariant=True)
        lossy.release(d.seat, outcome="clean", seconds=1, now=self.t)

    def housekeeping(self, *, borrowed_sample: bool = True) -> None:
        """Before each intent: the sampler, and the primary pod at work on its own plane."""
        self.sample(PRIMARY)
        if borrowed_sample:
            self.sample(BORROWED)
        if self.primary_seats and self.rng.random() < PRIMARY_RETRY_P:
            r = self.pod("pod-p").retry(self.rng.choice(self.primary_seats), now=self.t)
            self.res.calls[f"primary pod retry: {r.decision}"] += 1

    def baseline(self, rid: str, *, adm: Admission | None = None, rev: int | None = None) -> Decision:
        """A healthy borrow: admitted (most of the time), maybe retried once, bound, released."""
        adm = adm or self.pod("pod-a")
        d = self.ask(adm, rid, lane=self.rng.choice(LANES), rev=rev)
        if d.admitted:
            if self.rng.random() < BORROW_RETRY_P:
                self.retry(adm, d.seat)
            if rev is not None:
                self.bind(adm, rid, rev)
            self.release(adm, d.seat)
        return d

    # -- the faults ------------------------------------------------------------------------------
    def intent_stale_borrowed_health(self, i: int, rid: str, injected: bool) -> None:
        if not injected:
            self.housekeeping()
            self.baseline(rid)
            return
        variant = "absent" if i == 0 else self.rng.choice(("stalled", "down"))
        if variant == "stalled":  # the borrowed sampler stops: its last sample ages past the max age
            self.advance(HEALTH_MAX_AGE + self.rng.uniform(0.5, 10))
        self.housekeeping(borrowed_sample=False)
        if variant == "down":
            self.sample(BORROWED, ok=False)
        self.res.calls[f"injected: {variant}"] += 1
        d = self.ask(self.pod("pod-a"), rid, lane=self.rng.choice(LANES))
        self.expect("injected: reject_stale_borrowed_health", d, ("reject_stale_borrowed_health",), rid)

    def pick(self, *variants: str) -> str:
        """One way of injecting the fault, drawn from the run's seed and counted."""
        variant = self.rng.choice(variants)
        self.res.calls[f"injected: {variant}"] += 1
        return variant

    def intent_borrowed_depth(self, i: int, rid: str, injected: bool) -> None:
        self.housekeeping()
        if not injected:
            self.baseline(rid)
            return
        variant = self.pick("waiters", "sample")
        filler = self.pod("pod-q")
        seats, waiters = [], []
        if variant == "sample":
            self.sample(BORROWED, depth=DEPTH_LIMIT[BORROWED] + self.rng.randrange(3))
        else:  # another pod fills the borrowed pool and queues up to its depth limit there
            for k in range(SEED_ESTIMATE + 2):
                d = filler.try_admit(lane="b", model=BORROWED, round_id=f"Q{i}.{k}", now=self.t, draw=0.0,
                                     alternatives=[])
                if not d.admitted:
                    break
                seats.append(d.seat)
            for k in range(DEPTH_LIMIT[BORROWED]):
                d = filler.try_admit(lane="b", model=BORROWED, round_id=f"QW{i}.{k}", now=self.t, draw=0.0,
                                     alternatives=[], wait=True)
                if d.admitted:
                    seats.append(d.seat)
                else:
                    waiters.append(d.round_id)
        d = self.ask(self.pod("pod-a"), rid, lane=self.rng.choice(LANES))
        self.expect("injected: shed_borrowed_depth", d, ("shed_borrowed_depth",), rid)
        for w in waiters:  # undo: the waiters give up, the filler's rounds end
            filler._give_up(BORROWED, w)
        for s in seats:
            filler.release(s, outcome="clean", seconds=1, now=self.t)
        if variant == "sample":
            self.sample(BORROWED)

    def intent_primary_saturation(self, i: int, rid: str, injected: bool) -> None:
        self.housekeeping()
        if not injected:
            self.baseline(rid)
            return
        variant = self.pick("waiters", "sample")
        primary, extra = self.pod("pod-p"), []
        if variant == "sample":
            self.sample(PRIMARY, depth=DEPTH_LIMIT[PRIMARY] + self.rng.randrange(3))
        else:
            for k in range(DEPTH_LIMIT[PRIMARY] - self.base_waiters):
                d = primary.try_admit(lane="a", model=PRIMARY, round_id=f"PX{i}.{k}", now=self.t, draw=0.0,
                                      alternatives=[], wait=True)
                if d.admitted:
                    raise RuntimeError(f"primary-saturation: the primary admitted PX{i}.{k}")
                extra.append(d.round_id)
        d = self.ask(self.pod("pod-a"), rid, lane=self.rng.choice(LANES))
        self.expect("injected: reject_primary_depth", d, ("reject_primary_depth",), rid)
        for w in extra:
            primary._give_up(PRIMARY, w)
        if variant == "sample":
            self.sample(PRIMARY)

    def intent_late_score(self, i: int, rid: str, injected: bool) -> None:
        self.housekeeping()
        rev = self.rng.randint(1, 9)
        adm = self.pod("pod-a")
        if not injected:
            self.baseline(rid, rev=rev)
            return
        variant = self.pick("late-bind", "after-stale-shed", "after-fence-shed")
        if variant == "late-bind":  # admitted for R; the fixture moves to R+1; the score for R arrives
            d = self.ask(adm, rid, lane=self.rng.choice(LANES), rev=rev)
            if not d.admitted:
                return
            self.advance_rev(adm, rid, rev + 1)
            b = self.bind(adm, rid, rev)
            self.check("late-score: a late score for R after R+1 is rejected", b.decision == "reject_stale_revision",
                       f"intent {rid}: bind r{rev} after advance r{rev + 1} -> {b.decision}")
            self.release(adm, d.seat)  # compensated inside the borrowed plane
        elif variant == "after-stale-shed":  # the intent moved to R+1 before the borrow for R was asked
            self.advance_rev(adm, rid, rev + 1)
            d = self.ask(adm, rid, lane=self.rng.choice(LANES), rev=rev)
            self.expect("injected: reject_stale_revision", d, ("reject_stale_revision",), rid)
            b = self.bind(adm, rid, rev)
            self.check("late-score: a late score after a stale-revision shed is rejected",
                       b.decision == "reject_stale_revision", f"intent {rid}: bind r{rev} -> {b.decision}")
        else:  # the fence shed the borrow (its plane did not answer); a score for R arrives anyway
            self.sample(BORROWED, ok=False)
            d = self.ask(adm, rid, lane=self.rng.choice(LANES), rev=rev)
            self.expect("injected: reject_stale_borrowed_health", d, ("reject_stale_borrowed_health",), rid)
            b = self.bind(adm, rid, rev, "late score after a fence shed")  # the primary must not change (checked)
            self.check("late-score: a late score after a fence shed binds nothing",
                       b.decision == "reject_not_admitted", f"intent {rid}: bind r{rev} -> {b.decision}")
            self.sample(BORROWED)

    def intent_redis_unreachable(self, i: int, rid: str, injected: bool) -> None:
        self.housekeeping()  # through the reachable server: the primary at work meanwhile
        dead = self.pods.get("pod-dead") or self.pods.setdefault(
            "pod-dead", Admission.from_url(self.closed_url, mesh=self.mesh, pod="pod-dead", background=False,
                                           seed=self.rng.randrange(2 ** 31)))
        d = self.ask(dead, rid, lane=self.rng.choice(LANES))
        self.check("injected: admission-unavailable, never an admit", not d.admitted and d.reason == UNAVAILABLE,
                   f"intent {rid}: {d.reason} admitted={d.admitted}")

    def intent_lost_replies(self, i: int, rid: str, injected: bool) -> None:
        self.housekeeping()
        lossy = self.pods.get("pod-l") or self.pod("pod-l", LossyRedis(self.client))
        if not injected:
            self.baseline(rid, adm=lossy)
            return
        variant = self.rng.choice(("admit", "retry", "both"))
        shed = self.rng.random() < 1 / 3  # a third of them: the reply of a shed is lost
        self.res.calls[f"injected: lost {variant}" + (" (of a shed)" if shed else "")] += 1
        if shed:
            self.sample(BORROWED, ok=False)
        lane = self.rng.choice(LANES)
        lose_admit = variant in ("admit", "both")
        d = self.ask(lossy, rid, lane=lane, lost_admit=lose_admit)
        if lose_admit:
            self.res.calls["admit reply lost"] += 1
            server = self.applied(rid)
            seq = int(lossy.redis.lost_reply[4])
            self.check("lost-replies: the client sees a shed, never an admit",
                       not d.admitted and d.reason == UNAVAILABLE, f"intent {rid}: {d.reason}")
            d = self.ask(lossy, rid, lane=lane, first=False)  # asked again, same round id
            self.res.calls[f"re-ask: {d.reason}"] += 1
            same = (d.admitted and d.reason == "same-intent" and d.seat.seq == seq) if server[0] \
                else (not d.admitted and d.reason == server[1])
            running = int(self.client.hget(f"adm:{{{self.mesh}}}:pool:{BORROWED}", "running") or 0)
            self.check("lost-replies: asked again, the intent is decided once", same and running <= 1,
                       f"intent {rid}: server decided {server}, re-ask -> {d.reason} seq "
                       f"{d.seat.seq if d.seat else '-'}, borrowed running {running}")
            if shed:  # the plane answers again, but the intent's refusal stands while it lives
                self.sample(BORROWED)
                again = self.ask(lossy, rid, lane=lane, first=False)
                self.check("lost-replies: a refusal stands for the intent (decision_ttl)",
                           not again.admitted and again.reason == server[1],
                           f"intent {rid}: {server[1]} then {again.reason}")
        if shed:
            self.sample(BORROWED)
        if not d.admitted:
            return
        self.retry(lossy, d.seat, lost=variant in ("retry", "both"))
        self.release(lossy, d.seat)

    def intent_pod_killed(self, i: int, rid: str, injected: bool) -> None:
        self.housekeeping()
        if not injected:
            self.baseline(rid)
            return
        lane = self.rng.choice(LANES)
        doomed = self.fresh_pod("pod-k")
        d = self.ask(doomed, rid, lane=lane)
        if not d.admitted:
            self.res.calls["killed: nothing admitted to kill"] += 1
            return
        first = self.retry(doomed, d.seat)
        del self.pods["pod-k"]  # the pod dies: no release, no heartbeat
        variant = self.rng.choice(("restarted", "other-pod"))
        self.res.calls[f"injected: {variant}"] += 1
        if variant == "restarted":  # the same pod name, a new process: it asks again, same intent
            pod = self.fresh_pod("pod-k")
            d2 = self.ask(pod, rid, lane=lane, first=False)
            self.res.calls[f"re-ask: {d2.reason}"] += 1
        else:  # another pod asks again: the seat is the dead pod's until its lease lapses
            pod = self.pod("pod-b")
            d2 = self.ask(pod, rid, lane=lane, first=False)
            self.res.calls[f"re-ask: {d2.reason}"] += 1
            if d2.admitted and d2.seat.pod != pod.pod:
                self.retry(pod, d2.seat)  # NotYourSeat: nothing spent
            self.advance(LEASE_TTL + STEP)  # the dead pod's lease lapses (the live pods renew theirs)
            self.housekeeping()
            d2 = self.ask(pod, rid, lane=lane, first=False)
            self.res.calls[f"re-ask after the lease: {d2.reason}"] += 1
        if not (d2.admitted and d2.seat.pod == pod.pod):
            self.check("pod-killed: the intent goes on from another process", False,
                       f"intent {rid} ({variant}): re-ask -> {d2.reason} held by {d2.seat.pod if d2.seat else '-'}")
            return
        r = self.retry(pod, d2.seat)
        want = first.retries + (r.decision == "retry_same_plane")
        self.check("pod-killed: the retry count survives the pod", r.retries == want,
                   f"intent {rid} ({variant}): the dead pod's retry left {first.retries}, the next one "
                   f"({r.decision}) says {r.retries}")
        self.release(pod, d2.seat)


# -- the whole report ------------------------------------------------------------------------------


def default_engine() -> str:
    return "redis" if find_server("redis") else "valkey" if find_server("valkey") else "fakeredis"


@contextlib.contextmanager
def _server(engine: str | None, url: str | None, client: Any) -> Iterator[tuple[Any, str, bool]]:
    """(client, description, real server?)"""
    if client is not None:
        fake = type(client).__module__.startswith("fakeredis")
        yield client, "fakeredis (given)" if fake else "a given client", not fake
        return
    if url:
        c = redis.Redis.from_url(url, **fail_fast_options(1.0, 10.0))
        info = c.info("server")
        name = "valkey" if "valkey_version" in info else "redis"
        yield c, f"{name} {info.get('valkey_version') or info.get('redis_version')} at {url}", True
        return
    engine = engine or default_engine()
    if engine == "fakeredis":
        import fakeredis

        yield (fakeredis.FakeRedis(server=fakeredis.FakeServer()),
               f"fakeredis {getattr(fakeredis, '__version__', '?')}", False)
        return
    with LocalServer(engine) as srv:
        c = redis.Redis.from_url(srv.url, **fail_fast_options(1.0, 10.0))
        try:
            yield c, f"{engine} {srv.version} (embedded, started for this run)", True
        finally:
            c.close()


def run(intents: int, seed: int, *, engine: str | None = None, url: str | None = None, client: Any = None,
        faults: Sequence[str] = FAULTS, share: float = DEFAULT_SHARE, progress: bool | None = False) -> dict[str, Any]:
    """Run the report; returns it as a dict (``ok``: every check held in every case)."""
    if intents < 1:
        raise ValueError("intents must be >= 1")
    if not 0 < share <= 1:
        raise ValueError("share must be in (0, 1]")
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(FAULTS)}")
    started = time.perf_counter()
    results: list[FaultResult] = []
    with (_server(engine, url, client) as (c, desc, real),
          progress_bar(intents * len(faults), progress, unit="intent", desc="fence-report") as bar):
        closed_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
        for k, fault in enumerate(faults):
            bar.set_postfix_str(fault)
            rng = random.Random(f"{seed}/{fault}")  # each fault its own seeded stream
            results.append(FaultRun(c, fault, intents, rng, share=share, dump=real,
                                    closed_url=closed_url).run(bar))
    seconds = time.perf_counter() - started
    return {"intents": intents, "seed": seed, "share": share, "server": desc,
            "comparison": "DUMP + PTTL of each primary key" if real else "HGETALL/ZRANGE + PTTL of each primary key",
            "python": platform.python_version(), "machine": f"{platform.machine()} {_cpus()} cpu",
            "seconds": round(seconds, 2), "faults": [r.as_dict() for r in results],
            "ok": all(r.ok for r in results)}


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 0)


# -- printing ----------------------------------------------------------------------------------------


def _reasons(r: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in r["reasons"].items())


def render(report: dict[str, Any], markdown: bool = False) -> str:
    title = (f"admission fence-report — {report['intents']:,} intents per fault, seed {report['seed']}, "
             f"injected share {report['share']:g} (redis-unreachable: all); {report['server']}; "
             f"Python {report['python']}, {report['machine']}; {report['seconds']:.1f} s")
    head = ["fault", "intents", "injected", "admitted", "shed", "shed/100 intents", "shed/100 injected",
            "primary unchanged on shed", "decisions by reason"]
    rows = []
    for f in report["faults"]:
        inv = f["invariant"]
        mark = "✓" if inv["ok"] else "✗"
        rows.append([f["fault"], f"{f['intents']:,}", f"{f['injected']:,}", f"{f['admitted']:,}", f"{f['shed']:,}",
                     f"{f['shedPer100']:.1f}", f"{f['shedPer100Injected']:.1f}",
                     f"{inv['held']:,}/{inv['cases']:,} {mark}", _reasons(f)])
    out = [("**" + title + "**") if markdown else title, ""]
    out += _table(head, rows, markdown, right={1, 2, 3, 4, 5, 6, 7})
    out += ["", "**checks** (held/cases)" if markdown else "checks (held/cases):", ""]
    chead = ["fault", "check", "held/cases"]
    crows = []
    for f in report["faults"]:
        for name, c in f["checks"].items():
            crows.append([f["fault"], name, f"{c['held']:,}/{c['cases']:,} {'✓' if c['ok'] else '✗'}"])
    out += _table(chead, crows, markdown, right={2})
    calls = [[f["fault"], ", ".join(f"{k} {v:,}" for k, v in f["calls"].items())] for f in report["faults"]]
    out += ["", "**calls and injections**" if markdown else "calls and injections:", ""]
    out += _table(["fault", "counts"], calls, markdown, right=set())
    failed = [(f["fault"], name) for f in report["faults"] for name, c in f["checks"].items() if not c["ok"]]
    out.append("")
    if failed:
        out.append("FAILED: " + "; ".join(f"{fault}: {name}" for fault, name in failed))
        for f in report["faults"]:
            out += [f"  {d}" for d in f["failures"]]
    else:
        out.append("every check held in every case: the primary was unchanged across every shed borrow")
    for f in report["faults"]:
        out += [("- " if markdown else "") + f"note ({f['fault']}): {n}" for n in f["notes"]]
    return "\n".join(out)


def _table(head: list[str], rows: list[list[str]], markdown: bool, right: set[int]) -> list[str]:
    if markdown:
        return (["| " + " | ".join(head) + " |", "|" + "|".join("---:" if i in right else "---"
                                                               for i in range(len(head))) + "|"]
                + ["| " + " | ".join(r) + " |" for r in rows])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]

    def line(r: list[str]) -> str:
        cells = [(str(x).rjust(w) if i in right else str(x).ljust(w)) for i, (x, w) in enumerate(zip(r, widths))]
        return "  ".join(cells).rstrip()

    return [line(head)] + [line(r) for r in rows]


# -- the command -------------------------------------------------------------------------------------


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
                       description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
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
                                           description=__doc__.split("\n\n")[0]))
    return run_cli(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
