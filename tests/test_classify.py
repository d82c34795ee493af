"""The one classifier (DESIGN §6): the rules table as test vectors, one test per rule that fails
when its row is removed, and real exception objects of the openai / anthropic SDKs and httpx."""
from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import pytest

from admission import classify
from admission.classify import (CLOSING, LOAD, RULES, outcome_of, rule_for, signal_of, status_of)
from admission.codes import CLOSING_SIGNALS, LOAD_SIGNALS, OUTCOMES, SIGNALS
from admission.errors import BadArgument

openai = pytest.importorskip("openai")
anthropic = pytest.importorskip("anthropic")
httpx = pytest.importorskip("httpx")

SEED = "Key limit exceeded (daily limit)"  # the seed's exact message, with HTTP 403
SEED_BODY = {"error": {"message": SEED, "code": 403}}
URL = "https://api.example.test/v1/chat"


def seen(status, message="") -> SimpleNamespace:
    """An object with a status and a message, as a caller's own error record would be."""
    return SimpleNamespace(status_code=status, message=message)


# --- the table as test vectors --------------------------------------------------------------------
VECTORS = [
    # (what the round saw, signal, row)
    (seen(403, SEED), "key_daily_limit", "key_daily_limit"),
    (seen(403, "HTTP 403 " + SEED), "key_daily_limit", "key_daily_limit"),
    (seen(403, json.dumps(SEED_BODY)), "key_daily_limit", "key_daily_limit"),
    (seen(403, "key LIMIT exceeded ( Daily Limit )"), "key_daily_limit", "key_daily_limit"),
    (SimpleNamespace(status=403, body=SEED_BODY), "key_daily_limit", "key_daily_limit"),
    ({"status": 403, "message": SEED}, "key_daily_limit", "key_daily_limit"),
    (seen(402, "daily budget reached"), "budget_reached", "budget_reached"),
    (seen(403, "Budget exceeded for today"), "budget_reached", "budget_reached"),
    (seen(429, "The daily budget has been reached"), "budget_reached", "budget_reached"),
    (seen(429, "Too Many Requests"), "rate_limited", "rate_limit_429"),
    (seen(429), "rate_limited", "rate_limit_429"),
    (seen(529, "Overloaded"), "rate_limited", "overloaded_529"),
    (seen(504, "Gateway Timeout"), "round_cap", "gateway_timeout_504"),
    (seen(402, "Insufficient credits"), "credit", "credit_402"),
    (seen(401, "invalid x-api-key"), "key_rejected", "key_rejected"),
    (seen(403, "Forbidden"), "key_rejected", "key_rejected"),
    (seen(403, "Key limit exceeded (weekly limit)"), "key_rejected", "key_rejected"),
    (seen(403, "quota exceeded"), "key_rejected", "key_rejected"),
    (seen(500, "Internal Server Error"), "error", "server_error_5xx"),
    (seen(502, "Bad Gateway"), "error", "server_error_5xx"),
    (seen(503, "Service Unavailable"), "error", "server_error_5xx"),
    (seen(500, "rate limit exceeded upstream"), "error", "server_error_5xx"),
    (seen(500, "daily budget reached"), "error", "server_error_5xx"),
    (seen(503, SEED), "error", "server_error_5xx"),
    (httpx.ReadTimeout("timed out reading https://api.example.test/v1/rate-limits"), "error", "anything_else"),
    (TimeoutError("429 too many requests"), "error", "anything_else"),
    (ConnectionResetError("rate limit proxy reset the connection"), "error", "anything_else"),
    # never a bare "429" or "rate limit" in arbitrary text: load is what a status says
    (ValueError("invoice 429 not found"), "error", "anything_else"),
    (Exception("429 Too Many Requests"), "error", "anything_else"),
    (RuntimeError("provider says: rate limit reached"), "error", "anything_else"),
    (RuntimeError("too many requests"), "error", "anything_else"),
    (seen(400, "rate limit: too many tokens in the request"), "error", "anything_else"),
    (seen(404, "model not found"), "error", "anything_else"),
    (seen(408, "request timeout"), "error", "anything_else"),
    (seen(429 + 1000, "no such status"), "error", "anything_else"),  # not an HTTP status: ignored
    (ValueError("bad tool output"), "error", "anything_else"),
    (SimpleNamespace(status_code=None, message="daily budget reached"), "error", "anything_else"),
    (RuntimeError(SEED), "error", "anything_else"),  # the daily limit needs its 403
]


