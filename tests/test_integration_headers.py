"""The integrations read the providers' rate-limit headers (issue 25, parts 4 and 5): after every
response (success or error, streamed or not) the round's handle has the response's
``rate_reading``; a 429 naming a spent ceiling sets ``ceiling`` / ``reset_s`` and the round ends
``ceiling`` (the pool's estimate is not cut); a capacity 429 stays ``rate_limited``; a header that
cannot be read never fails the call.

Over real HTTP against the fake provider enforcing ceilings (admission/tools/fake_provider/), on
real Redis / Valkey. At scale 10 a ceiling of 100 tokens per minute lets one call of 90 answer
tokens through and refuses the next for about 5 real seconds (OpenAI style: prompt +
``max_tokens`` counted on arrival).
"""
from __future__ import annotations

import asyncio
import itertools

import anthropic
import httpx
import litellm
import openai
import pytest

from admission import ratelimits
from admission.integrations import anthropic as adm_anthropic
from admission.integrations import openai as adm_openai
from admission.integrations.httpx import AdmissionTransport, AsyncAdmissionTransport
from admission.integrations.litellm import AdmissionHook
from admission.tools.fake_provider import pools as fake_pools
from admission.tools.sim import model as provider_model

from helpers import pool_row
from test_integrations import (ASK, CLAUDE, GPT, KEY, aclose, async_adm, integration_policy, make_adm,  # noqa: F401
                               provider, totals)

#: litellm's pydantic models warn about their own TypedDicts when first built
pytestmark = pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier:UserWarning")
TIGHT = {"scale": 10.0, "ceilings": {"tpm": 100}}  # one call of N passes, the next is refused
N = 90


def exits(adm) -> list[dict]:
    """What each round's exit sent: the handle's reading, ceiling and reset, the outcome."""
    seen: list[dict] = []
    exit_record = adm._exit_record

    def spy(handle, outcome, seconds, retry_after=None):
        record, bad = exit_record(handle, outcome, seconds, retry_after)
        seen.append({"reading": handle.rate_reading, "ceiling": handle.ceiling, "reset_s": handle.reset_s,
                     "outcome": record["outcome"]})
        return record, bad

    adm._exit_record = spy
    return seen


def signals(adm, pool: str = GPT) -> tuple[int, int]:
    """(ceiling, rate_limited) signals the pool counted: a ceiling only as a mid-round report (a
    round that ends ``ceiling`` counts on its scope's ceilings, none here), load as either."""
    return counted(totals(adm), pool)


def counted(t: dict, pool: str = GPT) -> tuple[int, int]:
    return t.get(f"signal|{pool}|ceiling", 0), t.get(f"signal|{pool}|rate_limited", 0)


async def asignals(adm, pool: str = GPT) -> tuple[int, int]:
    raw = await adm.redis.hgetall(f"adm:{{{adm.mesh}}}:totals")
    return counted({k.decode(): int(v) for k, v in raw.items()}, pool)


def assert_read(reading, kind: str = "tpm", limit: float = 100) -> None:
    assert isinstance(reading, ratelimits.Reading)
    assert reading.get(kind).limit == limit and reading.get(kind).reset_s is not None


def assert_ceiling(exit_: dict, kind: str = "tpm") -> None:
    assert (exit_["outcome"], exit_["ceiling"]) == ("ceiling", kind)
    assert 0 < exit_["reset_s"] <= 60
    assert exit_["reset_s"] == pytest.approx(exit_["reading"].get(kind).reset_s)   # that limit's own reset
    assert exit_["reading"].spent == kind


def capacity_429s(monkeypatch) -> None:
    """Every request refused for load (no ceiling named, remaining tokens > 0)."""
    monkeypatch.setattr(provider_model, "p_rate_limited", lambda n, k: 1.0)


def broken_headers(monkeypatch) -> None:
    """The provider sends rate-limit headers that are no numbers nor times."""
    monkeypatch.setattr(fake_pools, "rate_headers", lambda *a, **k: {
        "x-ratelimit-limit-tokens": "lots", "x-ratelimit-remaining-tokens": "-3",
        "x-ratelimit-reset-tokens": "soon", "anthropic-ratelimit-output-tokens-reset": "9999-99-99"})


