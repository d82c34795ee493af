"""The LiteLLM proxy hook (admission/integrations/litellm.py).

In process: the hook's methods called with the shapes the proxy passes (real litellm exceptions
and responses, a real Redis/Valkey). End to end: the real proxy (``litellm --config
examples/litellm_proxy/config.yaml``) in a subprocess in front of the fake provider, a burst of
chat completions through it with the openai SDK.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import httpx
import litellm
import pytest
import redis
from fastapi import HTTPException
from litellm.proxy._types import UserAPIKeyAuth

from admission import Admission, AsyncAdmission
from admission.integrations.litellm import ROUND_KEY, AdmissionHook, close_admission

from helpers import policy, pool_row, spy_releases

POOL = "gpt-x@fake"
MODEL = "gpt-x"
LANES = {"default": {"floor": 0.5, "weight": 1, "priority": 2},
         "reviews": {"floor": 0.3, "weight": 1, "priority": 1}}
#: litellm's pydantic models warn about their own TypedDicts when first built
pytestmark = pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier:UserWarning")
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "litellm_proxy"


def server_policy(**tunables):
    """A policy on the server's clock (the hook passes no ``now``)."""
    pools = tunables.pop("pools", (POOL,))
    pol = policy(LANES, pools=pools, **tunables)
    del pol["clock"]
    return pol


async def setup(url, pol=None, **hook_kwargs):
    adm = AsyncAdmission.from_url(url, mesh="t", pod="proxy-1", seed=1)
    await adm.ops.apply_policy(pol or server_policy(), recovery_hold=False)
    hook = AdmissionHook(adm, provider="fake", **hook_kwargs)
    return adm, hook


async def teardown(adm, hook):
    await hook.aclose()
    await close_admission(adm)
    await adm.redis.aclose()


def request(call_id, **metadata):
    """The request data the proxy hands to the pre-call hook."""
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "litellm_call_id": call_id,
            "metadata": {"user_api_key_hash": "abc", **metadata}}


def logged(data, **extra):
    """The kwargs of the logging callbacks for a call made with ``data``."""
    return {"model": MODEL, "litellm_call_id": data["litellm_call_id"],
            "litellm_params": {"metadata": dict(data["metadata"])}, **extra}


def status_error(cls, status, headers=None):
    response = httpx.Response(status, headers=headers or {},
                              request=httpx.Request("POST", "https://fake.test/v1/chat/completions"))
    return cls(message="provider says no", llm_provider="openai", model=MODEL, response=response)


def run(main, timeout=30.0):
    """asyncio.run(main()), bounded: a hang fails the test with the stacks of every task."""
    async def bounded():
        task = asyncio.ensure_future(main())
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            import io
            out = io.StringIO()
            for t in asyncio.all_tasks():
                t.print_stack(file=out)
            task.cancel()
            pytest.fail(f"hung for {timeout:g} s:\n{out.getvalue()}")
        return task.result()
    return asyncio.run(bounded())


async def row(adm, pool=POOL):
    return pool_row(await adm.ops.census(), pool)


KEY = UserAPIKeyAuth(api_key="sk-test")
NOW = datetime.now()


# -- in process ---------------------------------------------------------------------------------
def test_admitted_then_released_clean_with_litellm_cost(server_url):
    async def main():
        adm, hook = await setup(server_url)
        try:
            other = {"model": "text-embedding", "input": "x"}
            assert await hook.async_pre_call_hook(KEY, None, dict(other), "aembedding") == other  # not a round
            data = await hook.async_pre_call_hook(KEY, None, request("c1"), "acompletion")
            assert data["metadata"][ROUND_KEY] == "c1" and data["model"] == MODEL
            assert (await row(adm))["running"] == 1
            assert hook.held["c1"].decision.lane == "default"
            await hook.async_log_success_event(logged(data, response_cost=0.25), None, NOW, NOW)
            r = await row(adm)
            assert (r["running"], r["successes"], r["failures"]) == (0, 1, 0)
            assert r["meanCostUsd"] == pytest.approx(0.25)
            assert not hook.held
        finally:
            await teardown(adm, hook)
    run(main)