@pytest.mark.parametrize("x,signal,row", VECTORS, ids=[f"{r}:{s}:{i}" for i, (_, s, r) in enumerate(VECTORS)])
def test_the_table_as_vectors(x, signal, row):
    assert rule_for(x).name == row
    assert signal_of(x) == signal


def test_every_row_of_the_table_has_a_vector():
    assert {r.name for r in RULES} == {row for _, _, row in VECTORS}


def test_the_table_is_one_ordered_table_ending_in_error():
    assert RULES[-1].name == "anything_else" and RULES[-1].statuses is None and RULES[-1].signal == "error"
    assert len({r.name for r in RULES}) == len(RULES)
    assert {r.signal for r in RULES} <= set(SIGNALS)


# --- one test per rule: it fails when the rule's row is removed ------------------------------------
def without(monkeypatch, name: str) -> None:
    assert any(r.name == name for r in RULES), name
    monkeypatch.setattr(classify, "RULES", tuple(r for r in RULES if r.name != name))


def check_rule(monkeypatch, name: str, x, signal: str) -> None:
    assert rule_for(x).name == name
    assert signal_of(x) == signal
    without(monkeypatch, name)
    assert signal_of(x) != signal, f"removing {name} changed nothing for {x!r}"


def test_rule_key_daily_limit(monkeypatch):
    check_rule(monkeypatch, "key_daily_limit", seen(403, SEED), "key_daily_limit")


def test_rule_budget_reached(monkeypatch):
    check_rule(monkeypatch, "budget_reached", seen(429, "daily budget reached"), "budget_reached")


def test_rule_rate_limit_429(monkeypatch):
    check_rule(monkeypatch, "rate_limit_429", seen(429, "slow down"), "rate_limited")


def test_rule_overloaded_529(monkeypatch):
    check_rule(monkeypatch, "overloaded_529", seen(529, "Overloaded"), "rate_limited")


def test_rule_gateway_timeout_504(monkeypatch):
    check_rule(monkeypatch, "gateway_timeout_504", seen(504, "Gateway Timeout"), "round_cap")


def test_rule_credit_402(monkeypatch):
    check_rule(monkeypatch, "credit_402", seen(402, "Payment Required"), "credit")


def test_rule_key_rejected(monkeypatch):
    check_rule(monkeypatch, "key_rejected", seen(401, "Unauthorized"), "key_rejected")


def test_rule_server_error_5xx(monkeypatch):
    # a 5xx other than 504 / 529 is an error whatever its text says; the row names that, so no
    # later row that reads text can take a 5xx (the last row would say error too, by default)
    x = seen(502, "rate limit")
    assert rule_for(x).name == "server_error_5xx" and signal_of(x) == "error"
    without(monkeypatch, "server_error_5xx")
    assert rule_for(x).name != "server_error_5xx"


def test_no_rule_reads_load_from_arbitrary_text():
    """Message patterns only for the daily key limit (403) and the budget messages: a 429 in
    an invoice number, a log line or a tool's output is no rate limit."""
    for text in ("invoice 429 not found", "HTTP 429", "rate limit", "Too Many Requests", "overloaded 529"):
        assert signal_of(ValueError(text)) == "error", text
        assert signal_of(seen(None, text)) == "error", text
    assert all(r.text is None or r.statuses is not None and None not in r.statuses for r in RULES)


def test_rule_anything_else():
    x = seen(418, "I'm a teapot")
    assert rule_for(x) is classify.ANYTHING_ELSE and signal_of(x) == "error"


