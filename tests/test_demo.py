"""The demo (python -m admission.tools.demo) end to end on a real server: a few seconds with 2 pods.

Checks that rounds complete through the real client and that every process it started is gone
afterwards (pods and server). Not a timing assertion.
"""
from __future__ import annotations

import io
import os
import signal
from pathlib import Path

import pytest

from admission.tools import demo
from admission.tools.servers import LocalServer, available_engines

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
def test_demo_runs_rounds_and_leaves_no_processes():
    before = _children()
    out = io.StringIO()
    summary = demo.run_demo(seconds=5, pods=2, capacity=6, engine=ENGINE, out=out, live=False)
    text = out.getvalue()
    assert summary["rounds"] > 0, text
    assert sum(summary["done"].values()) == summary["rounds"]
    assert summary["stopped"] == {"terminated": 2, "killed": 0}
    assert "summary after" in text and "rounds done" in text and "K̂ path" in text
    assert "sonnet@demo K̂" in text  # the per-second status lines
    # the estimate moved off its seed: slow start had demand (two pods outnumber 6 slots)
    assert any(kind == "grew" for _, kind, _, _ in summary["history"]), text
    # no orphans: the pods and the server are gone, and no new child is left behind
    assert len(summary["pids"]) == 2
    for pid in [*summary["pids"], summary["server_pid"]]:
        assert not _alive(pid), f"process {pid} outlived the demo"
    left = {pid: Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") for pid in _children() - before}
    # multiprocessing's own resource tracker (started by the spawn start method, which the demo
    # uses when this process already runs other threads) lives as long as its parent by design
    left = {pid: cmd for pid, cmd in left.items() if b"multiprocessing.resource_tracker" not in cmd}
    assert not left, f"processes left behind: {left}"


def test_demo_pod_then_census_watch():
    with LocalServer(ENGINE) as srv:
        handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
        assert demo.pod_cli(["--url", srv.url, "--mesh", "watch", "--pod", "pod-a", "--seconds", "2",
                             "--capacity", "4", "--pods", "1"]) == 0  # admission demo-pod ...
        assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
        stats = demo.provider_figures(srv.client(), "watch")
        assert stats is not None and sum(stats["done"].values()) > 0 and stats["capacity"] == 4
        out = io.StringIO()
        assert demo.census_watch(srv.url, "watch", 0.1, frames=2, out=out, live=True) == 0
    frame = out.getvalue().split("\x1b[H\x1b[2J")[-1]
    assert "pool sonnet@demo" in frame and "K̂" in frame
    assert "provider:" in frame and "hidden 4" in frame
    for lane in ("reviews", "bugfix"):
        assert lane in frame


def test_demo_policy_is_valid_and_scaled_down():
    from admission.policy import validate

    policy = validate(demo.demo_policy())
    assert [l["name"] for l in policy["lanes"]] == list(demo.DEMO_LANES)
    assert policy["tunables"]["grow_interval"] == 1 and policy["tunables"]["seed_estimate"] == 2
    assert [p["name"] for p in policy["pools"]] == ["sonnet@demo"]
