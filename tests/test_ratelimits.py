"""The providers' rate-limit headers read into one reading (admission/ratelimits.py): real header
sets of OpenAI, Azure OpenAI and Anthropic, every bad input (ignored with one warning, the rest of
the reading standing), which ceiling a 429 spent, and the wire encoding (read back in Python and
in Lua 5.1 without cjson). No network."""
from __future__ import annotations

import json
import logging
import subprocess
import sys
from datetime import datetime, timezone
from dataclasses import replace
from email.utils import format_datetime

import pytest

from admission import ratelimits
from admission.errors import BadArgument
from admission.ratelimits import KINDS, Limit, Reading, decode, encode, read, spent_ceiling

httpx = pytest.importorskip("httpx")

#: The response's time of every test: 2026-12-03 16:05:00 UTC.
NOW = datetime(2026, 12, 3, 16, 5, 0, tzinfo=timezone.utc).timestamp()

#: OpenAI, chat completions on a tier with 5,000 RPM and 160,000 TPM (with the usage-based variants).
OPENAI = {
    "date": "Thu, 03 Dec 2026 16:05:00 GMT", "content-type": "application/json", "openai-processing-ms": "412",
    "x-ratelimit-limit-requests": "5000", "x-ratelimit-limit-tokens": "160000",
    "x-ratelimit-limit-tokens_usage_based": "160000",
    "x-ratelimit-remaining-requests": "4999", "x-ratelimit-remaining-tokens": "159976",
    "x-ratelimit-remaining-tokens_usage_based": "159976",
    "x-ratelimit-reset-requests": "12ms", "x-ratelimit-reset-tokens": "9ms",
    "x-ratelimit-reset-tokens_usage_based": "9ms", "x-request-id": "req_4f3c2b1a",
}
#: OpenAI's 429 on tokens per minute, with its body.
OPENAI_429 = {
    "x-ratelimit-limit-requests": "60", "x-ratelimit-limit-tokens": "100000",
    "x-ratelimit-remaining-requests": "57", "x-ratelimit-remaining-tokens": "1200",
    "x-ratelimit-reset-requests": "2.88s", "x-ratelimit-reset-tokens": "59.28s",
    "retry-after": "1", "retry-after-ms": "650",
}
OPENAI_429_BODY = {"error": {
    "message": "Rate limit reached for gpt-4o in organization org-abc123 on tokens per min (TPM): Limit 100000, "
               "Used 98800, Requested 3048. Please try again in 1.108s. Visit https://platform.example.test/account/"
               "rate-limits to learn more.",
    "type": "tokens", "param": None, "code": "rate_limit_exceeded"}}
#: Azure OpenAI, a deployment of 30,000 TPM (180 RPM), on a 429.
AZURE_429 = {
    "x-ratelimit-limit-requests": "180", "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-requests": "171", "x-ratelimit-remaining-tokens": "0",
    "x-ratelimit-reset-requests": "10", "x-ratelimit-reset-tokens": "6",
    "retry-after": "6", "retry-after-ms": "5870", "x-ms-region": "Sweden Central",
    "apim-request-id": "6a7c1d2e-0000-4000-8000-000000000000",
}
AZURE_429_BODY = {"error": {"code": "429", "message": (
    "Requests to the ChatCompletions_Create Operation under Azure OpenAI API version 2024-10-21 have exceeded "
    "token rate limit of your current OpenAI S0 pricing tier. Please retry after 6 seconds.")}}
