"""The integrations (admission/integrations): the OpenAI and Anthropic SDK wrappers, the httpx
transports and the decorator, over real HTTP against the fake provider
(admission/tools/fake_provider/) and on real Redis / Valkey (``server_url``).

The fake provider runs at scale 100 (a round of 60 tokens takes about 10 ms); each test has its
own provider and its own mesh. A test that needs 429s on demand patches the provider model's
``p_rate_limited`` (the fake provider looks it up at each request)."""
from __future__ import annotations

import asyncio
import datetime as dt
import inspect
import itertools
import json
import subprocess
import sys
import threading
import uuid

import anthropic
import httpx
import httpx2
import openai
import pytest

from admission import Admission, AsyncAdmission, BadArgument, WaitTimeout, current_round
from admission.integrations import admitted, use
from admission.integrations import anthropic as adm_anthropic
from admission.integrations import openai as adm_openai
from admission.integrations._common import CALL_ARGS
from admission.integrations._prices import cost_of, tokens_of
from admission.integrations.httpx import AdmissionTransport, AsyncAdmissionTransport, AsyncHttpx2AdmissionTransport
from admission.tools.fake_provider import FakeProviderServer
from admission.tools.sim import model as provider_model

from helpers import policy, pool_row, spy_releases

GPT, CLAUDE = "gpt-x@openai", "claude-x@anthropic"
PRICES = {GPT: {"price_input": 1.0, "price_output": 4.0},
          CLAUDE: {"price_input": 3.0, "price_output": 15.0, "price_cached_input": 0.3}}
ASK = [{"role": "user", "content": "hello there"}]
KEY = "sk-test"


def integration_policy(lanes: dict | None = None, **tunables) -> dict:
    """Both pools priced, server clock (no ``now=``), as in production."""
    pol = policy(lanes, pools=(GPT, CLAUDE), lease_ttl=30, **tunables)
    del pol["clock"]
    pol["pools"] = {p: dict(v) for p, v in PRICES.items()}
    return pol


def today() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")


def usd(pool: str, usage) -> float:
    """What a usage costs on a pool (the test's own arithmetic)."""
    p = PRICES[pool]
    inp = getattr(usage, "prompt_tokens", None) or getattr(usage, "input_tokens", 0)
    out = getattr(usage, "completion_tokens", None) or getattr(usage, "output_tokens", 0)
    return (inp * p["price_input"] + out * p["price_output"]) / 1e6


def spent(adm, lane: str = "a", provider: str = "openai") -> float:
    return adm.ops.ledger(today()).get(lane, {}).get(provider, 0.0)


def running(adm, pool: str = GPT) -> int:
    return pool_row(adm.ops.census(), pool)["running"]


def totals(adm) -> dict[str, int]:
    raw = adm.redis.hgetall(f"adm:{{{adm.mesh}}}:totals")
    return {k.decode(): int(v) for k, v in raw.items()}


def admitted_count(adm, pool: str = GPT) -> int:
    return sum(v for k, v in totals(adm).items() if k.startswith(f"admitted|{pool}|"))


def tombstone(adm, round_id: str) -> list[str]:
    """state|seq|pod|pool|lane of a released round."""
    return adm.redis.get(f"adm:{{{adm.mesh}}}:gone:{round_id}").decode().split("|")


@pytest.fixture
def provider():
    """Starts fake providers (scale 100); all stopped at teardown."""
    started = []

    def start(**kw):
        srv = FakeProviderServer(**{"capacity": 8, "scale": 100.0, "seed": 1, **kw})
        url = srv.start()
        started.append(srv)
        return srv, url

    yield start
    for srv in started:
        srv.stop()


@pytest.fixture
def make_adm(server_url):
    """Sync admissions with a background clock, one fresh mesh each."""
    made = []

    def make(pol: dict | None = None, mesh: str | None = None, pod: str = "pod-a") -> Admission:
        a = Admission.from_url(server_url, mesh=mesh or f"int-{uuid.uuid4().hex[:8]}", pod=pod, background=True)
        if mesh is None:
            a.ops.apply_policy(pol or integration_policy(), recovery_hold=False)
        made.append(a)
        return a

    yield make
    for a in made:  # the clock thread ends within its 0.5 s poll; nobody waits for it
        threading.Thread(target=a.close, daemon=True).start()


async def async_adm(url: str, pol: dict | None = None) -> AsyncAdmission:
    a = AsyncAdmission.from_url(url, mesh=f"int-{uuid.uuid4().hex[:8]}", pod="pod-a", background=True)
    await a.ops.apply_policy(pol or integration_policy(), recovery_hold=False)
    return a


async def aclose(adm: AsyncAdmission) -> None:
    """``close()``, again until the clock task has ended: its cancel can be lost in redis-py's
    pubsub read (then ``close()`` alone waits forever); each call cancels it once more."""
    for _ in range(50):
        try:
            await asyncio.wait_for(asyncio.shield(adm.close()), 0.2)
            return
        except TimeoutError:
            continue
    raise AssertionError("the AsyncAdmission clock did not stop")