@pytest.fixture
def undeclared(monkeypatch):
    """The calls declare nothing to the ceilings and send no usage, as a call that names no sizes:
    the admission then reserves no tokens and learns no mean, so its buckets never hold a call
    back and the provider's own 429, which these tests are about, comes (the integrations
    declare their requests and reconcile them: tests/test_integration_usage.py)."""
    from admission.integrations import _calls, _calls_async, _calls_sync, _common
    from admission.integrations import litellm as adm_litellm

    monkeypatch.setattr(_common, "declared", lambda *a, **k: {"input_tokens": None, "max_tokens": None})
    monkeypatch.setattr(adm_litellm, "declared", lambda *a, **k: {})
    for module in (_calls, _calls_async, _calls_sync, adm_litellm):
        monkeypatch.setattr(module, "usage_of", lambda usage: None)


def oai(url: str, adm, **kw):
    return adm_openai.wrap(openai.OpenAI(base_url=url + "/v1", api_key=KEY), adm, lane="a", retries=0, **kw)


# -- no server ------------------------------------------------------------------------------------
def test_note_names_a_spent_ceiling_and_never_fails_the_call():
    from types import SimpleNamespace

    from admission.integrations._rate_headers import note

    r = SimpleNamespace(rate_reading=None, ceiling=None, reset_s=None)
    spent = {"x-ratelimit-limit-tokens": "100", "x-ratelimit-remaining-tokens": "0",
             "x-ratelimit-reset-tokens": "6s", "retry-after": "2"}
    assert note(r, spent, 429).spent == "tpm"
    assert (r.ceiling, r.reset_s) == ("tpm", 6.0)       # the limit's reset, not the Retry-After
    note(r, {"retry-after": "2"}, 429, "server busy")   # a capacity 429: no ceiling any more
    assert (r.ceiling, r.reset_s, r.rate_reading.retry_after) == (None, None, 2.0)
    assert note(r, {"x-ratelimit-reset-tokens": "in 9999 years"}, 200).get("tpm") is None
    assert note(r, object(), 200) is not None and note(None, spent, 429) is None
    far = {**spent, "x-ratelimit-reset-tokens": "47h"}   # a reading may be 2 days out, a release 1
    note(r, far, 429)
    assert r.reset_s == 86_400


# -- the OpenAI wrapper ---------------------------------------------------------------------------
def test_openai_calls_and_streams_leave_their_headers_on_the_round(make_adm, provider):
    adm = make_adm()
    _, url = provider(scale=10.0, ceilings={"tpm": 100_000, "rpm": 1000})
    seen = exits(adm)
    client = oai(url, adm)
    client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=20)
    list(client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=20, stream=True))
    with client.chat.completions.stream(model="gpt-x", messages=ASK, max_tokens=20) as stream:
        list(stream)
    assert [e["outcome"] for e in seen] == ["clean"] * 3
    for e in seen:
        assert_read(e["reading"], "tpm", 100_000)
        assert e["reading"].get("rpm").limit == 1000 and e["ceiling"] is None
    assert all(e["reading"].get("tpm").remaining is not None for e in seen)


def test_openai_429_on_a_token_ceiling_ends_the_round_ceiling_not_rate_limited(make_adm, provider, undeclared):
    adm = make_adm()
    _, url = provider(**TIGHT)
    seen = exits(adm)
    client = oai(url, adm)
    client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=N)
    estimate = pool_row(adm.ops.census(), GPT)["carryingCapacity"]
    with pytest.raises(openai.RateLimitError):
        client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=N)
    with pytest.raises(openai.RateLimitError):
        list(client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=N, stream=True))
    with pytest.raises(openai.RateLimitError):
        with client.chat.completions.stream(model="gpt-x", messages=ASK, max_tokens=N):
            pass
    assert seen[0]["outcome"] == "clean"
    for e in seen[1:]:
        assert_ceiling(e)
    assert signals(adm)[1] == 0   # no load signal
    assert pool_row(adm.ops.census(), GPT)["carryingCapacity"] == estimate   # not load: K̂ untouched


