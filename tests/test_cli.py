"""The `admission` command against a real server."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import redis

EXAMPLE = str(Path(__file__).resolve().parent.parent / "deploy" / "policy.example.toml")


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "admission", *args], capture_output=True, text=True, timeout=60)


def test_config_apply_then_census_and_events(server_url, tmp_path):
    conn = ["--url", server_url, "--mesh", "cli"]
    out = run("config", "apply", EXAMPLE, *conn)
    assert out.returncode == 0 and "version 1" in out.stdout
    census = run("census", *conn)
    assert census.returncode == 0 and "sonnet@anthropic" in census.stdout and "K̂" in census.stdout
    doc = json.loads(run("census", "--json", *conn).stdout)
    assert {p["pool"] for p in doc["pools"]} >= {"sonnet@anthropic", "gpt@azure-eu"}
    assert "kind=config" in run("events", *conn).stdout
    bad = tmp_path / "bad.toml"
    bad.write_text("maxConcurrentAgents = 8\n")
    out = run("config", "apply", str(bad), *conn)
    assert out.returncode == 2 and "retired" in out.stderr
    assert json.loads(run("config", "show", *conn).stdout)["version"] == 1   # unchanged


def test_unreachable_redis_is_a_clear_error():
    out = run("census", "--url", "redis://127.0.0.1:1/0")
    assert out.returncode == 3 and "unreachable" in out.stderr


@pytest.mark.corrupts_state
def test_doctor_ok_then_problems_then_errors(server_url):
    conn = ["--url", server_url, "--mesh", "cli"]
    assert run("config", "apply", EXAMPLE, *conn).returncode == 0
    out = run("doctor", *conn)
    assert (out.returncode, out.stdout.strip()) == (0, "ok: 0 seats, 0 tickets")
    client = redis.Redis.from_url(server_url)
    client.hset("adm:{cli}:lanes:sonnet@anthropic", "reviews", 2)   # two rounds nobody holds
    client.close()
    out = run("doctor", *conn)
    assert out.returncode == 1 and "1 problem in mesh cli" in out.stdout
    assert "lane-count: field=reviews lane=reviews pool=sonnet@anthropic records=0 stored=2" in out.stdout
    doc = json.loads(run("doctor", "--json", *conn).stdout)
    assert doc["ok"] is False and [p["kind"] for p in doc["problems"]] == ["lane-count"]
    out = run("doctor", "--url", server_url, "--mesh", "a}b")
    assert out.returncode == 2 and "BadName" in out.stderr
