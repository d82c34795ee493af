"""Stateful model test, distributed: two or three pods, each an `Admission` with its own Redis
connection and its own book, interleave their calls on one mesh while leases lapse, pods restart
and the server restarts (docs/design.md §3, §5, §10; issue 12).

A hypothesis RuleBasedStateMachine drives the pods over the mesh of tests/test_invariants.py (two
pools, three lanes, a caller clock, injected draws); each step draws which pod does what, so the
steps of different pods interleave arbitrarily:
  * admits (try / wait), re-asks of a waiter (also moving it), an admit whose reply was lost and
    is retried, a pod asking with a round id another pod holds (the work item moved), releases
    with every load outcome, retried releases, mid-round reports, heartbeats and ticks of one pod;
  * the clock jumps past `lease_ttl` for the pods that did not heartbeat; a tick sweeps their
    leases; a late heartbeat of such a pod re-asserts the seats it still runs (heartbeat.lua);
  * a pod restarts: its `Admission` and its book are dropped, a new one starts under a new name
    or the same name; the old pod's seats and tickets are nobody's and must lapse and be swept;
  * the server restarts: on Redis and Valkey a dedicated server with AOF (`appendfsync always`)
    is killed (SIGKILL) and started again, either as it was (nothing lost: every key identical)
    or after FUNCTION FLUSH and FLUSHALL, which the AOF keeps, so it comes back empty and without
    the library, as a server without persistence does; on fakeredis the wipe is FLUSHALL. After a wipe the operator
    re-applies the policy (at once or later; the pods meet NoPolicy meanwhile), which starts the
    recovery hold, and may apply it again; the pods' heartbeats re-assert their seats.

The machine keeps a model of every pod's book (seats, waiters and whether the server has their
place) and predicts every answer from the state read just before the call. After every step:
  * the doctor finds nothing and the counts equal the records per pool and lane (check_counts);
  * every pod's book (`Admission._book`) equals the model; a placed waiter's place is the server's;
  * every seat and ticket in Redis is held by a live pod's book or was left by a dropped pod;
  * the `admitted|…` totals equal the admissions the model counted since the last wipe and each
    pool's `seq` the model's: a re-asserted seat is not an admission;
  * per call: running passes slots only by an overdraft, a re-assertion or a decrease;
  * every decision made on a state read just before it (no lease lapsed, no live seat of the id,
    no hold) is the one the lane rules give, recomputed in Python (decision_of: oldest first,
    floors, overdraft, reserved, fair share, full, the draw), and every new admission also
    passes check_rule of tests/test_invariants.py; during the recovery hold nothing new is
    admitted (`recovering`), after it the hold never refuses;
  * after every lease lapsed and a tick swept, everything is zero.
"""
from __future__ import annotations

import dataclasses
import os
import signal
from collections import Counter

import fakeredis
import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from admission import Admission, NoPolicy, NotYourSeat, Status, UnknownSeat
from admission.client import fail_fast_options
from admission.codes import ADMIT_REASONS, REFUSE_REASONS
from admission.core import Seat
from admission.policy import TUNABLES
from admission.tools.servers import LocalServer
from admission.waiting import UNPLACED

from figures import record
from helpers import snapshot
from test_invariants import (HOT_POOL, LANE_CFG, LANES, LEASE_TTL, MESH, OUTCOMES, POLICY, POOLS, PREFIX, SIGNALS,
                             T0, _hash, _int, _s, check_counts, check_rule, check_zero, guaranteed, read_state)
from test_invariants import _pods as two_pods

SLOTS = ("pod-a", "pod-b", "pod-c")
HOLD = LEASE_TTL / 3 + 1  # the recovery hold after a policy is applied to a wiped mesh
MAX_SERVER_RESTARTS = 1   # per example: a real restart costs ~0.1 s
AOF = ["--appendonly", "yes", "--appendfsync", "always"]
# Reproducible in CI (derandomized, fixed sizes): about 4 s per engine on a 2-core machine, the
# file about 12 s (up to ~20 s when the machine is busy). A real server answers each step more
# slowly (round trips, an fsync per write, the restarts), so it runs fewer examples.
EXAMPLES = {"fakeredis": 20, "redis": 15, "valkey": 15}


def settings_for(engine: str) -> settings:
    return settings(max_examples=EXAMPLES[engine], stateful_step_count=50, deadline=None, database=None,
                    derandomize=True, print_blob=True, suppress_health_check=[HealthCheck.too_slow])


def slots_of(pool_hash: dict) -> int:
    return max(1, int(float(pool_hash.get("est") or POLICY["tunables"]["seed_estimate"])))


# ---------------------------------------------------------------------------------------------
# docs/design.md §5.3–5.8 in Python: the whole decision (refusals too) on one pool, from the state
# read just before the admit (no budget, closure or pause in this policy; the hold is checked apart)