#: Anthropic, 50 RPM, 30,000 ITPM, 8,000 OTPM; the combined tokens headers name the tighter one.
ANTHROPIC = {
    "request-id": "req_011CZ", "anthropic-organization-id": "0dccdde6-0000-4000-8000-000000000000",
    "anthropic-ratelimit-requests-limit": "50", "anthropic-ratelimit-requests-remaining": "49",
    "anthropic-ratelimit-requests-reset": "2026-12-03T16:05:01Z",
    "anthropic-ratelimit-input-tokens-limit": "30000", "anthropic-ratelimit-input-tokens-remaining": "27000",
    "anthropic-ratelimit-input-tokens-reset": "2026-12-03T16:05:06Z",
    "anthropic-ratelimit-output-tokens-limit": "8000", "anthropic-ratelimit-output-tokens-remaining": "8000",
    "anthropic-ratelimit-output-tokens-reset": "2026-12-03T16:05:00Z",
    "anthropic-ratelimit-tokens-limit": "8000", "anthropic-ratelimit-tokens-remaining": "8000",
    "anthropic-ratelimit-tokens-reset": "2026-12-03T16:05:00Z",
}
ANTHROPIC_429 = {
    **ANTHROPIC, "retry-after": "23",
    "anthropic-ratelimit-output-tokens-remaining": "0", "anthropic-ratelimit-output-tokens-reset": "2026-12-03T16:05:22.5Z",
    "anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": "2026-12-03T16:05:22.5Z",
}
ANTHROPIC_429_BODY = {"type": "error", "error": {"type": "rate_limit_error", "message": (
    "This request would exceed the rate limit for your organization (0dccdde6-0000-4000-8000-000000000000) of "
    "8,000 output tokens per minute. For details, refer to: https://docs.example.test/rate-limits. You can "
    "see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, "
    "or try again later.")}}


@pytest.fixture(autouse=True)
def fresh_warnings():
    ratelimits._WARNED.clear()
    yield
    ratelimits._WARNED.clear()


def ignored(caplog) -> list[dict]:
    return [r.admission for r in caplog.records
            if getattr(r, "admission", {}).get("event") == "ratelimit_header_ignored"]


# --- real header sets ---------------------------------------------------------------------------------
def test_openai_headers_read_as_rpm_and_tpm_with_go_durations():
    reading = read(httpx.Headers(OPENAI), now=NOW)
    assert reading.at == NOW and reading.retry_after is None and reading.spent is None
    assert reading.limits == {
        "rpm": Limit("rpm", 5000, 4999, pytest.approx(0.012), 0),
        "tpm": Limit("tpm", 160000, 159976, pytest.approx(0.009), 0),
    }


@pytest.mark.parametrize("headers", [
    httpx.Headers(OPENAI),                                    # case-insensitive, as the SDKs expose them
    {k.title(): v for k, v in OPENAI.items()},                # a plain dict of another case
    list(OPENAI.items()),                                     # a list of pairs
    {k.encode(): v.encode() for k, v in OPENAI.items()},      # raw bytes
], ids=["httpx", "title-case-dict", "pairs", "bytes"])
def test_any_shape_of_headers_gives_the_same_reading(headers):
    assert read(headers, now=NOW) == read(OPENAI, now=NOW)


@pytest.mark.parametrize("text, seconds", [
    ("6m0s", 360.0), ("1s", 1.0), ("20ms", 0.02), ("1h2m3.5s", 3723.5), ("0s", 0.0), ("59.28s", 59.28),
    ("17.28s", 17.28), ("500µs", 0.0005), ("1m30.5s", 90.5), ("6", 6.0), ("0.25", 0.25),
])
def test_resets_in_go_notation_or_plain_seconds(text, seconds):
    reading = read({"x-ratelimit-limit-tokens": "100000", "x-ratelimit-reset-tokens": text}, now=NOW)
    assert reading.get("tpm").reset_s == pytest.approx(seconds)


def test_openai_429_on_tokens_names_tpm_and_takes_retry_after_ms_first():
    reading = read(OPENAI_429, 429, OPENAI_429_BODY, now=NOW)
    assert reading.spent == "tpm"
    assert reading.retry_after == pytest.approx(0.65)
    assert reading.get("tpm") == Limit("tpm", 100000, 1200, pytest.approx(59.28), 0)


