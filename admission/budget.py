"""Budget readers (DESIGN §5.2, §6): how much of a provider's daily budget is spent, read from
the provider itself. A small pluggable interface: a reader per provider gives a ``Reading``.

A reader never raises and never closes anything: a timeout, an HTTP error, a body that is not
JSON or not of the expected shape is a warning on the ``admission.budget`` logger and no reading
(``None``). What a reading does (the budget reserve, the budget closure) is the Lua's to judge;
this module only reads.

Only the standard library is used (``urllib.request``): no new runtime dependency. The reader
honours the usual ``https_proxy`` / ``no_proxy`` environment, as urllib does.
"""
from __future__ import annotations

import datetime as _dt
import http.client
import json
import math
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ._log import get_logger
from .errors import BadArgument

log = get_logger("admission.budget")

#: How far in the future (seconds, against this host's clock) a reading's time may lie.
FUTURE_SKEW = 30.0
#: The most of a response body a reader reads (bytes); a longer body is malformed.
MAX_BODY = 1 << 20

_DAY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def utc_day(at: float) -> str:
    """The UTC day (YYYY-MM-DD) of an epoch time: the day boundary is 00:00 UTC (DESIGN §1)."""
    return _dt.datetime.fromtimestamp(at, _dt.timezone.utc).strftime("%Y-%m-%d")


def _usd(name: str, v: Any) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadArgument(f"{name} must be a number of USD or None, got {v!r}")
    v = float(v)
    if not math.isfinite(v) or v < 0:
        raise BadArgument(f"{name} must be finite and >= 0, got {v!r}")
    return v


@dataclass(frozen=True)
class Reading:
    """One budget reading of a provider: today's limit and spend in USD (``None``: unknown or no
    limit), taken at ``at`` (epoch seconds) for the UTC day ``day``.

    Refused with ``BadArgument`` (a ``ValueError``): an empty provider, a negative, NaN or
    infinite amount, a time that is not finite and positive or lies more than ``FUTURE_SKEW``
    seconds in the future, a day that is not YYYY-MM-DD or is later than the day of ``at``.
    Spend above the limit is a valid reading (providers overshoot)."""

    provider: str
    limit_usd: float | None
    spent_usd: float | None
    at: float
    day: str

    def __post_init__(self) -> None:
        if not isinstance(self.provider, str) or not self.provider:
            raise BadArgument(f"provider must be a non-empty string, got {self.provider!r}")
        object.__setattr__(self, "limit_usd", _usd("limit_usd", self.limit_usd))
        object.__setattr__(self, "spent_usd", _usd("spent_usd", self.spent_usd))
        at = self.at
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not math.isfinite(at) or at <= 0:
            raise BadArgument(f"at must be finite epoch seconds, got {at!r}")
        object.__setattr__(self, "at", float(at))
        now = time.time()
        if at > now + FUTURE_SKEW:
            raise BadArgument(f"a reading from the future: at={at:.3f} is {at - now:.1f} s ahead of this "
                              f"host's clock (at most {FUTURE_SKEW:g} s of skew is tolerated)")
        if not isinstance(self.day, str) or not _DAY.match(self.day):
            raise BadArgument(f"day must be a UTC day YYYY-MM-DD, got {self.day!r}")
        try:
            _dt.date.fromisoformat(self.day)
        except ValueError:
            raise BadArgument(f"day must be a UTC day YYYY-MM-DD, got {self.day!r}") from None
        if self.day > utc_day(at):
            raise BadArgument(f"a reading for a day after its own time: day={self.day}, at is on {utc_day(at)}")

    @property
    def left_usd(self) -> float | None:
        """What is left of today's limit (0 when overspent); ``None`` without limit or spend."""
        if self.limit_usd is None or self.spent_usd is None:
            return None
        return max(0.0, self.limit_usd - self.spent_usd)


@runtime_checkable
class BudgetReader(Protocol):
    """A provider's budget, read: ``read()`` gives today's reading, or ``None`` (and logs a
    warning) when it cannot be read. It must not raise."""

    provider: str

    def read(self) -> Reading | None: ...