def test_price_table_of_the_pool_prices_the_usage(server_url):
    async def main():
        pol = server_policy()
        pol["pools"][POOL] = {"price_input": 2.0, "price_output": 10.0, "price_cached_input": 0.5}
        adm, hook = await setup(server_url, pol)
        try:
            data = await hook.async_pre_call_hook(KEY, None, request("c1"), "acompletion")
            response = litellm.ModelResponse(model=MODEL, usage=litellm.Usage(
                prompt_tokens=1000, completion_tokens=500, total_tokens=1500,
                prompt_tokens_details={"cached_tokens": 400}))
            await hook.async_log_success_event(logged(data, response_cost=9.0), response, NOW, NOW)
            # (600 x 2 + 400 x 0.5 + 500 x 10) / 1e6, not LiteLLM's 9.0
            assert (await row(adm))["meanCostUsd"] == pytest.approx(0.0064)
        finally:
            await teardown(adm, hook)
    run(main)


def test_rate_limited_failure_pauses_the_pool_for_everyone(server_url):
    async def main():
        adm, hook = await setup(server_url)
        try:
            data = await hook.async_pre_call_hook(KEY, None, request("c1"), "acompletion")
            exc = status_error(litellm.RateLimitError, 429, {"retry-after": "5"})
            await hook.async_log_failure_event(logged(data, exception=exc), None, NOW, NOW)
            r = await row(adm)
            assert (r["running"], r["failures"]) == (0, 1)
            d = await adm.try_admit(lane="default", model=POOL, round_id="next")
            assert not d.admitted and d.reason == "paused" and 0 < d.paused_for <= 5
            totals = await adm.redis.hgetall("adm:{t}:totals")
            assert totals[f"signal|{POOL}|rate_limited".encode()] == b"1"
        finally:
            await teardown(adm, hook)
    run(main)


def test_server_error_is_an_error_and_pauses_nothing(server_url):
    async def main():
        adm, hook = await setup(server_url)
        try:
            data = await hook.async_pre_call_hook(KEY, None, request("c1"), "acompletion")
            exc = status_error(litellm.InternalServerError, 500)
            await hook.async_log_failure_event(logged(data, exception=exc), None, NOW, NOW)
            assert (await row(adm))["failures"] == 1
            d = await adm.try_admit(lane="default", model=POOL, round_id="next")
            assert d.admitted
            await adm.release(d.seat, outcome="clean")
            assert not any(k.startswith(b"signal|") for k in await adm.redis.hgetall("adm:{t}:totals"))
        finally:
            await teardown(adm, hook)
    run(main)


def test_litellms_own_rate_limit_is_not_the_providers_load(server_url):
    async def main():
        adm, hook = await setup(server_url)
        try:
            data = await hook.async_pre_call_hook(KEY, None, request("c1"), "acompletion")
            own = litellm.RateLimitError("key over its rpm", "openai", MODEL, category="litellm_rate_limit")
            await hook.async_post_call_failure_hook(data, own, KEY)
            assert (await row(adm))["failures"] == 1
            assert (await adm.try_admit(lane="default", model=POOL, round_id="next")).admitted  # not paused
        finally:
            await teardown(adm, hook)
    run(main)


def test_each_seat_is_released_exactly_once_whatever_the_order(server_url):
    async def main():
        adm, hook = await setup(server_url)
        releases = []
        release = adm.release

        async def counted(seat, **kw):
            releases.append((seat.id, kw["outcome"]))
            return await release(seat, **kw)

        adm.release = counted
        try:
            exc = status_error(litellm.InternalServerError, 500)
            a = await hook.async_pre_call_hook(KEY, None, request("a"), "acompletion")
            b = await hook.async_pre_call_hook(KEY, None, request("b"), "acompletion")
            c = await hook.async_pre_call_hook(KEY, None, request("c"), "acompletion")
            # the logged failure first, then the proxy's failure hook; the reverse; both at once
            await hook.async_log_failure_event(logged(a, exception=exc), None, NOW, NOW)
            await hook.async_post_call_failure_hook(a, exc, KEY)
            await hook.async_post_call_failure_hook(b, exc, KEY)
            await hook.async_log_failure_event(logged(b, exception=exc), None, NOW, NOW)
            await asyncio.gather(hook.async_log_failure_event(logged(c, exception=exc), None, NOW, NOW),
                                 hook.async_post_call_failure_hook(c, exc, KEY),
                                 hook.async_log_success_event(logged(c), None, NOW, NOW))
            assert sorted(rid for rid, _ in releases) == ["a", "b", "c"]
            r = await row(adm)
            assert (r["running"], r["successes"] + r["failures"]) == (0, 3)
        finally:
            await teardown(adm, hook)
    run(main)


