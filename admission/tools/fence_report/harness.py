"""One fault on one mesh: the plumbing every fault uses (pods, the caller clock, the samplers,
the invariant's snapshots around each call) and the run of its intents; the faults' own intents
are FaultRun's (faults.py)."""
from __future__ import annotations

import contextlib
import functools
import random
import time
from typing import Any, Callable, Sequence

from ... import doctor
from ...client import Admission
from ...core import Decision, Seat, mesh_key
from ...errors import NotYourSeat, Unavailable
from .clients import LossyRedis, State
from .planes import (BORROW_RETRY_P, BORROWED, DEPTH_LIMIT, LANES, LEASE_TTL, MAX_DETAILS, PRIMARY, PRIMARY_HELD,
                     PRIMARY_RETRY_P, SEED_ESTIMATE, SHED_REASONS, STEP, T0, fence_policy, unchanged)
from .results import Check, FaultResult


# -- one fault on one mesh -------------------------------------------------------------------------


class FaultHarness:
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
        k = functools.partial(mesh_key, self.mesh)
        self.primary_keys = [k("pool", PRIMARY), k("lanes", PRIMARY), k("plane", PRIMARY),
                             k("pinned", PRIMARY), *(k("wait", PRIMARY, lane) for lane in LANES)]
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
        pools = {row["pool"]: row for row in self.pod("sampler").ops.census(now=self.t)["pools"]}
        left = {p: (pools.get(p) or {}).get("plane", {}).get("retriesLeft") for p in (PRIMARY, BORROWED)}
        return State(primary, left)

    def diff(self, before: State, after: State) -> str:
        prefix = mesh_key(self.mesh, "")
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
        return int(self.client.hget(mesh_key(self.mesh, "intent", rid), "retries") or 0)

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
        stale = list(self.client.scan_iter(match=mesh_key(self.mesh, "*"), count=1000))
        if stale:  # the report's own throw-away mesh, from an earlier run on this server
            self.client.delete(*stale)
        self.pod("sampler").ops.apply_policy(fence_policy(), recovery_hold=False, now=self.t)
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