def test_openai_capacity_429_stays_rate_limited(make_adm, provider, monkeypatch):
    adm = make_adm()
    _, url = provider(scale=10.0, ceilings={"tpm": 100_000})
    seen = exits(adm)
    capacity_429s(monkeypatch)
    with pytest.raises(openai.RateLimitError):
        oai(url, adm).chat.completions.create(model="gpt-x", messages=ASK, max_tokens=N)
    assert (seen[0]["outcome"], seen[0]["ceiling"]) == ("rate_limited", None)
    assert_read(seen[0]["reading"], "tpm", 100_000)
    assert signals(adm) == (0, 1)


def test_openai_a_broken_header_or_a_failed_reading_never_fails_the_call(make_adm, provider, monkeypatch):
    adm = make_adm()
    _, url = provider(**TIGHT)
    seen = exits(adm)
    broken_headers(monkeypatch)
    answer = oai(url, adm).chat.completions.create(model="gpt-x", messages=ASK, max_tokens=20)
    assert answer.usage.completion_tokens > 0
    assert seen[0]["reading"].get("tpm") is None and seen[0]["outcome"] == "clean"

    def fails(*a, **k):
        raise RuntimeError("a bug in the reading")
    monkeypatch.setattr(ratelimits, "read", fails)
    oai(url, adm).chat.completions.create(model="gpt-x", messages=ASK, max_tokens=10)
    assert seen[1]["outcome"] == "clean" and seen[1]["reading"] is None


def test_a_joined_call_reports_a_spent_ceiling_on_its_round_not_load(make_adm, provider):
    adm = make_adm()
    _, url = provider(**TIGHT)
    client = oai(url, adm)
    seen = exits(adm)
    with pytest.raises(openai.RateLimitError):
        with adm.round(lane="a", model=GPT, round_id="outer") as r:
            client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=N)
            assert_read(r.rate_reading)
            assert r.ceiling is None
            client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=N)
    assert_ceiling(seen[0])
    assert signals(adm)[1] == 0 and signals(adm)[0] >= 1


def test_openai_async_wrapper_reads_headers_and_ceilings(server_url, provider, monkeypatch, undeclared):
    _, url = provider(**TIGHT)

    async def main():
        adm = await async_adm(server_url)
        seen = exits(adm)
        client = adm_openai.wrap(openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY), adm, lane="a", retries=0)
        await client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=N)
        failures = []
        for call in (lambda: client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=N),
                     lambda: client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=N, stream=True)):
            try:
                await call()
            except openai.RateLimitError as exc:
                failures.append(exc)
        try:
            async with client.chat.completions.stream(model="gpt-x", messages=ASK, max_tokens=N):
                pass
        except openai.RateLimitError as exc:
            failures.append(exc)
        counted = await asignals(adm)
        await aclose(adm)
        return seen, failures, counted

    seen, failures, counted = asyncio.run(main())
    assert len(failures) == 3
    assert seen[0]["outcome"] == "clean" and seen[0]["reading"].get("tpm").limit == 100
    for e in seen[1:]:
        assert_ceiling(e)
    assert counted[1] == 0


# -- the Anthropic wrapper ------------------------------------------------------------------------
def test_anthropic_calls_and_streams_read_headers_and_an_output_ceiling(make_adm, provider, undeclared):
    adm = make_adm()
    # Anthropic style: output tokens counted as produced, N per call, 100 a minute: the second
    # call passes on what is left and leaves the bucket in debt, the third is refused
    _, url = provider(scale=10.0, style="anthropic", ceilings={"otpm": 100, "rpm": 1000})
    seen = exits(adm)
    client = adm_anthropic.wrap(anthropic.Anthropic(base_url=url, api_key=KEY), adm, lane="a", retries=0)
    client.messages.create(model="claude-x", messages=ASK, max_tokens=N)
    with client.messages.stream(model="claude-x", messages=ASK, max_tokens=N) as stream:
        stream.get_final_message()
    with pytest.raises(anthropic.RateLimitError):
        client.messages.create(model="claude-x", messages=ASK, max_tokens=N)
    assert [e["outcome"] for e in seen[:2]] == ["clean", "clean"]
    for e in seen[:2]:
        assert e["reading"].get("otpm").limit == 100 and e["reading"].get("rpm").limit == 1000
    assert_ceiling(seen[2], "otpm")
    assert signals(adm, CLAUDE)[1] == 0


