"""The providers' rate-limit headers, read into one ``Reading``: what a provider says of its
ceilings (requests and tokens per minute or per day), and which one a 429 spent.

Pure functions and dataclasses: no I/O, no SDK imports. ``read`` takes a response's headers (a
case-insensitive mapping as httpx, openai and anthropic expose them, a plain dict of any case, or
a list of pairs; LiteLLM's ``llm_provider-`` prefix is taken off), optionally its status and error body, and returns what the provider said about
its ceilings; ``spent_ceiling`` says which ceiling a 429 spent; ``encode`` / ``decode`` carry a
reading on the wire.

**What the providers send** (every response, success or 429):

* OpenAI (and OpenAI-compatible servers): ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``;
  the resets are durations (``6m0s``, ``1s``, ``20ms``, ``1h2m3.5s``: Go's notation) until the
  bucket is full again. The headers do not say their window: OpenAI's are per minute, some
  compatible servers (Groq) send requests per *day* under the same names, hence ``requests_per``
  and ``tokens_per``. The ``..._usage_based`` variants are not read.
* Azure OpenAI: the same names (a reset may be plain seconds), plus ``retry-after-ms`` and
  ``retry-after``; the limit drops when Azure lowers a deployment's quota (the reading just says
  the new one). Some Azure APIs send ``-1`` for a limit they do not apply: a negative value is
  ignored like any other bad header.
* Anthropic: ``anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-{limit,remaining,reset}``
  with resets as RFC 3339 times, and ``retry-after`` (seconds) on a 429. Token remainings are
  rounded to the thousand: the limit records ``rounding = 1000`` so a consumer that must not
  overshoot subtracts it. ``anthropic-ratelimit-tokens-*`` is the most restrictive of the input
  and output limits, not a ceiling of its own: it is kept (as ``tpm``) only when neither the input
  nor the output headers came. Priority Tier headers (``anthropic-priority-*``) are not read.

**What the reading keeps:** per limit kind (``KINDS``: ``rpm``, ``tpm``, ``itpm``, ``otpm``, ``rpd``,
``tpd``) the limit, the remaining, the reset as seconds from the response's time (``now``, the
caller's clock when the response came) and the rounding of the remaining; the reading's time
``at``; ``retry_after`` (seconds: ``retry-after-ms``, else ``retry-after`` as seconds or an HTTP
date); and, when a status was given, ``spent`` (``spent_ceiling``).

**Bad input never raises.** A value that is not a number, a negative or non-finite one, a reset in
the past (more than ``PAST_SLACK_S`` behind ``now``: clocks differ by a little) or more than
``FUTURE_CAP_S`` (two days) ahead is ignored, and the rest of the reading stands. Each kind of
mistake (header, why) is logged once per process as ``ratelimit_header_ignored``, so a provider
that sends ``-1`` on every response does not flood the log.

**The 429 rule** (``spent_ceiling``): a 429 spent a ceiling when its error names one (OpenAI's
"Rate limit reached for ... on tokens per min (TPM)", Anthropic's "... of 8,000 output tokens per
minute" or "Number of requests has exceeded your per-minute rate limit", Azure's "exceeded token
rate limit" / "call rate limit") or, failing that, when a limit of the reading has nothing
remaining (the one with the longest reset when several have). A 429 with neither, and every other
status (a 529 or a 504 included), is no ceiling: ``None``, a capacity refusal. A quota or budget
refusal ("You exceeded your current quota") names no rate ceiling either: the classifier judges it.

**The wire encoding** (``encode``): one ASCII string, ``;``-separated ``key=value`` fields, parsed in
Lua 5.1 without cjson by ``for k, v in s:gmatch("([^;=]+)=([^;]*)")``::

    v=1;at=1764777775.25;ra=6.5;sp=tpm;rpm=60,59,1,0;tpm=100000,0,6,0;itpm=30000,12000,24.5,1000

``v`` is the format (1); ``at`` the reading's time (Unix seconds); ``ra`` the retry-after and ``sp``
the spent ceiling, each present only when known; then one field per kind that was read, in
``KINDS`` order: ``limit,remaining,reset_s,rounding`` (split with ``(v .. ","):gmatch("([^,]*),")``),
an unknown value empty (``rpm=60,,1,0``). Numbers are decimal (``tonumber`` reads them; integers
without ``.0``). A reading with nothing in it encodes as the empty string.
"""
from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime
from typing import Any

from ._log import get_logger
from .classify import source_text
from .errors import BadArgument

log = get_logger("admission.ratelimits")

