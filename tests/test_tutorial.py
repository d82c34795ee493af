"""docs/tutorial.md, run step by step as a reader would, against real servers on free loopback
ports: the page cannot fall behind the code.

The tutorial marks what the test does with an HTML comment before a fenced block:

    <!-- tutorial: redis -->               the reader starts a Redis; the test uses its own server
    <!-- tutorial: run -->                 a shell block, run to completion (bash -e, pipefail)
    <!-- tutorial: file NAME -->           a file the reader saves as NAME (in the working dir)
    <!-- tutorial: background NAME -->     a command that runs until the end (Ctrl-C for a reader)
    <!-- tutorial: output -->              what the block before it printed (an excerpt)
    <!-- tutorial: output NAME -->         what the background command NAME has printed so far

Blocks without a mark (the install step) are not run. The tutorial's ports are the documented
defaults (Redis 6379, the fake provider 8400, ``admission serve`` 9464); the test rewrites them,
in every block and every expected output, to free ports. Run blocks share one environment (their
``export`` lines carry over to the next block, as in a reader's terminal).

An expected output is an excerpt: each of its lines must appear in what the command printed,
with every number standing for any number (the provider draws its 429s at random) and ``…`` for
anything. Then the test checks what the page claims in words: the four pods met the provider's
limit (K measured, K̂ above the one pod's 8 at some point), the 429s stayed a small share of the
requests, and the counts agree with the records (the doctor); one pod alone left K̂ at 8 and K
unmeasured.

``run_python_example(code)`` is for other tests (tests/test_readme.py): it runs a snippet like
the tutorial's ``hello.py`` against a live Redis with the tutorial's policy applied and a fake
provider, the snippet's URLs rewritten to theirs.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest
import redis

from admission import Mesh
from admission.tools.servers import LocalServer, default_engine, free_port

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = ROOT / "docs" / "tutorial.md"
#: The ports the tutorial names, by what listens there.
DEFAULT_PORTS = {"redis": 6379, "provider": 8400, "serve": 9464}
REDIS_URL = "redis://127.0.0.1:6379/0"
PROVIDER_URL = "http://127.0.0.1:8400"
MESH = "tutorial"
RUN_TIMEOUT = 90.0       # s: one run block (the four pods run 20 s)
START_TIMEOUT = 20.0     # s: a background command prints what the tutorial shows
CI = os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")

MARK = re.compile(r"^<!-- tutorial: (?P<kind>[a-z]+)(?: (?P<arg>\S+))? -->\n"
                  r"(?P<fence>```+)(?P<lang>[\w-]*)\n(?P<body>.*?)\n(?P=fence)[ \t]*$", re.M | re.S)
NUMBER = r"\d+(?:\.\d+)?"


@dataclass(frozen=True)
class Step:
    kind: str   # redis | run | file | background | output
    arg: str    # the file's or the background command's name ("" for none)
    lang: str
    body: str
    line: int   # where the block starts in the page (for messages)


def steps(text: str) -> list[Step]:
    """The marked blocks of the page, in order."""
    out = []
    for m in MARK.finditer(text):
        kind = m["kind"]
        if kind not in ("redis", "run", "file", "background", "output"):
            raise ValueError(f"tutorial.md line {text.count(chr(10), 0, m.start()) + 1}: unknown mark {kind!r}")
        out.append(Step(kind, m["arg"] or "", m["lang"], m["body"], text.count("\n", 0, m.start()) + 1))
    return out


def substitute(text: str, ports: dict[str, int]) -> str:
    """The documented default ports replaced by ``ports`` (by what listens there)."""
    for name, default in DEFAULT_PORTS.items():
        if name in ports:
            text = re.sub(rf"(?<![\d.]){default}(?![\d])", str(ports[name]), text)
    return text


def line_pattern(line: str) -> str:
    """A regular expression for one line of an expected output: any number for a number, any run
    of spaces for spaces, anything for ``…``."""
    parts = []
    line = re.sub(r"\s*…\s*", "…", line.strip())  # "a  …" is "a" then anything (nothing too)
    for token in re.findall(rf"{NUMBER}|\s+|…|[^\d\s…]+|\d", line):
        if token == "…":
            parts.append(".*?")
        elif token.isspace():
            parts.append(r"\s+")
        elif re.fullmatch(NUMBER, token):
            parts.append(NUMBER)
        else:
            parts.append(re.escape(token))
    return "".join(parts)


def missing_lines(expected: str, actual: str) -> list[str]:
    """The lines of ``expected`` that ``actual`` does not show."""
    return [line for line in expected.splitlines()
            if line.strip() and not re.search(line_pattern(line), actual)]


def _shims(bin_dir: Path) -> None:
    """``python``, ``python3`` and ``admission`` of the interpreter running the tests, first on PATH
    (``admission`` as ``python -m admission``: the console script need not be installed)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, argv in (("python", ""), ("python3", ""), ("admission", " -m admission")):
        path = bin_dir / name
        path.write_text(f'#!/bin/sh\nexec "{sys.executable}"{argv} "$@"\n')
        path.chmod(0o755)