def test_anthropic_async_reads_headers_and_a_capacity_429_stays_rate_limited(server_url, provider, monkeypatch):
    _, url = provider(scale=10.0, style="anthropic", ceilings={"otpm": 100_000})

    async def main():
        adm = await async_adm(server_url)
        seen = exits(adm)
        client = adm_anthropic.wrap(anthropic.AsyncAnthropic(base_url=url, api_key=KEY), adm, lane="a", retries=0)
        message = await client.messages.create(model="claude-x", messages=ASK, max_tokens=N)
        assert message.usage.output_tokens > 0
        capacity_429s(monkeypatch)
        with pytest.raises(anthropic.RateLimitError):
            await client.messages.create(model="claude-x", messages=ASK, max_tokens=N)
        with pytest.raises(anthropic.RateLimitError):
            async with client.messages.stream(model="claude-x", messages=ASK, max_tokens=N):
                pass
        await aclose(adm)
        return seen

    seen = asyncio.run(main())
    assert [(e["outcome"], e["ceiling"]) for e in seen] == [("clean", None)] + [("rate_limited", None)] * 2
    assert all(e["reading"].get("otpm").limit == 100_000 for e in seen)


# -- the httpx transports -------------------------------------------------------------------------
def body(max_tokens: int = N) -> dict:
    return {"model": "gpt-x", "messages": ASK, "max_tokens": max_tokens}


def test_transport_reads_each_responses_headers_and_a_ceiling_429(make_adm, provider, monkeypatch, undeclared):
    adm = make_adm()
    _, url = provider(**TIGHT)
    seen = exits(adm)
    transport = AdmissionTransport(adm, lane="a", provider="openai")
    with httpx.Client(transport=transport, base_url=url, headers={"authorization": f"Bearer {KEY}"}) as c:
        assert c.post("/v1/chat/completions", json=body()).status_code == 200
        assert c.post("/v1/chat/completions", json=body()).status_code == 429
        broken_headers(monkeypatch)
        capacity_429s(monkeypatch)
        assert c.post("/v1/chat/completions", json=body(1)).status_code == 429  # never fails the call
    assert seen[0]["outcome"] == "clean" and seen[0]["reading"].get("tpm").limit == 100
    assert_ceiling(seen[1])
    assert (seen[2]["outcome"], seen[2]["ceiling"]) == ("rate_limited", None)
    assert seen[2]["reading"].get("tpm") is None
    assert signals(adm)[1] == 1   # the capacity 429 only


def test_async_transport_reads_headers_and_a_ceiling_429(server_url, provider, undeclared):
    _, url = provider(**TIGHT)

    async def main():
        adm = await async_adm(server_url)
        seen = exits(adm)
        transport = AsyncAdmissionTransport(adm, lane="a", provider="openai")
        async with httpx.AsyncClient(transport=transport, base_url=url,
                                     headers={"authorization": f"Bearer {KEY}"}) as c:
            statuses = [(await c.post("/v1/chat/completions", json=body())).status_code for _ in range(2)]
        await aclose(adm)
        return seen, statuses

    seen, statuses = asyncio.run(main())
    assert statuses == [200, 429]
    assert seen[0]["reading"].get("tpm").limit == 100 and seen[0]["outcome"] == "clean"
    assert_ceiling(seen[1])


