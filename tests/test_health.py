"""Health samplers (admission/health.py) against a local fake vLLM /metrics server: a read writes
a sample through the real scripts; a failed read writes nothing and is logged."""
from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from admission import AsyncAdmission, health
from admission.health import Sample, SampleError, SamplerRun, VllmSampler, parse_vllm_metrics
from admission.policy import validate

from helpers import T0, adm, policy, snapshot

METRICS = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B"} 4.0
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5 7B {chat}"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B"} 2.0
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5 7B {chat}"} 1.0
# HELP vllm:num_requests_waiting_by_reason Requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0
# HELP vllm:gpu_cache_usage_perc GPU KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B"} 0.37
vllm:request_success_total{finished_reason="stop",model_name="meta-llama/Llama-3.1-8B"} 12.0
"""
PLANE = "adm:{t}:plane:m@p"


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/broken":
            self.send_error(500, "engine dead")
            return
        if self.path == "/slow":
            time.sleep(1.0)
        body = {"/metrics": METRICS, "/slow": METRICS, "/garbage": "hello\n"}.get(self.path)
        if body is None:
            self.send_error(404)
            return
        data = body.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):  # quiet
        pass


@pytest.fixture(scope="module")
def server():
    """http://127.0.0.1:PORT of a fake vLLM: /metrics, /broken (500), /garbage, /slow (1 s)."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()
    srv.server_close()


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch):
    # an http_proxy in the environment must not carry loopback reads away
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def closed_port_url() -> str:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connection refused
    return f"http://127.0.0.1:{port}/metrics"


def health_policy(**pools):
    pol = policy(pools=tuple(pools))
    pol["pools"] = pools
    return pol


def plane(client, pool="m@p") -> dict[str, str]:
    return {k.decode(): v.decode() for k, v in client.hgetall(f"adm:{{t}}:plane:{pool}").items()}


# -- parsing -------------------------------------------------------------------------------------

def test_parse_sums_label_sets_and_tolerates_floats():
    assert parse_vllm_metrics(METRICS) == (3, 5)
    # no labels, integer values, a trailing timestamp, CRLF line ends
    assert parse_vllm_metrics("vllm:num_requests_waiting 7 1712345678000\r\nvllm:num_requests_running 2\r\n") == (7, 2)
    assert parse_vllm_metrics("vllm:num_requests_running{m=\"a\"} 3.0\n") == (0, 3)  # one absent counts 0


def test_parse_refuses_missing_metrics_and_bad_values():
    for text in ("", "# HELP vllm:num_requests_waiting only a comment\n",
                 'vllm:num_requests_waiting_by_reason{reason="capacity"} 9.0\nvllm:gpu_cache_usage_perc 0.3\n'):
        with pytest.raises(ValueError, match="no vllm:num_requests_waiting or vllm:num_requests_running"):
            parse_vllm_metrics(text)
    for bad in ("NaN", "-1", "+Inf", "many"):
        with pytest.raises(ValueError, match="line 1: vllm:num_requests_waiting"):
            parse_vllm_metrics(f'vllm:num_requests_waiting{{m="a"}} {bad}\nvllm:num_requests_running 1\n')


# -- the vLLM sampler ----------------------------------------------------------------------------

def test_vllm_sampler_reads_the_fake_server(server):
    s = VllmSampler("m@p", server + "/metrics", every=5, clock=lambda: T0)
    assert s.sample() == Sample("m@p", 3, 5, True, T0)
    assert isinstance(s, health.Sampler)


def test_vllm_sampler_failures_raise_sample_error(server):
    cases = {server + "/broken": "HTTP 500", closed_port_url(): "unreachable",
             server + "/garbage": "unparsable metrics", server + "/slow": "timed out after 0.2 s"}
    for url, reason in cases.items():
        with pytest.raises(SampleError, match=reason) as info:
            VllmSampler("m@p", url, every=5, timeout=0.2).sample()
        assert info.value.pool == "m@p"