def test_status_codes_come_before_the_message():
    assert signal_of(seen(400, "rate limit")) == "error"
    assert signal_of(seen(401, "daily budget reached")) == "key_rejected"
    assert signal_of(seen(429, SEED)) == "rate_limited"   # the daily key limit is a 403
    assert signal_of(seen(402, SEED)) == "credit"


# --- where the status comes from ------------------------------------------------------------------
def test_status_is_read_from_every_usual_attribute():
    assert status_of(SimpleNamespace(status_code=429)) == 429
    assert status_of(SimpleNamespace(status=403)) == 403
    assert status_of(SimpleNamespace(http_status=402)) == 402
    assert status_of(SimpleNamespace(response=SimpleNamespace(status_code=504))) == 504
    assert status_of(SimpleNamespace(response=SimpleNamespace(status=529))) == 529  # aiohttp style
    assert status_of(SimpleNamespace(status="429")) == 429
    assert status_of({"status_code": 401}) == 401
    assert status_of(SimpleNamespace(status=True)) is None
    assert status_of(SimpleNamespace(status="failed")) is None
    assert status_of(Exception("x")) is None


@pytest.mark.parametrize("name,signal", [
    ("RateLimitError", "rate_limited"), ("OverloadedError", "rate_limited"),
    ("GatewayTimeoutError", "round_cap"), ("PaymentRequiredError", "credit"),
    ("AuthenticationError", "key_rejected"), ("PermissionDeniedError", "key_rejected"),
    ("InternalServerError", "error"),
])
def test_an_sdk_class_name_stands_for_its_status_when_the_error_has_none(name, signal):
    exc = type(name, (Exception,), {})("no status here")
    assert status_of(exc) is None
    assert signal_of(exc) == signal


def test_a_class_named_permission_denied_with_the_seed_message_is_the_daily_limit():
    exc = type("PermissionDeniedError", (Exception,), {})(SEED)
    assert signal_of(exc) == "key_daily_limit"


def test_a_wrapped_error_is_judged_by_its_explicit_cause():
    inner = seen_exc(429)
    try:
        try:
            raise inner
        except Exception as e:
            raise RuntimeError("round failed") from e
    except RuntimeError as outer:
        assert signal_of(outer) == "rate_limited"
    try:  # an implicit context is not followed
        try:
            raise inner
        except Exception:
            raise RuntimeError("cleanup failed")
    except RuntimeError as outer:
        assert signal_of(outer) == "error"


def seen_exc(status: int, message: str = "") -> Exception:
    exc = Exception(message)
    exc.status_code = status  # type: ignore[attr-defined]
    return exc


# --- explicit words, None, bad input --------------------------------------------------------------
@pytest.mark.parametrize("word", SIGNALS)
def test_an_explicit_signal_word_passes_through(word):
    assert signal_of(word) == word


@pytest.mark.parametrize("word", ["", "Rate_Limited", "overloaded", "ok", "clean ", SEED, "429"])
def test_an_unknown_word_is_a_clear_bad_argument(word):
    with pytest.raises(BadArgument, match="unknown signal word") as info:
        signal_of(word)
    assert isinstance(info.value, ValueError)
    assert "key_daily_limit" in str(info.value)


@pytest.mark.parametrize("x", [429, 403.0, True, b"stall"])
def test_a_bare_number_or_bytes_is_refused(x):
    with pytest.raises(BadArgument, match="cannot classify"):
        signal_of(x)


def test_outcome_of_keeps_working_and_names_the_new_words():
    assert outcome_of(None) == "clean"
    assert signal_of(None) == "clean"
    assert outcome_of(seen_exc(429, "Too Many Requests")) == "rate_limited"
    assert outcome_of(seen_exc(403, SEED)) == "key_daily_limit"
    assert outcome_of(seen_exc(504)) == "round_cap"
    assert outcome_of(ValueError("x")) == "error"
    assert outcome_of(KeyboardInterrupt()) == "error"