def test_the_reaper_releases_a_seat_whose_callbacks_never_came(server_url):
    async def main():
        adm, hook = await setup(server_url, max_hold=0.3)
        try:
            await hook.async_pre_call_hook(KEY, None, request("lost"), "acompletion")
            assert (await row(adm))["running"] == 1
            deadline = time.monotonic() + 5
            while hook.held and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            r = await row(adm)
            assert not hook.held and (r["running"], r["failures"]) == (0, 1)
        finally:
            await teardown(adm, hook)
    run(main)


def test_lane_from_the_request_then_the_key_then_the_default(server_url):
    async def main():
        adm, hook = await setup(server_url)
        try:
            await hook.async_pre_call_hook(KEY, None, request("m", admission_lane="reviews"), "acompletion")
            keyed = UserAPIKeyAuth(api_key="sk-r", metadata={"lane": "reviews"})
            await hook.async_pre_call_hook(keyed, None, request("k"), "acompletion")
            await hook.async_pre_call_hook(keyed, None, request("both", lane="default"), "acompletion")
            assert {rid: h.decision.lane for rid, h in hook.held.items()} == {
                "m": "reviews", "k": "reviews", "both": "default"}
            with pytest.raises(HTTPException) as refused:
                await hook.async_pre_call_hook(KEY, None, request("x", lane="nope"), "acompletion")
            assert refused.value.status_code == 400
        finally:
            await teardown(adm, hook)
    run(main)


def test_no_seat_within_the_timeout_is_a_429_with_retry_after(server_url):
    async def main():
        adm, hook = await setup(server_url, server_policy(seed_estimate=1, max_estimate=1, grow_interval=60),
                                timeout=30)
        try:
            holder = await adm.try_admit(lane="default", model=POOL, round_id="holder")
            assert holder.admitted
            t0 = time.monotonic()
            with pytest.raises(HTTPException) as refused:
                await hook.async_pre_call_hook(KEY, None, request("w", admission_timeout=0.5), "acompletion")
            assert time.monotonic() - t0 < 5  # the request's shorter timeout
            assert refused.value.status_code == 429
            assert refused.value.headers["retry-after"] == "60"  # the pool clock's next step
            assert not hook.held and (await row(adm))["waiting"] == 0  # the waiter withdrew
            await adm.release(holder.seat, outcome="clean")
        finally:
            await teardown(adm, hook)
    run(main)


def test_admission_unreachable_is_a_503(server_url):
    async def main():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            dead = f"redis://127.0.0.1:{s.getsockname()[1]}/0"  # nothing listens there
        hook = AdmissionHook(url=dead, mesh="t", pod="proxy-1", provider="fake", timeout=1.0)
        try:
            with pytest.raises(HTTPException) as refused:
                await hook.async_pre_call_hook(KEY, None, request("u"), "acompletion")
            assert refused.value.status_code == 503 and "retry-after" in refused.value.headers
            assert not hook.held
        finally:
            await hook.aclose()
    run(main)


def test_a_moved_round_calls_the_model_group_of_its_pool(server_url):
    async def main():
        pol = server_policy(pools=(POOL, "gpt-y@fake"), seed_estimate=1, max_estimate=1, grow_interval=60)
        pol["alternatives"] = {POOL: ["gpt-y@fake"]}
        adm, hook = await setup(server_url, pol)
        try:
            holder = await adm.try_admit(lane="default", model=POOL, round_id="holder", alternatives=[])
            data = await hook.async_pre_call_hook(KEY, None, request("mv"), "acompletion")
            assert hook.held["mv"].decision.pool == "gpt-y@fake" and data["model"] == "gpt-y"
            await hook.async_log_success_event(logged(data), None, NOW, NOW)
            assert (await row(adm, "gpt-y@fake"))["successes"] == 1
            await adm.release(holder.seat, outcome="clean")
        finally:
            await teardown(adm, hook)
    run(main)


