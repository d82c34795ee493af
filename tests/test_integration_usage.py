"""The integrations declare what their call will count against the rate ceilings and reconcile
what the provider counted (docs/design.md §5.9; admission/integrations/_counts.py): the admit
reserves the request's prompt estimate (its text's characters / 4) and its answer budget on the
pool's scope, and the round's end sends the answer's usage (uncached input, cache creation, cache
reads, output), so the bucket ends at what the provider counted.

Over real HTTP against the fake provider (admission/tools/fake_provider/), on real Redis /
Valkey. The scopes have a daily token bucket only (``tpd``: no refill within the test, so levels
are exact); the fake provider reads half of each prompt from its cache and writes a quarter to
it, so what it counts differs from the reservation and the refund shows. What a round reserved
is read at its exit, before its release: the seat (``cIn``, ``cOut``) and the bucket's level.
"""
from __future__ import annotations

import asyncio
import json
import math

import anthropic
import httpx
import openai
import pytest
import redis

from admission import Status, Usage
from admission.integrations import anthropic as adm_anthropic
from admission.integrations import openai as adm_openai
from admission.integrations._counts import declared, input_estimate, usage_of
from admission.integrations._http import _call_of
from admission.integrations._sdk import NO_ANSWER
from admission.integrations.httpx import AdmissionTransport, AsyncAdmissionTransport
from admission.integrations.litellm import AdmissionHook

from test_integrations import (CLAUDE, GPT, KEY, aclose, async_adm, integration_policy, make_adm,  # noqa: F401
                               provider)

pytestmark = pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier:UserWarning")
START = 1_000_000.0                          # each scope's daily tokens
PROMPT = [{"role": "user", "content": "word " * 399 + "word"}]   # 1,999 characters
ESTIMATE = math.ceil(1999 / 4)               # 500: what the integrations declare
BUDGET = 60
CACHE = {"cache_read_share": 0.5, "cache_write_share": 0.25}
SCOPE = {GPT: "oai", CLAUDE: "ant"}


def usage_policy() -> dict:
    """The two pools on a scope each: OpenAI's output counted on arrival as its budget, Anthropic's
    as produced."""
    pol = integration_policy()
    pol["ceilings"] = {"oai": {"headroom": 1, "tpd": START},
                       "ant": {"headroom": 1, "tpd": START, "output_charge": "received"}}
    pol["pools"][GPT]["ceilings"], pol["pools"][CLAUDE]["ceilings"] = "oai", "ant"
    return pol


def level(r: redis.Redis, mesh: str, pool: str) -> float:
    return float(r.hget(f"adm:{{{mesh}}}:ceil:{SCOPE[pool]}", "tpd") or START)


def reservations(adm, url: str) -> dict:
    """What each round reserved and counted, read at its exit (before its release): round id ->
    {"in", "out": the seat's reservation, "level": its scope's bucket, "usage", "handle"}."""
    r = redis.Redis.from_url(url)
    seen: dict = {}
    exit_record = adm._exit_record

    def spy(handle, outcome, seconds, retry_after=None):
        seat = {k.decode(): v.decode() for k, v in r.hgetall(f"adm:{{{adm.mesh}}}:seat:{handle.seat.id}").items()}
        seen[handle.seat.id] = {"in": float(seat["cIn"]), "out": float(seat["cOut"]), "scope": seat["cScope"],
                                "level": level(r, adm.mesh, handle.pool), "usage": handle.usage, "handle": handle}
        return exit_record(handle, outcome, seconds, retry_after)

    adm._exit_record = spy
    return seen


def counted(pool: str, usage) -> float:
    """What the provider counted against the scope, from the answer's own usage: OpenAI the
    uncached prompt and the budget (output_charge max_tokens), Anthropic the uncached input, the
    cache writes and the output produced; cache reads count on neither (cache_reads_count off)."""
    if pool == GPT:
        cached = usage.prompt_tokens_details.cached_tokens
        return usage.prompt_tokens - cached + max(BUDGET, usage.completion_tokens)
    return usage.input_tokens + usage.cache_creation_input_tokens + usage.output_tokens