def test_azure_headers_plain_second_resets_and_a_lowered_limit():
    before = read(AZURE_429, 429, AZURE_429_BODY, now=NOW)
    assert before.spent == "tpm" and before.retry_after == pytest.approx(5.87)
    assert before.get("rpm") == Limit("rpm", 180, 171, 10, 0)
    assert before.get("tpm") == Limit("tpm", 30000, 0, 6, 0)
    lowered = read({**AZURE_429, "x-ratelimit-limit-tokens": "15000", "x-ratelimit-remaining-tokens": "14000"},
                   200, now=NOW + 60)
    assert lowered.get("tpm").limit == 15000 and lowered.spent is None and lowered.at == NOW + 60


def test_azure_minus_one_for_a_limit_it_does_not_apply_is_ignored_once(caplog):
    headers = {"x-ratelimit-limit-tokens": "-1", "x-ratelimit-remaining-tokens": "-1", "x-ratelimit-reset-tokens": "0",
               "x-ratelimit-limit-requests": "180", "x-ratelimit-remaining-requests": "179"}
    with caplog.at_level(logging.WARNING, logger="admission"):
        for _ in range(3):
            reading = read(headers, now=NOW)
    assert reading.get("tpm") == Limit("tpm", None, None, 0.0, 0)
    assert reading.get("rpm") == Limit("rpm", 180, 179, None, 0)
    assert [(w["header"], w["why"]) for w in ignored(caplog)] == [
        ("x-ratelimit-limit-tokens", "negative"), ("x-ratelimit-remaining-tokens", "negative")]


def test_anthropic_headers_read_as_rpm_itpm_otpm_with_the_token_rounding():
    reading = read(httpx.Headers(ANTHROPIC), 200, now=NOW)
    assert reading.limits == {
        "rpm": Limit("rpm", 50, 49, 1.0, 0),
        "itpm": Limit("itpm", 30000, 27000, 6.0, 1000),
        "otpm": Limit("otpm", 8000, 8000, 0.0, 1000),
    }  # the combined tokens headers only repeat the tighter of the two
    assert reading.spent is None and reading.retry_after is None


def test_anthropic_combined_tokens_headers_stand_in_when_the_split_ones_are_absent():
    headers = {k: v for k, v in ANTHROPIC.items() if "input-tokens" not in k and "output-tokens" not in k}
    assert read(headers, now=NOW).get("tpm") == Limit("tpm", 8000, 8000, 0.0, 1000)


@pytest.mark.parametrize("reset, seconds", [
    ("2026-12-03T16:05:06Z", 6.0), ("2026-12-03T16:05:06.250Z", 6.25), ("2026-12-03T17:05:06+01:00", 6.0),
    ("2026-12-03T16:05:06", 6.0), ("2026-12-03T16:04:59.5Z", 0.0),  # half a second of clock skew is now
])
def test_anthropic_resets_as_rfc3339_times(reset, seconds):
    reading = read({"anthropic-ratelimit-input-tokens-reset": reset}, now=NOW)
    assert reading.get("itpm").reset_s == pytest.approx(seconds)


def test_a_time_without_a_zone_is_utc_whatever_the_local_zone(monkeypatch):
    import time
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        reading = read({"anthropic-ratelimit-input-tokens-reset": "2026-12-03T16:05:06"}, now=NOW)
    finally:
        monkeypatch.undo()
        time.tzset()
    assert reading.get("itpm").reset_s == pytest.approx(6.0)


def test_anthropic_429_on_output_tokens():
    reading = read(ANTHROPIC_429, 429, ANTHROPIC_429_BODY, now=NOW)
    assert reading.spent == "otpm" and reading.retry_after == 23
    assert reading.get("otpm") == Limit("otpm", 8000, 0, 22.5, 1000)


def test_retry_after_as_an_http_date():
    headers = {"retry-after": format_datetime(datetime(2026, 12, 3, 16, 5, 30, tzinfo=timezone.utc), usegmt=True)}
    assert read(headers, now=NOW).retry_after == pytest.approx(30.0)