HIGH_FREE = TUNABLES["high_free"][0]
MAX_WEIGHT = max(w for _, w, _ in LANE_CFG.values())


def p_phi(phi: float) -> float:
    if phi >= HIGH_FREE:
        return 1.0
    if phi <= 0:
        return 0.0
    x = phi / HIGH_FREE
    return x * x * (3 - 2 * x)


def decision_of(before: dict, pool: str, lane: str, rid: str, u: float) -> tuple[bool, str] | None:
    """(admitted, reason) the lane rules give; None when the draw is too close to p(φ) to call."""
    lanes, p = before["lanes"][pool], before["pools"][pool]
    run = {l: _int(lanes, l) for l in LANES}
    wait = {l: _int(lanes, l + "|w") for l in LANES}
    est = float(p.get("est") or POLICY["tunables"]["seed_estimate"])
    C, running = max(1, int(est)), _int(p, "running")
    free = C - running
    _, weight, priority = LANE_CFG[lane]
    if wait[lane] > 0 and before["wait"][(pool, lane)][0] != rid:  # 3. oldest first
        return False, "behind-older"
    g = guaranteed(run, wait, C, lane)
    if run[lane] < g[lane]:  # 4. within floor; overdraft only on a pool never measured
        if free > 0:
            return True, "within-floor"
        return (True, "overdraft") if _int(p, "exhausted") != 1 else (False, "full")
    others = [l for l in LANES if l != lane and wait[l] > 0]
    owed = sum(max(0, g[l] - run[l]) for l in others)
    if owed > 0 and free <= owed:  # 5. reserved for lanes below their floors
        return False, "reserved"
    mine = (run[lane] - g[lane]) / weight  # 7. fair share among the lanes with work waiting
    for l in others:
        theirs = max(0, run[l] - g[l]) / LANE_CFG[l][1]
        if theirs < mine - 1e-12 or (abs(theirs - mine) <= 1e-12 and LANE_CFG[l][2] > priority):
            return False, "fair-share"
    if free <= 0:  # 8. a borrow never passes the slots
        return False, "full"
    prob = p_phi(1 - running / est) ** min(4, max(1, MAX_WEIGHT / weight))
    if abs(u - prob) < 1e-9:
        return None
    return (True, "borrowed") if u < prob else (False, "draw")


# ---------------------------------------------------------------------------------------------
# Where the pods run: one fakeredis server, or a dedicated real server that can restart


class FakeWorld:
    real = False

    def __init__(self):
        self.server = fakeredis.FakeServer()

    def client(self):
        return fakeredis.FakeRedis(server=self.server)

    pod_client = client

    def reset(self, obs) -> None:
        obs.flushall()

    def restart(self, obs, persist: bool) -> None:
        assert not persist
        obs.function_flush()
        obs.flushall()


class RealWorld:
    real = True

    def __init__(self, srv: LocalServer):
        self.srv = srv

    def client(self):
        return redis.Redis.from_url(self.srv.url)

    def pod_client(self):
        # a pod's client as from_url makes it (one quick retry: a connection a restart broke
        # reconnects once), with timeouts a busy 2-core CI machine cannot hit by accident
        return redis.Redis.from_url(self.srv.url, **fail_fast_options(2.0, 5.0))

    def reset(self, obs) -> None:
        obs.flushall()

    def restart(self, obs, persist: bool) -> None:
        if not persist:  # the AOF keeps the flushes: the server comes back empty, no library
            obs.function_flush()
            obs.flushall()
        os.kill(self.srv.pid, signal.SIGKILL)  # a crash: no shutdown, no last save
        self.srv.restart()


# ---------------------------------------------------------------------------------------------
# One pod process: its Admission (and so its book) and its own connection


@dataclasses.dataclass
class Pod:
    slot: str
    name: str
    client: object
    adm: Admission
    seats: dict = dataclasses.field(default_factory=dict)     # model of the book: rid -> Seat
    waiters: dict = dataclasses.field(default_factory=dict)   # rid -> [lane, pool, placed]
    released: list = dataclasses.field(default_factory=list)  # seats it released (for retries)