def assert_reconciled(seen: dict, rid: str, pool: str, usage, after: float) -> None:
    """The admit reserved the estimate and the budget; the end left the bucket at what the
    provider counted."""
    got = seen[rid]
    assert (got["in"], got["out"], got["scope"]) == (ESTIMATE, BUDGET, SCOPE[pool])
    assert got["level"] == pytest.approx(START - ESTIMATE - BUDGET)
    assert isinstance(got["usage"], Usage) and got["usage"] == usage_of(usage)
    assert after == pytest.approx(START - counted(pool, usage))
    assert counted(pool, usage) < ESTIMATE + BUDGET          # the cache reads were refunded


# -- no server ------------------------------------------------------------------------------------
def test_a_request_declares_its_prompt_estimate_and_answer_budget_and_nothing_it_does_not_name():
    assert declared({"messages": PROMPT, "max_tokens": BUDGET}) == {"input_tokens": ESTIMATE, "max_tokens": BUDGET}
    assert declared({"messages": PROMPT, "max_tokens": BUDGET}, input_tokens=7)["input_tokens"] == 7   # the call's own
    assert declared({"model": "m"}) == {"input_tokens": None, "max_tokens": None}   # the learned mean stands in
    assert declared({"input": "abcdefgh", "instructions": "abcd", "max_output_tokens": 5}) == \
        {"input_tokens": 3, "max_tokens": 5}                                          # Responses
    assert declared({"input": "abcd"}, answers=False)["max_tokens"] == 0              # embeddings answer nothing
    assert ("embeddings", "create") in NO_ANSWER
    # Anthropic's system and tools count; roles, types and an image's bytes do not
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "A" * 10_000}}
    assert input_estimate({"system": "abcd", "messages": [{"role": "user", "content": [image]}],
                           "tools": [{"name": "ab", "input_schema": {}}]}) == math.ceil((4 + 4 + 2 + 12) / 4)
    assert input_estimate({"prompt": [1, 2, 3]}) == 3                                 # token ids


def test_a_transport_request_declares_its_json_body_and_an_embeddings_request_answers_nothing():
    chat = {"model": "gpt-x", "messages": PROMPT, "max_tokens": BUDGET}
    assert _call_of(httpx.Request("POST", "http://p/v1/chat/completions", json=chat)) == (chat, True)
    assert _call_of(httpx.Request("POST", "http://p/v1/embeddings/", json={"input": "abcd"})) == \
        ({"input": "abcd"}, False)
    assert _call_of(httpx.Request("POST", "http://p/v1/chat/completions", content=b'{"max_tokens": 9}')) == \
        ({}, True)                                                                     # not JSON: not read


def test_the_answers_usage_is_what_the_provider_counted_in_each_sdks_shape():
    assert usage_of({"prompt_tokens": 10, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 4}}) == \
        Usage(input_tokens=6, cache_read_tokens=4, output_tokens=3)                  # OpenAI chat
    assert usage_of({"input_tokens": 10, "output_tokens": 3, "input_tokens_details": {"cached_tokens": 4}}) == \
        Usage(input_tokens=6, cache_read_tokens=4, output_tokens=3)                  # Responses
    assert usage_of({"input_tokens": 10, "cache_creation_input_tokens": 2, "cache_read_input_tokens": 4,
                     "output_tokens": 3}) == Usage(10, 2, 4, 3)                       # Anthropic: beside the input
    assert usage_of({"prompt_tokens": 16, "completion_tokens": 3, "cache_creation_input_tokens": 2,
                     "cache_read_input_tokens": 4}) == Usage(10, 2, 4, 3)             # LiteLLM's form of it
    assert usage_of({"prompt_tokens": 5}) == Usage(input_tokens=5)                    # embeddings
    assert usage_of(None) is None and usage_of({"total_tokens": 3}) is None