def _environment(work: Path) -> dict[str, str]:
    _shims(work / ".bin")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMISSION_", "OPENAI_"))}
    env["PATH"] = f"{work / '.bin'}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    return env


class Background:
    """A command that runs until the end of the tutorial, its output in a file."""

    def __init__(self, name: str, command: str, cwd: Path, env: dict[str, str]):
        self.name, self.command = name, command
        self.log = cwd / f".{name}.log"
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(["bash", "-c", "exec " + command], cwd=cwd, env=env, stdout=out,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def expect(self, expected: str, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            missing = missing_lines(expected, self.output())
            if not missing:
                return
            if self.proc.poll() is not None or time.monotonic() > deadline:
                state = f"exited {self.proc.returncode}" if self.proc.poll() is not None else "still running"
                pytest.fail(f"`{self.command}` ({state}) did not print:\n" + "\n".join(missing)
                            + f"\n--- it printed:\n{self.output()[-3000:]}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)  # what Ctrl-C sends
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


class Reader:
    """Runs the steps in one working directory, with one environment, like a reader's terminal."""

    def __init__(self, work: Path, ports: dict[str, int]):
        self.work, self.ports = work, ports
        self.env = _environment(work)
        self.background: dict[str, Background] = {}
        # the last run block (its command and output) or background command (its name)
        self.last: tuple[str, str] | str | None = None

    def run(self, step: Step) -> None:
        body = substitute(step.body, self.ports)
        env_file = self.work / ".env"
        script = f"set -eo pipefail\n{body}\nenv -0 > {env_file}\n"
        try:
            done = subprocess.run(["bash", "-c", script], cwd=self.work, env=self.env, capture_output=True,
                                  text=True, timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired as exc:
            pytest.fail(f"tutorial.md line {step.line}: `{body}` did not end within {RUN_TIMEOUT:g} s:\n"
                        f"{exc.stdout or ''}{exc.stderr or ''}")
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"tutorial.md line {step.line}: `{body}` exited {done.returncode}:\n{output}"
        self.env = dict(kv.split("=", 1) for kv in env_file.read_text().split("\0") if "=" in kv)
        self.last = (body, output)

    def start(self, step: Step) -> None:
        assert step.arg and step.arg not in self.background, f"tutorial.md line {step.line}: name it once"
        bg = Background(step.arg, substitute(step.body, self.ports), self.work, self.env)
        self.background[step.arg] = bg
        self.last = step.arg
        # as a reader would, wait for it to print before the next step (each one prints at start)
        deadline = time.monotonic() + START_TIMEOUT
        while not bg.output().strip():
            if bg.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"tutorial.md line {step.line}: `{bg.command}` printed nothing "
                            f"({'exited ' + str(bg.proc.returncode) if bg.proc.poll() is not None else 'running'})")
            time.sleep(0.1)

    def check(self, step: Step) -> None:
        expected = substitute(step.body, self.ports)
        name = step.arg or (self.last if isinstance(self.last, str) else None)
        if name:
            self.background[name].expect(expected)
            return
        assert self.last is not None, f"tutorial.md line {step.line}: an output block before any command"
        command, output = self.last
        missing = missing_lines(expected, output)
        assert not missing, (f"tutorial.md line {step.line}: `{command}` did not print:\n" + "\n".join(missing)
                             + f"\n--- it printed:\n{output}")

    def stop(self) -> None:
        for bg in reversed(list(self.background.values())):
            bg.stop()


def _free_ports() -> dict[str, int]:
    ports: dict[str, int] = {}
    while len(set(ports.values())) < len(DEFAULT_PORTS):
        ports = {name: free_port() for name in DEFAULT_PORTS}
    return ports


def tutorial_policy() -> str:
    """The policy file the tutorial applies (its ``tutorial.toml``)."""
    return next(s.body for s in steps(TUTORIAL.read_text()) if s.kind == "file" and s.arg == "tutorial.toml")


# -- for other tests: a snippet against a live mesh -------------------------------------------------


@contextmanager
def live_mesh(redis_url: str | None = None, *, mesh: str = MESH, policy: str | None = None,
              capacity: float = 12, scale: float = 60) -> Iterator[tuple[str, str]]:
    """A Redis (``redis_url``, else an embedded server started here) whose ``mesh`` has the
    tutorial's policy (or ``policy``, TOML text) applied, and a fake provider in this process:
    yields (redis URL, provider URL) and stops what it started."""
    from admission.tools.fake_provider import FakeProviderServer

    server = None
    if redis_url is None:
        server = LocalServer(default_engine("valkey")).start()
        redis_url = server.url
    provider = FakeProviderServer(capacity=capacity, scale=scale, seed=1)
    try:
        ops = Mesh.from_url(redis_url, mesh=mesh)
        try:
            ops.apply_policy(_policy_dict(policy or tutorial_policy()), recovery_hold=False)
        finally:
            ops.close()
        provider.start()
        yield redis_url, provider.url
    finally:
        provider.stop()
        if server is not None:
            server.stop()


def _policy_dict(text: str) -> dict:
    import tomllib

    return tomllib.loads(text)


def run_python_example(code: str, *, redis_url: str | None = None, provider_url: str | None = None,
                       mesh: str = MESH, policy: str | None = None, timeout: float = 60.0,
                       cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` (a Python snippet written for the tutorial's setup: Redis at
    ``redis://127.0.0.1:6379/0``, the fake provider at ``http://127.0.0.1:8400``) in a fresh
    interpreter, its URLs rewritten to live ones; fails the test when it exits non-zero. Without
    ``redis_url`` and ``provider_url`` it starts both (``live_mesh``: the tutorial's policy applied
    to ``mesh``). Returns the finished process (``.stdout``, ``.stderr``)."""
    if redis_url is None or provider_url is None:
        with live_mesh(redis_url, mesh=mesh, policy=policy) as (url, purl):
            return run_python_example(code, redis_url=url, provider_url=purl, mesh=mesh, timeout=timeout, cwd=cwd)
    code = code.replace(REDIS_URL, redis_url).replace(PROVIDER_URL, provider_url.rstrip("/"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ADMISSION_", "OPENAI_"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or ROOT, env=env)
    assert done.returncode == 0, f"the example exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done


# -- the tests ---------------------------------------------------------------------------------------


pytest.importorskip("openai", reason="the openai extra: pip install 'admission[openai]'")


def test_the_page_marks_what_the_test_runs():
    marks = steps(TUTORIAL.read_text())
    kinds = [s.kind for s in marks]
    assert kinds.count("redis") == 1 and kinds.index("redis") < kinds.index("run")
    assert {s.arg for s in marks if s.kind == "file"} >= {"tutorial.toml", "hello.py", "worker.py"}
    assert {s.arg for s in marks if s.kind == "background"} == {"provider", "serve", "watch"}
    hello = next(s.body for s in marks if s.arg == "hello.py")
    assert REDIS_URL in hello and PROVIDER_URL + "/v1" in hello and len(hello.splitlines()) <= 15
    # every output block follows a command, or names a background one
    for before, step in zip(marks, marks[1:]):
        if step.kind == "output" and not step.arg:
            assert before.kind in ("run", "background"), f"line {step.line}: output of what?"


def test_line_pattern():
    rx = line_pattern("pool p  K̂  13.6  K   15  exhausted (rate_limited)  …")
    assert re.search(rx, "pool p  K̂     2  K 0  exhausted (rate_limited), probing")
    assert not re.search(rx, "pool p  K̂     2  K 0  slow start")
    assert substitute("--port 8400 http://127.0.0.1:8400/v1 redis://127.0.0.1:6379/0 84001",
                      {"provider": 1, "redis": 2}) == "--port 1 http://127.0.0.1:1/v1 redis://127.0.0.1:2/0 84001"


def test_tutorial(server_pool, tmp_path):
    from conftest import REAL, assert_doctor_ok

    if not REAL:
        pytest.skip("no redis-server or valkey-server available/selected")
    if shutil.which("curl") is None and not CI:  # .ci/run installs it
        pytest.skip("the tutorial reads /metrics with curl, which is not installed")
    server = server_pool.get(REAL[0])
    client = redis.Redis.from_url(server.url)
    client.flushall()
    ports = {**_free_ports(), "redis": server.port}
    reader = Reader(tmp_path, ports)
    marks = steps(TUTORIAL.read_text())
    try:
        for step in marks:
            if step.kind == "redis":
                assert "--port 6379" in step.body  # the test's server stands for it
            elif step.kind == "file":
                (tmp_path / step.arg).write_text(substitute(step.body, ports) + "\n")
            elif step.kind == "run":
                reader.run(step)
            elif step.kind == "background":
                reader.start(step)
            elif step.kind == "output":
                reader.check(step)
        # What the page says in words: the pods met the limit together, with few 429s.
        census = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{ports['serve']}/census.json?mesh={MESH}",
                                                   timeout=5).read())
        pool = next(p for p in census["pools"] if p["pool"] == "sonnet@fake")
        assert pool["carryingCapacity"] > 0, pool  # a 429 measured K
        watched = reader.background["watch"].output()
        seen = [(float(est), float(k)) for est, k in
                re.findall(r"^pool sonnet@fake\s+K̂\s+([\d.]+)\s+K\s+([\d.]+)", watched, re.M)]
        assert seen[0] == (8, 0), watched  # one pod: slow start to 8, where six threads leave it; no 429
        # four pods: they met the limit together (a 429 measured K while the census was watched);
        # how far K̂ climbed first is the provider's draw (it may refuse a little below its K)
        assert any(k > 0 for _, k in seen[1:]), watched
        stats = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{ports['provider']}/stats", timeout=5).read())
        total = stats["total"]
        assert total["completions"] > 100 and total["429"] <= 0.1 * total["requests"], total
    finally:
        reader.stop()
    assert_doctor_ok(client)
    client.close()


def test_run_python_example_runs_hello():
    hello = next(s.body for s in steps(TUTORIAL.read_text()) if s.kind == "file" and s.arg == "hello.py")
    done = run_python_example(hello)
    assert "300 tokens" in done.stdout, done.stdout
