"""The provider's day from the command line, against a real server and a fake OpenRouter-style
key endpoint on 127.0.0.1: budget sync, provider close/reopen, day-rollover (twice), ledger."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import redis

from admission import Admission

from test_budget import Fake, fake, loopback_only  # noqa: F401 - fixtures

KEY_ENV = "ADMISSION_TEST_OPENROUTER_KEY"


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "admission", *args], capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})


def _policy_file(tmp_path, base_url: str) -> str:
    path = tmp_path / "policy.toml"
    path.write_text(f"""
[lanes.reviews]
floor = 0.5
[lanes.express]
floor = 0.2
priority = 9

[providers.openrouter]
daily_limit_usd = 500
budget_reader = "openrouter"
budget_url = "{base_url}"
api_key_env = "{KEY_ENV}"

[pools."sonnet@openrouter"]
""")
    return str(path)


def test_the_days_commands(server_url, tmp_path, fake: Fake):
    conn = ["--url", server_url, "--mesh", "day"]
    assert run("config", "apply", _policy_file(tmp_path, fake.base_url), "--no-recovery-hold", *conn).returncode == 0
    fake.key_reply(limit=100.0, limit_remaining=40.0, usage_daily=60.0, limit_reset="daily")

    out = run("budget", "sync", *conn, env={KEY_ENV: "sk-test"})
    assert out.returncode == 0, out.stderr
    assert "openrouter: spent $60.00 of $100.00" in out.stdout
    assert fake.requests and fake.requests[-1][1] == "Bearer sk-test"
    out = run("budget", "sync", *conn)                                   # no key in the environment
    assert out.returncode == 0 and "no budget readings" in out.stdout

    out = run("provider", "close", "openrouter", "--why", "maintenance", "--seconds", "600", *conn)
    assert out.returncode == 0 and "closed openrouter (maintenance) until" in out.stdout
    assert "kind=closed" in run("events", *conn).stdout
    census = json.loads(run("census", "--json", *conn).stdout)
    row = census["pools"][0]
    assert row["closedWhy"] == "operator:maintenance" and row["budgetLimitUsd"] == 100.0
    assert row["budgetSpentUsd"] == 60.0
    text = run("census", *conn).stdout
    assert "CLOSED" in text and "budget" in text

    first = run("day-rollover", *conn, env={KEY_ENV: "sk-test"})
    today = time.strftime("%Y-%m-%d", time.gmtime())
    assert first.returncode == 0 and f"rolled over to {today}: reopened none" in first.stdout, first.stdout
    second = run("day-rollover", *conn)
    assert second.returncode == 0 and f"{today} was rolled over already" in second.stdout

    assert run("provider", "reopen", "openrouter", "--why", "done", *conn).returncode == 0
    bad = run("provider", "close", "nobody", "--why", "x", *conn)
    assert bad.returncode == 2 and "not in the policy" in bad.stderr

    adm = Admission(redis.Redis.from_url(server_url), mesh="day", pod="cli-test", background=False)
    d = adm.try_admit(lane="reviews", model="sonnet@openrouter", round_id="r1", draw=0.0)
    adm.release(d.seat, outcome="clean", seconds=2, cost_usd=1.234567)
    out = run("ledger", *conn)
    assert out.returncode == 0 and "reviews" in out.stdout and "1.234567" in out.stdout and "total" in out.stdout
    doc = json.loads(run("ledger", "--json", *conn).stdout)
    assert doc == {"day": today, "ledger": {"reviews": {"openrouter": 1.234567}, "*": {"openrouter": 1.234567}}}
    assert "nothing spent" in run("ledger", "--day", "2001-01-01", *conn).stdout