# -- the OpenAI wrapper ---------------------------------------------------------------------------
def test_integration_reserves_its_request_and_reconciles_the_usage(make_adm, provider, server_url):
    adm = make_adm(usage_policy())
    _, url = provider(**CACHE)
    r = redis.Redis.from_url(server_url)
    seen = reservations(adm, server_url)
    client = adm_openai.wrap(openai.OpenAI(base_url=url + "/v1", api_key=KEY), adm, lane="a")
    answer = client.chat.completions.create(model="gpt-x", messages=PROMPT, max_tokens=BUDGET, round_id="o-1")
    after = level(r, adm.mesh, GPT)
    assert_reconciled(seen, "o-1", GPT, answer.usage, after)
    handle = seen["o-1"]["handle"]                               # the end sent twice: reconciled once
    assert adm.release(handle.seat, usage=handle.usage).status == Status.ALREADY_RELEASED
    assert level(r, adm.mesh, GPT) == after

    start = after                                                # a stream: its usage chunk
    stream = client.chat.completions.create(model="gpt-x", messages=PROMPT, max_tokens=BUDGET, stream=True,
                                            round_id="o-2", stream_options={"include_usage": True})
    chunks = list(stream)
    seen["o-2"]["level"] += START - start                        # (measured from this call's start)
    assert_reconciled(seen, "o-2", GPT, chunks[-1].usage, level(r, adm.mesh, GPT) + START - start)

    start = level(r, adm.mesh, GPT)                              # no usage chunk: the reservation stays
    list(client.chat.completions.create(model="gpt-x", messages=PROMPT, max_tokens=BUDGET, stream=True,
                                        round_id="o-3"))
    assert seen["o-3"]["usage"] is None
    assert level(r, adm.mesh, GPT) == pytest.approx(start - ESTIMATE - BUDGET)

    start = level(r, adm.mesh, GPT)                              # the call's own input_tokens= wins
    client.chat.completions.create(model="gpt-x", messages=PROMPT, max_tokens=BUDGET, input_tokens=900,
                                   round_id="o-4")
    assert (seen["o-4"]["in"], seen["o-4"]["out"]) == (900, BUDGET)


def test_integration_keeps_the_reservation_of_a_failed_call(make_adm, provider, server_url):
    adm = make_adm(usage_policy())
    _, url = provider(faults={500: 1.0}, **CACHE)
    r = redis.Redis.from_url(server_url)
    seen = reservations(adm, server_url)
    client = adm_openai.wrap(openai.OpenAI(base_url=url + "/v1", api_key=KEY), adm, lane="a")
    with pytest.raises(openai.InternalServerError):
        client.chat.completions.create(model="gpt-x", messages=PROMPT, max_tokens=BUDGET, round_id="f-1")
    assert seen["f-1"]["usage"] is None                           # no answer, no usage: nothing reconciled
    assert level(r, adm.mesh, GPT) == pytest.approx(START - ESTIMATE - BUDGET)


def test_each_joined_call_takes_its_own_reservation_and_the_round_reconciles_their_sum(make_adm, provider,
                                                                                        server_url):
    """A round of several SDK calls: its first joined call is its admit's reservation, each later
    one takes its own (its prompt estimate and budget) before it is sent, and the round's end
    reconciles the sum of their usages (design §5.9, lua/take.lua)."""
    adm = make_adm(usage_policy())
    _, url = provider(**CACHE)
    r = redis.Redis.from_url(server_url)
    client = adm_openai.wrap(openai.OpenAI(base_url=url + "/v1", api_key=KEY), adm, lane="a")
    with adm.round(lane="a", model=GPT, round_id="own", input_tokens=ESTIMATE, max_tokens=BUDGET) as h:
        assert level(r, adm.mesh, GPT) == START - ESTIMATE - BUDGET
        one = client.chat.completions.create(model="gpt-x", messages=PROMPT, max_tokens=BUDGET)
        assert level(r, adm.mesh, GPT) == START - ESTIMATE - BUDGET      # the admit's own
        two = client.chat.completions.create(model="gpt-x", messages=PROMPT, max_tokens=BUDGET)
        assert level(r, adm.mesh, GPT) == START - 2 * (ESTIMATE + BUDGET)  # taken before it was sent
        assert h.usage == Usage(input_tokens=2 * (one.usage.prompt_tokens - one.usage.prompt_tokens_details.cached_tokens),
                                cache_read_tokens=2 * one.usage.prompt_tokens_details.cached_tokens,
                                output_tokens=one.usage.completion_tokens + two.usage.completion_tokens)
    assert level(r, adm.mesh, GPT) == pytest.approx(START - counted(GPT, one.usage) - counted(GPT, two.usage))