async def arunning(adm, pool: str = GPT) -> int:
    return pool_row(await adm.ops.census(), pool)["running"]


def oai(url: str, adm, **kw):
    return adm_openai.wrap(openai.OpenAI(base_url=url + "/v1", api_key=KEY), adm, lane="a", **kw)


# -- no server ------------------------------------------------------------------------------------
def test_sdk_methods_have_no_parameter_named_like_the_popped_ones():
    from anthropic.resources.messages import AsyncMessages, Messages
    from openai.resources import completions, embeddings
    from openai.resources.chat.completions import AsyncCompletions, Completions
    from openai.resources.responses import AsyncResponses, Responses

    methods = [Completions.create, Completions.parse, Completions.stream, AsyncCompletions.create,
               completions.Completions.create, embeddings.Embeddings.create, Responses.create, Responses.parse,
               Responses.stream, AsyncResponses.create, Messages.create, Messages.parse, Messages.stream,
               AsyncMessages.create]
    for fn in methods:
        assert not set(CALL_ARGS) & set(inspect.signature(fn).parameters), fn.__qualname__


def test_a_client_and_an_admission_of_different_kinds_are_refused():
    import redis
    import redis.asyncio as aredis

    sync_adm = Admission(redis.Redis(), mesh="m", pod="p", background=False)
    async_adm_ = AsyncAdmission(aredis.Redis(), mesh="m", pod="p", background=False)
    with pytest.raises(BadArgument, match="AsyncAdmission"):
        adm_openai.wrap(openai.AsyncOpenAI(api_key=KEY), sync_adm)
    with pytest.raises(BadArgument, match="needs an admission.Admission"):
        adm_anthropic.wrap(anthropic.Anthropic(api_key=KEY), async_adm_)
    with pytest.raises(BadArgument, match="openai.OpenAI"):
        adm_openai.wrap(anthropic.Anthropic(api_key=KEY), sync_adm)
    with pytest.raises(BadArgument):
        AdmissionTransport(async_adm_, lane="a")
    with pytest.raises(BadArgument):
        AsyncAdmissionTransport(sync_adm, lane="a")


def test_usage_is_priced_per_kind_and_an_unknown_price_is_no_cost():
    anth = {"input_tokens": 100, "output_tokens": 10, "cache_read_input_tokens": 1000,
            "cache_creation_input_tokens": 50}
    assert tokens_of(anth) == (t := tokens_of(anth)) and (t.input, t.cached, t.output) == (150, 1000, 10)
    oa = {"prompt_tokens": 1000, "completion_tokens": 10, "prompt_tokens_details": {"cached_tokens": 800}}
    t = tokens_of(oa)
    assert (t.input, t.cached, t.output) == (200, 800, 10)
    assert cost_of(PRICES[CLAUDE], anth) == pytest.approx((150 * 3 + 1000 * 0.3 + 10 * 15) / 1e6)
    assert cost_of(PRICES[GPT], oa) == pytest.approx((1000 * 1 + 10 * 4) / 1e6)  # cached priced as input
    assert cost_of({"price_input": 1.0}, oa) is None   # output tokens without an output price
    assert cost_of(None, oa) is None
    assert cost_of(PRICES[GPT], {"prompt_tokens": 5, "total_tokens": 5}) == pytest.approx(5e-6)  # embeddings


def test_importing_admission_and_its_integrations_imports_no_sdk():
    code = ("import sys, admission, admission.integrations as i; i.use; i.admitted; "
            "print(sorted(m for m in ('openai', 'anthropic', 'httpx', 'httpx2', 'litellm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "PATH": ""})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# -- the OpenAI wrapper ---------------------------------------------------------------------------
def test_openai_call_runs_in_one_round_priced_and_released(make_adm, provider):
    adm = make_adm()
    srv, url = provider()
    client = oai(url, adm)
    answer = client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, round_id="t-1")
    assert answer.usage.completion_tokens == 60
    assert tombstone(adm, "t-1")[0::3] == ["released", GPT]           # released, on the pool asked
    assert spent(adm) == pytest.approx(usd(GPT, answer.usage))
    row = pool_row(adm.ops.census(), GPT)
    assert row["running"] == 0 and row["successes"] + row["failures"] == 1
    assert row["meanCostUsd"] > 0
    assert srv.stats()["models"]["gpt-x"]["requests"] == 1


def test_a_wrapped_call_moves_only_to_a_pool_its_client_can_call(make_adm, provider):
    """Refused on its pool (paused by a Retry-After), the call moves to the alternative on its own
    provider and calls that pool's model; another provider's alternative is never tried."""
    other = "gpt-y@openai"
    pol = integration_policy()
    pol["pools"][other] = dict(PRICES[GPT])
    pol["tiers"] = {}
    pol["alternatives"] = {GPT: [CLAUDE, other]}
    adm = make_adm(pol)
    srv, url = provider()
    d = adm.try_admit(lane="a", model=GPT, round_id="limited", alternatives=[])
    adm.release(d.seat, outcome="rate_limited", retry_after=30)      # GPT paused for 30 s
    client = oai(url, adm)
    for i in range(4):
        answer = client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=10, round_id=f"m-{i}")
        assert answer.model == "gpt-y" and tombstone(adm, f"m-{i}")[0::3] == ["released", other]
    models = srv.stats()["models"]
    assert models["gpt-y"]["completions"] == 4 and "claude-x" not in models and "gpt-x" not in models


