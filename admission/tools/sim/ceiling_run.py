"""The ``ceilings`` scenario's loop: pods of workers calling one provider key whose binding limit is
tokens per minute, through the shipped Lua, with the key's ceilings declared in the policy
(``with-ceilings``) and without them (``without-ceilings``: concurrency alone, K̂ learned from the
429s).

The provider is ``ceilings.KeyCeilings`` (the one provider model of the ceilings, as the fake
provider counts them) with no concurrency limit: every 429 is a ceiling's. Each worker has an
endless backlog: it draws a prompt and an answer, asks the admission (declaring its input tokens
and answer budget), calls the provider when admitted, and asks again for its next call when the
call ends. A refusal on a ceiling sleeps exactly its ``wait_s`` (as the client's waiter does); a
refusal on concurrency waits for a release or the pod's clock (each pod re-asks with its oldest
waiter); a provider 429 ends the round ``rate_limited`` with the provider's retry-after, and the
worker asks again after it. Every draw comes from the run's Generator, in event order.
"""
from __future__ import annotations

import bisect
import heapq
import itertools
import math
import uuid
from dataclasses import dataclass
from typing import Any

import numpy as np

from ... import Admission
from ...core import Usage
from ...policy import validate
from . import ceilings as C
from .engine import CLOCK, EPOCH
from .policies import TUNABLES

LANE = "work"
SCOPE = "key"
WITH, WITHOUT = "with-ceilings", "without-ceilings"
POLICIES = (WITH, WITHOUT)
ASK, DONE, TICK = range(3)
#: the provider's answer speed and the call's fixed latency (s): a 1,024-token answer takes ~10 s
OUTPUT_PER_S = 100.0
LATENCY_S = 0.5
#: the measured window starts after this many provider minutes (the issue's "minutes 2-10")
WARMUP_MINUTES = 2


@dataclass(frozen=True)
class Workload:
    """The key's ceilings at the provider and what the workers send."""

    limits: dict[str, float]
    style: str = "openai"
    rpm_burst_s: float = 1.0           # 60 RPM enforced as one request a second
    prompt: tuple[int, int] = (1_000, 3_000)
    max_tokens: int = 1_024
    answer: tuple[int, int] = (50, 1_024)
    pods: int = 4
    workers: int = 16
    minutes: float = 10.0


#: the issue's token-bound provider: OpenAI style, 60 RPM and 100k TPM counted on arrival
OPENAI = Workload({"rpm": 60.0, "tpm": 100_000.0})


@dataclass
class Call:
    worker: int
    pod: str
    rid: str
    prompt: int
    answer: int
    seat: Any = None
    started: float = 0.0
    since: float = math.inf  # the round's first ask (its waiter ticket's age): a pod's oldest waiter asks first


