"""The provider model of the seed (fitted to the rates measured on 2026-10-02).

One pool of one provider, with carrying capacity K:

* every round in flight progresses at ``61 / (1 + (n - 1) / (0.53·K))`` tokens/s when n rounds are
  being served (61 alone; about 43 at five and 20 at twenty for K = 18) — processor sharing, so all
  rounds of a pool progress at the same rate and the rate changes whenever n changes;
* a round started with n rounds in flight (itself included) is refused with a 429 with probability
  ``min(0.9, (n − K) / 10)``; the refusal arrives within 15 s (uniform) and the refused round takes
  no share of the provider while it waits for it;
* a round still running after ``STALL_AFTER`` (1,200 s) — slower than its tokens / 1,200 s — is
  reported as a stall by the worker's watchdog, and goes on;
* a round still running after ``ROUND_CAP`` (1,800 s) is cut.

Nothing here draws a random number: the engine draws from the run's Generator and passes it in.
"""
from __future__ import annotations

import heapq
import math

BASE_RATE = 61.0          # tokens/s of a round alone
SHAPE = 0.53              # rate halves at n − 1 = 0.53·K
RATE_LIMIT_WITHIN = 15.0  # a refused round hears its 429 within this many seconds
STALL_AFTER = 1200.0      # a round slower than its tokens / 1,200 s reports a stall
ROUND_CAP = 1800.0        # a round unfinished at 30 min is cut
_EPS = 1e-3               # tokens: a round this close to its target is done (float noise)


def rate(n: int, k: float) -> float:
    """Tokens/s of each round when ``n`` (>= 1) rounds are served by a pool of capacity ``k``."""
    return BASE_RATE / (1.0 + (max(n, 1) - 1) / (SHAPE * k))


def max_rounds_at_rate(r: float, k: float) -> float:
    """The largest (real) n at which every round still gets ``r`` tokens/s (inverse of ``rate``)."""
    if r <= 0:
        return math.inf
    return 1.0 + SHAPE * k * (BASE_RATE / r - 1.0)


def p_rate_limited(n: int, k: float) -> float:
    """Probability that a round started with ``n`` rounds in flight (itself included) gets a 429."""
    return min(0.9, max(0.0, (n - k) / 10.0))


class ProviderPool:
    """Processor sharing on one pool: a virtual clock ``v`` counts the tokens every served round
    has received; a round started at ``v0`` with ``tokens`` finishes when ``v`` reaches
    ``v0 + tokens``. Finish order is the order of those targets (a heap)."""

    def __init__(self, name: str, k: float):
        self.name = name
        self.k = float(k)
        self.v = 0.0
        self.t = 0.0
        self.served: dict[str, float] = {}   # round id -> target v
        self._heap: list[tuple[float, str]] = []
        self.version = 0                      # bumped whenever n changes (stale finish events)

    @property
    def n(self) -> int:
        return len(self.served)

    def rate(self) -> float:
        return rate(self.n, self.k)

    def advance(self, t: float) -> None:
        if t > self.t:
            if self.served:
                self.v += self.rate() * (t - self.t)
            self.t = t

    def add(self, rid: str, tokens: float, t: float) -> None:
        self.advance(t)
        target = self.v + tokens
        self.served[rid] = target
        heapq.heappush(self._heap, (target, rid))
        self.version += 1

    def remove(self, rid: str, t: float) -> float:
        """Stop serving ``rid`` (cut); returns the tokens it still needed."""
        self.advance(t)
        target = self.served.pop(rid)
        self.version += 1
        return max(0.0, target - self.v)

    def remaining(self, rid: str) -> float:
        return max(0.0, self.served[rid] - self.v)

    def _top(self) -> tuple[float, str] | None:
        while self._heap and self.served.get(self._heap[0][1]) != self._heap[0][0]:
            heapq.heappop(self._heap)  # cut rounds
        return self._heap[0] if self._heap else None

    def next_finish(self) -> float | None:
        """Simulated time of the next completion at the current n (None when idle)."""
        top = self._top()
        if top is None:
            return None
        return self.t + max(0.0, top[0] - self.v) / self.rate()

    def pop_finished(self, t: float) -> list[str]:
        """Advance to ``t`` and remove every round that has received all its tokens."""
        self.advance(t)
        done = []
        while (top := self._top()) is not None and top[0] <= self.v + _EPS:
            heapq.heappop(self._heap)
            del self.served[top[1]]
            done.append(top[1])
        if done:
            self.version += 1
        return done