def test_the_constants_and_the_codes_agree():
    assert LOAD == ("rate_limited", "stall", "round_cap") == LOAD_SIGNALS
    assert CLOSING == {"key_daily_limit": "until_midnight", "budget_reached": "until_midnight",
                       "credit": "closed_for", "key_rejected": "closed_for"}
    assert tuple(CLOSING) == CLOSING_SIGNALS
    # `ceiling` is not classified from an exception: a round names the ceiling its 429 spent
    # (handle.ceiling, from the provider's headers), and the exit turns rate_limited into it
    assert set(SIGNALS) | {"ceiling"} == set(OUTCOMES) | set(CLOSING_SIGNALS)
    assert len(SIGNALS) == 9
    # every word a release takes is a signal, and the five first words never go away
    assert set(OUTCOMES) <= set(SIGNALS) | {"ceiling"}
    assert {"clean", "rate_limited", "stall", "round_cap", "error"} <= set(OUTCOMES)


def test_the_sdks_are_not_imported_by_the_classifier():
    import ast
    import inspect
    tree = ast.parse(inspect.getsource(classify))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & {"openai", "anthropic", "httpx", "httpx2"}


# --- real exception objects ------------------------------------------------------------------------
def http_of(sdk):
    """The httpx flavour an SDK builds its errors from (``httpx``, or ``httpx2`` in newer SDKs)."""
    mod = sys.modules[sdk.APIStatusError.__module__]
    return getattr(mod, "httpx2", None) or getattr(mod, "httpx", None) or httpx


def status_error(sdk, cls, status: int, message: str, body=None):
    h = http_of(sdk)
    request = h.Request("POST", URL)
    kwargs = {"json": body} if body is not None else {}
    return cls(message, response=h.Response(status, request=request, **kwargs), body=body)


def sdk_cases():
    o, a = openai, anthropic
    oreq, areq = http_of(o).Request("POST", URL), http_of(a).Request("POST", URL)
    cases = [
        ("openai.RateLimitError", lambda: status_error(o, o.RateLimitError, 429, "Error code: 429 - Rate limit reached"),
         "rate_limited"),
        ("openai.AuthenticationError", lambda: status_error(o, o.AuthenticationError, 401, "Incorrect API key provided"),
         "key_rejected"),
        ("openai.PermissionDeniedError-seed-body", lambda: status_error(
            o, o.PermissionDeniedError, 403, f"Error code: 403 - {SEED_BODY}", SEED_BODY["error"]), "key_daily_limit"),
        ("openai.PermissionDeniedError-seed-json-only", lambda: status_error(
            o, o.PermissionDeniedError, 403, "Error code: 403", SEED_BODY), "key_daily_limit"),
        ("openai.PermissionDeniedError-other", lambda: status_error(
            o, o.PermissionDeniedError, 403, "Project does not have access to model"), "key_rejected"),
        ("openai.PermissionDeniedError-budget", lambda: status_error(
            o, o.PermissionDeniedError, 403, "Error code: 403 - daily budget reached"), "budget_reached"),
        ("openai.APIStatusError-402", lambda: status_error(o, o.APIStatusError, 402, "Insufficient credits"),
         "credit"),
        ("openai.InternalServerError-500", lambda: status_error(o, o.InternalServerError, 500, "server error"),
         "error"),
        ("openai.InternalServerError-504", lambda: status_error(o, o.InternalServerError, 504, "Gateway Timeout"),
         "round_cap"),
        ("openai.InternalServerError-529", lambda: status_error(o, o.InternalServerError, 529, "overloaded"),
         "rate_limited"),
        ("openai.APIConnectionError", lambda: o.APIConnectionError(request=oreq), "error"),
        ("openai.APITimeoutError", lambda: o.APITimeoutError(request=oreq), "error"),
        ("anthropic.RateLimitError", lambda: status_error(
            a, a.RateLimitError, 429, "rate_limit_error",
            {"type": "error", "error": {"type": "rate_limit_error", "message": "Number of requests has exceeded your rate limit"}}),
         "rate_limited"),
        ("anthropic.InternalServerError-529", lambda: status_error(
            a, a.InternalServerError, 529, "Overloaded",
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}), "rate_limited"),
        ("anthropic.AuthenticationError", lambda: status_error(
            a, a.AuthenticationError, 401, "invalid x-api-key"), "key_rejected"),
        ("anthropic.PermissionDeniedError-seed", lambda: status_error(
            a, a.PermissionDeniedError, 403, SEED, SEED_BODY), "key_daily_limit"),
        ("anthropic.InternalServerError-500", lambda: status_error(a, a.InternalServerError, 500, "api_error"),
         "error"),
        ("anthropic.APIConnectionError", lambda: a.APIConnectionError(request=areq), "error"),
        ("anthropic.APITimeoutError", lambda: a.APITimeoutError(request=areq), "error"),
    ]
    for name, status, signal in [("OverloadedError", 529, "rate_limited"), ("PaymentRequiredError", 402, "credit"),
                                 ("GatewayTimeoutError", 504, "round_cap")]:
        if hasattr(a, name):  # newer anthropic SDKs have a class per status
            cls = getattr(a, name)
            cases.append((f"anthropic.{name}", lambda cls=cls, status=status, name=name: status_error(a, cls, status, name), signal))
    return cases


