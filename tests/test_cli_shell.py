"""The `admission` command in a shell: where it connects (ADMISSION_URL / ADMISSION_MESH, global
--url / --mesh before or after the subcommand), --version, one-line errors with an exit code for
every operator mistake (no traceback, no Lua location), config validate / diff / show, a census
that sweeps expired leases first, plain output into a pipe and a quiet exit when it closes, the
legend, and the events (ISO-8601 UTC times, --json, filters, --follow, --refusals). One test per
rule, named after it; the ones that need a server run against Redis 7 and Valkey 8."""
from __future__ import annotations

import json
import os
import re
import select
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

import pytest
import redis

from admission import Admission
from admission.cli import CliError, EventFilter, latest_events, read_census

from helpers import T0, policy

EXAMPLE = str(Path(__file__).resolve().parent.parent / "deploy" / "policy.example.toml")
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z ")
ENV_NAMES = ("ADMISSION_URL", "ADMISSION_MESH", "ADMISSION_POD")


def env_with(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ENV_NAMES}
    return {**env, **extra}


def run(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "admission", *args], capture_output=True, text=True,
                          timeout=timeout, env=env or env_with())


def one_line_error(out: subprocess.CompletedProcess, code: int, *words: str) -> None:
    """Exit `code`, stderr exactly one line `admission: ...` with `words`, no traceback, no Lua."""
    lines = out.stderr.splitlines()
    assert out.returncode == code, (out.returncode, out.stderr)
    assert len(lines) == 1 and lines[0].startswith("admission"), out.stderr
    for bad in ("Traceback", "script:", "@user_function", ".lua"):
        assert bad not in out.stderr, out.stderr
    for w in words:
        assert w in out.stderr, (w, out.stderr)


@pytest.fixture
def applied(server_url):
    """The example policy applied to mesh `sh` (no recovery hold): the connection arguments."""
    out = run("config", "apply", EXAMPLE, "--no-recovery-hold", "--url", server_url, "--mesh", "sh")
    assert out.returncode == 0, out.stderr
    return server_url


def pod(url: str, mesh: str = "sh", name: str = "pod-a") -> Admission:
    return Admission(redis.Redis.from_url(url), mesh=mesh, pod=name, background=False)


# -- where it connects ------------------------------------------------------------------------------


def test_connection_from_the_environment_or_global_options_before_or_after_the_subcommand(server_url):
    # the environment only
    out = run("config", "apply", EXAMPLE, "--no-recovery-hold", env=env_with(ADMISSION_URL=server_url,
                                                                             ADMISSION_MESH="envmesh"))
    assert out.returncode == 0 and "mesh envmesh: version 1" in out.stdout, out.stderr
    # global options before the subcommand, and after it; the options win over the environment
    before = run("--url", server_url, "--mesh", "envmesh", "config", "show")
    after = run("config", "show", "--url", server_url, "--mesh", "envmesh",
                env=env_with(ADMISSION_URL="redis://127.0.0.1:1/0", ADMISSION_MESH="elsewhere"))
    assert before.returncode == after.returncode == 0
    assert json.loads(before.stdout)["version"] == json.loads(after.stdout)["version"] == 1
    # a mesh given before the subcommand is not reset by the subcommand's defaults
    out = run("--mesh", "envmesh", "census", "--json", env=env_with(ADMISSION_URL=server_url))
    assert out.returncode == 0 and json.loads(out.stdout)["mesh"] == "envmesh"


def test_version_prints_the_package_version():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"admission {version('admission')}"


# -- operator mistakes: one line, an exit code ---------------------------------------------------------


def test_mistakes_bad_url_scheme_and_database_are_usage_errors_not_tracebacks():
    one_line_error(run("census", "--url", "http://127.0.0.1:6379/0"), 2, "scheme", "redis://")
    one_line_error(run("census", "--url", "redis://127.0.0.1:6379/zero"), 2, "database", "'zero'")
    one_line_error(run("census", "--url", "redis://127.0.0.1:6379/0?db=x"), 2, "database")
    one_line_error(run("census", "--url", "redis://user:s3cret@127.0.0.1:notaport/0"), 2, "bad Redis URL")
    assert "s3cret" not in run("census", "--url", "redis://user:s3cret@127.0.0.1:notaport/0").stderr
    one_line_error(run("census", "--bogus"), 2, "unrecognized arguments")