def test_a_declared_request_sends_its_answer_tokens_and_a_budget_is_declared_only_when_asked(server_url):
    async def main():
        adm, hook = await setup(server_url, declare_budget=True)
        sent = spy_releases(adm)
        seat_tokens = f"adm:{{{adm.mesh}}}:seat:"
        try:
            response = litellm.ModelResponse(model=MODEL, usage=litellm.Usage(
                prompt_tokens=100, completion_tokens=42, total_tokens=142))
            # the metadata's size wins over the budget; the release sends the usage's output count
            data = await hook.async_pre_call_hook(KEY, None, {**request("s1", admission_tokens=3000), "max_tokens": 800},
                                                  "acompletion")
            assert await adm.redis.hget(seat_tokens + "s1", "tokens") == b"3000"
            await hook.async_log_success_event(logged(data), response, NOW, NOW)
            assert sent["s1"] == 42
            # the answer budget, when the hook declares budgets
            data = await hook.async_pre_call_hook(KEY, None, {**request("s2"), "max_tokens": 800}, "acompletion")
            assert await adm.redis.hget(seat_tokens + "s2", "tokens") == b"800"
            await hook.async_log_success_event(logged(data), response, NOW, NOW)
            assert sent["s2"] == 42
            # a size the admission cannot take: 400, nothing seated
            with pytest.raises(HTTPException) as refused:
                await hook.async_pre_call_hook(KEY, None, request("s3", admission_tokens=-1), "acompletion")
            assert refused.value.status_code == 400 and "s3" not in hook.held
            assert (await row(adm))["running"] == 0
        finally:
            await teardown(adm, hook)
        # without declare_budget a budget declares nothing, and the release sends nothing
        adm, hook = await setup(server_url)
        sent = spy_releases(adm)
        try:
            data = await hook.async_pre_call_hook(KEY, None, {**request("s4"), "max_tokens": 800}, "acompletion")
            assert await adm.redis.hget(seat_tokens + "s4", "tokens") is None
            await hook.async_log_success_event(logged(data), response, NOW, NOW)
            assert sent["s4"] is None
        finally:
            await teardown(adm, hook)
    run(main)


def test_from_env(monkeypatch):
    monkeypatch.setenv("ADMISSION_URL", "redis://example:6379/1")
    monkeypatch.setenv("ADMISSION_MESH", "m1")
    monkeypatch.delenv("ADMISSION_POD", raising=False)
    monkeypatch.setenv("ADMISSION_LANE", "reviews")
    monkeypatch.setenv("ADMISSION_PROVIDER", "openrouter")
    monkeypatch.setenv("ADMISSION_POOLS", '{"fast": "haiku@anthropic"}')
    monkeypatch.setenv("ADMISSION_TIMEOUT", "30")
    monkeypatch.setenv("ADMISSION_DECLARE_BUDGET", "1")
    hook = AdmissionHook.from_env()
    assert (hook.url, hook.mesh, hook.pod, hook.lane, hook.timeout, hook.declare_budget) == (
        "redis://example:6379/1", "m1", socket.gethostname(), "reviews", 30.0, True)
    assert hook.pool_of("fast") == "haiku@anthropic" and hook.pool_of("gpt-x") == "gpt-x@openrouter"
    assert hook.model_of("haiku@anthropic") == "fast" and hook.model_of("gpt-x@openrouter") == "gpt-x"
    assert hook.model_of("gpt-x@elsewhere") is None
    monkeypatch.setenv("ADMISSION_DECLARE_BUDGET", "yes")
    with pytest.raises(ValueError, match="ADMISSION_DECLARE_BUDGET"):
        AdmissionHook.from_env()