#: The limit kinds, in encoding order.
KINDS = ("rpm", "tpm", "itpm", "otpm", "rpd", "tpd")
PAST_SLACK_S = 1.0          # a reset this far behind our clock is read as "now" (clock skew, whole seconds)
FUTURE_CAP_S = 2 * 86_400.0  # a reset or retry-after further out is a mistake, not a daily window
ANTHROPIC_TOKEN_ROUNDING = 1000.0
WIRE_VERSION = "1"
_WINDOWS = {"minute": ("rpm", "tpm"), "day": ("rpd", "tpd")}
_LITELLM_PREFIX = "llm_provider-"


@dataclass(frozen=True)
class Limit:
    """One ceiling as a response described it. ``None`` where the provider said nothing (or said
    something unreadable). ``reset_s``: seconds from the reading's time until the bucket is full
    again. ``rounding``: the provider rounds ``remaining`` to this (0: exact)."""

    kind: str
    limit: float | None = None
    remaining: float | None = None
    reset_s: float | None = None
    rounding: float = 0.0


@dataclass(frozen=True)
class Reading:
    """What one response said about the provider's ceilings, read at ``at`` (Unix seconds)."""

    at: float
    limits: Mapping[str, Limit] = field(default_factory=dict)
    retry_after: float | None = None
    spent: str | None = None

    def get(self, kind: str) -> Limit | None:
        return self.limits.get(kind)

    @property
    def empty(self) -> bool:
        return not self.limits and self.retry_after is None and self.spent is None


# --- bad input: ignored, said once ----------------------------------------------------------------
_WARNED: set[tuple[str, str]] = set()


def _ignore(header: str, why: str, value: Any) -> None:
    if (header, why) in _WARNED:
        return
    _WARNED.add((header, why))
    log.warning("ratelimit_header_ignored", header=header, why=why, value=str(value)[:80])


# --- header access ----------------------------------------------------------------------------------
def _lowered(headers: Any) -> dict[str, Any]:
    """The headers as a dict of lower-case names; anything of an odd shape is no headers."""
    if headers is None:
        return {}
    try:
        pairs = headers.items() if hasattr(headers, "items") else headers
        out: dict[str, Any] = {}
        for k, v in pairs:
            if isinstance(k, bytes):
                k = k.decode("latin-1")
            if isinstance(k, str):
                out.setdefault(k.lower(), v)
        for k, v in list(out.items()):  # LiteLLM passes the provider's own headers on with a prefix
            if k.startswith(_LITELLM_PREFIX):
                out.setdefault(k[len(_LITELLM_PREFIX):], v)
        return out
    except Exception:  # noqa: BLE001 - headers we cannot iterate are no headers
        return {}


def _as_text(v: Any) -> str | None:
    if isinstance(v, bytes):
        v = v.decode("latin-1", "replace")
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return repr(v)
    return v.strip() if isinstance(v, str) else None


def _number(h: dict[str, Any], name: str) -> float | None:
    v = h.get(name)
    if v is None:
        return None
    text = _as_text(v)
    try:
        x = float(text) if text else math.nan
    except ValueError:
        x = math.nan
    if not math.isfinite(x):
        _ignore(name, "not_a_number", v)
        return None
    if x < 0:
        _ignore(name, "negative", v)
        return None
    return x


_DURATION_PART = r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|μs|ns|d|h|m|s)"
_DURATION = re.compile(rf"(?:{_DURATION_PART})+")
_UNIT_S = {"d": 86_400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6,
           "ns": 1e-9}


def _seconds_from_text(text: str, now: float) -> tuple[float, bool] | None:
    """Seconds from ``now`` for a reset or a retry-after, and whether the text was a point in time:
    plain seconds or a Go duration (``1h2m3.5s``) are not, an RFC 3339 time
    (``2026-12-03T16:05:00Z``) or an HTTP date is; ``None`` when it is none of them."""
    try:
        return float(text), False
    except ValueError:
        pass
    if _DURATION.fullmatch(text):
        return sum(float(n) * _UNIT_S[u] for n, u in re.findall(_DURATION_PART, text)), False
    try:
        at = datetime.fromisoformat(text)
        if at.tzinfo is None:  # an RFC 3339 time always has a zone; without one, read it as UTC
            at = at.replace(tzinfo=timezone.utc)
        return at.timestamp() - now, True
    except (ValueError, OverflowError):
        pass
    try:
        return parsedate_to_datetime(text).timestamp() - now, True
    except (TypeError, ValueError, IndexError, OverflowError):
        return None


