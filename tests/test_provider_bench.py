"""The provider bench (``python -m admission.tools.bench --provider``): a small burst, three ways.

One run (40 rounds, 2 pod processes, capacity 4, scale 120: about 6 s) is shared by the checks.
The figures depend on the machine and on timing; only what holds by construction is asserted
exactly (every round drains, the semaphore's peak, the admission's peak within its slots), and
the admission's 429s against mode (a)'s with a wide margin: over 13 runs of these settings (a)
saw 24-29 and (b) 1-7 (the assertion is b <= a / 2).
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import httpx
import pytest

from admission.tools import bench, provider_bench
from admission.tools.provider_bench import ceilings_pods  # noqa: F401 - the submodule, for provider_bench.ceilings_pods
from admission.tools.servers import find_server

ENGINE = "redis" if find_server("redis") else ("valkey" if find_server("valkey") else None)
pytestmark = [pytest.mark.real,
              pytest.mark.skipif(ENGINE is None, reason="no redis-server / valkey-server available")]

SMALL = ["--rounds", "40", "--pods", "2", "--capacity", "4", "--scale", "120", "--tokens", "150", "--seed", "1",
         "--engine", str(ENGINE), "--no-progress"]


@pytest.fixture(scope="module")
def result():
    """One small run through ``bench.main(["--provider", ...])`` with ``--json``: its stdout parsed."""
    capture = pytest.MonkeyPatch()
    out: list[str] = []
    capture.setattr(sys, "stdout", _Tee(out))
    try:
        rc = bench.main(["--provider", *SMALL, "--json"])
    finally:
        capture.undo()
    assert rc == 0
    return json.loads("".join(out))  # --json: the whole stdout is one JSON document


class _Tee:
    def __init__(self, out: list[str]):
        self.out = out

    def write(self, text: str) -> int:
        self.out.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def rows(result):
    return {r["mode"]: r for r in result["rows"]}


def test_every_mode_drains_every_round(result):
    assert [r["mode"] for r in result["rows"]] == ["none", "admission", "semaphore"]
    for r in result["rows"]:
        assert r["rounds"] == 40 and r["completions"] == 40, r
        assert r["drain_s"] > 0 and r["rounds_per_s"] > 0
        assert 0 < r["latency_mean_s"] <= r["latency_p95_s"] <= r["latency_max_s"]
        assert r["requests"] == r["completions"] + r["provider_429"] + r["provider_529"]
    s = result["settings"]
    assert (s["rounds"], s["pods"], s["capacity"], s["scale"], s["tokens"], s["seed"]) == (40, 2, 4, 120, 150, 1)
    assert result["versions"]["engine"].startswith(ENGINE)


def test_the_admission_stays_within_its_slots_and_is_refused_less(result):
    r = rows(result)
    b = r["admission"]
    assert 1 <= b["peak_in_flight"] <= b["max_slots"], b
    assert r["none"]["provider_429"] >= 8, r["none"]  # the burst does overload a provider left alone
    assert 2 * b["provider_429"] <= r["none"]["provider_429"], (b["provider_429"], r["none"]["provider_429"])
    assert b["requests"] < r["none"]["requests"]


def test_the_semaphore_never_exceeds_the_capacity(result):
    c = rows(result)["semaphore"]
    assert c["peak_in_flight"] <= 4 and c["provider_429"] == 0, c


def test_the_policy_is_default_but_the_provider_durations(result):
    tunables = result["policy"]["tunables"]
    assert set(tunables) == set(provider_bench.SCALED_TUNABLES)
    assert tunables["grow_interval"] == pytest.approx(15 / 120)
    assert tunables["probe_every"] == pytest.approx(0.1)  # 10 / 120, clamped to its lower bound
    assert list(result["policy"]["lanes"]) == [provider_bench.LANE]


def test_the_table_has_three_rows_and_the_columns(result):
    text = provider_bench.render(result)
    lines = text.splitlines()
    assert lines[0].startswith("admission bench --provider — rounds 40, pods 2, capacity 4, scale 120, tokens 150, "
                               "seed 1; " + ENGINE)
    header = next(i for i, line in enumerate(lines) if line.startswith("mode"))
    for column in provider_bench.COLUMNS:
        assert column in lines[header]
    body = lines[header + 2:header + 5]
    assert [line.split("  ")[0] for line in body] == ["(a) no admission", "(b) admission", "(c) semaphore = K"]
    assert lines[header + 5] == ""
    md = provider_bench.render(result, markdown=True).splitlines()
    table = [line for line in md if line.startswith("|")]
    assert len(table) == 2 + 3 and all(line.count("|") == len(provider_bench.COLUMNS) + 1 for line in table)


@pytest.mark.parametrize("args, word", [
    (["--rounds", "0"], "--rounds"),
    (["--pods", "5", "--rounds", "4"], "--pods"),
    (["--scale", "nan"], "--scale"),
    (["--engine", "memcached"], "--engine"),
    (["--bogus"], "unrecognized"),
])
def test_a_bad_argument_exits_2_with_one_line(capsys, args, word):
    assert bench.main(["--provider", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and word in err, err


def test_the_command_line_delegates():
    """``python -m admission.tools.bench --provider`` reaches the provider bench (a bad argument:
    no server is started)."""
    proc = subprocess.run([sys.executable, "-m", "admission.tools.bench", "--provider", "--tokens", "-3"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [
        "python -m admission.tools.bench --provider: error: argument --tokens: expected a whole number >= 1, got -3"]


def test_a_mode_that_does_not_drain_in_the_bound_exits_1_with_one_line(capsys, monkeypatch):
    monkeypatch.setattr(provider_bench.parent, "bound_s", lambda s: 0.05)  # the pods get the bound from the parent
    rc = provider_bench.main(["--rounds", "8", "--pods", "1", "--capacity", "2", "--scale", "10",
                              "--engine", str(ENGINE), "--no-progress"])
    assert rc == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "did not drain within the bound" in lines[0], captured.err


# -- the ceilings case ----------------------------------------------------------------------------
TINY_CEILINGS = ["--case", "ceilings", "--key", "openai", "--pods", "2", "--workers", "3", "--minutes", "3",
                 "--scale", "60", "--engine", str(ENGINE), "--no-progress"]


def test_the_ceilings_case_reports_every_contender(capsys):
    """A tiny run of ``--case ceilings`` (one key, 3 provider minutes a contender at scale 60):
    every contender has a row with the provider's 429s per ceiling, the share of each limit used
    and the calls done. Only what holds by construction is asserted (the figures are timing's)."""
    assert bench.main(["--provider", *TINY_CEILINGS, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["case"] == "ceilings"
    assert [r["contender"] for r in result["rows"]] == ["none", "admission", "ceilings", "headers", "litellm"]
    for r in result["rows"]:
        assert r["key"] == "openai" and set(r["provider_429_by"]) >= {"rpm", "tpm"}, r
        assert r["provider_429"] >= sum(r["provider_429_by"].values())
        assert set(r["used_pct"]) == {"rpm", "tpm"} and r["binding"] in ("rpm", "tpm")
        assert r["rounds"] > 0 and r["client_done"] <= r["rounds"]
    text = provider_bench.ceilings_case.render(result)
    for label in ("no admission", "admission, no ceilings", "admission, ceilings configured",
                  "admission, learning from headers only", "LiteLLM Router"):
        assert label in text


def test_the_ceilings_case_learns_from_headers_scaled_to_its_clock():
    """The headers contender's policy declares no ceiling (it learns them), and the harness scales
    the provider's limits (per provider minute) to the run's real clock, leaving the rest."""
    args = provider_bench.parser().parse_args(TINY_CEILINGS)
    s = provider_bench.cli.ceiling_settings_of(args)
    assert s.contenders == ("none", "admission", "ceilings", "headers", "litellm")
    headers = httpx.Headers({"x-ratelimit-limit-tokens": "100000", "x-ratelimit-remaining-tokens": "4000",
                             "x-ratelimit-reset-tokens": "6s", "anthropic-ratelimit-output-tokens-limit": "8000",
                             "anthropic-ratelimit-output-tokens-remaining": "1000", "retry-after": "2"})
    provider_bench.ceilings_pods.scaled_limits(headers, 10.0)
    assert headers["x-ratelimit-limit-tokens"] == "1000000"
    assert headers["anthropic-ratelimit-output-tokens-limit"] == "80000"
    assert headers["x-ratelimit-remaining-tokens"] == "4000" and headers["x-ratelimit-reset-tokens"] == "6s"
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "1000" and headers["retry-after"] == "2"
    assert "ceilings" not in provider_bench.ceilings_settings.admission_policy(
        provider_bench.ceilings_settings.KEYS["openai"], s, "headers")  # it declares none: it learns them
    assert provider_bench.main(["--case", "ceilings", "--minutes", "2"]) == 2  # the window starts at minute 2


def test_a_lowered_key_is_counted_against_its_new_limits(capsys):
    """The ``lowered`` key: the provider lowers its TPM at minute 5 of the run; each minute's
    share is of the limit in force then, and the row says what came after the change."""
    from admission.tools.provider_bench.ceilings_case import _used_pct
    from admission.tools.provider_bench.ceilings_settings import KEYS, effective_limits

    key = KEYS["lowered"]
    assert effective_limits(key, 4)["tpm"] == 100_000 and effective_limits(key, 5)["tpm"] == 50_000
    counted = {"used": {"tpm": {"per_minute": [0, 0, 0, 0, 0, 0, 0, 100_000, 50_000, 25_000]}, "rpm": {}}}
    assert _used_pct(counted, key, 3, range(4, 7))["tpm"] == round(100 * 175_000 / 200_000, 1)
    args = ["--provider", "--case", "ceilings", "--key", "lowered", "--contender", "headers", "--pods", "2",
            "--workers", "3", "--minutes", "7", "--scale", "60", "--engine", str(ENGINE), "--no-progress", "--json"]
    assert bench.main(args) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert set(row["after_change_429_by"]) >= {"rpm", "tpm"} and set(row["after_change_used_pct"]) == {"rpm", "tpm"}
    assert sum(row["after_change_429_by"].values()) <= row["provider_429"]


def test_the_daily_key_keeps_its_cap_unscaled_and_offers_an_alternative():
    """The ``daily`` key: 1,000 requests a day is the admission's own daily bucket (Redis' UTC day:
    never scaled), at headroom 1 so that every request of the day is used, and the lane may move
    to an alternative pool on a scope of its own once the day is spent."""
    from admission import policy as policy_mod
    from admission.tools.provider_bench.ceilings_settings import ALT_POOL, KEYS, CeilingSettings, admission_policy
    from admission.tools.provider_bench.settings import POOL

    s = CeilingSettings(scale=10.0)
    pol = admission_policy(KEYS["daily"], s, "ceilings")
    assert pol["ceilings"]["key"] == {"rpd": 1_000.0, "headroom": 1.0}
    assert pol["ceilings"]["alt"] == pol["ceilings"]["key"] and pol["pools"][ALT_POOL]["ceilings"] == "alt"
    assert pol["alternatives"] == {POOL: [ALT_POOL]}
    policy_mod.validate(pol)
    assert admission_policy(KEYS["openai"], s, "ceilings")["ceilings"]["key"]["tpm"] == 1_000_000   # per real minute
    row = {"key": "daily", "label": "admission, ceilings configured", "provider_429": 0, "provider_429_by": {"rpd": 0},
           "used_pct": {}, "binding": None, "binding_used_pct": None, "rounds": 1_896,
           "completions_by_model": {"m": 1_000, "m-alt": 896}, "closed": "rpd"}
    text = provider_bench.ceilings_case.render({"settings": dataclasses.asdict(s), "keys": {"daily": "x"},
                                               "rows": [row], "elapsed_s": 1})
    assert "1,000 calls on the key's model, then 896 on the alternative; the scope closed on rpd" in text


def test_the_killed_key_kills_a_pod_and_counts_what_came_after(capsys):
    """The ``killed`` key: one pod process is SIGKILLed at minute 4 with its rounds in flight and
    its waiters queued; its leases are scaled like the provider's durations, the others carry on,
    and the row says what came after (the 429s and the use of the key)."""
    from admission.tools.provider_bench.ceilings_settings import KEYS, CeilingSettings, admission_policy

    key = KEYS["killed"]
    assert key.change_minute == 4
    assert admission_policy(key, CeilingSettings(scale=10.0), "ceilings")["tunables"]["lease_ttl"] == 3.0
    args = ["--provider", "--case", "ceilings", "--key", "killed", "--contender", "ceilings", "--pods", "2",
            "--workers", "3", "--minutes", "6", "--scale", "60", "--engine", str(ENGINE), "--no-progress", "--json"]
    assert bench.main(args) == 0
    row = json.loads(capsys.readouterr().out)["rows"][0]
    assert row["client_done"] <= row["rounds"] and set(row["after_change_used_pct"]) == {"rpm", "tpm"}
    assert row["after_change_used_pct"]["tpm"] > 0                  # the pod left alive kept calling