def test_samplers_from_policy_periods():
    raw = policy(pools=("a@p", "b@p", "c@p", "d@p"), health_max_age=12)
    raw["pools"] = {"a@p": {"health_url": "http://h:1/metrics", "health_every": 2},
                    "b@p": {"health_url": "http://h:2/metrics", "health_max_age": 9},
                    "c@p": {"health_url": "http://h:3/metrics"},
                    "d@p": {"health_required": True}}  # no url: no sampler
    got = {s.pool: (s.url, s.every, s.timeout) for s in health.samplers_from_policy(validate(raw))}
    assert got == {"a@p": ("http://h:1/metrics", 2.0, 2.0), "b@p": ("http://h:2/metrics", 3.0, 2.0),
                   "c@p": ("http://h:3/metrics", 4.0, 2.0)}
    assert {s.every for s in health.samplers_from_policy(validate(raw), every=0.5)} == {0.5}
    assert {s.timeout for s in health.samplers_from_policy(validate(raw), every=0.5)} == {0.5}


# -- running them --------------------------------------------------------------------------------

class Fixed:
    """A third-party sampler: a fixed sample, or an exception."""

    def __init__(self, pool, every, result):
        self.pool, self.every, self.result = pool, every, result

    def sample(self):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_due_cadence_on_injected_monotonic_time():
    slow, fast = Fixed("a@p", 10, None), Fixed("b@p", 3, None)
    run = SamplerRun([slow, fast])
    assert run.next_due(100.0) == 0
    assert run.due(100.0) == [slow, fast]   # the first run is immediate
    assert run.due(102.0) == []
    assert run.next_due(102.0) == pytest.approx(1.0)
    assert run.due(103.0) == [fast]
    assert run.due(105.9) == []
    assert run.due(110.0) == [slow, fast]   # a late tick takes both
    assert run.next_due(111.0) == pytest.approx(2.0)
    assert SamplerRun([]).next_due(0) == health.IDLE


def test_run_once_writes_a_sample(redis_client, server):
    a = adm(redis_client, pol=health_policy(**{"m@p": {"health_url": server + "/metrics", "health_required": True}}))
    run = SamplerRun(health.samplers_from_policy(a.policy()))
    before = time.time()
    written = run.run_once(a)
    assert [(s.pool, s.depth, s.running, s.ok) for s in written] == [("m@p", 3, 5, True)]
    assert before <= written[0].at <= time.time() and run.failures == {}
    got = plane(redis_client)
    assert float(got.pop("healthAt")) == pytest.approx(written[0].at, abs=1e-3)
    assert got == {"healthOk": "1", "healthDepth": "3", "healthRunning": "5"}
    assert run.run_once(a) == []   # nothing due again before health_every


def test_failing_samplers_write_nothing_and_are_logged(redis_client, server, caplog):
    a = adm(redis_client, pol=health_policy(**{"m@p": {"health_url": server + "/metrics", "health_required": True}}))
    good = VllmSampler("m@p", server + "/metrics", every=1)
    assert len(SamplerRun([good]).run_once(a)) == 1
    kept = snapshot(redis_client)
    failing = [VllmSampler("m@p", server + "/broken", every=1), VllmSampler("m@p", closed_port_url(), every=1),
               VllmSampler("m@p", server + "/garbage", every=1), Fixed("m@p", 1, RuntimeError("bug")),
               Fixed("m@p", 1, "not a sample")]
    for sampler in failing:
        run = SamplerRun([sampler])
        with caplog.at_level(logging.WARNING, logger="admission.health"):
            caplog.clear()
            assert run.run_once(a) == []
        assert snapshot(redis_client) == kept   # byte for byte: the old sample just ages out
        assert list(run.failures) == ["m@p"]
        [rec] = [r for r in caplog.records if r.name == "admission.health"]
        assert rec.levelno == logging.WARNING and rec.admission["event"] == "health_sample_failed"
        assert rec.admission["pool"] == "m@p" and rec.admission["reason"] == run.failures["m@p"]