def test_lane_and_round_id_come_from_the_call_else_the_context_else_the_defaults(make_adm, provider):
    adm = make_adm()
    _, url = provider()
    client = oai(url, adm)
    with use(lane="b", round_id="ctx-1"):
        client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=20)
        client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=20, lane="a", round_id="call-1")
    client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=20, round_id="default-1")
    client.with_options(timeout=30).chat.completions.create(model="gpt-x", messages=ASK, max_tokens=20,
                                                            round_id="copy-1")   # a copy is admitted too
    assert tombstone(adm, "copy-1")[0] == "released"
    assert tombstone(adm, "ctx-1")[4] == "b"
    assert tombstone(adm, "call-1")[4] == "a"
    assert tombstone(adm, "default-1")[4] == "a"
    with pytest.raises(BadArgument, match="no lane"):
        adm_openai.wrap(openai.OpenAI(base_url=url + "/v1", api_key=KEY), adm).chat.completions.create(
            model="gpt-x", messages=ASK, max_tokens=20)


def test_openai_stream_holds_its_seat_until_it_ends(make_adm, provider):
    adm = make_adm()
    _, url = provider()
    client = oai(url, adm)
    stream = client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, stream=True,
                                            stream_options={"include_usage": True})
    assert running(adm) == 1
    chunks = list(stream)
    assert running(adm) == 0
    assert spent(adm) == pytest.approx(usd(GPT, chunks[-1].usage))
    closed = client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, stream=True)
    assert running(adm) == 1
    closed.close()
    assert running(adm) == 0
    with client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, stream=True) as left:
        next(left)
        assert running(adm) == 1
    assert running(adm) == 0
    assert current_round() is None  # the stream's round never became the caller's


def test_openai_async_wrapper_admits_prices_streams_and_takes_the_context(server_url, provider):
    _, url = provider()

    async def main():
        adm = await async_adm(server_url)
        client = adm_openai.wrap(openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY), adm, lane="a")
        answer = await client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60)
        async with use(lane="b", round_id="actx-1"):
            await client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60)
        stream = await client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, stream=True,
                                                      stream_options={"include_usage": True})
        assert await arunning(adm) == 1
        chunks = [c async for c in stream]
        assert await arunning(adm) == 0
        ledger = await adm.ops.ledger(today())
        gone = (await adm.redis.get(f"adm:{{{adm.mesh}}}:gone:actx-1")).decode().split("|")
        await aclose(adm)
        return answer, chunks, ledger, gone

    answer, chunks, ledger, gone = asyncio.run(main())
    assert gone[4] == "b"
    assert ledger["a"]["openai"] == pytest.approx(usd(GPT, answer.usage) + usd(GPT, chunks[-1].usage))
    assert ledger["b"]["openai"] == pytest.approx(usd(GPT, answer.usage))


def test_a_burst_never_has_more_in_flight_than_the_admission_allowed_and_429s_are_load(
        make_adm, provider):
    adm = make_adm(integration_policy({"a": {"floor": 1.0}}, seed_estimate=4, grow_interval=60))
    srv, url = provider(capacity=2)
    slots: list[int] = []
    ask = adm.try_admit

    def spy(**kw):
        d = ask(**kw)
        if d.admitted:
            slots.append(d.slots)
        return d

    adm.try_admit = spy  # every admission's slots, as the script decided them
    client = oai(url, adm, retries=2)
    failed: list[BaseException] = []

    def worker(n: int) -> None:
        for _ in range(2):
            try:
                client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60)
            except openai.RateLimitError as exc:
                failed.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    stats = srv.stats()["models"]["gpt-x"]
    assert stats["peak_in_flight"] <= max(slots) < len(threads)
    assert stats["429"] >= 1
    assert totals(adm).get(f"signal|{GPT}|rate_limited") == stats["429"]   # each 429 was load
    row = pool_row(adm.ops.census(), GPT)
    assert row["carryingCapacity"] > 0 and row["running"] == 0
    assert stats["requests"] == admitted_count(adm)   # every request was admitted, no SDK retry


def test_a_429_with_retry_after_pauses_the_pool_for_every_pod(make_adm, provider, monkeypatch):
    adm = make_adm()
    srv, url = provider()
    monkeypatch.setattr(provider_model, "p_rate_limited", lambda n, k: 1.0 if n > 1 else 0.0)
    long_one = threading.Thread(target=httpx.post, args=(url + "/v1/chat/completions",),
                                kwargs=dict(json={"model": "gpt-x", "messages": ASK, "max_tokens": 6000},
                                            headers={"authorization": f"Bearer {KEY}"}, timeout=10))
    long_one.start()
    while srv.stats()["models"].get("gpt-x", {}).get("in_flight") != 1:
        pass
    with pytest.raises(openai.RateLimitError) as info:
        oai(url, adm, retries=0).chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60)
    assert float(info.value.response.headers["retry-after-ms"]) > 200
    other_pod = make_adm(mesh=adm.mesh, pod="pod-b")
    d = other_pod.try_admit(lane="a", model=GPT, round_id="after-429")
    assert (d.admitted, d.reason) == (False, "paused") and d.paused_for > 0
    assert pool_row(adm.ops.census(), GPT)["pausedUntil"] > 0
    long_one.join(10)


