"""The fake provider (admission/tools/fake_provider/): the OpenAI and Anthropic protocols over real
HTTP, parsed by the real SDKs, served by the simulator's provider model (its one source)."""
from __future__ import annotations

import asyncio
import contextlib
import math
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Iterator

import anthropic
import httpx
import openai
import pytest

from admission import ratelimits
from admission.tools import fake_provider as fp
from admission.tools.fake_provider import FakeProvider, FakeProviderServer
from admission.tools.sim import model

KEY = "key-a-0123456789"
OTHER = "key-b-0123456789"  # another key: the stats show keys by their first 8 characters
HELLO = [{"role": "user", "content": "hello"}]


@contextlib.contextmanager
def served(**settings: Any) -> Iterator[tuple[FakeProviderServer, str]]:
    settings.setdefault("scale", 100.0)
    settings.setdefault("seed", 1)
    settings.setdefault("tokens", 50)
    srv = FakeProviderServer(**settings)
    with srv.running() as url:
        yield srv, url


def oai(url: str, key: str = KEY) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0, timeout=20)


def ant(url: str, key: str = KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=key, max_retries=0, timeout=20)


def post_chat(client: httpx.Client, tokens: int, model_name: str = "m", key: str = KEY) -> httpx.Response:
    return client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                       json={"model": model_name, "messages": HELLO, "max_tokens": tokens})


async def timed_chats(url: str, tokens: list[int], model_name: str = "m") -> list[tuple[int, float, httpx.Response]]:
    """Concurrent chat requests (one connection each); (status, real seconds, response) in order."""
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=httpx.Limits(max_connections=100)) as c:
        async def one(t: int) -> tuple[int, float, httpx.Response]:
            t0 = time.monotonic()
            r = await c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                             json={"model": model_name, "messages": HELLO, "max_tokens": t})
            return r.status_code, time.monotonic() - t0, r

        return list(await asyncio.gather(*(one(t) for t in tokens)))


# -- the protocols, parsed by the real SDKs -------------------------------------------------------


def test_chat_completion_parses_with_the_openai_sdk_and_usage_is_max_tokens():
    with served() as (_, url):
        r = oai(url).chat.completions.create(model="gpt-x", messages=[{"role": "user", "content": "x" * 40}],
                                             max_tokens=77)
        assert r.object == "chat.completion" and r.id.startswith("chatcmpl-") and r.model == "gpt-x"
        assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
        assert r.choices[0].finish_reason == "stop"
        assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (10, 77, 87)
        r = oai(url).chat.completions.create(model="gpt-x", messages=HELLO, max_completion_tokens=33)
        assert r.usage.completion_tokens == 33 and r.usage.prompt_tokens >= 1

        async def main() -> Any:
            client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=20)
            async with client:
                return await client.chat.completions.create(model="gpt-x", messages=HELLO, max_tokens=12)

        assert asyncio.run(main()).usage.completion_tokens == 12


def test_anthropic_message_parses_with_the_sdk_and_usage_is_max_tokens():
    with served() as (_, url):
        m = ant(url).messages.create(model="claude-x", max_tokens=64, system="be brief",
                                     messages=[{"role": "user", "content": [{"type": "text", "text": "y" * 40}]}])
        assert m.type == "message" and m.id.startswith("msg_") and m.role == "assistant" and m.model == "claude-x"
        assert m.content[0].type == "text" and m.content[0].text
        assert m.stop_reason == "end_turn" and m.stop_sequence is None
        assert (m.usage.input_tokens, m.usage.output_tokens) == (12, 64)

        async def main() -> Any:
            client = anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0, timeout=20)
            async with client:
                return await client.messages.create(model="claude-x", max_tokens=21, messages=HELLO)

        assert asyncio.run(main()).usage.output_tokens == 21


def test_streams_parse_with_both_sdks():
    with served() as (_, url):
        chunks = list(oai(url).chat.completions.create(model="m", messages=HELLO, max_tokens=40, stream=True,
                                                       stream_options={"include_usage": True}))
        assert all(c.object == "chat.completion.chunk" for c in chunks)
        assert chunks[0].choices[0].delta.role == "assistant"
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
        plain = list(oai(url).chat.completions.create(model="m", messages=HELLO, max_tokens=40, stream=True))
        assert all(c.usage is None for c in plain) and plain[-1].choices[0].finish_reason == "stop"

        with ant(url).messages.stream(model="c", max_tokens=30, messages=HELLO) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert text and final.content[0].text == text
        assert final.usage.output_tokens == 30 and final.stop_reason == "end_turn"
        kinds = [e.type for e in ant(url).messages.create(model="c", max_tokens=30, messages=HELLO, stream=True)]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert {"content_block_start", "content_block_delta", "content_block_stop", "message_delta"} <= set(kinds)

        async def main() -> str:
            client = anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0, timeout=20)
            async with client, client.messages.stream(model="c", max_tokens=5, messages=HELLO) as s:
                return "".join([t async for t in s.text_stream])

        assert asyncio.run(main())