# -- end to end: the real proxy -----------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def proxy(env: dict[str, str], port: int, log: Path):
    """``litellm --config config.yaml`` in the example's folder (where its callbacks module is),
    until its liveliness probe answers; terminated (then killed) on the way out."""
    litellm_cli = Path(sys.executable).with_name("litellm")
    with open(log, "w") as out:
        proc = subprocess.Popen([str(litellm_cli), "--config", "config.yaml", "--host", "127.0.0.1",
                                 "--port", str(port)], cwd=EXAMPLE, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 90
        while True:
            if proc.poll() is not None:
                pytest.fail(f"the proxy exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"http://127.0.0.1:{port}/health/liveliness", timeout=1).status_code == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(f"the proxy did not come up in 90 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_the_proxy_admits_every_call_and_reports_its_outcome(server_url, real_engine, tmp_path):
    if real_engine != "redis":
        pytest.skip("the proxy test runs on one engine (its startup is the slow part)")
    from openai import APIStatusError, AsyncOpenAI

    from admission.tools.fake_provider import FakeProviderServer

    slots = 3
    pol = server_policy(seed_estimate=slots, max_estimate=slots, lease_ttl=30, grow_interval=60)
    pol["lanes"] = {"default": {"floor": 1.0, "weight": 1, "priority": 1}}
    client = redis.Redis.from_url(server_url)
    test_pod = Admission(client, mesh="lp", pod="test", background=False)
    test_pod.ops.apply_policy(pol, recovery_hold=False)

    async def settled(successes, failures):
        """The pool's row once the proxy's releases are in (LiteLLM logs after it answers)."""
        deadline = time.monotonic() + 10
        while True:
            r = pool_row(test_pod.ops.census(), POOL)
            if (r["running"], r["successes"], r["failures"]) == (0, successes, failures) \
                    or time.monotonic() > deadline:
                return r
            await asyncio.sleep(0.05)

    fake = FakeProviderServer(capacity=slots, scale=100.0, seed=1, tokens=200)
    with fake.running() as fake_url:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMISSION_", "LITELLM_", "OPENAI_"))}
        env.update(ADMISSION_URL=server_url, ADMISSION_MESH="lp", ADMISSION_POD="proxy-1",
                   ADMISSION_PROVIDER="fake", FAKE_PROVIDER_BASE=f"{fake_url}/v1", FAKE_PROVIDER_KEY="sk-fake",
                   LITELLM_MASTER_KEY="sk-master", LITELLM_LOCAL_MODEL_COST_MAP="True", LITELLM_LOG="ERROR",
                   NO_PROXY="*", PYTHONUNBUFFERED="1")
        with proxy(env, free_port(), tmp_path / "proxy.log") as base:
            async def calls():
                api = AsyncOpenAI(base_url=base, api_key="sk-master", max_retries=0, timeout=60)
                ask = dict(model=MODEL, messages=[{"role": "user", "content": "hello"}])
                try:
                    # a burst of 20 on 3 slots: every call answered, never more than 3 at the provider
                    answers = await asyncio.gather(*[api.chat.completions.create(**ask) for _ in range(20)])
                    assert all(a.choices[0].message.content for a in answers)
                    # a stream holds its seat to its end
                    chunks = [c async for c in await api.chat.completions.create(**ask, stream=True)]
                    assert any(c.choices and c.choices[0].delta.content for c in chunks)
                    r = await settled(21, 0)
                    assert (r["running"], r["successes"], r["failures"]) == (0, 21, 0)
                    assert r["meanCostUsd"] > 0  # LiteLLM's response_cost (the config's prices)
                    # a lane the policy does not know: refused before any call
                    with pytest.raises(APIStatusError) as bad:
                        await api.chat.completions.create(**ask, extra_body={"metadata": {"admission_lane": "nope"}})
                    assert bad.value.status_code == 400
                    # every slot held by another pod: a 429 with Retry-After once the request's wait ends
                    held = [test_pod.try_admit(lane="default", model=POOL, round_id=f"h{i}") for i in range(slots)]
                    assert all(held)
                    with pytest.raises(APIStatusError) as full:
                        await api.chat.completions.create(**ask, extra_body={"metadata": {"admission_timeout": 0.5}})
                    assert full.value.status_code == 429 and full.value.response.headers["retry-after"] == "60"
                    for d in held:
                        test_pod.release(d.seat, outcome="clean")
                    # the provider overloaded (529): the client sees the error, the pool the load
                    fake.set_faults({529: 1.0})
                    with pytest.raises(APIStatusError):
                        await api.chat.completions.create(**ask)
                    fake.set_faults({})
                    return await settled(21 + slots, 1)
                finally:
                    await api.close()

            r = asyncio.run(calls())
        stats = fake.stats()["total"]
    assert (r["running"], r["waiting"], r["successes"], r["failures"]) == (0, 0, 21 + slots, 1)
    assert stats["completions"] == 21 and stats["peak_in_flight"] <= slots
    totals = {k.decode(): int(v) for k, v in client.hgetall("adm:{lp}:totals").items()}
    admitted = sum(v for k, v in totals.items() if k.startswith(f"admitted|{POOL}|default|"))
    assert admitted == 21 + slots + 1  # the proxy's calls, the held slots, the 529 call
    assert totals[f"signal|{POOL}|rate_limited"] == 1
    client.close()