def test_a_load_refusal_is_retried_each_time_in_a_new_round(make_adm, provider, monkeypatch):
    adm = make_adm()
    srv, url = provider()
    refusals = itertools.count()
    monkeypatch.setattr(provider_model, "p_rate_limited", lambda n, k: 1.0 if next(refusals) < 2 else 0.0)
    answer = oai(url, adm, retries=2).chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60)
    stats = srv.stats()["models"]["gpt-x"]
    assert (stats["requests"], stats["429"], stats["200"]) == (3, 2, 1)
    assert admitted_count(adm) == 3
    assert totals(adm)[f"signal|{GPT}|rate_limited"] == 2
    assert spent(adm) == pytest.approx(usd(GPT, answer.usage))


def test_an_injected_500_counts_as_an_error_and_is_not_retried(make_adm, provider):
    adm = make_adm()
    srv, url = provider(faults={500: 1.0})
    with pytest.raises(openai.InternalServerError):
        oai(url, adm, retries=2).chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60)
    row = pool_row(adm.ops.census(), GPT)
    assert (row["failures"], row["carryingCapacity"], row["running"]) == (1, 0, 0)
    assert f"signal|{GPT}|rate_limited" not in totals(adm)
    assert srv.stats()["models"]["gpt-x"]["requests"] == 1


def test_a_call_inside_a_round_joins_it_and_charges_once_per_call(make_adm, provider, monkeypatch):
    adm = make_adm()
    _, url = provider()
    client = oai(url, adm)
    with adm.round(lane="a", model=GPT, round_id="outer") as r:
        first = client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60)
        second = client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=30)
        assert running(adm) == 1 and current_round() is r
        stream = client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=10, stream=True,
                                                stream_options={"include_usage": True})
        last = list(stream)[-1]
        assert running(adm) == 1
    assert admitted_count(adm) == 1
    assert len(adm.redis.keys(f"adm:{{{adm.mesh}}}:charged:outer:*:call:*")) == 3  # <id>:<seq>:<key>
    assert spent(adm) == pytest.approx(usd(GPT, first.usage) + usd(GPT, second.usage) + usd(GPT, last.usage))
    monkeypatch.setattr(provider_model, "p_rate_limited", lambda n, k: 1.0)
    with pytest.raises(openai.RateLimitError):
        with adm.round(lane="a", model=GPT, round_id="outer-2"):
            client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60)
    assert totals(adm)[f"signal|{GPT}|rate_limited"] == 1   # reported once, by the joined call
    assert admitted_count(adm) == 2 and running(adm) == 0


def test_a_call_naming_another_round_id_takes_its_own_seat(make_adm, provider):
    adm = make_adm()
    _, url = provider()
    client = oai(url, adm)
    with adm.round(lane="a", model=GPT, round_id="parent"):
        client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=20, round_id="child")
    assert admitted_count(adm) == 2
    assert totals(adm).get(f"admitted|{GPT}|a|delegated") == 1


# -- the Anthropic wrapper ------------------------------------------------------------------------
def test_anthropic_call_and_stream_are_admitted_and_priced(make_adm, provider):
    adm = make_adm()
    _, url = provider()
    client = adm_anthropic.wrap(anthropic.Anthropic(base_url=url, api_key=KEY), adm, lane="a")
    message = client.messages.create(model="claude-x", messages=ASK, max_tokens=60, round_id="m-1")
    assert tombstone(adm, "m-1")[3] == CLAUDE
    with client.messages.stream(model="claude-x", messages=ASK, max_tokens=40) as stream:
        assert running(adm, CLAUDE) == 1
        final = stream.get_final_message()
    assert running(adm, CLAUDE) == 0
    assert spent(adm, provider="anthropic") == pytest.approx(usd(CLAUDE, message.usage) + usd(CLAUDE, final.usage))
    assert not hasattr(client.messages.count_tokens, "__wrapped__")  # runs no model: not admitted


def test_anthropic_529_overloaded_counts_as_rate_limited_not_error(make_adm, provider):
    adm = make_adm()
    srv, url = provider(faults={529: 1.0})
    client = adm_anthropic.wrap(anthropic.Anthropic(base_url=url, api_key=KEY), adm, lane="a", retries=1)
    with pytest.raises(anthropic.OverloadedError):
        client.messages.create(model="claude-x", messages=ASK, max_tokens=60)
    stats = srv.stats()["models"]["claude-x"]
    assert (stats["requests"], stats["529"]) == (2, 2)          # the wrapper's retry, no SDK retry
    assert totals(adm)[f"signal|{CLAUDE}|rate_limited"] == 2
    assert pool_row(adm.ops.census(), CLAUDE)["carryingCapacity"] > 0