def test_a_daily_window_for_compatible_servers_that_send_requests_per_day():
    groq = {"x-ratelimit-limit-requests": "14400", "x-ratelimit-remaining-requests": "14370",
            "x-ratelimit-reset-requests": "2m59.56s", "x-ratelimit-limit-tokens": "18000",
            "x-ratelimit-remaining-tokens": "17997", "x-ratelimit-reset-tokens": "7.66s"}
    reading = read(groq, now=NOW, requests_per="day")
    assert sorted(reading.limits) == ["rpd", "tpm"]
    assert reading.get("rpd") == Limit("rpd", 14400, 14370, pytest.approx(179.56), 0)
    assert sorted(read(groq, now=NOW, requests_per="day", tokens_per="day").limits) == ["rpd", "tpd"]
    with pytest.raises(BadArgument):
        read(groq, requests_per="hour")
    for now in (float("nan"), float("inf"), -1.0):  # the caller's own argument, not the provider's
        with pytest.raises(BadArgument):
            read(groq, now=now)


def test_no_headers_is_an_empty_reading():
    for headers in (None, {}, {"content-type": "application/json"}, 42, object(), [("only-one",)]):
        reading = read(headers, now=NOW)
        assert reading.empty and reading.limits == {} and encode(reading) == ""


def test_litellm_prefixed_provider_headers_are_read():
    prefixed = {"llm_provider-" + k: v for k, v in ANTHROPIC.items()}
    assert read(prefixed, now=NOW) == read(ANTHROPIC, now=NOW)
    both = {**prefixed, "anthropic-ratelimit-requests-remaining": "10"}  # an unprefixed header wins
    assert read(both, now=NOW).get("rpm").remaining == 10


def test_the_clock_is_the_default_time(monkeypatch):
    monkeypatch.setattr(ratelimits.time, "time", lambda: NOW + 5)
    assert read(OPENAI).at == NOW + 5


# --- bad input: ignored with one warning, the rest stands -------------------------------------------
BAD = [
    # (header, value, why)
    ("x-ratelimit-remaining-tokens", "abc", "not_a_number"),
    ("x-ratelimit-remaining-tokens", "", "not_a_number"),
    ("x-ratelimit-remaining-tokens", "nan", "not_a_number"),
    ("x-ratelimit-remaining-tokens", "inf", "not_a_number"),
    ("x-ratelimit-remaining-tokens", "1,000", "not_a_number"),
    ("x-ratelimit-remaining-tokens", "-5", "negative"),
    ("x-ratelimit-limit-tokens", "-1", "negative"),
    ("x-ratelimit-limit-requests", "sixty", "not_a_number"),
    ("x-ratelimit-reset-tokens", "soon", "not_a_time"),
    ("x-ratelimit-reset-tokens", "6 minutes", "not_a_time"),
    ("x-ratelimit-reset-tokens", "-3", "negative"),
    ("x-ratelimit-reset-tokens", "nan", "not_a_time"),
    ("x-ratelimit-reset-tokens", "72h", "too_far_ahead"),
    ("anthropic-ratelimit-input-tokens-reset", "2026-12-03T16:04:00Z", "in_the_past"),
    ("anthropic-ratelimit-input-tokens-reset", "2031-01-01T00:00:00Z", "too_far_ahead"),
    ("anthropic-ratelimit-input-tokens-reset", "2026-13-45T99:00:00Z", "not_a_time"),
    ("anthropic-ratelimit-input-tokens-remaining", "lots", "not_a_number"),
    ("anthropic-ratelimit-requests-limit", "-50", "negative"),
    ("retry-after", "later", "not_a_time"),
    ("retry-after", "-2", "negative"),
    ("retry-after", "Thu, 03 Dec 2026 15:00:00 GMT", "in_the_past"),
    ("retry-after", "31536000", "too_far_ahead"),
    ("retry-after-ms", "Thu, 03 Dec 2026 16:06:00 GMT", "not_a_time"),
    ("retry-after-ms", "-100", "negative"),
]
#: Which kind and field a header fills.
FIELD = {"limit": "limit", "remaining": "remaining", "reset": "reset_s"}
KIND = {"x-ratelimit-%s-tokens": "tpm", "x-ratelimit-%s-requests": "rpm",
        "anthropic-ratelimit-input-tokens-%s": "itpm", "anthropic-ratelimit-requests-%s": "rpm"}