@pytest.mark.parametrize("name,make,signal", sdk_cases(), ids=[c[0] for c in sdk_cases()])
def test_real_sdk_errors(name, make, signal):
    exc = make()
    assert isinstance(exc, Exception)
    assert signal_of(exc) == signal
    assert outcome_of(exc) == signal


def httpx_flavours():
    mods = [httpx]
    try:
        import httpx2  # the SDKs' own fork, when installed
        mods.append(httpx2)
    except ImportError:
        pass
    return mods


@pytest.mark.parametrize("h", httpx_flavours(), ids=lambda m: m.__name__)
@pytest.mark.parametrize("status,body,signal", [
    (403, SEED_BODY, "key_daily_limit"),
    (403, {"error": {"message": "Forbidden"}}, "key_rejected"),
    (429, {"error": {"message": "Too Many Requests"}}, "rate_limited"),
    (429, {"error": {"message": "Daily budget reached"}}, "budget_reached"),
    (402, {"error": {"message": "Insufficient credits"}}, "credit"),
    (401, None, "key_rejected"),
    (504, None, "round_cap"),
    (529, None, "rate_limited"),
    (503, None, "error"),
])
def test_real_httpx_status_errors(h, status, body, signal):
    request = h.Request("POST", URL)
    response = h.Response(status, request=request, **({"json": body} if body is not None else {}))
    exc = h.HTTPStatusError(f"Client error '{status}' for url '{URL}'", request=request, response=response)
    assert signal_of(exc) == signal


@pytest.mark.parametrize("h", httpx_flavours(), ids=lambda m: m.__name__)
def test_real_httpx_transport_errors_are_errors(h):
    request = h.Request("POST", URL)
    for exc in (h.ConnectError("All connection attempts failed", request=request),
                h.ConnectTimeout("timed out", request=request),
                h.ReadTimeout("timed out", request=request),
                h.RemoteProtocolError("peer closed connection", request=request)):
        assert signal_of(exc) == "error", exc


@pytest.mark.parametrize("h", httpx_flavours(), ids=lambda m: m.__name__)
def test_a_streamed_body_not_read_is_no_text_and_no_crash(h):
    request = h.Request("POST", URL)
    response = h.Response(403, request=request, stream=h.ByteStream(json.dumps(SEED_BODY).encode()))
    with pytest.raises(h.ResponseNotRead):
        response.text
    exc = h.HTTPStatusError("Client error '403 Forbidden'", request=request, response=response)
    assert signal_of(exc) == "key_rejected"  # the body was never read: only the status is known