def test_anthropic_async_wrapper_admits_and_holds_a_stream(server_url, provider):
    _, url = provider()

    async def main():
        adm = await async_adm(server_url)
        client = adm_anthropic.wrap(anthropic.AsyncAnthropic(base_url=url, api_key=KEY), adm, lane="a")
        message = await client.messages.create(model="claude-x", messages=ASK, max_tokens=60)
        async with client.messages.stream(model="claude-x", messages=ASK, max_tokens=40) as stream:
            held = await arunning(adm, CLAUDE)
            final = await stream.get_final_message()
        after = await arunning(adm, CLAUDE)
        ledger = await adm.ops.ledger(today())
        await aclose(adm)
        return message, final, held, after, ledger

    message, final, held, after, ledger = asyncio.run(main())
    assert (held, after) == (1, 0)
    assert ledger["a"]["anthropic"] == pytest.approx(usd(CLAUDE, message.usage) + usd(CLAUDE, final.usage))


# -- sizes and progress (the cap line) ------------------------------------------------------------
def test_answer_chars_count_the_text_deltas_of_every_sdks_stream_items():
    from admission.integrations._streams import answer_chars

    chat = {"choices": [{"delta": {"content": "hello", "tool_calls": [{"function": {"arguments": '{"a":1}'}}]}}]}
    assert answer_chars(chat) == 5 + 7
    assert answer_chars({"type": "response.output_text.delta", "delta": "abc"}) == 3      # Responses / helpers
    assert answer_chars({"type": "content_block_delta", "delta": {"type": "text_delta", "text": "four"}}) == 4
    assert answer_chars({"delta": {"partial_json": '{"x"'}}) == 4 and answer_chars({"delta": {"thinking": "hm"}}) == 2
    assert answer_chars({"type": "message_delta", "delta": {"stop_reason": "end_turn"}}) == 0
    assert answer_chars({"choices": []}) == answer_chars(None) == 0


def test_a_stream_meter_reports_when_due_and_the_usage_wins_at_the_end():
    from admission.integrations._prices import UsageTracker
    from admission.integrations._streams import PROGRESS_EVERY, ProgressMeter

    now = [0.0]
    usage = UsageTracker()
    meter = ProgressMeter(lambda n: None, clock=lambda: now[0])
    assert meter.see({"delta": "x" * 40}, usage) is None                # not due yet
    now[0] += PROGRESS_EVERY
    assert meter.see({"delta": "x" * 40}, usage) == 20                  # 80 characters, 4 a token
    now[0] += PROGRESS_EVERY
    assert meter.see({"delta": ""}, usage) is None                      # nothing new
    usage.see({"usage": {"output_tokens": 31}})                         # a usage count above the estimate
    assert meter.see({"delta": ""}, usage) == 31
    assert meter.received(usage) == 31
    assert ProgressMeter(None).see({"delta": "x" * 400}, usage) is None and ProgressMeter(None).received(usage) is None
    assert ProgressMeter(lambda n: None).received(UsageTracker()) == 0  # no usage, no text


def seat_field(adm, round_id: str, field: str):
    v = adm.redis.hget(f"adm:{{{adm.mesh}}}:seat:{round_id}", field)
    return None if v is None else float(v)


def test_a_declared_call_ends_its_round_with_the_answer_tokens_it_received(make_adm, provider):
    adm = make_adm()
    _, url = provider()
    sent = spy_releases(adm)
    client = oai(url, adm)
    answer = client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, tokens=4000, round_id="d-1")
    assert sent["d-1"] == answer.usage.completion_tokens == 60   # not the 4,000 declared
    client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, round_id="u-1")
    assert sent["u-1"] is None                                   # declared nothing: sends nothing
    # the answer budget as the size, when the wrapper declares budgets
    budget = oai(url, adm, declare_budget=True)
    stream = budget.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, stream=True, round_id="b-1",
                                            stream_options={"include_usage": True})
    assert seat_field(adm, "b-1", "tokens") == 60
    chunks = list(stream)
    assert sent["b-1"] == chunks[-1].usage.completion_tokens
    with pytest.raises(BadArgument):
        oai(url, adm, declare_budget="yes")
    with pytest.raises(BadArgument):                                     # a bad size: refused, nothing seated
        client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, tokens=-5, round_id="bad-1")
    assert running(adm) == 0 and adm.redis.get(f"adm:{{{adm.mesh}}}:gone:bad-1") is None


