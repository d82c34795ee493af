"""Fixtures of the chaos suite: a fake provider per module and a Redis server per test with the
deploy file's ACL users (the pods run as the pod user). Every test here is marked `chaos`; the
default run keeps each fault short (seconds), ADMISSION_SOAK=1 runs each for minutes."""
from __future__ import annotations

import pytest

from admission.tools.fake_provider import FakeProviderServer
from admission.tools.servers import LocalServer, find_server

from chaos.harness import secure


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "/chaos/" in str(item.fspath):
            item.add_marker(pytest.mark.chaos)


@pytest.fixture(scope="module")
def provider():
    """Capacity well above the slots: a 429 would move the estimate, and these tests judge the
    admission's own bounds. Time runs 10x (a round of 20 tokens takes tens of ms)."""
    server = FakeProviderServer(capacity=50, scale=10.0, seed=1, tokens=20)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def make_server():
    """Start Redis servers with the ACL users applied; all stopped at teardown."""
    if not find_server("redis"):
        pytest.skip("no redis-server")
    started = []

    def make(*extra_args: str) -> LocalServer:
        s = LocalServer("redis", extra_args=list(extra_args)).start()
        started.append(s)
        c = s.client()
        secure(c)
        c.close()
        return s

    yield make
    try:
        for s in started:
            if s.pid is None:
                continue
            with s.client() as c:
                # the pods ran as the pod user: the rules never met a refusal (failed logins while
                # a restarted server had no users yet are not the rules', nor a pod's try to load
                # the library a wiped server lost: refused by design, the operator loads it)
                refused = [e for e in c.acl_log() if e.get("reason") != "auth" and e.get("object") != "function|load"]
                assert not refused, f"the pod user met refusals: {refused[:3]}"
    finally:
        for s in started:
            s.stop()
