"""Budget readers: the Reading's validation, the OpenRouter key reader against a local fake server
(loopback only), and read_all."""
from __future__ import annotations

import json
import logging
import math
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from admission import budget
from admission.budget import BudgetReader, OpenRouterKeyReader, Reading, read_all, utc_day
from admission.errors import BadArgument

KEY = "sk-or-v1-test-secret"


# --- a fake OpenRouter on 127.0.0.1 ----------------------------------------------------------------
class Fake:
    def __init__(self) -> None:
        self.status = 200
        self.body: object = {}
        self.delay = 0.0
        self.requests: list[tuple[str, str | None]] = []
        self.wake = threading.Event()  # ends a sleeping handler at teardown
        self.base_url = ""

    def key_reply(self, **data) -> None:
        self.body = {"data": {"label": "sk-or-v1-abc...xyz", "usage": 120.0, "usage_weekly": 30.0,
                              "usage_monthly": 80.0, "is_free_tier": False, **data}}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False

    def handle_error(self, request, client_address) -> None:  # a client that timed out: quiet
        pass


@pytest.fixture
def fake():
    state = Fake()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            state.requests.append((self.path, self.headers.get("Authorization")))
            if state.delay:
                state.wake.wait(state.delay)
            body = state.body if isinstance(state.body, bytes) else json.dumps(state.body).encode()
            self.send_response(state.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = _Server(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        state.wake.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture(autouse=True)
def loopback_only(monkeypatch):
    """Never send the test's requests through a proxy the environment may name."""
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def reader(fake, **kw) -> OpenRouterKeyReader:
    return OpenRouterKeyReader("openrouter", fake.base_url, KEY, **kw)


def warnings_of(caplog) -> list[dict]:
    return [r.admission for r in caplog.records if r.name == "admission.budget" and r.levelno == logging.WARNING]


@pytest.fixture
def warned(caplog):
    caplog.set_level(logging.WARNING, logger="admission.budget")
    return caplog


# --- the reader --------------------------------------------------------------------------------------
def test_a_daily_limit(fake):
    fake.key_reply(limit=10.0, limit_remaining=7.5, limit_reset="daily", usage_daily=2.5)
    before = time.time()
    r = reader(fake).read()
    assert r == Reading("openrouter", 10.0, 2.5, r.at, utc_day(r.at))
    assert before <= r.at <= time.time()
    assert r.day == utc_day(time.time()) or r.day == utc_day(before)
    assert r.left_usd == 7.5
    assert fake.requests == [("/api/v1/key", f"Bearer {KEY}")]


def test_no_limit(fake):
    fake.key_reply(limit=None, limit_remaining=None, limit_reset=None, usage_daily=4.25)
    r = reader(fake).read()
    assert (r.limit_usd, r.spent_usd, r.left_usd) == (None, 4.25, None)


def test_usage_is_the_spend_of_today_and_may_pass_the_limit(fake):
    fake.key_reply(limit=5, limit_remaining=0, limit_reset="daily", usage_daily=6)
    r = reader(fake).read()
    assert (r.limit_usd, r.spent_usd, r.left_usd) == (5.0, 6.0, 0.0)
    assert isinstance(r.limit_usd, float) and isinstance(r.spent_usd, float)
    fake.key_reply(limit=5, limit_remaining=5, limit_reset="daily", usage_daily=0)
    assert reader(fake).read().spent_usd == 0.0


@pytest.mark.parametrize("reset", ["monthly", "weekly", None])
def test_a_limit_that_is_not_daily_gives_what_today_may_spend(fake, reset):
    # 40 USD left of a monthly 100, 3 of them spent today: today's limit is 43
    fake.key_reply(limit=100.0, limit_remaining=40.0, limit_reset=reset, usage_daily=3.0)
    r = reader(fake).read()
    assert (r.limit_usd, r.spent_usd, r.left_usd) == (43.0, 3.0, 40.0)


def test_a_limit_that_is_not_daily_without_remaining_gives_no_limit(fake):
    fake.key_reply(limit=100.0, limit_remaining=None, limit_reset="monthly", usage_daily=3.0)
    r = reader(fake).read()
    assert (r.limit_usd, r.spent_usd) == (None, 3.0)
    del fake.body["data"]["limit_remaining"], fake.body["data"]["limit_reset"]
    assert reader(fake).read().limit_usd is None


@pytest.mark.parametrize("suffix", ["", "/", "/api/v1", "/api/v1/"])
def test_the_path_is_never_doubled(fake, suffix):
    fake.key_reply(limit=None, usage_daily=1.0)
    r = OpenRouterKeyReader("openrouter", fake.base_url + suffix, KEY).read()
    assert r is not None and fake.requests[-1][0] == "/api/v1/key"


def test_a_timeout_is_a_warning_and_no_reading(fake, warned):
    fake.key_reply(limit=10.0, limit_reset="daily", usage_daily=1.0)
    fake.delay = 5.0
    t0 = time.monotonic()
    assert reader(fake, timeout=0.3).read() is None
    assert time.monotonic() - t0 < 3.0
    [w] = warnings_of(warned)
    assert w["event"] == "budget_read_failed" and w["why"] == "timeout" and w["provider"] == "openrouter"


def test_an_unreachable_server_is_a_warning_and_no_reading(warned):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert OpenRouterKeyReader("openrouter", f"http://127.0.0.1:{port}", KEY, timeout=1).read() is None
    [w] = warnings_of(warned)
    assert w["why"] == "unreachable"


@pytest.mark.parametrize("body", [b"<html>502 Bad Gateway</html>", b"", b"{\"data\": ", b"\xff\xfe\x00"])
def test_bad_json_is_a_warning_and_no_reading(fake, warned, body):
    fake.body = body
    assert reader(fake).read() is None
    [w] = warnings_of(warned)
    assert w["why"] == "not_json"


@pytest.mark.parametrize("body", [
    {},
    [],
    {"data": None},
    {"data": []},
    {"data": {}},
    {"data": {"limit": 10.0, "limit_reset": "daily"}},      # no usage_daily
    {"data": {"usage_daily": 1.0}},                          # no limit
    {"data": {"limit": 10.0, "usage_daily": None}},
    {"data": {"limit": "10", "usage_daily": 1.0}},
    {"data": {"limit": 10.0, "usage_daily": True}},
    {"data": {"limit": 10.0, "usage_daily": 1.0, "limit_remaining": "lots"}},
])
def test_missing_or_malformed_fields_are_a_warning_and_no_reading(fake, warned, body):
    fake.body = body
    assert reader(fake).read() is None
    [w] = warnings_of(warned)
    assert w["why"] == "malformed"


@pytest.mark.parametrize("status", [401, 403, 404, 500])
def test_an_http_error_is_a_warning_and_no_reading(fake, warned, status):
    fake.status = status
    fake.body = {"error": {"message": "No auth credentials found", "code": status}}
    assert reader(fake).read() is None
    [w] = warnings_of(warned)
    assert w["why"] == "http_error" and w["status"] == status


def test_the_key_is_never_logged_nor_shown(fake, warned):
    fake.status = 401
    r = reader(fake)
    assert r.read() is None
    assert KEY not in repr(r)
    assert all(KEY not in rec.getMessage() and KEY not in repr(rec.admission) for rec in warned.records)


def test_a_reading_from_the_future_is_refused(fake, warned):
    fake.key_reply(limit=10.0, limit_reset="daily", usage_daily=1.0)
    assert reader(fake, clock=lambda: time.time() + 3600).read() is None
    [w] = warnings_of(warned)
    assert w["why"] == "refused" and "future" in w["error"]


@pytest.mark.parametrize("raw", [
    b'{"data": {"limit": 10.0, "limit_reset": "daily", "usage_daily": -0.5}}',
    b'{"data": {"limit": -10.0, "limit_reset": "daily", "usage_daily": 0.5}}',
    b'{"data": {"limit": NaN, "limit_reset": "daily", "usage_daily": 0.5}}',
    b'{"data": {"limit": 10.0, "limit_reset": "daily", "usage_daily": NaN}}',
    b'{"data": {"limit": Infinity, "limit_reset": "daily", "usage_daily": 0.5}}',
    b'{"data": {"limit": 10.0, "limit_reset": "monthly", "limit_remaining": -1, "usage_daily": 0.5}}',
])
def test_negative_or_nan_values_are_refused(fake, warned, raw):
    fake.body = raw
    assert reader(fake).read() is None
    [w] = warnings_of(warned)
    assert w["why"] == "malformed"


def test_an_oversized_body_is_malformed(fake, warned, monkeypatch):
    monkeypatch.setattr(budget, "MAX_BODY", 64)
    fake.key_reply(limit=10.0, limit_reset="daily", usage_daily=1.0, padding="x" * 200)
    assert reader(fake).read() is None
    assert warnings_of(warned)[0]["why"] == "malformed"


def test_a_reader_never_raises(warned):
    r = OpenRouterKeyReader("openrouter", "http://127.0.0.1:1", KEY, clock=lambda: 1 / 0)
    r.url = "http://[::1"  # broken after construction: urllib itself raises
    assert r.read() is None
    assert warnings_of(warned)


@pytest.mark.parametrize("kw", [
    {"provider": ""}, {"base_url": "ftp://example.test"}, {"base_url": "openrouter.ai"},
    {"timeout": 0}, {"timeout": -1.0}, {"timeout": math.nan}, {"timeout": True},
])
def test_a_bad_reader_configuration_is_a_clear_error(kw):
    args = {"provider": "openrouter", "base_url": "https://openrouter.ai", "api_key": KEY, **kw}
    with pytest.raises(BadArgument):
        OpenRouterKeyReader(**args)


def test_the_reader_is_a_budget_reader():
    assert isinstance(OpenRouterKeyReader("openrouter", "https://openrouter.ai", KEY), BudgetReader)


# --- the Reading --------------------------------------------------------------------------------------
def test_a_reading_is_frozen_and_validated():
    now = time.time()
    r = Reading("openrouter", 10, 2, now, utc_day(now))
    assert (r.limit_usd, r.spent_usd, r.at) == (10.0, 2.0, now)
    with pytest.raises(AttributeError):
        r.spent_usd = 3.0  # type: ignore[misc]
    assert Reading("p", None, None, now, utc_day(now)).left_usd is None
    assert Reading("p", 1.0, 5.0, now, utc_day(now)).left_usd == 0.0
    # a reading about yesterday, taken today, is a reading (the Lua judges its day)
    assert Reading("p", 1.0, 0.5, now, utc_day(now - 86400)).day == utc_day(now - 86400)


def test_a_small_clock_skew_is_tolerated_but_the_future_is_refused():
    now = time.time()
    Reading("p", 1.0, 0.5, now + 5, utc_day(now + 5))
    with pytest.raises(BadArgument, match="future"):
        Reading("p", 1.0, 0.5, now + budget.FUTURE_SKEW + 60, utc_day(now + budget.FUTURE_SKEW + 60))


@pytest.mark.parametrize("field,value", [
    ("limit_usd", -1.0), ("limit_usd", math.nan), ("limit_usd", math.inf), ("limit_usd", "10"),
    ("spent_usd", -0.01), ("spent_usd", math.nan), ("spent_usd", -math.inf), ("spent_usd", True),
    ("at", math.nan), ("at", -1.0), ("at", 0), ("at", "now"),
    ("day", "2025-1-01"), ("day", "2025-02-30"), ("day", "yesterday"), ("day", None),
    ("provider", ""), ("provider", None),
])
def test_bad_values_are_refused(field, value):
    now = time.time()
    args = {"provider": "p", "limit_usd": 10.0, "spent_usd": 1.0, "at": now, "day": utc_day(now), field: value}
    with pytest.raises(BadArgument) as info:
        Reading(**args)
    assert isinstance(info.value, ValueError)


def test_a_reading_for_a_day_after_its_own_time_is_refused():
    now = time.time()
    with pytest.raises(BadArgument, match="day after"):
        Reading("p", 1.0, 0.5, now, utc_day(now + 86400))


# --- read_all --------------------------------------------------------------------------------------
class Stub:
    def __init__(self, provider, result=None, exc=None, barrier=None):
        self.provider, self.result, self.exc, self.barrier = provider, result, exc, barrier

    def read(self):
        if self.barrier is not None:
            self.barrier.wait()
        if self.exc is not None:
            raise self.exc
        return self.result


def test_read_all_collects_in_order_and_skips_failing_readers(fake, warned):
    fake.key_reply(limit=10.0, limit_reset="daily", usage_daily=2.0)
    now = time.time()
    other = Reading("direct", None, 1.0, now, utc_day(now))
    got = read_all([reader(fake), Stub("broken", exc=RuntimeError("boom")), Stub("silent"),
                    Stub("odd", result={"spent": 1}), Stub("direct", result=other)])
    assert [r.provider for r in got] == ["openrouter", "direct"]
    assert got[1] is other
    skipped = {w["provider"]: w["why"] for w in warnings_of(warned) if w["event"] == "budget_reader_skipped"}
    assert skipped == {"broken": "raised", "silent": "no_reading", "odd": "not_a_reading"}


def test_read_all_runs_readers_at_once():
    now = time.time()
    barrier = threading.Barrier(3, timeout=5)  # passes only when all three read at the same time
    readers = [Stub(f"p{i}", Reading(f"p{i}", 1.0, 0.0, now, utc_day(now)), barrier=barrier) for i in range(3)]
    assert [r.provider for r in read_all(readers)] == ["p0", "p1", "p2"]


def test_read_all_of_nothing_is_nothing():
    assert read_all([]) == []