def test_mistakes_unreachable_is_exit_3():
    one_line_error(run("census", "--url", "redis://127.0.0.1:1/0"), 3, "unreachable", "127.0.0.1:1")
    one_line_error(run("events", "--follow", "--url", "redis://127.0.0.1:1/0"), 3, "unreachable")


def test_mistakes_a_database_the_server_does_not_have_is_exit_2(server_url):
    one_line_error(run("census", "--url", server_url.rsplit("/", 1)[0] + "/4000"), 2, "no such database")


def test_mistakes_no_policy_is_exit_4_with_no_lua_location(server_url):
    conn = ["--url", server_url, "--mesh", "empty"]
    for args in (["census"], ["config", "show"], ["config", "show", "--alternatives"],
                 ["config", "diff", EXAMPLE], ["tick"], ["census", "--no-sweep"]):
        one_line_error(run(*args, *conn), 4, "mesh empty has no policy", "config apply")


def test_mistakes_a_policy_that_cannot_be_read_or_is_stale_is_exit_2(applied, tmp_path):
    conn = ["--url", applied, "--mesh", "sh"]
    one_line_error(run("config", "apply", str(tmp_path), *conn), 2, "is a directory")
    one_line_error(run("config", "apply", str(tmp_path / "none.toml"), *conn), 2, "not found")
    (tmp_path / "bad.toml").write_text("[lanes\n")
    one_line_error(run("config", "apply", str(tmp_path / "bad.toml"), *conn), 2, "not valid TOML")
    one_line_error(run("config", "apply", EXAMPLE, "--expect-version", "7", *conn), 2, "StaleVersion", "7")
    one_line_error(run("config", "apply", *conn), 2, "FILE is required")
    one_line_error(run("provider", "close", "nobody", "--why", "x", *conn), 2, "not in the policy")


# -- config validate / diff / show ----------------------------------------------------------------------


def test_config_validate_reports_every_error_at_once(tmp_path):
    bad = tmp_path / "policy.toml"
    bad.write_text("""
maxConcurrentAgents = 3
[tunables]
seed_estimate = 0
grow_intervall = 3
[lanes.a]
floor = 0.8
[lanes.b]
floor = 0.5
weight = -1
[providers.p]
route = "mars"
[pools."m@p"]
[pools."n@q"]
[pins]
lanes = ["zz"]
""")
    out = run("config", "validate", str(bad))
    assert out.returncode == 2 and out.stdout == ""
    lines = out.stderr.splitlines()
    assert all(line.startswith(f"admission: {bad}: ") for line in lines)
    for what in ("maxConcurrentAgents is retired", "grow_intervall", "tunables.seed_estimate", "providers.p.route",
                 "provider 'q' is not declared", "lanes.b.weight", "must sum to <= 1", "pins.lanes: zz",
                 "8 errors; nothing applied"):
        assert sum(what in line for line in lines) == 1, (what, out.stderr)
    assert "Traceback" not in out.stderr
    ok = run("config", "validate", EXAMPLE)
    assert ok.returncode == 0 and "a valid policy: 7 lanes, 3 providers, 5 pools" in ok.stdout
    one_line_error(run("config", "validate", str(tmp_path)), 2, "is a directory")


def test_config_diff_against_the_live_policy(applied, tmp_path):
    conn = ["--url", applied, "--mesh", "sh"]
    same = run("config", "diff", EXAMPLE, *conn)
    assert same.returncode == 0 and "no difference" in same.stdout and "version 1" in same.stdout
    changed = tmp_path / "changed.toml"
    changed.write_text(Path(EXAMPLE).read_text().replace("seed_estimate = 2", "seed_estimate = 3"))
    out = run("config", "diff", str(changed), *conn)
    assert out.returncode == 1, out.stderr
    assert out.stdout.startswith("--- live policy of mesh sh (version 1)\n+++ " + str(changed))
    assert '-    "seed_estimate": 2,' in out.stdout and '+    "seed_estimate": 3,' in out.stdout
    assert sum(line[:1] in "+-" and line[:3] not in ("---", "+++") for line in out.stdout.splitlines()) == 2