# -- the model: processor sharing, refusals, cuts -------------------------------------------------------


def test_one_round_alone_takes_its_tokens_over_the_model_rate_over_scale():
    scale, tokens = 100.0, 1830
    with served(capacity=4, scale=scale) as (_, url), httpx.Client(base_url=url, timeout=20) as c:
        post_chat(c, 1)  # the connection is open before the clock starts
        t0 = time.monotonic()
        assert post_chat(c, tokens).status_code == 200
        took = time.monotonic() - t0
    expected = tokens / model.rate(1, 4) / scale  # 0.30 s
    assert expected * 0.95 < took < expected * 1.25 + 0.03


def test_two_concurrent_rounds_share_the_pool_at_the_model_rate():
    scale, tokens, k = 100.0, 1830, 2
    with served(capacity=k, scale=scale) as (srv, url):
        results = asyncio.run(timed_chats(url, [tokens, tokens]))
        assert srv.stats()["models"]["m"]["peak_in_flight"] == 2
    expected = tokens / model.rate(2, k) / scale  # 0.48 s, 1.6 times alone
    for status, took, _ in results:
        assert status == 200
        assert expected * 0.9 < took < expected * 1.25 + 0.03


def test_short_round_finishes_first_and_the_long_one_speeds_up():
    scale, k = 100.0, 2
    with served(capacity=k, scale=scale) as (_, url):
        (_, short, _), (_, long_, _) = asyncio.run(timed_chats(url, [610, 1830]))
    # both at rate(2) until the short one is done, then the long one alone at rate(1)
    t_short = 610 / model.rate(2, k)
    t_long = t_short + (1830 - 610) / model.rate(1, k)
    assert t_short / scale * 0.9 < short < t_short / scale * 1.3 + 0.03
    assert t_long / scale * 0.9 < long_ < t_long / scale * 1.25 + 0.03


def test_above_capacity_429_has_retry_after_headers_and_sdks_raise_rate_limit_errors():
    with served(capacity=1, scale=200.0, seed=3) as (srv, url):
        results = asyncio.run(timed_chats(url, [600] * 24))
        refused = [r for status, _, r in results if status == 429]
        assert refused and len(refused) + sum(s == 200 for s, _, _ in results) == 24
        for r in refused:
            assert int(r.headers["retry-after"]) >= 1
            assert 0 <= int(r.headers["retry-after-ms"]) <= 60_000
            assert r.json()["error"]["code"] == "rate_limit_exceeded" and r.json()["error"]["param"] is None
        st = srv.stats()["models"]["m"]
        assert st["429"] == len(refused) and st["peak_in_flight"] > 1

        async def sdk_errors() -> list[BaseException]:
            o = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=20)
            a = anthropic.AsyncAnthropic(base_url=url, api_key=KEY, max_retries=0, timeout=20)
            async with o, a:
                calls = [o.chat.completions.create(model="m", messages=HELLO, max_tokens=600) for _ in range(12)]
                calls += [a.messages.create(model="m", max_tokens=600, messages=HELLO) for _ in range(12)]
                return [x for x in await asyncio.gather(*calls, return_exceptions=True) if isinstance(x, Exception)]

        errors = asyncio.run(sdk_errors())
        assert any(isinstance(e, openai.RateLimitError) for e in errors)
        assert any(isinstance(e, anthropic.RateLimitError) for e in errors)
        assert all(isinstance(e, (openai.RateLimitError, anthropic.RateLimitError)) for e in errors)
        for e in errors:
            assert e.status_code == 429 and int(e.response.headers["retry-after"]) >= 1