def kind_and_field(header: str) -> tuple[str | None, str | None]:
    for pattern, kind in KIND.items():
        for part, field in FIELD.items():
            if header == pattern % part:
                return kind, field
    return None, None


@pytest.mark.parametrize("header, value, why", BAD, ids=[f"{h}={v!r}" for h, v, _ in BAD])
def test_a_bad_header_is_ignored_with_one_warning_and_the_rest_stands(caplog, header, value, why):
    good = {**OPENAI_429, **ANTHROPIC}  # both families at once: x-ratelimit's rpm is overwritten by Anthropic's
    if header == "retry-after":  # read only when retry-after-ms is not there
        del good["retry-after-ms"]
    bad = {**good, header: value}
    with caplog.at_level(logging.WARNING, logger="admission"):
        first = read(bad, now=NOW)
        second = read(bad, now=NOW)
    assert first == second
    kind, field = kind_and_field(header)
    expected = read(good, now=NOW)
    if header.startswith("x-ratelimit") and kind == "rpm":  # Anthropic's rpm wins either way
        kind = None
    if kind is not None:
        lim = expected.limits[kind]
        rounding = 0 if field == "remaining" else lim.rounding
        expected = Reading(NOW, {**expected.limits, kind: replace(lim, **{field: None, "rounding": rounding})},
                           expected.retry_after)
    elif header == "retry-after-ms":
        expected = Reading(NOW, expected.limits, 1.0)  # retry-after stands in
    elif header == "retry-after":
        expected = Reading(NOW, expected.limits, None)
    assert first == expected
    assert [(w["header"], w["why"]) for w in ignored(caplog)] == [(header, why)]
    assert ignored(caplog)[0]["value"] == value


@pytest.mark.parametrize("value", ["Thu, 03 Dec 2026 15:00:00 GMT", "-2", "abc"])
def test_a_bad_retry_after_without_retry_after_ms_is_no_retry_after(value):
    assert read({"retry-after": value}, now=NOW).retry_after is None


def test_odd_values_never_raise():
    odd = {"x-ratelimit-limit-tokens": None, "x-ratelimit-remaining-tokens": b"\xff\xfe",
           "x-ratelimit-reset-tokens": object(), "anthropic-ratelimit-requests-limit": 1e400,
           "anthropic-ratelimit-requests-reset": "9" * 400, "retry-after": "1e309",
           "retry-after-ms": "  250  "}
    reading = read(odd, 429, object(), now=NOW)
    assert reading.retry_after == 0.25 and reading.spent is None
    assert reading.get("tpm") is None and reading.get("rpm") is None


# --- which ceiling a 429 spent ------------------------------------------------------------------------
def limits(**kinds) -> Reading:
    return Reading(NOW, {k: Limit(k, *v) for k, v in kinds.items()})