class OpenRouterKeyReader:
    """Today's spend and limit of an OpenRouter-style API key: ``GET {base_url}/api/v1/key``.

    ``base_url`` is the site (``https://openrouter.ai``); one that already ends in ``/api/v1``
    (as an SDK's base URL does) is taken as is, so the path is never doubled. From the reply's
    ``data`` object:

    * spent = ``usage_daily`` (USD spent today, UTC); required.
    * ``limit`` (USD or null) is required; null means the key has no limit: ``limit_usd=None``.
    * ``limit_reset == "daily"``: the limit is today's limit, ``limit_usd = limit``.
    * any other reset (weekly, monthly, or null for a limit that never resets): today's limit is
      what the key may still spend today plus what it spent today,
      ``limit_usd = limit_remaining + usage_daily``, so the reserve stops lanes before the key
      runs dry; it stays constant through a day as spend moves from one term to the other.
      Without a ``limit_remaining`` number there is no daily figure: ``limit_usd=None``.

    ``timeout`` (seconds) bounds the connect and each read of the socket. The key is only sent in
    the ``Authorization`` header and never logged.
    """

    def __init__(self, provider: str, base_url: str, api_key: str, timeout: float = 5.0,
                 clock: Callable[[], float] = time.time) -> None:
        if not isinstance(provider, str) or not provider:
            raise BadArgument(f"provider must be a non-empty string, got {provider!r}")
        if not isinstance(base_url, str) or not re.match(r"^https?://", base_url):
            raise BadArgument(f"base_url must be an http(s) URL, got {base_url!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not math.isfinite(timeout) \
                or timeout <= 0:
            raise BadArgument(f"timeout must be > 0 seconds, got {timeout!r}")
        self.provider = provider
        base = base_url.rstrip("/")
        self.url = base + ("/key" if base.endswith("/api/v1") else "/api/v1/key")
        self._api_key = api_key
        self.timeout = float(timeout)
        self._clock = clock

    def __repr__(self) -> str:  # never shows the key
        return f"OpenRouterKeyReader(provider={self.provider!r}, url={self.url!r}, timeout={self.timeout!r})"

    def _warn(self, why: str, **fields: Any) -> None:
        log.warning("budget_read_failed", provider=self.provider, url=self.url, why=why, **fields)

    def read(self) -> Reading | None:
        try:
            return self._read()
        except Exception as exc:  # noqa: BLE001 - a reader never raises
            self._warn("unexpected", error=repr(exc))
            return None

    def _read(self) -> Reading | None:
        req = urllib.request.Request(self.url, method="GET", headers={
            "Authorization": f"Bearer {self._api_key}", "Accept": "application/json",
            "User-Agent": "admission-budget-reader"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # noqa: S310 - http(s) only
                raw = resp.read(MAX_BODY + 1)
        except urllib.error.HTTPError as exc:
            self._warn("http_error", status=exc.code)
            return None
        except (TimeoutError, urllib.error.URLError, OSError, http.client.HTTPException) as exc:
            reason = getattr(exc, "reason", exc)
            timed_out = isinstance(exc, TimeoutError) or isinstance(reason, TimeoutError)
            self._warn("timeout" if timed_out else "unreachable", timeout=self.timeout, error=str(reason))
            return None
        at = self._clock()
        if len(raw) > MAX_BODY:
            self._warn("malformed", error=f"body over {MAX_BODY} bytes")
            return None
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as exc:
            self._warn("not_json", error=str(exc), body=raw[:120].decode("utf-8", "replace"))
            return None
        try:
            limit, spent = self._amounts(doc)
        except BadArgument as exc:
            self._warn("malformed", error=str(exc))
            return None
        try:
            return Reading(self.provider, limit, spent, at, _day_or_blank(at))
        except BadArgument as exc:
            self._warn("refused", error=str(exc))
            return None

    @staticmethod
    def _amounts(doc: Any) -> tuple[float | None, float | None]:
        data = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(data, dict):
            raise BadArgument("the reply has no 'data' object")
        for field in ("limit", "usage_daily"):
            if field not in data:
                raise BadArgument(f"the reply's data has no '{field}'")
        spent = _usd("data.usage_daily", data["usage_daily"])
        if spent is None:
            raise BadArgument("data.usage_daily is null")
        limit = _usd("data.limit", data["limit"])
        remaining = _usd("data.limit_remaining", data.get("limit_remaining"))
        if limit is None or data.get("limit_reset") == "daily":
            return limit, spent
        return (None if remaining is None else remaining + spent), spent


def _day_or_blank(at: Any) -> str:
    """The UTC day of ``at``, or '' for a time that has none (``Reading`` then refuses ``at``)."""
    try:
        return utc_day(at)
    except (TypeError, ValueError, OverflowError, OSError):
        return ""


def read_all(readers: Iterable[BudgetReader], max_workers: int = 8) -> list[Reading]:
    """Run every reader (concurrently, so one slow provider costs one timeout, not the sum) and
    collect their readings in the readers' order. A reader that fails (returns ``None``, raises,
    or returns something that is not a ``Reading``) is skipped with a warning."""
    readers = list(readers)
    if not readers:
        return []

    def one(reader: BudgetReader) -> Reading | None:
        name = getattr(reader, "provider", repr(reader))
        try:
            got = reader.read()
        except Exception as exc:  # noqa: BLE001 - one failing reader never stops the others
            log.warning("budget_reader_skipped", provider=name, why="raised", error=repr(exc))
            return None
        if got is None:
            log.warning("budget_reader_skipped", provider=name, why="no_reading")
            return None
        if not isinstance(got, Reading):
            log.warning("budget_reader_skipped", provider=name, why="not_a_reading", got=repr(got)[:200])
            return None
        return got

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(readers))),
                            thread_name_prefix="admission-budget") as pool:
        results = list(pool.map(one, readers))
    return [r for r in results if r is not None]