def _seconds(h: dict[str, Any], name: str, now: float, ms: bool = False) -> float | None:
    """A header's seconds from ``now``, or ``None`` (and a warning) when it cannot stand.
    ``ms``: the header counts milliseconds and must be a plain number."""
    v = h.get(name)
    if v is None:
        return None
    text = _as_text(v)
    got = _seconds_from_text(text, now) if text else None
    if got is None or not math.isfinite(got[0]) or (ms and got[1]):
        _ignore(name, "not_a_time", v)
        return None
    s, point_in_time = got
    s = s / 1000.0 if ms else s
    if s < 0 and not point_in_time:
        _ignore(name, "negative", v)
        return None
    if s < -PAST_SLACK_S:
        _ignore(name, "in_the_past", v)
        return None
    if s > FUTURE_CAP_S:
        _ignore(name, "too_far_ahead", v)
        return None
    return max(s, 0.0)


# --- the two header families ------------------------------------------------------------------------
def _limit(h: dict[str, Any], kind: str, names: tuple[str, str, str], now: float, rounding: float = 0.0) -> Limit | None:
    limit, remaining, reset = _number(h, names[0]), _number(h, names[1]), _seconds(h, names[2], now)
    if limit is None and remaining is None and reset is None:
        return None
    return Limit(kind, limit, remaining, reset, rounding if remaining is not None else 0.0)


def _openai(h: dict[str, Any], now: float, requests_kind: str, tokens_kind: str) -> dict[str, Limit]:
    out = {}
    for what, kind in (("requests", requests_kind), ("tokens", tokens_kind)):
        names = (f"x-ratelimit-limit-{what}", f"x-ratelimit-remaining-{what}", f"x-ratelimit-reset-{what}")
        if (lim := _limit(h, kind, names, now)) is not None:
            out[kind] = lim
    return out


def _anthropic(h: dict[str, Any], now: float) -> dict[str, Limit]:
    out = {}
    for what, kind, rounding in (("requests", "rpm", 0.0), ("input-tokens", "itpm", ANTHROPIC_TOKEN_ROUNDING),
                                 ("output-tokens", "otpm", ANTHROPIC_TOKEN_ROUNDING)):
        names = tuple(f"anthropic-ratelimit-{what}-{part}" for part in ("limit", "remaining", "reset"))
        if (lim := _limit(h, kind, names, now, rounding)) is not None:  # type: ignore[arg-type]
            out[kind] = lim
    if "itpm" not in out and "otpm" not in out:  # the combined one only stands in for the split ones
        names = tuple(f"anthropic-ratelimit-tokens-{part}" for part in ("limit", "remaining", "reset"))
        if (lim := _limit(h, "tpm", names, now, ANTHROPIC_TOKEN_ROUNDING)) is not None:  # type: ignore[arg-type]
            out["tpm"] = lim
    return out


def _retry_after(h: dict[str, Any], now: float) -> float | None:
    """``retry-after-ms`` (OpenAI, Azure), else ``retry-after`` (seconds or an HTTP date)."""
    ms = _seconds(h, "retry-after-ms", now, ms=True)
    return ms if ms is not None else _seconds(h, "retry-after", now)


def read(headers: Any, status: int | None = None, error_text: Any = None, *, now: float | None = None,
         requests_per: str = "minute", tokens_per: str = "minute") -> Reading:
    """One reading of a response's rate-limit headers (see the module's docstring). ``now``: when
    the response came (Unix seconds; default the clock). ``requests_per`` / ``tokens_per``
    (``"minute"`` or ``"day"``): the window of the ``x-ratelimit-*`` family, per minute for OpenAI
    and Azure. With a ``status``, ``spent`` says which ceiling a 429 spent."""
    if requests_per not in _WINDOWS or tokens_per not in _WINDOWS:
        raise BadArgument(f"requests_per and tokens_per are 'minute' or 'day', not {requests_per!r}, {tokens_per!r}")
    now = time.time() if now is None else float(now)
    if not math.isfinite(now) or now < 0:
        raise BadArgument(f"now is a time in Unix seconds, not {now!r}")
    h = _lowered(headers)
    limits = _openai(h, now, _WINDOWS[requests_per][0], _WINDOWS[tokens_per][1])
    limits.update(_anthropic(h, now))
    reading = Reading(now, {k: limits[k] for k in KINDS if k in limits}, _retry_after(h, now))
    if status is None:
        return reading
    return replace(reading, spent=spent_ceiling(status, reading, error_text))


# --- which ceiling a 429 spent ------------------------------------------------------------------------
_PER = {"min": "m", "minute": "m", "day": "d"}
_NAMED = re.compile(r"""(?ix)
    \b(?P<what>input\s+tokens|output\s+tokens|request\s+tokens|tokens|requests)
    (?:\s+has\s+exceeded\s+your)?           # Anthropic: "Number of requests has exceeded your per-minute rate limit"
    \s+per[\s-]+(?P<per>minute|min|day)\b""")