def test_config_show_exits_non_zero_on_an_empty_mesh(applied):
    out = run("config", "show", "--url", applied, "--mesh", "sh")
    assert out.returncode == 0 and json.loads(out.stdout)["version"] == 1
    out = run("config", "show", "--url", applied, "--mesh", "nobody")
    assert out.returncode == 4 and out.stdout == ""


# -- census ---------------------------------------------------------------------------------------------


def test_census_sweeps_expired_leases_first(server_url, tmp_path):
    path = tmp_path / "short.toml"
    path.write_text('[tunables]\nlease_ttl = 0.5\n[lanes.a]\nfloor = 0.5\n[providers.p]\n[pools."m@p"]\n')
    conn = ["--url", server_url, "--mesh", "lease"]
    assert run("config", "apply", str(path), "--no-recovery-hold", *conn).returncode == 0
    one_line_error(run("census", "--no-sweep", *conn), 4, "no census yet")
    d = pod(server_url, "lease").try_admit(lane="a", model="m@p", round_id="dead-pod-round")
    assert d.admitted                                      # no heartbeat: the pod is gone
    time.sleep(0.8)
    doc = json.loads(run("census", "--json", *conn).stdout)
    assert doc["pools"][0]["running"] == 0
    events = run("events", "--kind", "expired", "--json", *conn).stdout.splitlines()
    assert [json.loads(e)["round"] for e in events] == ["dead-pod-round"]
    # read-only: the stored census as it was written, no sweep
    stored = run("census", "--no-sweep", "--json", *conn)
    assert stored.returncode == 0 and json.loads(stored.stdout)["pools"][0]["running"] == 0


def test_census_sweeps_expired_leases_first_on_every_engine(redis_client):
    """The same rule in-process (fakeredis too): a mesh on Redis' clock, a pod that died."""
    a = Admission(redis_client, mesh="lease", pod="pod-a", background=False)
    pol = policy({"a": {"floor": 0.5, "weight": 1, "priority": 1}}, lease_ttl=0.3)
    pol.pop("clock")                                                          # Redis' own clock
    a.ops.apply_policy(pol, recovery_hold=False)
    assert a.try_admit(lane="a", model="m@p", round_id="dead", draw=0.0).admitted
    with pytest.raises(CliError) as err:                                    # read-only, nothing stored yet
        read_census(a.ops, "lease", no_sweep=True)
    assert err.value.code == 4
    time.sleep(0.5)
    assert read_census(a.ops, "lease", no_sweep=False)["pools"][0]["running"] == 0
    assert [f["round"] for _, f in latest_events(redis_client, "adm:{lease}:events", 5,
                                                 EventFilter(kinds=["expired"]))[0]] == ["dead"]
    assert read_census(a.ops, "lease", no_sweep=True)["pools"][0]["running"] == 0


