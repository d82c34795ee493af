"""The one classifier (DESIGN §6): what a round saw -> the one signal word it reports.

The Lua stays the judge of effects (decrease, closure, failure counts); this module only names
the signal. It accepts:

* an exception: from the ``openai`` / ``anthropic`` SDKs, ``httpx``, or anything else (the SDKs
  are optional and never imported here: the status is read from attributes and, where a status is
  absent, from the class names of ``type(exc).__mro__``);
* any object (or mapping) with a status (``status_code``, ``status``, ``http_status``, or
  ``response.status_code`` / ``response.status``) and a message;
* an explicit signal word (validated), e.g. ``"stall"`` from the watchdog;
* ``None``: nothing went wrong, ``clean``.

The signal words (``codes.SIGNALS``)::

    clean | rate_limited | stall | round_cap | key_daily_limit | budget_reached | credit
          | key_rejected | error

**The rules** are the ordered table ``RULES`` below; the first row that matches names the signal:

==================== ================= =============================== ================
row                  status            message (case-insensitive)      signal
==================== ================= =============================== ================
key_daily_limit      403               ``KEY_DAILY_LIMIT_TEXT``        key_daily_limit
budget_reached       402, 403, 429     ``BUDGET_TEXT``                 budget_reached
rate_limit_429       429               -                               rate_limited
overloaded_529       529               -                               rate_limited
gateway_timeout_504  504               -                               round_cap
credit_402           402               -                               credit
key_rejected         401, 403          -                               key_rejected
server_error_5xx     500-599           -                               error
anything_else        any               -                               error
==================== ================= =============================== ================

Choices the design leaves open, written down here:

* **Status codes and SDK types come first.** Message text is consulted only for the daily key
  limit (``KEY_DAILY_LIMIT_TEXT``: "key limit exceeded (daily limit)", the seed's OpenRouter
  message, also inside a JSON error body), the daily budget (``BUDGET_TEXT``: "budget reached" /
  "budget exceeded", optionally "daily budget ...", optionally with "has been", "was" or "is"
  before the verb; only with 402, 403 or 429). Never a bare "429" or "rate limit" in arbitrary
  text: ``ValueError("invoice 429 not found")`` is an error, and so is a 400 or a 500 whose
  text says "rate limit". Load is what a status (or an SDK's type) says.
* **504 (gateway timeout) is ``round_cap``**: a gateway cut a long round, which is load the
  estimate learns from exactly like the round cap of our own watchdog (before, it counted as an
  error and the estimate never saw it). Any 504 counts, whatever the round's length: the
  classifier does not know how long the round ran, and a gateway that times out a short round is
  overloaded too.
* **529 "overloaded" is ``rate_limited``** (load, as a 429), by its status alone.
* **Timeouts and network errors without a status are ``error``** (openai / anthropic
  ``APIConnectionError`` and ``APITimeoutError``, httpx ``TransportError`` and its
  ``TimeoutException`` / ``ConnectError``, builtin ``TimeoutError`` / ``ConnectionError``): a
  client-side timeout is our own setting, and a failed connection says nothing about the
  provider's capacity. Their text is never searched for rate-limit words.
* **Where a status is absent**, an SDK class name stands for its status (``STATUS_BY_TYPE``:
  ``RateLimitError`` 429, ``OverloadedError`` 529, ``GatewayTimeoutError`` 504, ...).
* **A wrapped error** (``raise RoundFailed(...) from exc``) that itself matches nothing but the
  last row is classified by its explicit ``__cause__`` (8 levels at most); an implicit
  ``__context__`` is not followed.
* A 403 whose text names another key limit ("key limit exceeded (weekly limit)", monthly, total)
  is ``key_rejected``: only the daily limit ends at midnight.
* Any other 4xx, any other 5xx, anything unknown: ``error`` (a failure in the statistics).

**Retry-After** (``retry_after_of``): a 429 or 529 that says when to come back (``retry-after-ms``,
else ``retry-after`` in seconds or as an HTTP date) pauses new admissions on the round's pool for
every pod until then, bounded by the tunable ``retry_after_max`` (the Lua does that; this module
only reads the header). A header that cannot be read is no pause.

``CLOSING`` says how long each closing signal closes the provider: ``until_midnight`` (the next
00:00 UTC) or ``closed_for`` (the policy's ``closed_for``).
"""
from __future__ import annotations

import json
import math
import re
import time
from email.utils import parsedate_to_datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .codes import SIGNALS
from .errors import BadArgument

CLEAN = "clean"
RATE_LIMITED = "rate_limited"
STALL = "stall"
ROUND_CAP = "round_cap"
KEY_DAILY_LIMIT = "key_daily_limit"
BUDGET_REACHED = "budget_reached"
CREDIT = "credit"
KEY_REJECTED = "key_rejected"
ERROR = "error"