NAMED = [
    # OpenAI
    ("Rate limit reached for gpt-4o in organization org-abc on tokens per min (TPM): Limit 30000, Used 29000, "
     "Requested 2000. Please try again in 6s.", "tpm"),
    ("Rate limit reached for gpt-4o in organization org-abc on requests per min (RPM): Limit 500, Used 500, "
     "Requested 1. Please try again in 120ms.", "rpm"),
    ("Rate limit reached for gpt-4o-mini in organization org-abc on requests per day (RPD): Limit 200, Used 200, "
     "Requested 1. Please try again in 7m12s.", "rpd"),
    ("Rate limit reached for gpt-3.5-turbo in organization org-abc on tokens per day (TPD): Limit 200000, "
     "Used 199000, Requested 3000.", "tpd"),
    (json.dumps(OPENAI_429_BODY), "tpm"),
    # Anthropic
    (json.dumps(ANTHROPIC_429_BODY), "otpm"),
    ("This request would exceed the rate limit for your organization (0dcc) of 20,000 input tokens per minute. "
     "Please reduce the prompt length or the maximum tokens requested, or try again later.", "itpm"),
    ("This request would exceed your organization's rate limit of 50 requests per minute.", "rpm"),
    ("Number of request tokens has exceeded your per-minute rate limit (https://docs.example.test/"
     "rate-limits); see the response headers for current usage.", "itpm"),
    ("Number of requests has exceeded your per-minute rate limit", "rpm"),
    ("Number of requests has exceeded your per-day rate limit", "rpd"),
    # Azure OpenAI
    (json.dumps(AZURE_429_BODY), "tpm"),
    ("Requests to the Embeddings_Create Operation under Azure OpenAI API version 2024-02-01 have exceeded call rate "
     "limit of your current OpenAI S0 pricing tier. Please retry after 2 seconds.", "rpm"),
    # the abbreviation alone
    ("429: RPM exhausted", "rpm"),
    ("quota: ITPM", "itpm"),
]


@pytest.mark.parametrize("text, kind", NAMED, ids=[k + ":" + t[:40] for t, k in NAMED])
def test_a_429_whose_error_names_a_ceiling(text, kind):
    assert spent_ceiling(429, None, text) == kind
    assert spent_ceiling(429, limits(rpm=(60, 30, 1), tpm=(1000, 500, 1)), text) == kind  # the text is precise
    assert spent_ceiling(429, None, text.encode()) == kind


def test_a_status_as_text_is_read():
    assert spent_ceiling("429", None, NAMED[0][0]) == "tpm"
    assert spent_ceiling(True, None, NAMED[0][0]) is None


def test_a_429_with_a_limit_at_zero_spent_it_the_longest_reset_first():
    assert spent_ceiling(429, limits(rpm=(60, 0, 1), tpm=(1000, 500, 30)), "Too Many Requests") == "rpm"
    assert spent_ceiling(429, limits(rpm=(60, 0, 1), tpm=(1000, 0, 30)), None) == "tpm"
    assert spent_ceiling(429, limits(itpm=(30000, 0, None), otpm=(8000, 0, None)), None) == "itpm"
    assert read(ANTHROPIC_429, 429, "rate limited", now=NOW).spent == "otpm"


CAPACITY = [
    ("Too Many Requests", limits(rpm=(60, 30, 1), tpm=(100000, 5000, 3))),
    ("", limits()),
    (None, None),
    ("Number of concurrent connections has exceeded your rate limit", limits(rpm=(50, 40, 1))),
    ("You exceeded your current quota, please check your plan and billing details.", None),
    ("The daily budget has been reached", limits(tpm=(1000, 10, 1))),
    ("Rate limit is exceeded. Try again in 6 seconds.", limits(tpm=(1000, None, 1))),
    ("request tokens per day", None),  # no provider has an input-tokens-per-day ceiling
]


@pytest.mark.parametrize("text, reading", CAPACITY, ids=[repr(t)[:40] for t, _ in CAPACITY])
def test_a_429_without_a_spent_ceiling_is_a_capacity_refusal(text, reading):
    assert spent_ceiling(429, reading, text) is None


@pytest.mark.parametrize("status", [529, 504, 200, 500, 403, None])
def test_other_statuses_are_never_a_ceiling(status):
    text = json.dumps(OPENAI_429_BODY)
    assert spent_ceiling(status, limits(rpm=(60, 0, 1), tpm=(1000, 0, 5)), text) is None
    assert read(AZURE_429, status, AZURE_429_BODY, now=NOW).spent is None


