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

The provider's day (scenario ``provider-day``; ``ProviderKey``): the pool is reached through one
API key with a daily limit in USD, counted by the provider itself. A round is a sequence of
requests of ``turn`` tokens (``ProviderPool(turn_tokens=...)``); the key is checked when a request
starts and a request is billed (its tokens at a price per 1,000) when it ends. Once the day's count
has reached the limit, every request is refused with HTTP 403 "Key limit exceeded (daily limit)"
within a second — a new round at its first request, a running round at its next one — until
00:00 UTC, when the count starts again at zero. The requests in flight when the count reaches the
limit complete and are billed: that is the provider's own overshoot.

The providers' rate ceilings (requests and tokens per minute and per day, their two counting
styles, outside traffic on the same key) are the model's too, in ``ceilings`` beside this module.

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

    def __init__(self, name: str, k: float, turn_tokens: float | None = None):
        self.name = name
        self.k = float(k)
        self.v = 0.0
        self.t = 0.0
        self.served: dict[str, float] = {}   # round id -> target v
        self._heap: list[tuple[float, str]] = []
        self.version = 0                      # bumped whenever n changes (stale finish events)
        # requests (provider-day only): a round is a sequence of requests of `turn` tokens; the
        # ends of its requests but the last are the points where the provider bills and checks
        self.turn = turn_tokens
        self.start_v: dict[str, float] = {}  # round id -> v when it started
        self._turns: list[tuple[float, str]] = []
        self.turn_seq = 0                     # the engine's stamp on the one valid request-end event

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
        if self.turn:
            self.start_v[rid] = self.v
            if tokens > self.turn + _EPS:
                heapq.heappush(self._turns, (self.v + self.turn, rid))

    def remove(self, rid: str, t: float) -> float:
        """Stop serving ``rid`` (cut); returns the tokens it still needed."""
        self.advance(t)
        target = self.served.pop(rid)
        self.start_v.pop(rid, None)
        self.version += 1
        return max(0.0, target - self.v)

    def served_tokens(self, rid: str) -> float:
        """Tokens ``rid`` has received so far (requests only)."""
        return self.v - self.start_v[rid]

    def _turn_top(self) -> tuple[float, str] | None:
        while self._turns and self._turns[0][1] not in self.served:
            heapq.heappop(self._turns)  # ended, cut or refused rounds
        return self._turns[0] if self._turns else None

    def next_turn_end(self) -> float | None:
        """Simulated time when the next request (not a round's last) ends, at the current n."""
        top = self._turn_top()
        if top is None:
            return None
        return self.t + max(0.0, top[0] - self.v) / self.rate()

    def pop_turn_ends(self, t: float) -> list[str]:
        """Advance to ``t``; the rounds whose request (not their last) has just ended, in order.
        Each one's next request is queued (while it is not its last)."""
        self.advance(t)
        out = []
        while (top := self._turn_top()) is not None and top[0] <= self.v + _EPS:
            v, rid = heapq.heappop(self._turns)
            if v + self.turn < self.served[rid] - _EPS:
                heapq.heappush(self._turns, (v + self.turn, rid))
            out.append(rid)
        return out

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
            self.start_v.pop(top[1], None)
            done.append(top[1])
        if done:
            self.version += 1
        return done


# -- the provider's day: one key with a daily limit (scenario provider-day) --------------------
KEY_LIMIT_STATUS = 403
KEY_LIMIT_MESSAGE = "Key limit exceeded (daily limit)"  # the seed's OpenRouter answer
KEY_REFUSAL_WITHIN = 1.0  # s: a request on a key past its limit hears the 403 within a second
DAY = 86_400.0


class ProviderError(Exception):
    """What a round's request got back from the provider: an HTTP status and its message (the
    shape ``admission.classify`` reads, like an SDK's error)."""

    def __init__(self, status_code: int, message: str):
        super().__init__(f"Error code: {status_code} - {{'error': {{'message': '{message}', 'code': {status_code}}}}}")
        self.status_code = status_code
        self.message = message


def key_limit_error() -> ProviderError:
    return ProviderError(KEY_LIMIT_STATUS, KEY_LIMIT_MESSAGE)


class ProviderKey:
    """One API key's day, as the provider counts it (epoch seconds; the day is the UTC day).

    ``bill`` adds a request's cost (its tokens at ``price_per_1k`` USD per 1,000 tokens) to the
    day's count, per lane for the report; ``open`` says whether a request starting now passes the
    key: not once the day's count reached ``limit_usd``. The count starts again at 00:00 UTC; a
    day's totals stay readable in ``days`` (``spent``, ``by_lane``, ``reached_at``)."""

    def __init__(self, limit_usd: float | None, price_per_1k: float):
        self.limit = limit_usd
        self.price = price_per_1k
        self.days: dict[int, dict] = {}
        self.day: int | None = None
        self.spent = 0.0
        self.by_lane: dict[str, float] = {}
        self.reached_at: float | None = None  # when the day's count reached the limit

    def cost(self, tokens: float) -> float:
        return tokens / 1000.0 * self.price

    def _roll(self, now: float) -> None:
        day = int(now // DAY)
        if day != self.day:
            if self.day is not None:
                self.days[self.day] = self.today()
            self.day, self.spent, self.by_lane, self.reached_at = day, 0.0, {}, None

    def today(self) -> dict:
        return {"spent": self.spent, "by_lane": dict(self.by_lane), "reached_at": self.reached_at}

    def totals(self, day: int) -> dict:
        """The totals of a UTC day (day number = epoch // 86,400)."""
        if day == self.day:
            return self.today()
        return self.days.get(day, {"spent": 0.0, "by_lane": {}, "reached_at": None})

    def open(self, now: float) -> bool:
        self._roll(now)
        return self.limit is None or self.spent < self.limit

    def bill(self, tokens: float, lane: str, now: float) -> float:
        """Bill one request that ended now; returns its cost."""
        self._roll(now)
        usd = self.cost(tokens)
        if usd <= 0:
            return 0.0
        self.spent += usd
        self.by_lane[lane] = self.by_lane.get(lane, 0.0) + usd
        if self.limit is not None and self.reached_at is None and self.spent >= self.limit:
            self.reached_at = now
        return usd