def test_async_integration_reserves_its_request_and_reconciles_the_usage(server_url, provider):
    _, url = provider(**CACHE)
    r = redis.Redis.from_url(server_url)

    async def main():
        adm = await async_adm(server_url, usage_policy())
        seen = reservations(adm, server_url)
        client = adm_openai.wrap(openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY), adm, lane="a")
        answer = await client.chat.completions.create(model="gpt-x", messages=PROMPT, max_tokens=BUDGET,
                                                      round_id="a-1")
        first = level(r, adm.mesh, GPT)
        stream = await client.chat.completions.create(model="gpt-x", messages=PROMPT, max_tokens=BUDGET,
                                                      stream=True, round_id="a-2",
                                                      stream_options={"include_usage": True})
        chunks = [c async for c in stream]
        second = level(r, adm.mesh, GPT)
        await aclose(adm)
        return seen, answer, first, chunks, second

    seen, answer, first, chunks, second = asyncio.run(main())
    assert_reconciled(seen, "a-1", GPT, answer.usage, first)
    seen["a-2"]["level"] += START - first
    assert_reconciled(seen, "a-2", GPT, chunks[-1].usage, second + START - first)


# -- the Anthropic wrapper ------------------------------------------------------------------------
def test_anthropic_integration_reserves_its_request_and_reconciles_the_usage(make_adm, provider, server_url):
    adm = make_adm(usage_policy())
    _, url = provider(**CACHE)
    r = redis.Redis.from_url(server_url)
    seen = reservations(adm, server_url)
    client = adm_anthropic.wrap(anthropic.Anthropic(base_url=url, api_key=KEY), adm, lane="a")
    message = client.messages.create(model="claude-x", messages=PROMPT, max_tokens=BUDGET, round_id="c-1")
    first = level(r, adm.mesh, CLAUDE)
    assert_reconciled(seen, "c-1", CLAUDE, message.usage, first)
    assert message.usage.cache_creation_input_tokens > 0        # all four counts went with the end
    with client.messages.stream(model="claude-x", messages=PROMPT, max_tokens=BUDGET, round_id="c-2") as stream:
        final = stream.get_final_message()
    seen["c-2"]["level"] += START - first
    assert_reconciled(seen, "c-2", CLAUDE, final.usage, level(r, adm.mesh, CLAUDE) + START - first)
    start = level(r, adm.mesh, CLAUDE)                          # stream=True: its events' usage
    items = list(client.messages.create(model="claude-x", messages=PROMPT, max_tokens=BUDGET, stream=True,
                                        round_id="c-3"))
    assert items[-1].type == "message_stop"
    start_usage = items[0].message.usage
    assert seen["c-3"]["usage"] == Usage(start_usage.input_tokens, start_usage.cache_creation_input_tokens,
                                         start_usage.cache_read_input_tokens, BUDGET)
    got = seen["c-3"]["usage"]
    assert level(r, adm.mesh, CLAUDE) == pytest.approx(
        start - got.input_tokens - got.cache_creation_tokens - got.output_tokens)


def test_async_anthropic_integration_reserves_its_request_and_reconciles_the_usage(server_url, provider):
    _, url = provider(**CACHE)
    r = redis.Redis.from_url(server_url)

    async def main():
        adm = await async_adm(server_url, usage_policy())
        seen = reservations(adm, server_url)
        client = adm_anthropic.wrap(anthropic.AsyncAnthropic(base_url=url, api_key=KEY), adm, lane="a")
        message = await client.messages.create(model="claude-x", messages=PROMPT, max_tokens=BUDGET, round_id="b-1")
        first = level(r, adm.mesh, CLAUDE)
        async with client.messages.stream(model="claude-x", messages=PROMPT, max_tokens=BUDGET,
                                          round_id="b-2") as stream:
            final = await stream.get_final_message()
        second = level(r, adm.mesh, CLAUDE)
        await aclose(adm)
        return seen, message, first, final, second

    seen, message, first, final, second = asyncio.run(main())
    assert_reconciled(seen, "b-1", CLAUDE, message.usage, first)
    seen["b-2"]["level"] += START - first
    assert_reconciled(seen, "b-2", CLAUDE, final.usage, second + START - first)