class DistributedMachine(RuleBasedStateMachine):
    world = None  # set by the test

    def __init__(self):
        super().__init__()
        self.obs = self.world.client()  # the observer: reads only (and the wipes)
        self.world.reset(self.obs)
        self.pods: dict[str, Pod] = {}
        self.now = T0
        self.n = 0
        self.gen = 0
        self.policy = True
        self.hold_until = 0.0
        self.seq = {p: 0 for p in POOLS}    # each pool's admission sequence (model)
        self.admitted: Counter = Counter()   # (pool, lane, reason) -> new admissions since the last wipe
        self.orphans: set[str] = set()       # seats and tickets of dropped pods
        self.restarts = 0                     # of the server, this example
        self._cached: dict | None = None      # the state the invariant read after the last step

    # -- set-up --------------------------------------------------------------------------------
    @initialize(n=st.integers(2, 3))
    def start_pods(self, n):
        for i, slot in enumerate(SLOTS[:n]):
            self.pods[slot] = self._new_pod(slot, slot, seed=i)
        self.pods[SLOTS[0]].adm.ops.apply_policy(POLICY, recovery_hold=False)

    def _new_pod(self, slot: str, name: str, seed: int) -> Pod:
        client = self.world.pod_client()
        return Pod(slot, name, client, Admission(client, mesh=MESH, pod=name, background=False, seed=seed))

    def _pick(self, data, label="pod", where=None) -> Pod:
        slots = sorted(s for s, p in self.pods.items() if where is None or where(p))
        return self.pods[data.draw(st.sampled_from(slots), label=label)]

    # -- reading ---------------------------------------------------------------------------------
    def _gone(self, rid: str) -> tuple[str, int, str] | None:
        raw = self.obs.get(PREFIX + "gone:" + rid)
        if raw is None:
            return None
        state, seq, pod = _s(raw).split("|")[:3]
        return state, int(seq), pod

    def _read(self) -> dict:
        """The state before this step's first call: what the invariant read after the last step
        (nothing ran since), else a fresh read."""
        st_, self._cached = self._cached, None
        return st_ if st_ is not None else read_state(self.obs)

    def _expired(self) -> int:
        pipe = self.obs.pipeline(transaction=False)
        pipe.zcount(PREFIX + "seats", "-inf", self.now)
        pipe.zcount(PREFIX + "tickets", "-inf", self.now)
        return sum(pipe.execute())

    def _levels(self, st_: dict | None = None) -> dict[str, tuple[int, int]]:
        """Each pool's running and slots, from a state read or read now."""
        if st_ is not None:
            return {p: (_int(st_["pools"][p], "running"), slots_of(st_["pools"][p])) for p in POOLS}
        pipe = self.obs.pipeline(transaction=False)
        for p in POOLS:
            pipe.hgetall(PREFIX + "pool:" + p)
        out = {}
        for p, raw in zip(POOLS, pipe.execute()):
            h = {_s(k): _s(v) for k, v in raw.items()}
            out[p] = (_int(h, "running"), slots_of(h))
        return out

    def _check_excess(self, before, over: Counter = Counter(), reasserted: Counter = Counter()) -> None:
        """Running passes slots only by an overdraft, a re-assertion or a decrease (fewer slots)."""
        after = self._levels()
        for p in POOLS:
            (r0, s0), (r1, s1) = before[p], after[p]
            allowed = max(0, r0 - s0) + over[p] + reasserted[p] + max(0, s0 - s1)
            assert r1 - s1 <= allowed, f"{p}: running {r1} on {s1} slots (before {r0} on {s0}), unexplained"

    def _owner_says(self, pod: Pod, seat: Seat, st_: dict):
        """What release/report find for this seat: 'live', or the error, or the tombstone."""
        s = st_["seats"].get(seat.id)
        if s is not None:
            return "live" if (s["pod"], int(s["seq"])) == (pod.name, seat.seq) else NotYourSeat
        gone = self._gone(seat.id)
        if gone is None:
            return UnknownSeat
        if (gone[2], gone[1]) != (pod.name, seat.seq):
            return NotYourSeat
        return gone[0]  # released | expired

    # -- one admit, its answer predicted ---------------------------------------------------------
    def _admit(self, pod: Pod, lane: str, pool: str, rid: str, wait: bool, draw: float, lost_reply=False):
        exact = not self._expired()  # the admit's own sweep cannot change what it reads
        before = self._read()
        levels = self._levels(before)
        seat_before = before["seats"].get(rid)
        if lost_reply:  # the server applies it, the pod never hears: its book is unchanged
            d = pod.adm._exec(pod.adm.core.admit(lane=lane, model=pool, round_id=rid, now=self.now, draw=draw,
                                                 wait=wait, alternatives=()))
        else:
            d = pod.adm.try_admit(lane=lane, model=pool, round_id=rid, now=self.now, draw=draw, wait=wait)
        assert d.reason in ADMIT_REASONS + REFUSE_REASONS, d
        holding = self.now < self.hold_until
        if exact and seat_before is None and holding:
            assert (d.admitted, d.reason) == (False, "recovering"), f"admitted during the recovery hold: {d}"
        elif exact and seat_before is None:
            expected = decision_of(before, pool, lane, rid, draw)
            assert expected is None or (d.admitted, d.reason) == expected, (d, expected)
        if not holding:
            assert d.reason != "recovering", (d, self.now, self.hold_until)
        over = Counter()
        if d.admitted:
            if d.reason == "same-intent":
                assert seat_before is not None, f"same-intent for {rid} without a live seat"
                assert (d.pool, d.lane, d.seat.seq, d.seat.pod) == (
                    seat_before["pool"], seat_before["lane"], int(seat_before["seq"]), seat_before["pod"])
            else:
                assert seat_before is None or not exact, f"{rid} admitted twice: live seat {seat_before}"
                assert not holding, f"{rid} admitted by {d.reason} during the recovery hold"
                assert d.pool == pool and d.seat.pod == pod.name
                self.admitted[(pool, lane, d.reason)] += 1
                assert d.seat.seq == self.seq[pool] + 1, (d.seat, self.seq)  # one admission, one seq
                self.seq[pool] = d.seat.seq
                seat = _hash(self.obs, PREFIX + "seat:" + rid)
                assert (seat["pool"], seat["lane"], seat["pod"], int(seat["seq"])) == (pool, lane, pod.name, d.seat.seq)
                assert self.obs.zscore(PREFIX + "seats", rid) == pytest.approx(self.now + LEASE_TTL)
                if d.running > d.slots:
                    assert d.reason == "overdraft", f"running {d.running} > slots {d.slots} by {d.reason}"
                if d.reason == "overdraft":
                    over[pool] += 1
                    assert before["pools"][pool].get("exhausted", "0") != "1", "overdraft on an exhausted pool"
                if exact:
                    check_rule(before, d, pool, lane, rid)
            assert not self.obs.exists(PREFIX + "ticket:" + rid), "a seated round keeps a ticket"
        else:
            assert d.seat is None
            if exact:
                assert seat_before is None, f"refused {rid} although its seat is live"
            if wait:
                t = _hash(self.obs, PREFIX + "ticket:" + rid)
                old = before["tickets"].get(rid)
                if old is not None and (old["pool"], old["lane"]) != (pool, lane):
                    old = None  # it moves here: a new place, this pod's
                assert (t["pool"], t["lane"]) == (pool, lane), (t, pool, lane)
                assert self.obs.zscore(PREFIX + "tickets", rid) == pytest.approx(self.now + LEASE_TTL)
                since = self.obs.zscore(PREFIX + f"wait:{pool}:{lane}", rid)
                assert d.waiting_since == pytest.approx(since, abs=1e-6) == pytest.approx(float(t["since"]), abs=1e-6)
                # a ticket already there keeps its place and its pod (when the round id waits on
                # another pod too, that pod's heartbeat renews it and this one's says it is lost)
                kept = old is not None and (t["pod"], float(t["since"])) == (old["pod"], float(old["since"]))
                if exact and old is not None:
                    assert kept, ("a waiter lost its place", old, t)
                if not kept:  # a new place, behind every waiter already there, this pod's
                    queue = self.obs.zrange(PREFIX + f"wait:{pool}:{lane}", 0, -1)
                    assert _s(queue[-1]) == rid and t["pod"] == pod.name, (rid, queue, t)
        self._check_excess(levels, over=over)
        if not lost_reply:
            self._book_decision(pod, d, lane, wait)
        return d

    def _book_decision(self, pod: Pod, d, lane: str, wait: bool) -> None:
        """What the pod's book must hold after this answer (base.py _note_decision)."""
        if d.admitted:
            pod.waiters.pop(d.round_id, None)
            if d.seat.pod == pod.name:
                pod.seats[d.round_id] = d.seat
        elif wait:
            pod.waiters[d.round_id] = [lane, d.pool, True]  # placed; moved when it asked elsewhere

    # -- one heartbeat, its answer predicted -----------------------------------------------------
    def _heartbeat(self, pod: Pod) -> None:
        st_ = self._read()
        levels = self._levels(st_)
        renewed, lost, reasserted = [], [], []
        for rid, seat in pod.seats.items():
            s = st_["seats"].get(rid)
            if s is not None:  # renewed, or another pod holds the round id now
                (renewed if (s["pod"], int(s["seq"])) == (pod.name, seat.seq) else lost).append(rid)
            elif (self._gone(rid) or ("",))[0] == "released":
                lost.append(rid)  # the round id ended (here or on the pod that took it over)
            else:
                reasserted.append(rid)  # swept under a live pod, or lost by the server: still running
        sent = [rid for rid, w in pod.waiters.items() if w[2]]
        kept = [rid for rid in sent if st_["tickets"].get(rid, {}).get("pod") == pod.name]
        if self.policy:
            hb = pod.adm.heartbeat(now=self.now)
        else:
            with pytest.raises(NoPolicy):
                pod.adm.heartbeat(now=self.now)
            assert read_state(self.obs) == st_, "a heartbeat without a policy changed the state"
            return
        assert sorted(hb.lost) == sorted(lost), (hb, lost)
        assert sorted(hb.reasserted) == sorted(reasserted), (hb, reasserted)
        assert sorted(hb.lost_tickets) == sorted(set(sent) - set(kept)), (hb, sent, kept)
        re_pools = Counter()
        for rid in renewed + reasserted:
            seat = pod.seats[rid]
            rec = _hash(self.obs, PREFIX + "seat:" + rid)
            assert (rec["pool"], rec["lane"], rec["pod"], int(rec["seq"])) == (seat.pool, seat.lane, pod.name, seat.seq)
            assert float(rec["at"]) == pytest.approx(seat.admitted_at)
            assert self.obs.zscore(PREFIX + "seats", rid) == pytest.approx(self.now + LEASE_TTL)
        for rid in reasserted:
            seat = pod.seats[rid]
            re_pools[seat.pool] += 1
            self.seq[seat.pool] = max(self.seq[seat.pool], seat.seq)  # kept past its seats, not bumped
            assert self._gone(rid) is None
        for rid in kept:
            assert self.obs.zscore(PREFIX + "tickets", rid) == pytest.approx(self.now + LEASE_TTL)
        for rid in lost:
            pod.seats.pop(rid)
        for rid in set(sent) - set(kept):
            pod.waiters[rid][2] = False  # the pod forgets its place: it must ask again
        self._check_excess(levels, reasserted=re_pools)

    def _tick(self, pod: Pod) -> None:
        self._cached = None
        expired = self._expired()
        levels = self._levels()
        t = pod.adm.tick(now=self.now)
        assert t.swept == expired, (t, expired)
        # nothing expired survives a tick (fewer than 100 leases here, the sweep limit)
        assert self.obs.zcount(PREFIX + "seats", "-inf", self.now) == 0
        assert self.obs.zcount(PREFIX + "tickets", "-inf", self.now) == 0
        self._check_excess(levels)

    # -- the steps -------------------------------------------------------------------------------
    # One rule draws which pod does what, weighted, among the actions that can run now: every
    # example runs every kind of step (hypothesis' swarm testing would switch whole rules off per
    # example, and a short CI budget then spends its steps on two or three of them). On a failure
    # the draws print the action and its arguments by label.

    def _enabled(self) -> list[str]:
        seats = any(p.seats for p in self.pods.values())
        acts = []
        if self.policy:
            acts += ["admit"] * 4 + ["admit_reply_lost_then_retried", "census_agrees"] + ["tick"] * 3
            acts += ["leases_lapse_for_silent_pods"] * 2
            if any(p.waiters for p in self.pods.values()):
                acts += ["reask_waiter"] * 3
            if seats:
                acts += ["release"] * 6 + ["report"] * 2 + ["ask_with_a_round_another_pod_holds"] * 2
            if any(p.released for p in self.pods.values()):
                acts += ["retry_release"]
            if self.restarts < MAX_SERVER_RESTARTS:
                acts += ["server_restarts"]
        else:
            acts += ["pods_meet_no_policy"]
        if not self.policy or self.now < self.hold_until:
            acts += ["operator_applies_the_policy"] * 3
        acts += ["heartbeat"] * 4 + ["pod_restarts"]
        return acts

    #: how often each action ran over every example of a test: the report's figures
    tally: Counter = Counter()

    @rule(data=st.data())
    def step(self, data):
        action = data.draw(st.sampled_from(self._enabled()), label="action")
        getattr(self, action)(data)
        self.tally[action] += 1

    def _dt(self, data, hi=5.0) -> None:
        self.now += data.draw(st.floats(0, hi), label="dt")

    def _draw(self, data) -> float:
        return data.draw(st.floats(0, 1, exclude_max=True), label="draw")

    # -- rounds ----------------------------------------------------------------------------------
    def admit(self, data):
        pod = self._pick(data)
        lane = data.draw(st.sampled_from(LANES), label="lane")
        pool = data.draw(HOT_POOL, label="pool")
        wait = data.draw(st.booleans(), label="wait")
        self._dt(data)
        self.n += 1
        self._admit(pod, lane, pool, f"{pod.name}/r{self.n}", wait, self._draw(data))

    def admit_reply_lost_then_retried(self, data):
        """The server applied the admit, the reply never came: the retry gets the same decision."""
        pod = self._pick(data)
        lane = data.draw(st.sampled_from(LANES), label="lane")
        pool = data.draw(HOT_POOL, label="pool")
        wait = data.draw(st.booleans(), label="wait")
        draw = self._draw(data)
        self.n += 1
        rid = f"{pod.name}/r{self.n}"
        first = self._admit(pod, lane, pool, rid, wait, draw, lost_reply=True)
        again = self._admit(pod, lane, pool, rid, wait, draw)
        if first.admitted:
            assert (again.admitted, again.reason, again.seat.seq) == (True, "same-intent", first.seat.seq)
        elif wait and not again.admitted:
            assert again.waiting_since == pytest.approx(first.waiting_since, abs=1e-6)

    def reask_waiter(self, data):
        """A waiter asks again (as a pod's oldest waiter does on a wake-up or the clock), or moves
        to another lane or pool (and then waits there, giving up its old place)."""
        pod = self._pick(data, where=lambda p: p.waiters)
        rid = data.draw(st.sampled_from(sorted(pod.waiters)), label="waiter")
        lane, pool, _ = pod.waiters[rid]
        move = data.draw(st.booleans(), label="move")
        if move:
            lane = data.draw(st.sampled_from(LANES), label="lane")
            pool = data.draw(HOT_POOL, label="pool")
        wait = move or data.draw(st.booleans(), label="wait")
        self._dt(data)
        self._admit(pod, lane, pool, rid, wait, self._draw(data))

    def ask_with_a_round_another_pod_holds(self, data):
        """A work item moved to another pod (its first pod looked dead): one id, one holder."""
        holder = self._pick(data, "holder", where=lambda p: p.seats)
        seat = data.draw(st.sampled_from(sorted(holder.seats.values(), key=lambda s: s.id)), label="seat")
        if not any(p is not holder and seat.id not in p.seats for p in self.pods.values()):
            return  # every other pod holds it too (it took the id over after a lapse)
        asker = self._pick(data, "asker", where=lambda p: p is not holder and seat.id not in p.seats)
        wait = data.draw(st.booleans(), label="wait")
        self._dt(data)
        self._admit(asker, seat.lane, seat.pool, seat.id, wait, self._draw(data))

    def release(self, data):
        pod = self._pick(data, where=lambda p: p.seats)
        seat = data.draw(st.sampled_from(sorted(pod.seats.values(), key=lambda s: s.id)), label="seat")
        outcome = data.draw(st.sampled_from(OUTCOMES), label="outcome")
        seconds = data.draw(st.floats(0, 3000), label="seconds")
        cost = data.draw(st.one_of(st.none(), st.floats(0, 5)), label="cost")
        self._dt(data)
        st_ = self._read()
        said = self._owner_says(pod, seat, st_)
        levels = self._levels(st_)
        pod.seats.pop(seat.id)  # the round ended: whatever the answer, the book lets it go
        if isinstance(said, type):
            with pytest.raises(said):
                pod.adm.release(seat, outcome=outcome, seconds=seconds, cost_usd=cost, now=self.now)
        else:
            r = pod.adm.release(seat, outcome=outcome, seconds=seconds, cost_usd=cost, now=self.now)
            assert r.status == {"live": Status.RELEASED, "expired": Status.EXPIRED,
                                "released": Status.ALREADY_RELEASED}[said], (r, said)
            assert not self.obs.exists(PREFIX + "seat:" + seat.id)
            assert self._gone(seat.id) == ("released", seat.seq, pod.name)
            pod.released.append(seat)
        self._check_excess(levels)

    def retry_release(self, data):
        """A release retried after a lost reply counts once and changes nothing."""
        pod = self._pick(data, where=lambda p: p.released)
        seat = data.draw(st.sampled_from(pod.released), label="seat")
        before = self._read()
        said = self._owner_says(pod, seat, before)
        if isinstance(said, type):  # a wipe took its tombstone, or another pod runs the id now
            with pytest.raises(said):
                pod.adm.release(seat, outcome="clean", seconds=1.0, now=self.now)
        else:
            assert said == "released", said
            r = pod.adm.release(seat, outcome="clean", seconds=1.0, now=self.now)
            assert r.status == Status.ALREADY_RELEASED, r
        after = read_state(self.obs)
        assert (after["pools"], after["lanes"]) == (before["pools"], before["lanes"])

    def report(self, data):
        pod = self._pick(data, where=lambda p: p.seats)
        seat = data.draw(st.sampled_from(sorted(pod.seats.values(), key=lambda s: s.id)), label="seat")
        signal = data.draw(st.sampled_from(SIGNALS), label="signal")
        self._dt(data)
        st_ = self._read()
        live = st_["seats"].get(seat.id)  # a report reads the live seat only, never a tombstone
        levels = self._levels(st_)
        if live is None or (live["pod"], int(live["seq"])) != (pod.name, seat.seq):
            with pytest.raises(UnknownSeat if live is None else NotYourSeat):
                pod.adm.report(seat, signal=signal, now=self.now)
            return
        r = pod.adm.report(seat, signal=signal, now=self.now)
        assert r.status == (Status.ALREADY_REPORTED if live["signalled"] else Status.REPORTED), (r, live)
        if r.decreased:
            p = _hash(self.obs, PREFIX + "pool:" + seat.pool)
            assert p["exhausted"] == "1" and p["why"] == signal
        self._check_excess(levels)

    # -- the clock, leases and pods --------------------------------------------------------------
    def heartbeat(self, data):
        pod = self._pick(data)
        self._dt(data, 10.0)
        self._heartbeat(pod)

    def tick(self, data):
        pod = self._pick(data)
        self._dt(data, 10.0)
        self._tick(pod)

    def leases_lapse_for_silent_pods(self, data):
        """The clock jumps past the lease; only the pods in `alive` heartbeat meanwhile, and a
        tick may sweep what lapsed. None alive and a sweep: every count is back to zero."""
        alive = data.draw(st.sets(st.sampled_from(sorted(self.pods))), label="alive")
        self.now += data.draw(st.floats(LEASE_TTL, 2 * LEASE_TTL), label="dt")
        for slot in sorted(alive):
            self._heartbeat(self.pods[slot])
        if data.draw(st.booleans(), label="sweep"):
            self._tick(self._pick(data, "ticker"))
            if not alive:
                check_zero(self.obs)

    def pod_restarts(self, data):
        """The pod process dies and comes back with an empty book (under a new name, as a new
        process usually is, or the same one): what it held is nobody's until it lapses."""
        old = self._pick(data)
        same_name = data.draw(st.booleans(), label="same_name")
        old.adm.close()
        old.client.close()
        self.orphans |= set(old.seats) | set(old.waiters)
        self.gen += 1
        name = old.name if same_name else f"{old.slot}#{self.gen}"
        self.pods[old.slot] = self._new_pod(old.slot, name, seed=10 + self.gen)

    def census_agrees(self, data):
        self._cached = None
        doc = self._pick(data).adm.ops.census(now=self.now)
        st_ = read_state(self.obs)
        for row in doc["pools"]:
            p = row["pool"]
            assert (row["running"], row["waiting"]) == (_int(st_["pools"][p], "running"),
                                                        _int(st_["pools"][p], "waiting"))

    # -- the server ------------------------------------------------------------------------------
    def server_restarts(self, data):
        """A real server restarts with its AOF (nothing lost) or comes back empty (as without
        persistence); the operator re-applies the policy at once or a few steps later."""
        persist = data.draw(st.booleans(), label="persist") and self.world.real
        reapply = data.draw(st.booleans(), label="reapply")
        self.restarts += 1
        self._cached = None
        before = snapshot(self.obs) if persist else None
        self.world.restart(self.obs, persist)
        if persist:
            assert snapshot(self.obs) == before, "an AOF restart (fsync always) lost or changed state"
            return
        self.policy = False
        self.hold_until = 0.0
        self.seq = {p: 0 for p in POOLS}
        self.admitted.clear()
        if reapply:
            self.operator_applies_the_policy(data)

    def operator_applies_the_policy(self, data=None):
        """The policy-apply job: after a wipe it starts the recovery hold; run again while the hold
        runs (a retried job, a policy change) it must not end the hold."""
        self._cached = None
        first = not self.policy
        self.pods[min(self.pods)].adm.ops.apply_policy(POLICY, now=self.now)
        if first:
            self.policy = True
            self.hold_until = self.now + HOLD
        cfg = _hash(self.obs, PREFIX + "config")
        if self.now < self.hold_until:
            assert float(cfg["holdUntil"]) == pytest.approx(self.hold_until), "an apply ended the recovery hold"

    def pods_meet_no_policy(self, data):
        """Between a wipe and the re-apply every call is NoPolicy and changes nothing."""
        pod = self._pick(data)
        lane = data.draw(st.sampled_from(LANES), label="lane")
        pool = data.draw(HOT_POOL, label="pool")
        before = self._read()
        self.n += 1
        with pytest.raises(NoPolicy):
            pod.adm.try_admit(lane=lane, model=pool, round_id=f"{pod.name}/r{self.n}", now=self.now, draw=0.0,
                              wait=True)
        with pytest.raises(NoPolicy):
            pod.adm.tick(now=self.now)
        assert read_state(self.obs) == before

    # -- invariants --------------------------------------------------------------------------------
    @invariant()
    def counts_books_and_admissions_agree(self):
        if not self.pods:
            return
        st_ = self._cached = check_counts(self.obs)
        # every pod's book is what the model says
        for pod in self.pods.values():
            book = pod.adm._book
            assert {r: h.seat for r, h in book.seats.items()} == pod.seats, (pod.name, book.seats, pod.seats)
            assert {r: [w.lane, w.pool, w.since != UNPLACED] for r, w in book.waiters.items()} == pod.waiters, \
                (pod.name, book.waiters, pod.waiters)
            for rid, w in book.waiters.items():
                t = st_["tickets"].get(rid)
                if w.since != UNPLACED and t is not None and t["pod"] == pod.name:
                    assert w.since == pytest.approx(float(t["since"]), abs=1e-6), (rid, w, t)
        # nothing leaks: every record is held by a live pod, or was left by a dropped one
        self.orphans &= set(st_["seats"]) | set(st_["tickets"])
        held = {(p.name, rid) for p in self.pods.values() for rid in p.seats}
        waiting = {(p.name, rid) for p in self.pods.values() for rid in p.waiters}
        for rid, s in st_["seats"].items():
            assert (s["pod"], rid) in held or rid in self.orphans, f"seat {rid} of {s['pod']} held by no pod"
        for rid, t in st_["tickets"].items():
            assert (t["pod"], rid) in waiting or rid in self.orphans, f"ticket {rid} of {t['pod']} held by no pod"
        # a re-asserted seat is not an admission: the totals and sequences count admissions only
        totals = Counter()
        for k, v in self.obs.hgetall(PREFIX + "totals").items():
            parts = _s(k).split("|")
            if parts[0] == "admitted":
                totals[tuple(parts[1:])] = int(v)
        assert totals == self.admitted, (totals, self.admitted)
        for p in POOLS:
            assert _int(st_["pools"][p], "seq") == self.seq[p], (p, st_["pools"][p], self.seq)

    def teardown(self):
        try:
            if self.pods and not self.policy:
                self.operator_applies_the_policy()
            if self.pods:
                self.now += LEASE_TTL + 1
                self._tick(self.pods[min(self.pods)])
                check_zero(self.obs)
        finally:
            for pod in self.pods.values():
                pod.adm.close()
                pod.client.close()
            self.obs.close()


# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def restartable():
    """Dedicated servers with AOF (fsync always), one per engine, started on first use: the
    machine restarts them, so never the session's shared servers."""
    servers: dict[str, LocalServer] = {}

    def get(engine: str) -> LocalServer:
        if engine not in servers:
            servers[engine] = LocalServer(engine, extra_args=AOF).start()
        return servers[engine]

    yield get
    for srv in servers.values():
        srv.stop()


def test_pods_interleaved_keep_the_lane_rules_the_counts_and_the_leases(engine, restartable):
    world = FakeWorld() if engine == "fakeredis" else RealWorld(restartable(engine))
    machine = type(f"DistributedMachine_{engine}", (DistributedMachine,), {"world": world, "tally": Counter()})
    run_state_machine_as_test(machine, settings=settings_for(engine))
    t = machine.tally
    ran = {"engine": engine, "examples": EXAMPLES[engine], "pods": "2-3"}
    record("model", "steps checked (every invariant and the lane-rule model after each)", sum(t.values()),
           settings=ran)
    record("model", "lease lapses / pod restarts / server restarts",
           f"{t['leases_lapse_for_silent_pods']} / {t['pod_restarts']} / {t['server_restarts']}", settings=ran)
    record("model", "invariant or model violations", 0, must="0", settings=ran)