# --- the wire -----------------------------------------------------------------------------------------
READINGS = [
    read(OPENAI, now=NOW),
    read(OPENAI_429, 429, OPENAI_429_BODY, now=NOW + 0.123456),
    read(AZURE_429, 429, AZURE_429_BODY, now=NOW),
    read(ANTHROPIC_429, 429, ANTHROPIC_429_BODY, now=NOW),
    Reading(NOW, {"rpm": Limit("rpm", 60), "tpd": Limit("tpd", None, 12.5, None, 0)}),
    Reading(NOW, {}, retry_after=3.0),
    Reading(NOW, {k: Limit(k, 1e6 + i, 1.0 / 3, 0.001 * i, 1000) for i, k in enumerate(KINDS)}, 0.1, "tpd"),
]


@pytest.mark.parametrize("reading", READINGS)
def test_the_encoding_round_trips(reading):
    text = encode(reading)
    assert text.isascii() and " " not in text
    assert decode(text) == reading


def test_the_encoding_reads_as_documented():
    assert encode(read(ANTHROPIC_429, 429, ANTHROPIC_429_BODY, now=NOW)) == (
        f"v=1;at={int(NOW)};ra=23;sp=otpm;rpm=50,49,1,0;itpm=30000,27000,6,1000;otpm=8000,0,22.5,1000")
    assert encode(Reading(NOW, {"rpm": Limit("rpm", 60, None, 1)})) == f"v=1;at={int(NOW)};rpm=60,,1,0"
    assert encode(None) == encode(Reading(NOW)) == "" and decode("") is None


@pytest.mark.parametrize("text", [
    "v=2;at=1", "at=1", "v=1", "v=1;at=x", "v=1;at=1;rpm=1,2,3", "v=1;at=1;rpm=1,2,3,4,5", "v=1;at=1;rpm=a,,,",
    "v=1;at=1;rpm=-1,,,", "v=1;at=1;sp=rph", "v=1;at=1;ra=nan", "v=1;at=1;xyz=1", "v=1;at=1;rpm", "v=1;at=1;at=2",
    "garbage",
])
def test_decoding_garbage_raises_bad_argument(text):
    with pytest.raises(BadArgument):
        decode(text)


LUA_PARSE = """
local function parse(s)
  local r = {limits = {}}
  for k, v in s:gmatch("([^;=]+)=([^;]*)") do
    if k == "v" or k == "at" or k == "ra" then r[k] = tonumber(v)
    elseif k == "sp" then r.sp = v
    else
      local f = {}
      for x in (v .. ","):gmatch("([^,]*),") do f[#f + 1] = tonumber(x) or false end
      r.limits[k] = f
    end
  end
  return r
end
return parse
"""


def test_the_lua_reads_the_encoding_without_cjson():
    lua51 = pytest.importorskip("lupa.lua51")
    parse = lua51.LuaRuntime().execute(LUA_PARSE)
    for reading in READINGS:
        got = parse(encode(reading))
        assert got["v"] == 1 and got["at"] == pytest.approx(reading.at, abs=1e-6)
        assert got["ra"] == reading.retry_after and got["sp"] == reading.spent
        back = {k: [None if x is False else x for x in got["limits"][k].values()] for k in got["limits"]}
        assert back == {k: [lim.limit, lim.remaining, lim.reset_s, lim.rounding] for k, lim in reading.limits.items()}


# --- the runtime ----------------------------------------------------------------------------------------
def test_the_module_imports_no_sdk_and_admission_does_not_import_it():
    code = ("import sys, json; import admission; a = 'admission.ratelimits' in sys.modules; "
            "import admission.ratelimits; "
            "print(json.dumps([a, sorted(m for m in ('httpx', 'openai', 'anthropic', 'litellm') if m in sys.modules)]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [False, []]