_AZURE = re.compile(r"(?i)\bexceeded\s+(?P<what>token|call)\s+rate\s+limit\b")
_ABBREVIATED = re.compile(r"\b(ITPM|OTPM|RPM|TPM|RPD|TPD)\b")
_WHAT = {"input tokens": "it", "request tokens": "it", "output tokens": "ot", "tokens": "t", "requests": "r"}


def _named_ceiling(text: str) -> str | None:
    """The ceiling an error message names, the first one it names; ``None`` without one."""
    found = []
    if m := _NAMED.search(text):
        what = _WHAT[" ".join(m["what"].lower().split())]
        per = _PER[m["per"].lower()]
        found.append((m.start(), f"{what}p{per}"))
    if m := _AZURE.search(text):
        found.append((m.start(), "tpm" if m["what"].lower() == "token" else "rpm"))
    if m := _ABBREVIATED.search(text):
        found.append((m.start(), m[1].lower()))
    kinds = [k for _, k in sorted(found) if k in KINDS]  # "itpd" / "otpd": no provider has them
    return kinds[0] if kinds else None


def _text(v: Any) -> str:
    """An error's text as the classifier reads it (bytes decoded, a body as JSON, capped)."""
    return source_text(v) or ""


def _status(v: Any) -> int | None:
    if isinstance(v, str) and v.strip().isascii() and v.strip().isdigit():
        return int(v)
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def spent_ceiling(status: int | None, reading: Reading | None, error_text: Any = None) -> str | None:
    """The ceiling (a kind of ``KINDS``) a 429 spent: the one its error names, else the reading's
    limit with nothing remaining (the longest reset first); ``None`` for a capacity refusal (a 429
    with neither) and for any other status: a 529 or a 504 is never a ceiling."""
    if _status(status) != 429:
        return None
    if named := _named_ceiling(_text(error_text)):
        return named
    if reading is None:
        return None
    spent = [lim for lim in reading.limits.values() if lim.remaining is not None and lim.remaining <= 0]
    if not spent:
        return None
    return max(spent, key=lambda lim: (lim.reset_s or 0.0, -KINDS.index(lim.kind))).kind


# --- the wire -----------------------------------------------------------------------------------------
def _num(x: float | None) -> str:
    if x is None:
        return ""
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return repr(float(x))


def encode(reading: Reading | None) -> str:
    """The reading as one ARGV string (format in the module's docstring); ``""`` for nothing."""
    if reading is None or reading.empty:
        return ""
    parts = [f"v={WIRE_VERSION}", f"at={_num(reading.at)}"]
    if reading.retry_after is not None:
        parts.append(f"ra={_num(reading.retry_after)}")
    if reading.spent is not None:
        parts.append(f"sp={reading.spent}")
    for kind in KINDS:
        if (lim := reading.limits.get(kind)) is not None:
            parts.append(f"{kind}={_num(lim.limit)},{_num(lim.remaining)},{_num(lim.reset_s)},{_num(lim.rounding)}")
    return ";".join(parts)


def _decoded_number(text: str, what: str) -> float | None:
    if text == "":
        return None
    try:
        x = float(text)
    except ValueError:
        x = math.nan
    if not math.isfinite(x) or x < 0:
        raise BadArgument(f"bad rate-limit reading: {what}={text!r}")
    return x


def decode(text: str) -> Reading | None:
    """The reading ``encode`` wrote; ``None`` for ``""``. Raises ``BadArgument`` on anything else."""
    if text == "":
        return None
    fields: dict[str, str] = {}
    for part in text.split(";"):
        key, eq, value = part.partition("=")
        if not eq or key in fields:
            raise BadArgument(f"bad rate-limit reading: {part!r} in {text[:200]!r}")
        fields[key] = value
    if fields.pop("v", None) != WIRE_VERSION:
        raise BadArgument(f"bad rate-limit reading: version is not {WIRE_VERSION}: {text[:200]!r}")
    at = _decoded_number(fields.pop("at", ""), "at")
    if at is None:
        raise BadArgument(f"bad rate-limit reading: no time: {text[:200]!r}")
    retry_after = _decoded_number(fields.pop("ra", ""), "ra")
    spent = fields.pop("sp", None)
    if spent is not None and spent not in KINDS:
        raise BadArgument(f"bad rate-limit reading: sp={spent!r}")
    limits = {}
    for kind in KINDS:
        if (value := fields.pop(kind, None)) is None:
            continue
        values = value.split(",")
        if len(values) != 4:
            raise BadArgument(f"bad rate-limit reading: {kind}={value!r}")
        limit, remaining, reset_s, rounding = (_decoded_number(v, kind) for v in values)
        limits[kind] = Limit(kind, limit, remaining, reset_s, rounding or 0.0)
    if fields:
        raise BadArgument(f"bad rate-limit reading: unknown fields {sorted(fields)}")
    return Reading(at, limits, retry_after, spent)