#: The load signals: the estimate decreases, nothing closes.
LOAD = (RATE_LIMITED, STALL, ROUND_CAP)
#: The closing signals and how long they close the provider (every pool of it).
CLOSING = {KEY_DAILY_LIMIT: "until_midnight", BUDGET_REACHED: "until_midnight",
           CREDIT: "closed_for", KEY_REJECTED: "closed_for"}

#: The seed's daily key limit: HTTP 403 ``Key limit exceeded (daily limit)``.
KEY_DAILY_LIMIT_TEXT = re.compile(r"(?i)\bkey\s+limit\s+exceeded\s*\(\s*daily\s+limit\s*\)")
#: The provider's daily budget: "budget reached", "daily budget exceeded", "budget has been reached".
BUDGET_TEXT = re.compile(r"(?i)\b(?:daily\s+)?budget\s+(?:(?:has\s+been|was|is)\s+)?(?:reached|exceeded)\b")

#: The status an SDK class stands for, used only when the error carries no status itself.
STATUS_BY_TYPE = {
    "RateLimitError": 429, "OverloadedError": 529, "GatewayTimeoutError": 504,
    "DeadlineExceededError": 504, "PaymentRequiredError": 402, "AuthenticationError": 401,
    "PermissionDeniedError": 403, "ServiceUnavailableError": 503, "InternalServerError": 500,
}

_TEXT_CAP = 8192  # characters of one text source that the regexes see
_CAUSE_DEPTH = 8


@dataclass(frozen=True)
class Rule:
    """One row of the table: it matches when the status is in ``statuses`` (``None`` in the set
    stands for "no status"; ``statuses=None`` for any), ``text`` (when given) is found in the
    message, and a class name of ``types`` (when given) is in the error's class chain."""

    name: str
    statuses: frozenset[int | None] | None
    signal: str
    text: re.Pattern[str] | None = None
    types: frozenset[str] = frozenset()

    def matches(self, status: int | None, text: str, names: frozenset[str]) -> bool:
        if self.statuses is not None and status not in self.statuses:
            return False
        if self.types and not (self.types & names):
            return False
        return self.text is None or bool(self.text.search(text))


#: The last row: what no other row names is an error (a failure in the statistics).
ANYTHING_ELSE = Rule("anything_else", None, ERROR)

RULES: tuple[Rule, ...] = (
    Rule("key_daily_limit", frozenset({403}), KEY_DAILY_LIMIT, text=KEY_DAILY_LIMIT_TEXT),
    Rule("budget_reached", frozenset({402, 403, 429}), BUDGET_REACHED, text=BUDGET_TEXT),
    Rule("rate_limit_429", frozenset({429}), RATE_LIMITED),
    Rule("overloaded_529", frozenset({529}), RATE_LIMITED),
    Rule("gateway_timeout_504", frozenset({504}), ROUND_CAP),
    Rule("credit_402", frozenset({402}), CREDIT),
    Rule("key_rejected", frozenset({401, 403}), KEY_REJECTED),
    Rule("server_error_5xx", frozenset(range(500, 600)), ERROR),
    ANYTHING_ELSE,
)