# --- LiteLLM's exceptions (it keeps the provider's status and headers) -------------------------------
def litellm_cases():
    ll = pytest.importorskip("litellm")
    req = httpx.Request("POST", URL)

    def resp(status, headers=None):
        return httpx.Response(status, request=req, headers=headers or {})
    return [
        ("litellm.RateLimitError", lambda: ll.RateLimitError("rate limited", "openai", "gpt-x", response=resp(429)),
         "rate_limited"),
        ("litellm.ServiceUnavailableError", lambda: ll.ServiceUnavailableError("down", "openai", "gpt-x",
                                                                              response=resp(503)), "error"),
        ("litellm.InternalServerError", lambda: ll.InternalServerError("boom", "openai", "gpt-x", response=resp(500)),
         "error"),
        ("litellm.AuthenticationError", lambda: ll.AuthenticationError("bad key", "openai", "gpt-x",
                                                                      response=resp(401)), "key_rejected"),
        ("litellm.APIError-529", lambda: ll.APIError(529, "Overloaded", "anthropic", "claude-x", request=req),
         "rate_limited"),
        ("litellm.APIError-403-seed", lambda: ll.APIError(403, SEED, "openrouter", "x", request=req), "key_daily_limit"),
        ("litellm.APIConnectionError", lambda: ll.APIConnectionError("refused 429", "openai", "gpt-x", request=req),
         "error"),
        ("litellm.BadRequestError-rate-text", lambda: ll.BadRequestError("rate limit in prompt", "gpt-x", "openai",
                                                                        response=resp(400)), "error"),
    ]


@pytest.mark.parametrize("i", range(8))
def test_real_litellm_errors(i):
    name, make, signal = litellm_cases()[i]
    assert signal_of(make()) == signal, name


# --- Retry-After -------------------------------------------------------------------------------------
def test_retry_after_is_read_from_the_sdks_errors():
    o, a = openai, anthropic
    h = http_of(o)
    req = h.Request("POST", URL)
    exc = o.RateLimitError("429", response=h.Response(429, request=req, headers={"retry-after": "7"}), body=None)
    assert classify.retry_after_of(exc) == 7.0
    exc = o.RateLimitError("429", response=h.Response(429, request=req, headers={"retry-after-ms": "1500",
                                                                                  "retry-after": "2"}), body=None)
    assert classify.retry_after_of(exc) == 1.5  # the precise one first
    ha = http_of(a)
    exc = a.RateLimitError("429", response=ha.Response(429, request=ha.Request("POST", URL),
                                                        headers={"Retry-After": "3"}), body=None)
    assert classify.retry_after_of(exc) == 3.0


def test_retry_after_reads_an_http_date_and_a_cause():
    from email.utils import formatdate
    now = 1_800_000_000.0
    x = {"headers": {"Retry-After": formatdate(now + 30, usegmt=True)}}
    assert classify.retry_after_of(x, now=now) == pytest.approx(30, abs=1)
    inner = SimpleNamespace(headers={"retry-after": "4"})
    try:
        try:
            raise RuntimeError("inner")
        except RuntimeError as e:
            e.headers = inner.headers  # type: ignore[attr-defined]
            raise ValueError("outer") from e
    except ValueError as outer:
        assert classify.retry_after_of(outer) == 4.0


@pytest.mark.parametrize("value", ["", "soon", "-1", "nan", "inf", None, True])
def test_a_retry_after_that_cannot_be_read_is_no_pause(value):
    assert classify.retry_after_of({"headers": {"retry-after": value}}) is None
    assert classify.retry_after_of(ValueError("retry-after: 5")) is None  # never from text


def test_retry_after_of_litellm_headers():
    ll = pytest.importorskip("litellm")
    exc = ll.RateLimitError("rate limited", "openai", "gpt-x",
                            response=httpx.Response(429, request=httpx.Request("POST", URL), headers={"retry-after": "9"}))
    assert classify.retry_after_of(exc) == 9.0
