"""The README is the front door: short, true, and its example runs.

* at most 250 lines (everything else lives on the documentation site, docs/);
* its quick start is the two make targets CI and a newcomer run;
* its openai example runs as written against a real server and the fake provider (only the
  addresses are substituted), and the round it starts is admitted and released;
* its links point at files of this repository, and nothing points outside it.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from admission import Mesh
from admission.tools.fake_provider import FakeProviderServer

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
TEXT = README.read_text()


def example() -> str:
    """The Python block right after the `<!-- readme: example -->` marker."""
    m = re.search(r"<!-- readme: example -->\n```python\n(.*?)```", TEXT, re.S)
    assert m, "README.md lost its `<!-- readme: example -->` block"
    return m.group(1)


def test_readme_is_at_most_250_lines():
    assert len(TEXT.splitlines()) <= 250


def test_readme_quick_start_is_the_two_make_targets():
    quick = TEXT.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = [line.split("#")[0].strip() for line in quick.splitlines() if line.startswith("    make ")]
    assert commands == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:", makefile, re.M) and re.search(r"^test:", makefile, re.M)
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_readme_example_is_about_fifteen_lines():
    lines = [line for line in example().splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert len(lines) <= 18


def test_readme_example_runs(server_url, tmp_path):
    provider = FakeProviderServer(capacity=8, scale=100.0, seed=1)
    url = provider.start()
    try:
        code = example()
        assert "redis://127.0.0.1:6379/0" in code and "http://127.0.0.1:8400/v1" in code
        code = code.replace("redis://127.0.0.1:6379/0", server_url).replace("http://127.0.0.1:8400", url)
        script = tmp_path / "example.py"
        script.write_text(code)
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip(), "the example printed no answer"
    finally:
        provider.stop()
    ops = Mesh.from_url(server_url, mesh="demo")
    try:
        # the round was admitted and released clean: the pool counts one success, nothing running
        pool = next(p for p in ops.census()["pools"] if p["pool"] == "gpt-4o@fake")
        assert pool["running"] == 0
        assert ops.redis.exists("adm:{demo}:gone:thread-1/round-1")
        assert ops.redis.hget("adm:{demo}:pool:gpt-4o@fake", "succ") == b"1"
    finally:
        ops.close()


LINK = re.compile(r"\]\(([^)]+)\)")


def test_readme_links_point_into_the_repository():
    targets = LINK.findall(TEXT)
    assert targets
    for target in targets:
        assert not re.match(r"[a-z]+://", target), f"README links outside the project: {target}"
        path = target.split("#", 1)[0]
        assert (ROOT / path).exists(), f"README links to a missing file: {target}"


def test_readme_names_no_outside_address():
    for url in re.findall(r"[a-z]+://[^\s)`\"']+", TEXT):
        assert re.match(r"(redis|http)://127\.0\.0\.1", url), f"README points outside the project: {url}"