# -- the httpx transports and the LiteLLM hook -------------------------------------------------------
def chat_body(**kw) -> dict:
    return {"model": "gpt-x", "messages": PROMPT, "max_tokens": BUDGET, **kw}


AUTH = {"authorization": f"Bearer {KEY}"}


def test_transport_reserves_its_json_body_and_reconciles_the_bodys_usage(make_adm, provider, server_url):
    adm = make_adm(usage_policy())
    _, url = provider(**CACHE)
    r = redis.Redis.from_url(server_url)
    seen = reservations(adm, server_url)
    with httpx.Client(transport=AdmissionTransport(adm, lane="a", provider="openai")) as http:
        answer = http.post(url + "/v1/chat/completions", json=chat_body(), headers=AUTH).json()
        rid = next(iter(seen))
        first = level(r, adm.mesh, GPT)
        assert_reconciled(seen, rid, GPT, openai.types.chat.ChatCompletion(**answer).usage, first)
        with http.stream("POST", url + "/v1/chat/completions",
                         json=chat_body(stream=True, stream_options={"include_usage": True}), headers=AUTH) as resp:
            assert b"[DONE]" in resp.read()
    rid = list(seen)[1]
    assert (seen[rid]["in"], seen[rid]["out"]) == (ESTIMATE, BUDGET)
    got = seen[rid]["usage"]
    assert got.cache_read_tokens > 0 and got.output_tokens == BUDGET
    assert level(r, adm.mesh, GPT) == pytest.approx(first - got.input_tokens - BUDGET)


def test_async_transport_reserves_its_json_body_and_reconciles_the_bodys_usage(server_url, provider):
    _, url = provider(**CACHE)
    r = redis.Redis.from_url(server_url)

    async def main():
        adm = await async_adm(server_url, usage_policy())
        seen = reservations(adm, server_url)
        async with httpx.AsyncClient(transport=AsyncAdmissionTransport(adm, lane="a", provider="openai")) as http:
            answer = (await http.post(url + "/v1/chat/completions", json=chat_body(), headers=AUTH)).json()
        after = level(r, adm.mesh, GPT)
        await aclose(adm)
        return seen, answer, after

    seen, answer, after = asyncio.run(main())
    assert_reconciled(seen, next(iter(seen)), GPT, openai.types.chat.ChatCompletion(**answer).usage, after)


def summed(*usages) -> Usage:
    """The round's usage after joined calls with these answers' usages: their sum."""
    got = [usage_of(u) for u in usages]
    return Usage(*(sum(getattr(u, f) for u in got)
                   for f in ("input_tokens", "cache_creation_tokens", "cache_read_tokens", "output_tokens")))


def test_each_joined_transport_request_takes_its_own_reservation_and_the_round_reconciles_their_sum(
        make_adm, provider, server_url):
    """A round of several requests through the transport, as of several SDK calls (above): its
    first joined request is its admit's reservation, each later one takes its JSON body's prompt
    estimate and budget before it is sent (the level the inner transport sees), and each 2xx
    body's usage adds to the round's, whose end reconciles the sum."""
    adm = make_adm(usage_policy())
    _, url = provider(**CACHE)
    r = redis.Redis.from_url(server_url)
    at_send = []

    class Inner(httpx.HTTPTransport):
        def handle_request(self, request):
            at_send.append(level(r, adm.mesh, GPT))
            return super().handle_request(request)

    transport = AdmissionTransport(adm, lane="a", provider="openai", inner=Inner())
    with httpx.Client(transport=transport, base_url=url, headers=AUTH) as http:
        with adm.round(lane="a", model=GPT, round_id="hx", input_tokens=ESTIMATE, max_tokens=BUDGET) as h:
            one = openai.types.chat.ChatCompletion(**http.post("/v1/chat/completions", json=chat_body()).json())
            two = openai.types.chat.ChatCompletion(**http.post("/v1/chat/completions", json=chat_body()).json())
            calls = r.hget(f"adm:{{{adm.mesh}}}:seat:hx", "cCalls")
            assert h.usage == summed(one.usage, two.usage)
    assert at_send == [START - ESTIMATE - BUDGET, START - 2 * (ESTIMATE + BUDGET)]   # the admit's own, then taken
    assert calls == b"2"
    assert level(r, adm.mesh, GPT) == pytest.approx(START - counted(GPT, one.usage) - counted(GPT, two.usage))