def test_a_joined_transport_request_reports_a_spent_ceiling(make_adm, provider):
    adm = make_adm()
    _, url = provider(**TIGHT)
    transport = AdmissionTransport(adm, lane="a", provider="openai")
    with httpx.Client(transport=transport, base_url=url, headers={"authorization": f"Bearer {KEY}"}) as c:
        with adm.round(lane="a", model=GPT, round_id="outer") as r:
            c.post("/v1/chat/completions", json=body())
            assert_read(r.rate_reading)
            assert c.post("/v1/chat/completions", json=body()).status_code == 429
            assert r.ceiling == "tpm" and r.reset_s > 0
    assert signals(adm) == (1, 0)   # reported by the joined request; the round ended clean


# -- the LiteLLM hook -----------------------------------------------------------------------------
def _litellm_call(url: str, **kw):
    return litellm.acompletion(model="openai/gpt-x", api_base=url + "/v1", api_key=KEY, messages=ASK,
                               max_tokens=N, num_retries=0, max_retries=0, **kw)


def test_litellm_hook_reads_the_provider_headers_litellm_passes_on(server_url, provider, monkeypatch):
    srv, url = provider(**TIGHT)
    calls = itertools.count()

    async def main():
        adm = await async_adm(server_url)
        hook = AdmissionHook(adm, provider="openai", lane="a")
        releases = []
        release = adm.release

        async def spy(seat, **kw):
            releases.append(kw)
            return await release(seat, **kw)
        adm.release = spy
        helds = []

        async def one(fail_as=None):
            data = {"model": "gpt-x", "messages": ASK, "litellm_call_id": f"c{next(calls)}", "metadata": {}}
            data = await hook.async_pre_call_hook(None, None, data, "acompletion")
            held = hook.held[data["litellm_call_id"]]
            helds.append(held)
            logged = {"litellm_call_id": data["litellm_call_id"], "litellm_params": {"metadata": data["metadata"]}}
            try:
                response = await _litellm_call(url)
            except Exception as exc:  # noqa: BLE001 - the hook is given what the proxy gives it
                await hook.async_log_failure_event({**logged, "exception": exc}, None, None, None)
                return
            await hook.async_log_success_event(logged, response, None, None)

        await one()
        await one()                      # the token ceiling: a 429 naming tokens per min
        capacity_429s(monkeypatch)
        srv.configure(ceilings={"tpm": None})  # no ceiling, no header: the next 429 is the provider's load
        await one()
        counted = await asignals(adm)
        await hook.aclose()
        await aclose(adm)
        return helds, releases, counted

    helds, releases, counted = asyncio.run(main())
    assert helds[0].rate_reading.get("tpm").limit == 100 and releases[0]["outcome"] == "clean"
    assert releases[0]["reading"] is helds[0].rate_reading     # the release carries it: the ceilings learn
    assert helds[1].rate_reading.spent == "tpm"
    assert (releases[1]["outcome"], releases[1]["ceiling"]) == ("ceiling", "tpm") and releases[1]["reset_s"] > 0
    assert releases[2]["outcome"] == "rate_limited" and "ceiling" not in releases[2]
    assert counted[1] == 1   # the capacity 429 only


def test_litellm_hook_a_failed_reading_never_fails_the_release(server_url, provider, monkeypatch):
    _, url = provider(**TIGHT)

    async def main():
        adm = await async_adm(server_url)
        hook = AdmissionHook(adm, provider="openai", lane="a")
        monkeypatch.setattr(ratelimits, "read", lambda *a, **k: 1 / 0)
        data = await hook.async_pre_call_hook(None, None, {"model": "gpt-x", "messages": ASK,
                                                           "litellm_call_id": "x1", "metadata": {}}, "acompletion")
        response = await _litellm_call(url)
        logged = {"litellm_call_id": "x1", "litellm_params": {"metadata": data["metadata"]}}
        await hook.async_log_success_event(logged, response, None, None)
        row = pool_row(await adm.ops.census(), GPT)
        await hook.aclose()
        await aclose(adm)
        return row

    row = asyncio.run(main())
    assert (row["running"], row["successes"]) == (0, 1)