def test_a_declared_stream_reports_its_progress_and_a_failed_report_never_fails_it(make_adm, provider, monkeypatch):
    from admission.integrations import _streams

    monkeypatch.setattr(_streams, "PROGRESS_EVERY", 0.0)  # every item with new tokens reports
    adm = make_adm()
    _, url = provider()
    sent = spy_releases(adm)
    client = oai(url, adm)
    stream = client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, tokens=60, stream=True,
                                            round_id="p-1")
    seen = []
    for _ in stream:
        got = seat_field(adm, "p-1", "pTok")
        if got is not None and (not seen or got != seen[-1]):
            seen.append(got)
    assert len(seen) >= 2 and seen == sorted(seen)                       # reported as it came, growing
    assert sent["p-1"] == pytest.approx(seen[-1], abs=1)        # no usage chunk: the estimate
    # a report Redis refuses: logged, the stream goes on and its round ends as usual
    from admission import Unavailable

    def down(*a, **kw):
        raise Unavailable("redis is down")

    monkeypatch.setattr(adm, "progress", down)
    chunks = list(client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, tokens=60, stream=True,
                                                 stream_options={"include_usage": True}, round_id="p-2"))
    assert chunks and running(adm) == 0 and sent["p-2"] == chunks[-1].usage.completion_tokens


def test_a_stream_interrupted_while_reporting_its_progress_ends_its_round(make_adm, server_url, provider, monkeypatch):
    from admission.integrations import _streams

    class Interrupted(BaseException):
        pass

    def interrupted(*a, **kw):
        raise Interrupted

    monkeypatch.setattr(_streams, "PROGRESS_EVERY", 0.0)
    adm = make_adm()
    _, url = provider()
    monkeypatch.setattr(adm, "progress", interrupted)
    stream = oai(url, adm).chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, tokens=60, stream=True)
    with pytest.raises(Interrupted):
        list(stream)
    assert running(adm) == 0

    async def main():
        aadm = await async_adm(server_url)

        async def cancelled(*a, **kw):
            raise asyncio.CancelledError

        aadm.progress = cancelled
        client = adm_openai.wrap(openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY), aadm, lane="a")
        astream = await client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, tokens=60,
                                                       stream=True)
        try:
            async for _ in astream:
                pass
        except asyncio.CancelledError:
            pass
        left = await arunning(aadm)
        await aclose(aadm)
        return left

    assert asyncio.run(main()) == 0


def test_anthropic_stream_helper_reports_progress_and_sends_the_output_tokens(make_adm, provider, monkeypatch):
    from admission.integrations import _streams

    monkeypatch.setattr(_streams, "PROGRESS_EVERY", 0.0)
    adm = make_adm()
    _, url = provider()
    sent = spy_releases(adm)
    client = adm_anthropic.wrap(anthropic.Anthropic(base_url=url, api_key=KEY), adm, lane="a", declare_budget=True)
    with client.messages.stream(model="claude-x", messages=ASK, max_tokens=40, round_id="h-1") as stream:
        assert seat_field(adm, "h-1", "tokens") == 40
        reported = [seat_field(adm, "h-1", "pTok") for _ in stream]
        final = stream.get_final_message()
    assert any(r for r in reported)
    assert sent["h-1"] == final.usage.output_tokens


def test_an_async_declared_stream_reports_progress_and_sends_what_it_received(server_url, provider, monkeypatch):
    from admission.integrations import _streams

    monkeypatch.setattr(_streams, "PROGRESS_EVERY", 0.0)
    _, url = provider()

    async def main():
        adm = await async_adm(server_url)
        sent = spy_releases(adm)
        client = adm_openai.wrap(openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY), adm, lane="a",
                                 declare_budget=True)
        answer = await client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, round_id="q-0")
        stream = await client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60, stream=True,
                                                      stream_options={"include_usage": True}, round_id="q-1")
        key = f"adm:{{{adm.mesh}}}:seat:q-1"
        reported = []
        async for _ in stream:
            reported.append(await adm.redis.hget(key, "pTok"))
        await aclose(adm)
        return answer, sent, reported

    answer, sent, reported = asyncio.run(main())
    assert sent["q-0"] == answer.usage.completion_tokens
    assert any(reported) and sent["q-1"] == 60


# -- the httpx transports -------------------------------------------------------------------------
def body(max_tokens: int = 60) -> dict:
    return {"model": "gpt-x", "messages": ASK, "max_tokens": max_tokens}


AUTH = {"authorization": f"Bearer {KEY}"}


def test_transport_runs_each_request_as_a_round_until_its_body_is_closed(make_adm, provider):
    adm = make_adm()
    srv, url = provider()
    with httpx.Client(transport=AdmissionTransport(adm, lane="a", provider="openai"), base_url=url) as http:
        ok = http.post("/v1/chat/completions", json=body(), headers=AUTH)
        assert ok.status_code == 200 and running(adm) == 0
        assert spent(adm) == pytest.approx((ok.json()["usage"]["prompt_tokens"] + 60 * 4) / 1e6)
        with http.stream("POST", "/v1/chat/completions", json=body(), headers=AUTH) as streamed:
            assert streamed.status_code == 200 and running(adm) == 1
            streamed.read()
        assert running(adm) == 0
        srv.set_faults({500: 1.0})
        assert http.post("/v1/chat/completions", json=body(), headers=AUTH).status_code == 500
        srv.set_faults({529: 1.0})
        assert http.post("/v1/chat/completions", json=body(), headers=AUTH).status_code == 529
    row = pool_row(adm.ops.census(), GPT)
    assert (row["successes"], row["failures"], row["running"]) == (2, 2, 0)
    assert totals(adm)[f"signal|{GPT}|rate_limited"] == 1          # the 529, not the 500
    with pytest.raises(BadArgument, match="no pool"):
        httpx.Client(transport=AdmissionTransport(adm, lane="a")).post(url + "/v1/chat/completions", json=body())