def test_census_plain_into_a_pipe_and_quiet_when_the_pipe_closes(applied):
    proc = subprocess.Popen([sys.executable, "-m", "admission", "census", "--watch", "0.05", "--url", applied,
                             "--mesh", "sh"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env_with())
    first = b""
    deadline = time.monotonic() + 20
    while first.count(b"mesh sh") < 2 and time.monotonic() < deadline:   # two censuses, one after the other
        if select.select([proc.stdout], [], [], 1)[0]:
            first += os.read(proc.stdout.fileno(), 65536)
    proc.stdout.close()                                                       # `| head` went away
    code = proc.wait(timeout=20)
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert first.count(b"mesh sh") >= 2 and b"\x1b" not in first           # no terminal codes, no redraw
    assert code == 141 and err == "", err


def test_census_explain_prints_the_legend(applied):
    out = run("census", "--explain", "--url", applied, "--mesh", "sh")
    assert out.returncode == 0
    legend = out.stdout.split("\nlegend\n", 1)[1]
    for word in ("K̂ ", "K ", "slots", "guaranteed", "borrowed", "must yield"):
        assert f"\n  {word}" in "\n" + legend, word
    one_line_error(run("census", "--explain", "--json", "--url", applied, "--mesh", "sh"), 2, "--explain")


# -- events ---------------------------------------------------------------------------------------------


def test_events_iso_times_json_and_filters(applied):
    conn = ["--url", applied, "--mesh", "sh"]
    a, b = pod(applied), pod(applied, name="pod-b")
    da = a.try_admit(lane="reviews", model="sonnet@anthropic", round_id="r-a")
    db = b.try_admit(lane="bugfix", model="sonnet@anthropic", round_id="r-b")
    a.release(da.seat, outcome="clean", seconds=1)
    b.release(db.seat, outcome="clean", seconds=1)
    lines = run("events", *conn).stdout.splitlines()
    assert len(lines) == 5 and all(ISO.match(line) for line in lines), lines
    assert " kind=config " in lines[0] and " kind=released " in lines[-1]
    docs = [json.loads(line) for line in run("events", "--json", *conn).stdout.splitlines()]
    assert [d["kind"] for d in docs] == ["config", "admitted", "admitted", "released", "released"]
    assert all(re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$", d["at"]) and "-" in d["id"] for d in docs)

    def rounds(*args):
        return [json.loads(x).get("round") for x in run("events", "--json", *args, *conn).stdout.splitlines()]

    assert rounds("--kind", "admitted") == ["r-a", "r-b"]
    assert rounds("--kind", "admitted,released", "--pod", "pod-b") == ["r-b"]       # released has no pod
    assert rounds("--lane", "reviews") == ["r-a", "r-a"]
    assert rounds("--pool", "sonnet@anthropic", "--count", "1") == ["r-b"]
    assert rounds("--pool", "gpt@azure-eu") == []


def test_events_follow_prints_new_events_as_they_come(applied):
    proc = subprocess.Popen([sys.executable, "-m", "admission", "events", "--follow", "--count", "1", "--kind",
                             "config,admitted", "--url", applied, "--mesh", "sh"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env_with())
    try:
        assert " kind=config " in proc.stdout.readline()                  # the backlog: the last one
        time.sleep(0.3)
        pod(applied).try_admit(lane="reviews", model="sonnet@anthropic", round_id="later")
        line = proc.stdout.readline()
        assert ISO.match(line) and " kind=admitted round=later " in line
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()
        proc.stderr.close()


def test_events_refusals_shows_the_counts_per_pool_lane_and_reason(server_url):
    a = Admission(redis.Redis.from_url(server_url), mesh="ref", pod="pod-a", background=False)
    a.ops.apply_policy(policy({"a": {"floor": 0, "weight": 1, "priority": 1}}, seed_estimate=1, max_estimate=1),
                   recovery_hold=False)
    a.try_admit(lane="a", model="m@p", round_id="holder", now=T0, draw=0.0)
    for i in range(3):
        assert not a.try_admit(lane="a", model="m@p", round_id=f"r{i}", now=T0 + i, draw=0.0).admitted
    conn = ["--url", server_url, "--mesh", "ref", "--now", str(T0 + 5)]
    assert "kind=refused" not in run("events", "--url", server_url, "--mesh", "ref").stdout
    out = run("events", "--refusals", "--minutes", "5", *conn)
    assert out.returncode == 0
    assert re.search(r"^m@p\s+a\s+full\s+3$", out.stdout, re.M) and re.search(r"^total\s+3$", out.stdout, re.M)
    doc = json.loads(run("events", "--refusals", "--json", *conn).stdout)
    assert doc["refusals"] == [{"pool": "m@p", "lane": "a", "reason": "full", "count": 3}] and doc["total"] == 3
    assert doc["from"].endswith("Z") and doc["minutes"] == 60
    assert "none" in run("events", "--refusals", "--lane", "b", *conn).stdout
    one_line_error(run("events", "--refusals", "--minutes", "5000", *conn), 2, "minutes")