class CeilingSim:
    def __init__(self, client, policy: str, rng: np.random.Generator, work: Workload = OPENAI):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES)}")
        self.client, self.policy, self.rng, self.work = client, policy, rng, work
        self.key = C.KeyCeilings(C.check_config(work.limits, work.style, rpm_burst_s=work.rpm_burst_s), EPOCH)
        self.pods = [f"pod-{i}" for i in range(work.pods)]
        self.pool = "model@sim"
        self.end = work.minutes * 60.0
        self.now = 0.0
        self._heap: list = []
        self._seq = itertools.count()
        self._rid = itertools.count()
        self.waiting: dict[str, list[Call]] = {pod: [] for pod in self.pods}
        self.rounds_done = 0
        self.provider_429 = 0          # in the measured window (the key counts all, per ceiling)
        self.refused: dict[str, int] = {}  # the admission's refusals by reason

    # -- plumbing ------------------------------------------------------------------------------
    def _push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self._heap, (t, kind, next(self._seq), payload))

    def _epoch(self) -> float:
        return EPOCH + self.now

    def _policy(self) -> dict:
        pol = {"tunables": TUNABLES, "lanes": {LANE: {"floor": 0, "weight": 1, "priority": 1}},
               "providers": {"sim": {}}, "pools": {self.pool: {}}, "clock": "caller"}
        if self.policy == WITH:
            scope = dict(self.work.limits)
            if "rpm" in scope:
                scope["burst_s"] = self.work.rpm_burst_s
            if self.work.style == "anthropic":
                scope["output_charge"] = "received"
            pol["ceilings"] = {SCOPE: scope}
            pol["pools"][self.pool]["ceilings"] = SCOPE
        return pol

    def _new_call(self, worker: int) -> Call:
        lo, hi = self.work.prompt
        alo, ahi = self.work.answer
        prompt = int(self.rng.integers(lo, hi + 1))
        answer = min(self.work.max_tokens, int(self.rng.integers(alo, ahi + 1)))
        return Call(worker, self.pods[worker % len(self.pods)], f"r{next(self._rid):07d}.w{worker}", prompt, answer)

    # -- the worker ----------------------------------------------------------------------------
    def _ask(self, call: Call) -> bool:
        """One ask; admitted: the call reaches the provider now."""
        call.since = min(call.since, self.now)
        d = self.adm[call.pod].try_admit(lane=LANE, model=self.pool, round_id=call.rid, now=self._epoch(),
                                         draw=float(self.rng.random()), wait=True,
                                         input_tokens=call.prompt, max_tokens=self.work.max_tokens)
        if not d.admitted:
            self.refused[d.reason] = self.refused.get(d.reason, 0) + 1
            if d.ceiling and d.wait_s > 0:  # its bucket covers it then: the client sleeps exactly that
                self._push(self.now + d.wait_s, ASK, call)
            else:  # in its ticket's order (a waiter back from a ceiling's sleep is still the oldest)
                q = self.waiting[call.pod]
                q.insert(bisect.bisect_right([c.since for c in q], call.since), call)
            return False
        call.seat, call.started = d.seat, self.now
        refusal = self.key.admit(C.Prompt(call.prompt), self.work.max_tokens, self._epoch())
        if refusal is None:
            self._push(self.now + LATENCY_S + call.answer / OUTPUT_PER_S, DONE, call)
            return True
        # the provider's 429: the round ends rate_limited with its retry-after; the worker retries then
        if self.now >= WARMUP_MINUTES * 60.0:
            self.provider_429 += 1
        retry = refusal.wait_s if math.isfinite(refusal.wait_s) else 60.0
        self.adm[call.pod].release(call.seat, outcome="rate_limited", seconds=0.0, retry_after=retry,
                                   now=self._epoch())
        self._push(self.now + retry, ASK, self._again(call))
        self._reask_all()
        return True

    def _again(self, call: Call) -> Call:
        """The same call asked again as a new round (a new waiter ticket if it waits)."""
        return Call(call.worker, call.pod, f"r{next(self._rid):07d}.w{call.worker}", call.prompt, call.answer)

    def _reask(self, pod: str) -> None:
        q = self.waiting[pod]
        while q and self._ask(q.pop(0)):
            pass  # admitted: the next oldest may ask

    def _reask_all(self) -> None:
        for pod in self.pods:
            self._reask(pod)

    def _done(self, call: Call) -> None:
        self.key.complete(call.answer, self._epoch())
        self.adm[call.pod].release(call.seat, outcome="clean", seconds=self.now - call.started, now=self._epoch(),
                                   usage=Usage(input_tokens=call.prompt, output_tokens=call.answer))
        if self.now >= WARMUP_MINUTES * 60.0:
            self.rounds_done += 1
        self._reask_all()
        self._ask(self._new_call(call.worker))  # the worker's next call

    # -- the loop ------------------------------------------------------------------------------
    def run(self) -> "CeilingSim":
        pol = self._policy()
        validate(pol)
        mesh = f"simceil-{uuid.uuid4().hex[:8]}"
        self.adm = {pod: Admission(self.client, mesh=mesh, pod=pod, background=False) for pod in self.pods}
        self.adm[self.pods[0]].ops.apply_policy(pol, recovery_hold=False)
        n = self.work.pods * self.work.workers
        for w in range(n):  # the workers start within the first second
            self._push(float(self.rng.uniform(0.0, 1.0)), ASK, self._new_call(w))
        for pod in self.pods:
            self._push(float(self.rng.uniform(0.0, CLOCK)), TICK, pod)
        try:
            while self._heap:
                t, kind, _, payload = heapq.heappop(self._heap)
                if t > self.end:
                    break
                self.now = t
                if kind == ASK:
                    self._ask(payload)
                elif kind == DONE:
                    self._done(payload)
                else:
                    self.adm[payload].tick(now=self._epoch())
                    self._reask_all()
                    self._push(self.now + CLOCK, TICK, payload)
        finally:
            for adm in self.adm.values():
                adm.close()
        return self

    # -- figures -------------------------------------------------------------------------------
    def used_pct(self) -> dict[str, float]:
        """Per per-minute limit: the share of it (%) the provider counted in minutes 2 to the end."""
        first, last = WARMUP_MINUTES, int(self.work.minutes)
        out = {}
        for kind, tally in self.key.used.items():
            if kind in C.DAY_KINDS or last <= first:
                continue
            used = sum(tally.per_minute[m - tally.first] for m in range(first, last)
                       if 0 <= m - tally.first < len(tally.per_minute))
            out[kind] = 100.0 * used / (self.key.buckets[kind].limit * (last - first))
        return out

    def figures(self) -> dict[str, Any]:
        used = self.used_pct()
        binding = max(used, key=used.get) if used else None  # the limit the key spends most of
        return {
            "provider_429": self.provider_429,
            "provider_429_by": dict(self.key.refused),   # the whole run, per ceiling
            "used_pct_by": used,
            "binding": binding,
            "binding_used_pct": used.get(binding) if binding else None,
            "rounds_done": self.rounds_done,
            "refusals": dict(self.refused),
            "sim_minutes": self.work.minutes,
            # what report.summarize reads of every run
            "capacity": {}, "drained": True,
        }