def test_transport_declares_the_bodys_budget_only_when_asked_and_ends_with_the_usage(make_adm, provider, server_url):
    adm = make_adm()
    _, url = provider()
    sent = spy_releases(adm)
    seat = f"adm:{{{adm.mesh}}}:seat:"
    declaring = AdmissionTransport(adm, lane="a", pool=GPT, provider="openai", declare_budget=True)
    with httpx.Client(transport=declaring, base_url=url) as http:
        with use(round_id="hx-1"):
            with http.stream("POST", "/v1/chat/completions", json=body(60), headers=AUTH) as streamed:
                assert adm.redis.hget(seat + "hx-1", "tokens") == b"60"   # pool= given: the body read for it
                answer = json.loads(streamed.read())
    assert sent["hx-1"] == answer["usage"]["completion_tokens"]
    with httpx.Client(transport=AdmissionTransport(adm, lane="a", provider="openai"), base_url=url) as http:
        with use(round_id="hx-2"):
            with http.stream("POST", "/v1/chat/completions", json=body(60), headers=AUTH) as streamed:
                assert adm.redis.hget(seat + "hx-2", "tokens") is None    # not asked: nothing declared
                streamed.read()
    assert sent["hx-2"] is None

    async def main():
        aadm = await async_adm(server_url)
        asent = spy_releases(aadm)
        transport = AsyncAdmissionTransport(aadm, lane="a", provider="openai", declare_budget=True)
        async with httpx.AsyncClient(transport=transport, base_url=url) as http:
            async with use(round_id="ahx-1"):
                ok = await http.post("/v1/chat/completions", json=body(40), headers=AUTH)
        await aclose(aadm)
        return ok.json(), asent

    answer, asent = asyncio.run(main())
    assert asent["ahx-1"] == answer["usage"]["completion_tokens"] == 40


def test_async_transport_classifies_a_non_2xx_response_without_an_exception(server_url, provider):
    srv, url = provider()

    async def main():
        adm = await async_adm(server_url)
        transport = AsyncAdmissionTransport(adm, lane="a", pool=lambda request: GPT)
        async with httpx.AsyncClient(transport=transport, base_url=url) as http:
            ok = await http.post("/v1/chat/completions", json=body(), headers=AUTH)
            async with http.stream("POST", "/v1/chat/completions", json=body(), headers=AUTH) as streamed:
                held = await arunning(adm)
                await streamed.aread()
            srv.set_faults({529: 1.0})
            refused = await http.post("/v1/chat/completions", json=body(), headers=AUTH)
        census = await adm.ops.census()
        raw = await adm.redis.hgetall(f"adm:{{{adm.mesh}}}:totals")
        ledger = await adm.ops.ledger(today())
        await aclose(adm)
        return ok, held, refused, census, {k.decode(): int(v) for k, v in raw.items()}, ledger

    ok, held, refused, census, counts, ledger = asyncio.run(main())
    assert (ok.status_code, held, refused.status_code) == (200, 1, 529)
    assert counts[f"signal|{GPT}|rate_limited"] == 1
    assert pool_row(census, GPT)["running"] == 0
    assert ledger["a"]["openai"] == pytest.approx(2 * (ok.json()["usage"]["prompt_tokens"] + 60 * 4) / 1e6)


def test_transport_ends_the_round_of_a_response_dropped_unclosed(make_adm, provider):
    """Nothing orphaned: a streamed response never closed ends its round when it is collected
    (by the body's finalizer with the response's verdict, or, when the collector reaches the
    abandoned round() first, by the generator's close as an error); counted once either way."""
    import gc
    adm = make_adm()
    srv, url = provider()
    with httpx.Client(transport=AdmissionTransport(adm, lane="a", provider="openai"), base_url=url) as http:
        response = http.send(http.build_request("POST", "/v1/chat/completions", json=body(), headers=AUTH),
                             stream=True)
        assert running(adm) == 1
        del response
        gc.collect()
        row = pool_row(adm.ops.census(), GPT)
    assert row["running"] == 0 and row["successes"] + row["failures"] == 1