def _as_status(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if 100 <= v <= 599 else None
    if isinstance(v, str) and len(v) == 3 and v.isdigit():
        return _as_status(int(v))
    return None


def _field(x: Any, name: str) -> Any:
    return x.get(name) if isinstance(x, Mapping) else getattr(x, name, None)


def status_of(x: Any) -> int | None:
    """The HTTP status an error (or a status object) carries: ``status_code``, ``status``,
    ``http_status``, else its ``response``'s ``status_code`` / ``status``; ``None`` without one."""
    for attr in ("status_code", "status", "http_status"):
        if (v := _as_status(_field(x, attr))) is not None:
            return v
    response = _field(x, "response")
    if response is not None:
        for attr in ("status_code", "status"):
            if (v := _as_status(getattr(response, attr, None))) is not None:
                return v
    return None


def _type_names(x: Any) -> frozenset[str]:
    return frozenset(t.__name__ for t in type(x).__mro__) if isinstance(x, BaseException) else frozenset()


def source_text(v: Any) -> str | None:
    """One text source as the regexes see it: bytes decoded, a body as JSON, capped."""
    if v is None:
        return None
    if isinstance(v, bytes):
        v = v.decode("utf-8", "replace")
    if not isinstance(v, str):
        try:
            v = json.dumps(v, default=str) if isinstance(v, (Mapping, list, tuple)) else str(v)
        except (TypeError, ValueError):
            return None
    return v[:_TEXT_CAP]


def text_of(x: Any) -> str:
    """What the regexes see: the message, the SDK's parsed body, the response body when it was
    read, and ``str(exc)``."""
    parts = [_field(x, "message"), _field(x, "api_message"), _field(x, "body"), _field(x, "error")]
    response = _field(x, "response")
    if response is not None:
        try:  # httpx: .text of a read response; a streamed one raises ResponseNotRead
            parts.append(response.text if isinstance(response.text, str) else None)
        except Exception:  # noqa: BLE001 - an unreadable body is no text
            pass
    if isinstance(x, BaseException):
        parts.append(str(x))
    return "\n".join(t for t in map(source_text, parts) if t)


def rule_for(x: Any) -> Rule:
    """The table row that names the signal of ``x`` (an exception or a status object).

    An exception that only the last row matches is judged by its explicit ``__cause__``.
    """
    seen: Any = x
    for _ in range(_CAUSE_DEPTH):
        rule = _first_rule(seen)
        cause = getattr(seen, "__cause__", None)
        if rule is not ANYTHING_ELSE or not isinstance(cause, BaseException):
            return rule
        seen = cause
    return _first_rule(seen)


def _first_rule(x: Any) -> Rule:
    names = _type_names(x)
    status = status_of(x)
    if status is None:
        status = next((s for n, s in STATUS_BY_TYPE.items() if n in names), None)
    text = text_of(x)
    for rule in RULES:
        if rule.matches(status, text, names):
            return rule
    return ANYTHING_ELSE


def signal_of(x: Any) -> str:
    """The one signal word for what a round saw: an exception, a status object (or mapping) with a
    message, an explicit signal word (validated), or ``None`` (clean)."""
    if x is None:
        return CLEAN
    if isinstance(x, str):
        if x not in SIGNALS:
            raise BadArgument(f"unknown signal word {x!r}: expected one of {', '.join(SIGNALS)}")
        return x
    if isinstance(x, (bool, int, float, bytes, bytearray)):
        raise BadArgument(f"cannot classify {x!r}: pass an exception, an object with a status and a "
                          f"message, or a signal word ({', '.join(SIGNALS)})")
    return rule_for(x).signal


def outcome_of(exc: BaseException | None) -> str:
    """The signal word for the error a round ended with (``None``: clean); see ``signal_of``.

    Stall and round cap are reported by the watchdog while the round runs, so a round that ends
    in an error after them still reports its error here.
    """
    return signal_of(exc)


#: Headers a provider says "come back in" with, most precise first (OpenAI and Anthropic send
#: ``retry-after``; OpenAI also ``retry-after-ms``). LiteLLM keeps the provider's headers in
#: ``litellm_response_headers``.
_HEADER_SOURCES = ("headers", "litellm_response_headers", "response_headers")
RETRY_AFTER_CAP = 86_400.0  # s: a header further out than a day is read as a day (the Lua bounds it again)


def _header(headers: Any, name: str) -> Any:
    if headers is None:
        return None
    try:
        v = headers.get(name)
        if v is None and isinstance(headers, Mapping):
            v = next((val for k, val in headers.items() if isinstance(k, str) and k.lower() == name), None)
        return v
    except Exception:  # noqa: BLE001 - headers of an odd shape are no headers
        return None


def _headers_of(x: Any) -> list[Any]:
    found = [_field(x, n) for n in _HEADER_SOURCES]
    response = _field(x, "response")
    if response is not None:
        found.append(getattr(response, "headers", None))
    return [h for h in found if h is not None]


def _seconds(v: Any, ms: bool, now: float) -> float | None:
    if isinstance(v, bytes):
        v = v.decode("latin-1", "replace")
    if isinstance(v, bool) or v is None:
        return None
    try:
        s = float(v) / (1000.0 if ms else 1.0)
    except (TypeError, ValueError):
        if ms or not isinstance(v, str):
            return None
        try:  # an HTTP date
            s = parsedate_to_datetime(v).timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if not math.isfinite(s) or s < 0:
        return None
    return min(s, RETRY_AFTER_CAP)


def retry_after_of(x: Any, now: float | None = None) -> float | None:
    """The seconds a provider asked the caller to wait before the next request (``retry-after-ms``
    or ``retry-after`` of the error's headers or its response's), or ``None``. Follows an
    explicit ``__cause__`` like ``rule_for``."""
    now = time.time() if now is None else now
    seen: Any = x
    for _ in range(_CAUSE_DEPTH):
        if seen is None:
            return None
        for headers in _headers_of(seen):
            for name, ms in (("retry-after-ms", True), ("retry-after", False)):
                if (s := _seconds(_header(headers, name), ms, now)) is not None:
                    return s
        seen = getattr(seen, "__cause__", None) if isinstance(seen, BaseException) else None
    return None