def test_a_joined_transport_request_that_failed_adds_no_usage_to_its_round(make_adm):
    """A 5xx's body may carry a usage; the request failed, so it adds none (as an SDK call's error)."""
    adm = make_adm(usage_policy())
    said = json.dumps({"error": {"message": "boom"}, "usage": {"prompt_tokens": 7, "completion_tokens": 3}})
    failed = httpx.MockTransport(lambda request: httpx.Response(   # a stream: read through the transport's tee
        500, headers={"content-type": "application/json"}, stream=httpx.ByteStream(said.encode())))
    transport = AdmissionTransport(adm, lane="a", provider="openai", inner=failed)
    with httpx.Client(transport=transport, base_url="http://provider.invalid") as http:
        with adm.round(lane="a", model=GPT, round_id="hx-f", input_tokens=ESTIMATE, max_tokens=BUDGET) as h:
            assert http.post("/v1/chat/completions", json=chat_body()).status_code == 500
            assert h.usage is None


def test_each_joined_async_transport_request_takes_its_own_reservation_and_the_round_reconciles_their_sum(
        server_url, provider):
    _, url = provider(**CACHE)
    r = redis.Redis.from_url(server_url)
    at_send = []

    async def main():
        adm = await async_adm(server_url, usage_policy())

        class Inner(httpx.AsyncHTTPTransport):
            async def handle_async_request(self, request):
                at_send.append(level(r, adm.mesh, GPT))
                return await super().handle_async_request(request)

        transport = AsyncAdmissionTransport(adm, lane="a", provider="openai", inner=Inner())
        async with httpx.AsyncClient(transport=transport, base_url=url, headers=AUTH) as http:
            async with adm.round(lane="a", model=GPT, round_id="ahx", input_tokens=ESTIMATE,
                                 max_tokens=BUDGET) as h:
                answers = [openai.types.chat.ChatCompletion(
                    **(await http.post("/v1/chat/completions", json=chat_body())).json()) for _ in range(2)]
                usage = h.usage
        after = level(r, adm.mesh, GPT)
        await aclose(adm)
        return answers, usage, after

    (one, two), usage, after = asyncio.run(main())
    assert at_send == [START - ESTIMATE - BUDGET, START - 2 * (ESTIMATE + BUDGET)]
    assert usage == summed(one.usage, two.usage)
    assert after == pytest.approx(START - counted(GPT, one.usage) - counted(GPT, two.usage))


def test_litellm_hook_reserves_its_request_and_reconciles_the_usage(server_url, provider):
    import litellm

    _, url = provider(**CACHE)
    r = redis.Redis.from_url(server_url)

    async def main():
        adm = await async_adm(server_url, usage_policy())
        hook = AdmissionHook(adm, provider="openai", lane="a")
        data = {"model": "gpt-x", "messages": PROMPT, "max_tokens": BUDGET, "litellm_call_id": "l-1", "metadata": {}}
        data = await hook.async_pre_call_hook(None, None, data, "acompletion")
        reserved = float((await adm.redis.hget(f"adm:{{{adm.mesh}}}:seat:l-1", "cIn")).decode()), \
            float((await adm.redis.hget(f"adm:{{{adm.mesh}}}:seat:l-1", "cOut")).decode())
        held_level = level(r, adm.mesh, GPT)
        response = await litellm.acompletion(model="openai/gpt-x", api_base=url + "/v1", api_key=KEY,
                                             messages=PROMPT, max_tokens=BUDGET, num_retries=0, max_retries=0)
        logged = {"litellm_call_id": "l-1", "litellm_params": {"metadata": data["metadata"]}}
        await hook.async_log_success_event(logged, response, None, None)
        after = level(r, adm.mesh, GPT)
        await hook.aclose()
        await aclose(adm)
        return reserved, held_level, response, after

    reserved, held_level, response, after = asyncio.run(main())
    assert reserved == (ESTIMATE, BUDGET) and held_level == pytest.approx(START - ESTIMATE - BUDGET)
    usage = response.usage
    assert after == pytest.approx(START - (usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens) - BUDGET)