def test_async_transport_ends_the_round_of_a_response_dropped_unclosed(server_url, provider):
    """Nothing orphaned: a streamed response the caller never closes ends its round when it is
    collected, instead of holding its seat for as long as the pod lives."""
    import gc
    srv, url = provider()

    async def main():
        adm = await async_adm(server_url)
        transport = AsyncAdmissionTransport(adm, lane="a", pool=lambda request: GPT)
        async with httpx.AsyncClient(transport=transport, base_url=url) as http:
            response = await http.send(http.build_request("POST", "/v1/chat/completions", json=body(),
                                                          headers=AUTH), stream=True)
            held = await arunning(adm)
            del response
            gc.collect()
            for _ in range(100):  # the finalizer schedules the round's end on the loop
                if await arunning(adm) == 0:
                    break
                await asyncio.sleep(0.02)
            row = pool_row(await adm.ops.census(), GPT)
        await aclose(adm)
        return held, row["running"], row["successes"], row["failures"]

    # asyncio's async-generator finalizer closes the abandoned round(): released as an error
    # (the response was never read, so nothing says it was clean), its seat free at once
    assert asyncio.run(main()) == (1, 0, 0, 1)


def test_transport_as_the_sdks_http_client_admits_every_sdk_attempt(make_adm, provider, server_url):
    adm = make_adm()
    srv, url = provider()
    http = httpx.Client(transport=AdmissionTransport(adm, lane="a", provider="openai"))
    client = openai.OpenAI(base_url=url + "/v1", api_key=KEY, http_client=http, max_retries=0)
    answer = client.chat.completions.create(model="gpt-x", messages=ASK, max_tokens=60)
    assert spent(adm) == pytest.approx(usd(GPT, answer.usage))
    assert admitted_count(adm) == 1 and running(adm) == 0

    async def main():
        aadm = await async_adm(server_url)
        transport = AsyncHttpx2AdmissionTransport(aadm, lane="a", provider="anthropic")  # Anthropic 2.x: httpx2
        aclient = anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0,
                                           http_client=httpx2.AsyncClient(transport=transport))
        message = await aclient.messages.create(model="claude-x", messages=ASK, max_tokens=60)
        ledger, census = await aadm.ops.ledger(today()), await aadm.ops.census()
        await aclose(aadm)
        return message, ledger, census

    message, ledger, census = asyncio.run(main())
    assert ledger["a"]["anthropic"] == pytest.approx(usd(CLAUDE, message.usage))
    assert pool_row(census, CLAUDE)["running"] == 0


# -- the decorator --------------------------------------------------------------------------------
def test_decorated_function_runs_as_one_round_with_or_without_the_round_parameter(make_adm):
    adm = make_adm()

    @admitted(lambda: adm, lane="a", model=GPT, round_id=lambda job, **_: f"job-{job}")
    def priced(job: int, *, round=None):
        assert current_round() is round and round.pool == GPT
        round.cost_usd = 0.25
        return job

    @admitted(adm, lane="b", model=GPT)
    def plain(x: int) -> int:
        assert current_round() is not None
        return 2 * x

    assert priced(7) == 7 and plain(2) == 4
    assert tombstone(adm, "job-7")[4] == "a"
    assert spent(adm) == pytest.approx(0.25)
    assert running(adm) == 0 and admitted_count(adm) == 2

    @admitted(adm, lane="a", model=GPT)
    async def wrong_kind() -> None:
        pass

    with pytest.raises(BadArgument, match="AsyncAdmission"):
        asyncio.run(wrong_kind())


def test_a_decorated_round_moves_only_where_the_function_can_call(make_adm):
    """Refused on its pool (paused by a Retry-After), a decorated call stays there unless its
    ``move_to`` says where else the function can run it (then ``round.pool`` says where)."""
    pol = integration_policy()
    pol["tiers"] = {}
    pol["alternatives"] = {GPT: [CLAUDE]}
    adm = make_adm(pol)
    d = adm.try_admit(lane="a", model=GPT, round_id="limited", alternatives=[])
    adm.release(d.seat, outcome="rate_limited", retry_after=30)      # GPT paused for 30 s

    @admitted(adm, lane="a", model=GPT, timeout=0.5)
    def fixed(*, round):
        return round.pool

    @admitted(adm, lane="a", model=GPT, timeout=5, move_to=lambda pool: pool == CLAUDE)
    def either(*, round):
        return round.pool

    with pytest.raises(WaitTimeout):
        fixed()
    assert either() == CLAUDE


def test_decorated_coroutine_runs_as_one_round_with_or_without_the_round_parameter(server_url):
    async def main():
        adm = await async_adm(server_url)

        @admitted(lambda: adm, lane="a", model=GPT, round_id="co-1")
        async def priced(*, round):
            round.cost_usd = 0.5
            return round.pool

        @admitted(adm, lane="a", model=GPT)
        async def plain(x):
            await asyncio.sleep(0)
            return x + 1

        results = (await priced(), await plain(1))
        counts = await adm.redis.hgetall(f"adm:{{{adm.mesh}}}:totals")
        ledger, census = await adm.ops.ledger(today()), await adm.ops.census()
        await aclose(adm)
        return results, counts, ledger, census

    results, counts, ledger, census = asyncio.run(main())
    assert results == (GPT, 2)
    assert sum(int(v) for k, v in counts.items() if k.decode().startswith(f"admitted|{GPT}|")) == 2
    assert ledger["a"]["openai"] == pytest.approx(0.5)
    assert pool_row(census, GPT)["running"] == 0
