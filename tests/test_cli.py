"""The `admission` command against a real server."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
