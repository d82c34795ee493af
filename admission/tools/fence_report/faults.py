"""The faults: how each one injects itself into an intent, and what it must give."""
from __future__ import annotations

from ...client import Admission
from ...core import mesh_key
from .clients import LossyRedis
from .harness import FaultHarness
from .planes import BORROWED, DEPTH_LIMIT, HEALTH_MAX_AGE, LANES, LEASE_TTL, PRIMARY, SEED_ESTIMATE, STEP, UNAVAILABLE


class FaultRun(FaultHarness):
    """One fault on one mesh (FaultHarness) with the intents of every fault: ``intent_<fault>``."""

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
            running = int(self.client.hget(mesh_key(self.mesh, "pool", BORROWED), "running") or 0)
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
