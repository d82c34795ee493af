"""The demo (python -m admission.tools.demo) end to end on a real server: a few seconds with 2 pods
whose rounds are openai SDK calls, admitted by the integration, to the fake provider over HTTP.

Checks that rounds complete through the real client and the real HTTP provider, that the summary
gives both views (the provider's and the admission's), and that every process and thread it
started is gone afterwards (pods, server, provider). Not a timing assertion.
"""
from __future__ import annotations

import io
import os
import signal
import threading
from pathlib import Path

import pytest

from admission.tools import demo
from admission.tools.fake_provider import FakeProviderServer
from admission.tools.servers import LocalServer, available_engines

pytest.importorskip("openai")

ENGINE = next(iter(available_engines()), None)
pytestmark = [pytest.mark.real,
              pytest.mark.skipif(ENGINE is None, reason="no redis-server / valkey-server available")]


def _children() -> set[int]:
    """Live (non-zombie) child processes of this process, with their command lines."""
    me, kids = os.getpid(), set()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == me and fields[0] != "Z":
            kids.add(int(d.name))
    return kids


def _alive(pid: int) -> bool:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="needs /proc to look for orphans")
def test_demo_runs_rounds_over_http_and_leaves_no_processes():
    before = _children()
    out = io.StringIO()
    summary = demo.run_demo(seconds=5, pods=2, capacity=6, engine=ENGINE, out=out, live=False)
    text = out.getvalue()
    assert summary["rounds"] > 0, text
    assert sum(summary["done"].values()) == summary["rounds"]
    assert summary["stopped"] == {"terminated": 2, "killed": 0}
    # the provider's own view: the requests arrived over HTTP, and it served what the pods counted
    provider = summary["provider"]
    assert provider["capacity"] == 6 and provider["requests"] > 0, text
    assert summary["rounds"] <= provider["completions"] <= provider["requests"]
    assert provider["peak"] >= 1 and provider["in_flight"] == 0  # every call ended before the summary
    assert "summary after" in text and "rounds done" in text and "K̂ path" in text
    assert "the provider's view: " in text and "requests over HTTP" in text and "hidden capacity 6" in text
    assert "sonnet@demo K̂" in text and "| provider: in flight" in text  # the per-second status lines
    # the estimate moved off its seed: slow start had demand (two pods outnumber 6 slots)
    assert any(kind == "grew" for _, kind, _, _ in summary["history"]), text
    # no orphans: the pods and the server are gone, no new child is left behind, and the
    # provider's thread is stopped
    assert len(summary["pids"]) == 2
    for pid in [*summary["pids"], summary["server_pid"]]:
        assert not _alive(pid), f"process {pid} outlived the demo"
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") for pid in _children() - before}
    # multiprocessing's own resource tracker (started by the spawn start method, which the demo
    # uses when this process already runs other threads) lives as long as its parent by design
    left = {pid: cmd for pid, cmd in left.items() if b"multiprocessing.resource_tracker" not in cmd}
    assert not left, f"processes left behind: {left}"
    assert not [t for t in threading.enumerate() if t.name == "fake-provider"]


def test_demo_pod_then_census_watch():
    with LocalServer(ENGINE) as srv, FakeProviderServer(capacity=12, scale=60).running() as provider_url:
        handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        assert demo.pod_cli(["--url", srv.url, "--mesh", "watch", "--pod", "pod-a", "--seconds", "2",
                             "--provider-url", provider_url, "--capacity", "4", "--pods", "1"]) == 0
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
        stats = demo.http_stats(provider_url)
        assert demo.provider_capacity(stats) == 4  # --capacity set it through /admin/faults
        assert stats["total"]["requests"] > 0 and stats["total"]["in_flight"] == 0
        pods = demo.pod_figures(srv.client(), "watch")
        assert sum(pods["done"].values()) > 0 and pods["provider_url"] == provider_url
        out = io.StringIO()
        assert demo.census_watch(srv.url, "watch", 0.1, frames=2, out=out, live=True) == 0
    frame = out.getvalue().split("\x1b[H\x1b[2J")[-1]
    assert "pool sonnet@demo" in frame and "K̂" in frame
    assert "the provider's view" in frame and "of a hidden 4" in frame  # found through the mesh's key
    for lane in ("reviews", "bugfix"):
        assert lane in frame