# ---------------------------------------------------------------------------------------------
# What the machine found, each pinned by the rule it broke


def test_a_second_apply_during_the_recovery_hold_keeps_the_hold(redis_client):
    """A policy applied again while the recovery hold ran (a retried apply job, a policy change)
    ended the hold at once: a new round was admitted before the pods re-asserted theirs, and the
    pool then ran past its slots."""
    a, b = two_pods(redis_client)
    pool = POOLS[0]
    for i in range(2):  # the pool's two slots
        assert a.try_admit(lane="gamma", model=pool, round_id=f"a{i}", now=T0, draw=0.0).admitted
    redis_client.flushall()                     # a restart without persistence
    b.ops.apply_policy(POLICY, now=T0 + 1)          # the hold runs until T0 + 1 + HOLD
    b.ops.apply_policy(POLICY, now=T0 + 2)          # the apply job runs again
    d = b.try_admit(lane="gamma", model=pool, round_id="new", now=T0 + 3, draw=0.0)
    assert (d.admitted, d.reason) == (False, "recovering")
    assert sorted(a.heartbeat(now=T0 + 5).reasserted) == ["a0", "a1"]
    d = b.try_admit(lane="gamma", model=pool, round_id="new", now=T0 + 1 + HOLD, draw=0.0)
    assert (d.admitted, d.reason, d.running) == (False, "full", 2)


def test_a_waiter_that_moves_to_another_pool_moves_in_its_pods_book(redis_client):
    """A waiter that asked to wait on another pool moved there on the server but stayed under its
    old lane and pool in its pod's book, so the pod judged its turn (oldest of its lane and pool)
    and woke it by the queue it had left."""
    a, _ = two_pods(redis_client)
    m1, m2 = POOLS
    for pool in POOLS:
        for i in range(2):
            assert a.try_admit(lane="gamma", model=pool, round_id=f"{pool}/{i}", now=T0, draw=0.0).admitted
    assert not a.try_admit(lane="gamma", model=m1, round_id="w", now=T0, draw=0.0, wait=True).admitted
    d = a.try_admit(lane="gamma", model=m2, round_id="w", now=T0 + 1, draw=0.0, wait=True)
    assert (d.admitted, d.pool) == (False, m2)
    assert redis_client.zrange(PREFIX + f"wait:{m2}:gamma", 0, -1) == [b"w"]
    w = a._book.waiters["w"]
    assert (w.lane, w.pool, w.since) == ("gamma", m2, pytest.approx(d.waiting_since))
    assert ("gamma", m1) not in a._book.groups and a._book.is_oldest("gamma", m2, "w")