def test_retry_after_is_the_real_time_until_the_pools_next_completion(monkeypatch):
    scale, tokens = 100.0, 3050  # 0.5 s alone
    with served(capacity=4, scale=scale) as (_, url), httpx.Client(base_url=url, timeout=20) as c:
        async def main() -> tuple[float, float, httpx.Response]:
            async with httpx.AsyncClient(base_url=url, timeout=20) as ac:
                first = asyncio.ensure_future(ac.post("/v1/chat/completions", headers={"x-api-key": KEY},
                                                      json={"model": "m", "messages": HELLO, "max_tokens": tokens}))
                await asyncio.sleep(0.1)
                monkeypatch.setattr(model, "p_rate_limited", lambda n, k: 1.0)
                r = await asyncio.to_thread(post_chat, c, 10)
                heard = time.monotonic()
                monkeypatch.undo()
                assert (await first).status_code == 200
                return heard, time.monotonic(), r

        heard, done, r = asyncio.run(main())
    assert r.status_code == 429
    ms = int(r.headers["retry-after-ms"])
    assert int(r.headers["retry-after"]) == max(1, -(-ms // 1000))
    assert abs((heard + ms / 1000) - done) < 0.06  # the slot frees up when the provider said


def test_overloaded_share_one_gives_529_overloaded_errors_without_retry_after(monkeypatch):
    monkeypatch.setattr(model, "p_rate_limited", lambda n, k: 1.0)
    with served(overloaded_share=1.0) as (srv, url):
        with pytest.raises(anthropic.OverloadedError) as exc:
            ant(url).messages.create(model="m", max_tokens=10, messages=HELLO)
        assert isinstance(exc.value, anthropic.InternalServerError) and exc.value.status_code == 529
        assert exc.value.body["error"]["type"] == "overloaded_error"
        assert "retry-after" not in exc.value.response.headers
        with pytest.raises(openai.InternalServerError) as oexc:
            oai(url).chat.completions.create(model="m", messages=HELLO, max_tokens=10)
        assert oexc.value.status_code == 529 and oexc.value.body["message"] == "Overloaded"
        assert srv.stats()["models"]["m"]["529"] == 2


def test_a_round_unfinished_at_round_cap_is_cut_with_504():
    # two rounds of 100,000 tokens on K = 2 need 3,185 s each: both cut at 1,800 s (0.36 s real)
    with served(capacity=2, scale=5000.0) as (srv, url):
        results = asyncio.run(timed_chats(url, [10**6, 10**6]))
        for status, took, r in results:
            assert status == 504 and r.json()["error"]["code"] == "timeout"
            assert model.ROUND_CAP / 5000.0 * 0.95 < took < 1.5
        st = srv.stats()["models"]["m"]
        assert st["504"] == 2 and st["in_flight"] == 0 and st["tokens"] == 0

        async def sdk() -> list[Any]:
            async with openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=20) as o:
                calls = [o.chat.completions.create(model="m", messages=HELLO, max_tokens=10**6) for _ in range(2)]
                return await asyncio.gather(*calls, return_exceptions=True)

        for e in asyncio.run(sdk()):
            assert isinstance(e, openai.InternalServerError) and e.status_code == 504


def test_one_source_patched_p_rate_limited_changes_the_refusals(monkeypatch):
    monkeypatch.setattr(model, "p_rate_limited", lambda n, k: 0.0)
    with served(capacity=1, scale=200.0) as (srv, url):
        results = asyncio.run(timed_chats(url, [300] * 12))
        assert [s for s, _, _ in results] == [200] * 12
        assert srv.stats()["models"]["m"]["peak_in_flight"] >= 10  # far above K = 1
        monkeypatch.setattr(model, "p_rate_limited", lambda n, k: 1.0)
        results = asyncio.run(timed_chats(url, [300] * 6))
        assert [s for s, _, _ in results] == [429] * 6
        st = srv.stats()["models"]["m"]
        assert (st["200"], st["429"], st["requests"]) == (12, 6, 18)


# -- faults, keys ----------------------------------------------------------------------------------


def test_injected_faults_raise_sdk_errors_with_their_status():
    with served(faults={500: 1.0}) as (srv, url):
        with pytest.raises(openai.InternalServerError) as exc:
            oai(url).chat.completions.create(model="m", messages=HELLO)
        assert exc.value.status_code == 500
        srv.set_faults({529: 1.0})
        with pytest.raises(anthropic.OverloadedError):
            ant(url).messages.create(model="m", max_tokens=5, messages=HELLO)
        srv.set_faults({"402": 1.0})
        with pytest.raises(anthropic.APIStatusError) as aexc:
            ant(url).messages.create(model="m", max_tokens=5, messages=HELLO)
        assert aexc.value.status_code == 402 and aexc.value.body["error"]["type"] == "billing_error"
        with pytest.raises(openai.APIStatusError) as oexc:
            oai(url).chat.completions.create(model="m", messages=HELLO)
        assert oexc.value.status_code == 402 and oexc.value.body["message"] == "Insufficient credits"
        srv.set_faults(None)
        assert oai(url).chat.completions.create(model="m", messages=HELLO).usage.completion_tokens == 50
        st = srv.stats()["models"]["m"]
        assert (st["5xx"], st["529"], st["402"], st["200"]) == (1, 1, 2, 1)


def test_admin_faults_replace_the_faults_and_settings_at_runtime():
    with served(faults={500: 1.0}) as (srv, url), httpx.Client(base_url=url, timeout=20) as c:
        r = c.post("/admin/faults", json={"faults": {"503": 1.0}, "capacity": {"m": 3}, "overloaded_share": 0.5})
        assert r.status_code == 200 and r.json()["faults"] == {"503": 1.0}
        assert post_chat(c, 5).status_code == 503
        assert c.post("/admin/faults", json={"faults": {}}).json()["faults"] == {}
        assert post_chat(c, 5).status_code == 200
        st = srv.stats()
        assert st["models"]["m"]["capacity"] == 3 and st["overloaded_share"] == 0.5
        assert c.post("/admin/faults", json={"faults": {"999": 1}}).status_code == 400
        assert c.post("/admin/faults", json={"faults": {"500": 0.7, "502": 0.7}}).status_code == 400
        assert srv.stats()["faults"] == {}  # a refused change changes nothing
        assert c.post("/admin/reset").status_code == 200
        st = srv.stats()["models"]["m"]
        assert (st["requests"], st["200"], st["5xx"]) == (0, 0, 0)


def test_daily_key_limit_refuses_with_403_and_the_exact_message_per_key():
    # 100 + 1 tokens at 0.01 USD / 1k = 0.00101 USD: one request reaches a 0.001 USD limit
    with served(key_limit_usd=0.001, price_per_1k=0.01) as (srv, url):
        assert oai(url).chat.completions.create(model="m", messages=HELLO, max_tokens=100).usage.total_tokens == 101
        with pytest.raises(openai.PermissionDeniedError) as exc:
            oai(url).chat.completions.create(model="m", messages=HELLO, max_tokens=100)
        assert exc.value.status_code == model.KEY_LIMIT_STATUS == 403
        assert exc.value.body["message"] == model.KEY_LIMIT_MESSAGE
        with pytest.raises(anthropic.PermissionDeniedError) as aexc:
            ant(url).messages.create(model="m", max_tokens=5, messages=HELLO)
        assert aexc.value.body["error"] == {"type": "permission_error", "message": model.KEY_LIMIT_MESSAGE}
        assert ant(url, OTHER).messages.create(model="m", max_tokens=5, messages=HELLO).usage.output_tokens == 5
        keys = srv.stats()["keys"]
        assert keys[KEY[:8]]["limit_usd"] == 0.001 and keys[KEY[:8]]["spent_usd"] == pytest.approx(0.00101)
        assert srv.stats()["models"]["m"]["403"] == 2


def test_a_client_that_hangs_up_takes_its_round_out_of_the_pool():
    with served(scale=10.0) as (srv, url):
        with httpx.Client(base_url=url, timeout=0.2) as c, pytest.raises(httpx.ReadTimeout):
            post_chat(c, 6100)  # 10 s real
        deadline = time.monotonic() + 2
        while srv.stats()["models"]["m"]["in_flight"] and time.monotonic() < deadline:
            time.sleep(0.02)
        st = srv.stats()["models"]["m"]
        assert st["in_flight"] == 0 and st["499"] == 1 and st["peak_in_flight"] == 1


def test_fake_provider_serves_without_sockets():
    provider = FakeProvider(capacity=2, scale=100.0, seed=1)

    async def main() -> list[fp.Outcome]:
        try:
            return list(await asyncio.gather(provider.round("m", KEY, 610), provider.round("m", KEY, 610)))
        finally:
            provider.close()

    t0 = time.monotonic()
    outs = asyncio.run(main())
    took = time.monotonic() - t0
    assert [o.status for o in outs] == [200, 200] and [o.tokens for o in outs] == [610, 610]
    expected = 610 / model.rate(2, 2) / 100.0
    assert expected * 0.9 < took < expected * 1.3 + 0.03
    assert provider.stats()["total"]["tokens"] == 1220


# -- the other routes and the statistics --------------------------------------------------------------


def test_stats_count_requests_completions_refusals_peak_and_timeline(monkeypatch):
    with served(capacity=3, models={"big": 8}, scale=200.0) as (srv, url), httpx.Client(base_url=url) as c:
        asyncio.run(timed_chats(url, [200] * 3))
        monkeypatch.setattr(model, "p_rate_limited", lambda n, k: 1.0)
        assert post_chat(c, 5).status_code == 429
        monkeypatch.undo()
        assert post_chat(c, 5, model_name="big").status_code == 200
        st = c.get("/stats").json()
    m, big, total = st["models"]["m"], st["models"]["big"], st["total"]
    assert (m["requests"], m["completions"], m["200"], m["429"], m["peak_in_flight"]) == (4, 3, 3, 1, 3)
    assert (m["capacity"], big["capacity"], total["capacity"]) == (3, 8, 11)
    assert m["tokens"] == 600 and big["tokens"] == 5 and total["tokens"] == 605
    assert (total["requests"], total["completions"], total["429"]) == (5, 4, 1)
    assert [n for _, n in m["timeline"]][:1] == [0] and max(n for _, n in m["timeline"]) == 3
    assert m["timeline"][-1][1] == 0 and m["in_flight"] == 0
    times = [t for t, _ in total["timeline"]]
    assert times == sorted(times) and total["peak_in_flight"] == 3
    assert m["over_capacity_s"] == 0.0 and st["scale"] == 200.0 and st["uptime_s"] > 0
    assert set(fp.STATUS_KEYS) <= set(m) and KEY[:8] in st["keys"]


def test_over_capacity_seconds_count_the_time_above_k(monkeypatch):
    monkeypatch.setattr(model, "p_rate_limited", lambda n, k: 0.0)
    with served(capacity=1, scale=100.0) as (srv, url):
        asyncio.run(timed_chats(url, [1000, 1000]))
        over = srv.stats()["models"]["m"]["over_capacity_s"]
    assert 1000 / model.rate(2, 1) / 100 * 0.85 < over < 1000 / model.rate(2, 1) / 100 * 1.2


def test_healthz_models_401_without_key_400_on_bad_body_404_411():
    with served(models={"a": 2, "b": 3}) as (srv, url), httpx.Client(base_url=url) as c:
        assert c.get("/healthz").text == "ok"
        assert [m.id for m in oai(url).models.list()] == ["a", "b"]
        r = c.post("/v1/chat/completions", json={"model": "a", "messages": HELLO})
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = c.post("/v1/messages", json={"model": "a", "max_tokens": 5, "messages": HELLO})
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        auth = {"Authorization": f"Bearer {KEY}"}
        r = c.post("/v1/chat/completions", headers=auth, content=b"{not json")
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert c.post("/v1/chat/completions", headers=auth, json={"messages": HELLO}).status_code == 400
        assert c.post("/v1/chat/completions", headers=auth, json={"model": "a", "messages": "hi"}).status_code == 400
        r = c.post("/v1/messages", headers={"x-api-key": KEY}, json={"model": "a", "messages": HELLO, "max_tokens": 0})
        assert r.status_code == 400 and r.json()["type"] == "error"
        with pytest.raises(openai.BadRequestError):
            oai(url).chat.completions.create(model="", messages=HELLO)
        assert c.get("/v1/nope").status_code == 404
        assert srv.stats()["rejected"] == {"401": 2, "400": 5, "404": 1}
    with served() as (srv, _), socket.create_connection((srv.host, srv.port)) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
        assert s.recv(100).startswith(b"HTTP/1.1 411 ")


def test_bad_settings_are_refused():
    for bad in ({"faults": {999: 1}}, {"faults": {500: 1.5}}, {"capacity": 0}, {"scale": -1},
                {"models": {"m": 0}}, {"overloaded_share": 2}, {"tokens": 0}):
        with pytest.raises(ValueError):
            FakeProvider(**bad)


# -- the command -----------------------------------------------------------------------------------------


def test_cli_prints_its_url_serves_and_exits_0_on_sigint():
    proc = subprocess.Popen([sys.executable, "-m", "admission", "fake-provider", "--port", "0", "--scale", "100",
                             "--model", "m=4", "--tokens", "20"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        url = line.split()[3]
        assert line == f"fake provider on {url} (OpenAI: {url}/v1, Anthropic: {url})" and not url.endswith(":0")
        assert oai(url).chat.completions.create(model="m", messages=HELLO).usage.completion_tokens == 20
        assert httpx.get(url + "/stats").json()["models"]["m"]["capacity"] == 4
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert proc.stderr.read() == ""  # nothing per request at INFO
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("args", [["--fault", "999=1"], ["--model", "m"], ["--scale", "0"], ["--nope"]])
def test_cli_bad_arguments_exit_2_with_one_line(args):
    r = subprocess.run([sys.executable, "-m", "admission", "fake-provider", "--port", "0", *args],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and r.stdout == ""
    assert len(r.stderr.strip().splitlines()) == 1 and r.stderr.startswith("admission fake-provider: ")


# -- the rate ceilings (admission/tools/sim/ceilings.py) --------------------------------------------

GO_DURATION = re.compile(r"(\d+h)?(\d+m)?(\d+(\.\d+)?s)?|\d+ms")


@pytest.fixture
def fast_rounds(monkeypatch):
    """Rounds served at once: what the buckets count is then not blurred by the rounds' time."""
    monkeypatch.setattr(model, "rate", lambda n, k: 1e9)


def ask(c: httpx.Client, prompt_tokens: int, max_tokens: int, route: str = "openai") -> httpx.Response:
    """A chat request whose prompt the provider counts as ``prompt_tokens`` (4 characters each)."""
    messages = [{"role": "user", "content": "x" * (4 * prompt_tokens)}]
    if route == "openai":
        return c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": "m", "messages": messages, "max_tokens": max_tokens})
    return c.post("/v1/messages", headers={"x-api-key": KEY},
                  json={"model": "m", "messages": messages, "max_tokens": max_tokens})


def bucket_state(srv: FakeProviderServer) -> dict:
    p = srv.provider
    return srv._call(lambda: p.scope(KEY, "m").state(p.provider_now()))


def rate_limit_headers(r: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in r.headers.items() if "ratelimit" in k}


def test_without_ceilings_no_rate_limit_headers_and_no_ceiling_stats():
    with served() as (srv, url), httpx.Client(base_url=url) as c:
        r = ask(c, 100, 10)
        assert r.status_code == 200 and rate_limit_headers(r) == {}
        assert "prompt_tokens_details" not in r.json()["usage"] and "ceilings" not in srv.stats()


def test_openai_style_counts_prompt_plus_max_tokens_on_arrival_and_names_tpm(fast_rounds):
    with served(ceilings={"rpm": 1000, "tpm": 10_000}, scale=1.0) as (srv, url), \
            httpx.Client(base_url=url, timeout=20) as c:
        r = ask(c, 1000, 5000)
        assert r.status_code == 200
        assert (r.json()["usage"]["prompt_tokens"], r.json()["usage"]["completion_tokens"]) == (1000, 5000)
        reading = ratelimits.read(r.headers, now=time.time())
        tpm, rpm = reading.get("tpm"), reading.get("rpm")
        assert tpm.limit == 10_000 and 4000 <= tpm.remaining <= 4300  # 6,000 counted on arrival
        assert rpm.limit == 1000 and rpm.remaining == 999
        assert GO_DURATION.fullmatch(r.headers["x-ratelimit-reset-tokens"])
        assert tpm.reset_s == pytest.approx((10_000 - tpm.remaining) / (10_000 / 60), abs=0.5)
        state = bucket_state(srv)  # the headers are the buckets' state
        assert abs(state["tpm"]["remaining"] - tpm.remaining) < 20 and state["rpm"]["limit"] == rpm.limit

        r = ask(c, 1000, 5000)  # 6,000 asked, about 4,000 left
        assert r.status_code == 429
        text = r.json()["error"]["message"]
        m = re.search(r"Rate limit reached for m in organization \S+ on tokens per min \(TPM\): "
                      r"Limit 10000, Used (\d+), Requested 6000\. Please try again in ([\d.]+)s", text)
        assert m and 5700 <= int(m[1]) <= 6000
        ms = int(r.headers["retry-after-ms"])
        assert 10_000 <= ms <= 12_100 and int(r.headers["retry-after"]) == math.ceil(ms / 1000)
        assert float(m[2]) == pytest.approx(ms / 1000, abs=0.01)
        assert r.json()["error"]["code"] == "rate_limit_exceeded"
        reading = ratelimits.read(r.headers, 429, text, now=time.time())
        assert reading.spent == "tpm" and reading.get("tpm").remaining < 6000  # headers on the 429 too
        assert ratelimits.spent_ceiling(429, reading, text) == "tpm"

        srv.set_faults({500: 1.0})  # every answer carries the headers
        r = ask(c, 10, 10)
        assert r.status_code == 500 and ratelimits.read(r.headers).get("tpm").limit == 10_000
        srv.set_faults(None)
        with pytest.raises(openai.RateLimitError) as exc:
            oai(url).chat.completions.create(model="m", messages=[{"role": "user", "content": "x" * 4000}],
                                             max_tokens=5000)
        assert ratelimits.read(exc.value.response.headers, 429, exc.value.message).spent == "tpm"
        st = srv.stats()
        assert st["ceilings"]["429"] == {"rpm": 0, "tpm": 2} and st["models"]["m"]["429"] == 2


def test_anthropic_style_counts_no_cache_reads_and_the_output_when_produced(fast_rounds):
    settings = {"ceilings": {"rpm": 50, "itpm": 20_000, "otpm": 2000}, "style": "anthropic",
                "cache_read_share": 0.7, "cache_write_share": 0.1, "scale": 1.0}
    with served(**settings) as (srv, url), httpx.Client(base_url=url, timeout=20) as c:
        raw = ant(url).messages.with_raw_response.create(
            model="m", max_tokens=500, messages=[{"role": "user", "content": "x" * 40_000}])
        usage = raw.parse().usage
        assert (usage.input_tokens, usage.cache_read_input_tokens, usage.cache_creation_input_tokens,
                usage.output_tokens) == (2000, 7000, 1000, 500)
        reading = ratelimits.read(raw.headers, now=time.time())
        itpm, otpm, rpm = reading.get("itpm"), reading.get("otpm"), reading.get("rpm")
        assert (itpm.limit, itpm.remaining, itpm.rounding) == (20_000, 17_000, 1000)  # 3,000 counted, not 10,000
        assert (otpm.limit, otpm.remaining) == (2000, 1000)  # 1,500 rounded down to the thousand
        assert (rpm.limit, rpm.remaining) == (50, 49)
        assert 0 <= itpm.reset_s <= 10
        st = srv.stats()["ceilings"]
        assert st["used"]["itpm"]["total"] == 3000 and st["used"]["otpm"]["total"] == 500
        assert st["used"]["rpm"]["total"] == 1

        r = ask(c, 60_000, 10, route="anthropic")  # 18,000 counted of about 17,000 left
        assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
        text = r.json()["error"]["message"]
        assert "exceed your organization's rate limit of 20,000 input tokens per minute" in text
        assert ratelimits.spent_ceiling(429, ratelimits.read(r.headers), text) == "itpm"
        assert int(r.headers["retry-after"]) >= 1

        assert ask(c, 10, 3000, route="anthropic").status_code == 200  # passes; its output is a debt
        with pytest.raises(anthropic.RateLimitError) as exc:
            ant(url).messages.create(model="m", max_tokens=10, messages=HELLO)
        assert "rate limit of 2,000 output tokens per minute" in exc.value.message
        assert int(exc.value.response.headers["retry-after"]) >= 30  # the debt of 1,500 at 33 a second
        assert exc.value.response.headers["anthropic-ratelimit-output-tokens-remaining"] == "0"
        assert srv.stats()["ceilings"]["429"] == {"rpm": 0, "itpm": 1, "otpm": 1}


def test_buckets_refill_continuously_on_the_scaled_clock(fast_rounds):
    # 60 RPM as one request a second of provider time; at scale 2, one every 500 ms real
    with served(ceilings={"rpm": 60}, rpm_burst_s=1, scale=2.0) as (_, url), \
            httpx.Client(base_url=url, timeout=20) as c:
        assert ask(c, 10, 10).status_code == 200
        r = ask(c, 10, 10)
        first = int(r.headers["retry-after-ms"])
        assert r.status_code == 429 and 0 < first <= 500
        time.sleep(first / 2000)
        r = ask(c, 10, 10)
        half = int(r.headers["retry-after-ms"])
        assert r.status_code == 429 and half <= first / 2 + 10  # refilled half-way: no fixed window
        time.sleep(half / 1000 + 0.01)
        r = ask(c, 10, 10)
        assert r.status_code == 200 and r.headers["x-ratelimit-limit-requests"] == "60"


def test_outside_traffic_spends_part_of_the_key(fast_rounds):
    # 6,000 TPM of which 3,000 spent outside; at scale 60 a provider minute is a real second
    with served(ceilings={"tpm": 6000}, outside={"tpm": 3000}, scale=60.0) as (srv, url), \
            httpx.Client(base_url=url, timeout=20) as c:
        r = ask(c, 1000, 5000)
        assert r.status_code == 200
        assert ratelimits.read(r.headers).get("tpm").reset_s == pytest.approx(2.0, abs=0.1)  # 6,000 at 3,000/s
        r = ask(c, 1000, 2000)
        assert r.status_code == 429
        assert 700 <= int(r.headers["retry-after-ms"]) <= 1000  # 3,000 at 3,000/s: twice as long as alone
        assert srv.stats()["ceilings"]["outside_per_minute"] == {"tpm": 3000}
    with pytest.raises(ValueError, match="below the tpm limit"):
        FakeProvider(ceilings={"tpm": 6000}, outside={"tpm": 6000})


def test_the_daily_cap_holds_until_utc_midnight_of_the_provider_clock(fast_rounds):
    midnight = (math.floor(time.time() / 86_400) + 1) * 86_400.0
    with served(ceilings={"rpd": 3}, clock_start=midnight - 120, scale=60.0) as (srv, url), \
            httpx.Client(base_url=url, timeout=20) as c:
        for left in (2, 1, 0):
            r = ask(c, 10, 10)
            assert r.status_code == 200 and r.headers["x-ratelimit-remaining-requests"] == str(left)
        r = ask(c, 10, 10)
        assert r.status_code == 429 and "on requests per day (RPD): Limit 3, Used 3" in r.json()["error"]["message"]
        reading = ratelimits.read(r.headers, 429, r.text, requests_per="day")
        assert reading.spent == "rpd" and (reading.get("rpd").limit, reading.get("rpd").remaining) == (3, 0)
        wait = int(r.headers["retry-after-ms"]) / 1000
        assert 0.5 < wait <= 2.0 and reading.get("rpd").reset_s == pytest.approx(wait, abs=0.05)
        time.sleep(wait + 0.05)
        r = ask(c, 10, 10)  # a new UTC day
        assert r.status_code == 200 and r.headers["x-ratelimit-remaining-requests"] == "2"
        assert srv.stats()["ceilings"]["429"] == {"rpd": 1}


def test_a_limit_lowered_mid_run_is_in_force_from_the_next_response(fast_rounds):
    with served(ceilings={"tpm": 100_000}, scale=1.0) as (srv, url), httpx.Client(base_url=url, timeout=20) as c:
        assert ask(c, 100, 10).headers["x-ratelimit-limit-tokens"] == "100000"
        r = c.post("/admin/faults", json={"ceilings": {"tpm": 50_000}})
        assert r.status_code == 200 and r.json()["ceilings"] == {"tpm": 50_000}
        r = ask(c, 100, 10)
        reading = ratelimits.read(r.headers)
        assert reading.get("tpm").limit == 50_000 and reading.get("tpm").remaining < 50_000
        r = ask(c, 50_000, 1000)  # more than the bucket holds: never fits, no retry-after
        text = r.json()["error"]["message"]
        assert r.status_code == 429 and "retry-after" not in r.headers
        assert text.startswith("Request too large for m") and "Limit 50000, Requested 51000" in text
        assert ratelimits.spent_ceiling(429, None, text) == "tpm"
        assert c.post("/admin/faults", json={"ceilings": {"tpm": -1}}).status_code == 400
        assert c.post("/admin/faults", json={"ceilings": [1]}).status_code == 400
        assert srv.stats()["ceilings"]["limits"] == {"tpm": 50_000}  # a refused change changes nothing
        assert c.post("/admin/faults", json={"outside": {"tpm": 10_000}, "ceilings": {"rpm": 30}}).status_code == 200
        st = srv.stats()["ceilings"]
        assert st["limits"] == {"rpm": 30, "tpm": 50_000} and st["outside_per_minute"] == {"tpm": 10_000}
        assert ask(c, 100, 10).headers["x-ratelimit-limit-requests"] == "30"
        srv.configure(ceilings={"tpm": None, "rpm": None})
        assert rate_limit_headers(ask(c, 100, 10)) == {}


def test_stats_count_each_limits_use_per_provider_minute_and_429s_per_ceiling(fast_rounds):
    with served(ceilings={"rpm": 100, "tpm": 10_000}, scale=30.0) as (srv, url), \
            httpx.Client(base_url=url, timeout=20) as c:
        assert [ask(c, 1000, 1000).status_code for _ in range(2)] == [200, 200]
        assert ask(c, 1000, 9000).status_code == 429   # 10,000 asked of about 6,000
        while srv.stats()["ceilings"]["provider_minute"] < 1:
            time.sleep(0.02)
        assert ask(c, 1000, 1000).status_code == 200
        st = srv.stats()
        ceil = st["ceilings"]
        assert ceil["used"]["tpm"]["per_minute"][:2] == [4000, 2000] and ceil["used"]["tpm"]["total"] == 6000
        assert ceil["used"]["rpm"]["per_minute"][:2] == [2, 1]
        assert ceil["429"] == {"rpm": 0, "tpm": 1} and ceil["real_s_per_minute"] == 2.0
        scope = ceil["scopes"][f"{KEY[:8]}/m"]
        assert scope["429"] == {"rpm": 0, "tpm": 1} and scope["state"]["tpm"]["limit"] == 10_000
        assert st["models"]["m"]["429"] == 1 and st["models"]["m"]["200"] == 3
        srv.reset()
        assert srv.stats()["ceilings"]["used"]["tpm"]["total"] == 0


def test_cli_ceiling_options_build_the_server_and_bad_ones_exit_2(capsys):
    args = fp.cli._arguments().parse_args(["--rpm", "50", "--itpm", "30_000", "--otpm", "8000", "--style",
                                           "anthropic", "--outside-tpm", "9000", "--cache-read-share", "0.7",
                                           "--rpm-burst-s", "1", "--clock-start", "2026-12-03T23:59:00Z"])
    p = fp.server_from_args(args).provider
    assert p.ceilings.limits == {"rpm": 50, "itpm": 30_000, "otpm": 8000} and p.ceilings.style == "anthropic"
    assert p.ceilings.outside == {"tpm": 9000} and p.ceilings.rpm_burst_s == 1 and p.cache_read_share == 0.7
    assert p.clock_start == 1_796_342_340.0  # 2026-12-03T23:59:00Z
    for bad in (["--style", "azure"], ["--tpm", "-5"], ["--tpm", "100", "--outside-tpm", "100"],
                ["--clock-start", "soon"], ["--cache-read-share", "2"]):
        assert fp.main(["--port", "0", *bad]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("admission fake-provider: ")