def test_demo_pod_serves_its_gauges_with_metrics_port():
    """``--metrics-port`` (docker-compose's pods): the pod's own /metrics while it runs."""
    import time
    import urllib.request

    from admission.tools.servers import free_port

    pytest.importorskip("prometheus_client")
    port, pages, done = free_port(), [], threading.Event()

    def scrape() -> None:
        while not done.is_set():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    text = r.read().decode()
                if 'admission_pod_rounds_held{mesh="pm",pod="pod-m"} 0.0' not in text:
                    pages.append(text)  # a page with seats held
                    return
            except OSError:
                pass
            time.sleep(0.05)

    with LocalServer(ENGINE) as srv, FakeProviderServer(capacity=4, scale=60).running() as provider_url:
        scraper = threading.Thread(target=scrape, daemon=True)
        scraper.start()
        try:
            assert demo.pod_cli(["--url", srv.url, "--mesh", "pm", "--pod", "pod-m", "--seconds", "3",
                                 "--provider-url", provider_url, "--pods", "1", "--metrics-port", str(port)]) == 0
        finally:
            done.set()
            scraper.join(5)
    assert pages, "no page with seats held while the pod ran"
    assert 'admission_pod_pending_records{mesh="pm",pod="pod-m"} 0.0' in pages[0]
    with pytest.raises(OSError):  # stopped with the pod
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2)


def test_demo_pod_without_a_provider_url_runs_its_own(capfd):
    with LocalServer(ENGINE) as srv:
        assert demo.pod_cli(["--url", srv.url, "--mesh", "own", "--pod", "pod-b", "--seconds", "1.5",
                             "--capacity", "3", "--pods", "1"]) == 0
        assert sum(demo.pod_figures(srv.client(), "own")["done"].values()) > 0
    err = capfd.readouterr().err
    assert "no --provider-url, so a fake provider of its own runs in this process" in err
    assert not [t for t in threading.enumerate() if t.name == "fake-provider"]


def test_demo_policy_is_valid_and_scaled_down():
    from admission.policy import validate

    policy = validate(demo.demo_policy())
    assert [l["name"] for l in policy["lanes"]] == list(demo.DEMO_LANES)
    assert policy["tunables"]["grow_interval"] == 1 and policy["tunables"]["seed_estimate"] == 2
    assert [p["name"] for p in policy["pools"]] == ["sonnet@demo"]


@pytest.mark.parametrize("build", [demo.parser, demo.pod_parser], ids=["demo", "demo-pod"])
def test_every_option_is_documented(build):
    p = build()
    options = [a for a in p._actions if a.option_strings and a.dest != "help"]
    assert options and all(a.help for a in options), [a.dest for a in options if not a.help]
    text = p.format_help()
    for a in options:
        assert a.option_strings[-1] in text


def test_the_summary_judges_the_estimate_after_the_first_minute():
    # K̂: 2 from the start, 16 at 30 s, 12 at 70 s, 14 at 100 s, 12 at 110 s; the run ends at 160 s
    history = [(30.0, "grew", 16.0, 0.0), (70.0, "exhausted", 12.0, 12.0), (100.0, "grew", 14.0, 13.0),
               (110.0, "exhausted", 12.0, 12.0)]
    s = demo.settling(history, 2.0, 12, 160.0)
    # from 60 s: 16 until 70 (out), 12 until 100 (in), 14 until 110 (out), 12 until 160 (in)
    assert s == {"within_one": pytest.approx(80 / 100), "min": 12.0, "max": 16.0}
    assert demo.settling(history, 2.0, 12, 50.0) is None                  # a run shorter than a minute


def test_the_summary_counts_429s_per_minute_after_the_first_minute():
    readings = [(1000.0, 0), (1030.0, 5), (1060.0, 9), (1090.0, 10), (1180.0, 13)]
    assert demo.refusals_per_minute(readings) == pytest.approx((13 - 9) / 2.0)
    assert demo.refusals_per_minute(readings[:3]) is None
