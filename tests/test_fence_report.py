"""The fence's fault-injection report (admission/tools/fence_report/, docs/fence.md): a small seeded run
on every engine holds the invariant, each fault gives its own reasons, and the check can fail."""
from __future__ import annotations

import argparse
import json

import pytest
import redis

from admission.tools import fence_report
from admission.client import Admission
from admission.codes import FENCE_REASONS, UNAVAILABLE

N = 40
SHED = set(FENCE_REASONS) | {UNAVAILABLE}


def by_fault(report: dict) -> dict[str, dict]:
    return {f["fault"]: f for f in report["faults"]}


def shed_reasons(f: dict) -> set[str]:
    return {r for r in f["reasons"] if r in SHED}


def test_every_fault_holds_the_invariant_with_its_own_reasons(redis_client):
    report = fence_report.run(N, 1, client=redis_client)
    faults = by_fault(report)
    assert list(faults) == list(fence_report.FAULTS)
    failed = {f["fault"]: f["failures"] for f in report["faults"] if not f["ok"]}
    assert report["ok"], failed
    for f in report["faults"]:
        assert f["intents"] == N
        assert f["invariant"]["ok"] and f["invariant"]["held"] == f["invariant"]["cases"]
        assert sum(f["reasons"].values()) == N  # one decision per intent
        assert f["shed"] == sum(n for r, n in f["reasons"].items() if r in SHED)
        assert f["shedPer100"] == pytest.approx(100 * f["shed"] / N)
        for c in f["checks"].values():
            assert c["held"] == c["cases"]
        assert f["checks"]["doctor: the counts agree with the records"]["cases"] == 1

    stale = faults["stale-borrowed-health"]
    assert shed_reasons(stale) == {"reject_stale_borrowed_health"}
    assert stale["shed"] == stale["injected"] > 0
    assert faults["borrowed-depth"]["shed"] > 0
    assert shed_reasons(faults["borrowed-depth"]) == {"shed_borrowed_depth"}
    sat = faults["primary-saturation"]
    assert shed_reasons(sat) == {"reject_primary_depth"} and sat["shed"] == sat["injected"] > 0
    assert sat["checks"]["shed: borrower's retry budget unchanged"]["cases"] >= sat["shed"]

    late = faults["late-score"]
    assert shed_reasons(late) <= {"reject_stale_revision", "reject_stale_borrowed_health"}
    assert late["reasons"].get("reject_stale_revision", 0) > 0
    assert late["calls"].get("bind: reject_stale_revision", 0) > 0
    assert late["checks"]["late-score: a late score for R after R+1 is rejected"]["cases"] > 0

    down = faults["redis-unreachable"]
    assert down["reasons"] == {UNAVAILABLE: N} and down["admitted"] == 0 and down["shedPer100"] == 100.0
    assert down["invariant"]["cases"] == N

    lost = faults["lost-replies"]
    assert lost["calls"]["admit reply lost"] > 0 and lost["calls"]["retry reply lost"] > 0
    assert lost["checks"]["lost-replies: asked again, the intent is decided once"]["cases"] > 0
    assert lost["checks"]["lost-replies: a lost retry is read back and spent once"]["cases"] > 0
    assert shed_reasons(lost) <= {"reject_stale_borrowed_health"}

    killed = faults["pod-killed"]
    assert killed["checks"]["pod-killed: the retry count survives the pod"]["cases"] > 0
    assert killed["calls"].get("retry: not your seat", 0) > 0  # another pod cannot spend the dead pod's seat
    assert shed_reasons(killed) == set()
    fake = type(redis_client).__module__.startswith("fakeredis")
    assert report["comparison"].startswith("HGETALL" if fake else "DUMP")  # a real server: byte-for-byte


def test_a_seed_gives_the_same_report():
    faults = ("lost-replies", "pod-killed")
    one = fence_report.run(15, 7, engine="fakeredis", faults=faults)
    two = fence_report.run(15, 7, engine="fakeredis", faults=faults)
    for a, b in zip(one["faults"], two["faults"]):
        assert (a["reasons"], a["calls"], a["checks"]) == (b["reasons"], b["calls"], b["checks"])


def test_the_command(tmp_path, capsys):
    out = tmp_path / "fence.json"
    assert fence_report.main(["--intents", "6", "--seed", "3", "--engine", "fakeredis", "--no-progress",
                              "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "shed/100" in text and "primary unchanged on shed" in text and "every check held" in text
    for fault in fence_report.FAULTS:
        assert fault in text
    saved = json.loads(out.read_text())
    assert saved["ok"] and saved["intents"] == 6 and len(saved["faults"]) == len(fence_report.FAULTS)

    # the subcommand, as admission/cli.py wires it
    parser = argparse.ArgumentParser(prog="admission")
    sub = parser.add_subparsers(dest="command", required=True)
    fence_report.add_parser(sub)
    args = parser.parse_args(["fence-report", "--intents", "4", "--engine", "fakeredis", "--fault", "late-score",
                              "--markdown", "--no-progress"])
    assert args.func is fence_report.run_cli
    assert args.func(args) == 0
    assert "| late-score |" in capsys.readouterr().out
    assert fence_report.main(["--intents", "0", "--engine", "fakeredis"]) == 2


def test_a_broken_comparison_fails_the_run(monkeypatch, capsys):
    """The negative control: a comparison that sees a changed primary makes the command exit 1."""
    monkeypatch.setattr(fence_report.harness, "unchanged", lambda before, after: False)  # where the runs compare
    assert fence_report.main(["--intents", "6", "--engine", "fakeredis", "--fault", "stale-borrowed-health",
                              "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "FAILED" in out and "shed: primary keys unchanged" in out


def test_a_shed_that_touches_the_primary_is_caught(monkeypatch, redis_client):
    """A fence that leaks: every shed borrow spends one token of the primary plane (written by hand
    after the real script ran). The report must see it, key and budget, and fail."""
    real = Admission.try_admit

    def leaky(self, **kw):
        d = real(self, **kw)
        if kw.get("borrow") and d.shed:
            key = f"adm:{{{self.mesh}}}:plane:{kw['model']}"
            redis_client.hset(key, mapping={"retries": 0, "retriesAt": kw["now"]})
        return d

    monkeypatch.setattr(Admission, "try_admit", leaky)
    report = fence_report.run(10, 1, client=redis_client, faults=("stale-borrowed-health", "primary-saturation"))
    assert not report["ok"]
    for f in report["faults"]:
        assert f["shed"] > 0
        assert not f["invariant"]["ok"]
        assert f["checks"]["shed: primary keys unchanged"]["held"] == 0
        assert f["checks"]["shed: primary retry budget unchanged"]["held"] < f["shed"]
        assert any("plane:primary@p" in d for d in f["failures"])


def test_an_unreachable_server_is_a_usage_error(capsys):
    url = f"redis://127.0.0.1:{fence_report.free_port()}/0"
    assert fence_report.main(["--intents", "2", "--url", url, "--no-progress"]) == 2
    assert "fence-report" in capsys.readouterr().err


def test_a_given_server_by_url(server_url):
    report = fence_report.run(8, 2, url=server_url, faults=("borrowed-depth", "redis-unreachable"))
    assert report["ok"] and report["comparison"].startswith("DUMP")
    assert report["server"].split()[0] in ("redis", "valkey")
    # the meshes stay for inspection; running again wipes them first
    assert fence_report.run(8, 2, url=server_url, faults=("borrowed-depth",))["ok"]
    client = redis.Redis.from_url(server_url)
    assert client.exists("adm:{fence-borrowed-depth}:config")