def test_a_failure_does_not_stop_the_others_and_a_lost_write_is_reported(redis_client, server):
    a = adm(redis_client, pol=health_policy(**{"m@p": {}, "n@p": {}}))
    run = SamplerRun([VllmSampler("n@p", server + "/broken", every=1), VllmSampler("m@p", server + "/metrics", every=1),
                      VllmSampler("gone@p", server + "/metrics", every=1)])   # not in the catalog
    assert [s.pool for s in run.run_once(a)] == ["m@p"]
    assert run.failures["n@p"] == f"HTTP 500 from {server}/broken"
    assert run.failures["gone@p"].startswith("write: UnknownPool")
    assert plane(redis_client, "n@p") == {} and plane(redis_client)["healthDepth"] == "3"


def test_arun_once_writes_through_async_admission(async_client_factory, server):
    async def main():
        client = async_client_factory()
        a = AsyncAdmission(client, mesh="t", pod="p", background=False)
        await a.ops.apply_policy(health_policy(**{"m@p": {"health_url": server + "/metrics"}, "n@p": {}}),
                             recovery_hold=False)
        run = SamplerRun([*health.samplers_from_policy(await a.policy()),
                          VllmSampler("n@p", server + "/broken", every=1)])
        written = await run.arun_once(a)
        assert [(s.pool, s.depth, s.running) for s in written] == [("m@p", 3, 5)]
        assert list(run.failures) == ["n@p"]
        got = {k.decode(): v.decode() for k, v in (await client.hgetall(PLANE)).items()}
        assert (got["healthOk"], got["healthDepth"], got["healthRunning"]) == ("1", "3", "5")
        assert await client.exists("adm:{t}:plane:n@p") == 0
        assert await run.arun_once(a) == []   # nothing due yet
        await client.aclose()
    asyncio.run(main())


# -- the CLI -------------------------------------------------------------------------------------

def parse(*argv: str) -> argparse.Namespace:
    """The subcommand as the lead's cli.py wires it (plus the --mesh its _conn_args adds)."""
    parser = argparse.ArgumentParser(prog="admission")
    p = health.add_parser(parser.add_subparsers(dest="command", required=True))
    p.add_argument("--mesh", default="t")
    return parser.parse_args(["health", *argv])


def test_run_cli_once(redis_client, server, capsys):
    a = adm(redis_client, pol=health_policy(**{"m@p": {"health_url": server + "/metrics"}, "n@p": {}}))
    assert health.run_cli(parse("run", "--once"), a) == 0
    assert capsys.readouterr().out == "m@p depth=3 running=5 ok\n"
    assert plane(redis_client)["healthDepth"] == "3"
    a.ops.apply_policy(health_policy(**{"m@p": {"health_url": server + "/metrics"},
                                    "n@p": {"health_url": server + "/broken"}}), recovery_hold=False)
    assert health.run_cli(parse("run", "--once"), a) == 1
    assert capsys.readouterr().out == f"m@p depth=3 running=5 ok\nn@p FAILED: HTTP 500 from {server}/broken\n"


def test_run_cli_without_health_url_is_a_one_line_error(redis_client, capsys):
    a = adm(redis_client, pol=health_policy(**{"m@p": {"health_required": True}}))
    assert health.run_cli(parse("run", "--once"), a) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err == "admission health: no pool of mesh t has a health_url\n"


def test_run_cli_runs_until_ctrl_c_and_follows_the_policy(redis_client, server, capsys):
    a = adm(redis_client, pol=health_policy(**{"m@p": {"health_url": server + "/metrics"}}))
    naps = []

    def sleep(seconds):
        naps.append(seconds)
        if len(naps) == 1:   # an operator applies a new policy while the sampler runs
            a.ops.apply_policy(health_policy(**{"m@p": {"health_url": server + "/broken"}}), recovery_hold=False)
        else:
            raise KeyboardInterrupt

    assert health.run_cli(parse("run", "--every", "30"), a, sleep=sleep) == 0
    assert naps[0] == pytest.approx(30, abs=1)
    assert capsys.readouterr().out.splitlines() == [
        "m@p depth=3 running=5 ok", "policy version 2: sampling 1 pool(s)", f"m@p FAILED: HTTP 500 from {server}/broken"]
    with pytest.raises(SystemExit):
        parse("run", "--every", "0")
