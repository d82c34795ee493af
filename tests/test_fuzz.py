"""Every script's ARGV fuzzed, and policies (issue 12, part 3).

On a busy mesh (a policy, seats, a delegated seat, a pinned waiter, spend, a reported stall, a
health sample, a budget reading, a closed provider, an intent watermark), hypothesis calls each
command of ``scripts.COMMANDS`` with FCALL directly: byte strings, and valid ARGV with positions
replaced by fuzz ("nan", "1e309", huge counts, names with braces, pipes, spaces, control bytes,
very long strings), cut short or extended. ``fuzz_atheris.Fuzzer`` checks on every call:

* the reply is a success or an error starting with an ``ADM_`` code, never a raw Lua error;
* an error reply leaves the state byte-for-byte unchanged;
* the call returns within ``CALL_BOUND_S`` (0.25 s) wall;
* after a success the doctor finds the counts consistent (and conftest's doctor at teardown).

Policies are fuzzed twice: JSON-ish documents straight into apply_config (the script's own
checks), and TOML-shaped dicts through ``Admission.apply_policy`` (Python's checks first). A
policy either side accepts then meets every command's valid ARGV: an accepted policy must never
make a later call fail raw.

The same properties run under atheris (``tests/fuzz_atheris.py``) where it installs. Every run
is derandomized (CI is reproducible). The figures (section "fuzzing", per engine): inputs tried
per command and in total, raw errors, state changes on an error reply, slow calls, doctor
problems (all must be 0) and the slowest call.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings, strategies as st

from admission import Admission, AdmissionError, scripts
from admission.errors import without_location
from admission.tools.servers import find_server

from figures import record
from fuzz_atheris import CALL_BOUND_S, NASTY, NOW, POLICY, Fuzzer, Stats, Violation, lua_policy, snapshot

HERE = Path(__file__).resolve().parent

#: Examples per test (per command for the ARGV): a call on fakeredis costs about three times one on
#: a real server (its Lua and its commands run in Python), and the real servers are the engines
#: that matter; the file stays within ~25 s on a busy 2-core machine. ADMISSION_FUZZ_EXAMPLES=N
#: runs N examples per test on every engine (a deeper run by hand; 500 takes a few minutes).
EXAMPLES = {"fakeredis": 15, "redis": 20, "valkey": 20}
POLICY_EXAMPLES = {"fakeredis": 15, "redis": 20, "valkey": 20}
SEQUENCE_EXAMPLES = {"fakeredis": 15, "redis": 20, "valkey": 20}
if os.environ.get("ADMISSION_FUZZ_EXAMPLES"):  # a deeper run by hand: examples per test, every engine
    EXAMPLES = POLICY_EXAMPLES = SEQUENCE_EXAMPLES = defaultdict(lambda: int(os.environ["ADMISSION_FUZZ_EXAMPLES"]))

STATS: dict[str, Stats] = defaultdict(Stats)
SECONDS: dict[str, float] = defaultdict(float)


def _settings(n: int) -> settings:
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module", autouse=True)
def figures():
    """Per engine: the inputs tried (per command, in total) and what was found (must be 0)."""
    yield
    for engine, s in sorted(STATS.items()):
        where = {"engine": engine, "fuzzer": "hypothesis (derandomized)", "bound_ms": CALL_BOUND_S * 1000}
        for command, n in sorted(s.tried.items()):
            replies = {k: v for (c, k), v in sorted(s.replies.items()) if c == command}
            record("fuzzing", f"inputs tried, {command}", n, settings={**where, "replies": replies})
        record("fuzzing", "inputs tried, total", s.total, settings={**where, "seconds": round(SECONDS[engine], 1)})
        record("fuzzing", "raw Lua errors found", s.raw_errors, must="0", settings=where)
        record("fuzzing", "state changes on an error reply found", s.state_changes, must="0", settings=where)
        record("fuzzing", "calls past the bound", s.slow_calls, must="0", settings=where)
        record("fuzzing", "doctor problems after a success", s.doctor_problems, must="0", settings=where)
        record("fuzzing", "slowest call", round(s.slowest_s * 1000, 2), unit="ms",
               must=f"< {CALL_BOUND_S * 1000:.0f}", settings={**where, "call": s.slowest})


# -- strategies ----------------------------------------------------------------------------------

FUZZ = st.one_of(
    st.sampled_from(NASTY),
    st.binary(max_size=48),
    st.integers(-(2 ** 70), 2 ** 70).map(lambda i: str(i).encode()),
    st.floats().map(lambda f: repr(f).encode()),
    st.text(max_size=24).map(str.encode),
)


@st.composite
def argv(draw, templates: list[list[bytes]]) -> list[bytes]:
    """Pure bytes, or a valid ARGV with 1-4 positions replaced, cut short or extended."""
    mode = draw(st.sampled_from(("one", "some", "cut", "more", "bytes")))
    if mode == "bytes":
        return draw(st.lists(FUZZ, max_size=14))
    args = list(draw(st.sampled_from(templates)))
    for _ in range(draw(st.integers(2, 4)) if mode == "some" else 1):
        if args:
            args[draw(st.integers(0, len(args) - 1))] = draw(FUZZ)
    if mode == "cut":
        args = args[:draw(st.integers(0, len(args)))]
    elif mode == "more":
        args += draw(st.lists(FUZZ, min_size=1, max_size=6))
    return args


#: JSON values: every type, numbers at and past every bound (NaN and Infinity too: json.dumps
#: writes them, and cjson reads them), names a key cannot hold.
NAMES = st.sampled_from(["a", "b", "c", "m@p", "n@p", "o@q", "x@y", "p", "q", "", "a b", "{x}", "a|b", "x" * 201,
                         "\x07", "é", "*", "@", "m@"])
SCALARS = st.one_of(
    st.none(), st.booleans(), NAMES,
    st.sampled_from([0, -0.0, -1, 0.5, 1, 1.5, 2, 1e-300, 1e9, 1e300, 2 ** 53 + 1, 2 ** 64, -(2 ** 63),
                     float("nan"), float("inf"), float("-inf"), "1e400"]),
    st.floats(), st.integers(), st.text(max_size=8),
)
JSONISH = st.recursive(SCALARS, lambda kids: st.lists(kids, max_size=4)
                       | st.dictionaries(st.one_of(NAMES, st.text(max_size=6)), kids, max_size=4), max_leaves=10)


def _paths(doc: Any, at: tuple = ()) -> list[tuple]:
    out = [at]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, at + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, at + (i,))
    return out


def _get(doc: Any, path: tuple) -> Any:
    for k in path:
        doc = doc[k]
    return doc


@st.composite
def mutated(draw, base: dict[str, Any]) -> dict[str, Any]:
    """``base`` with 1-3 mutations: a value replaced, a key dropped, an unknown key added, a list
    item repeated (duplicate names), a container emptied."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(_paths(doc)))
        op = draw(st.sampled_from(("replace", "replace", "drop", "add", "repeat", "empty")))
        if not path:
            op = "add" if op in ("replace", "drop") else op
        node = _get(doc, path)
        parent = _get(doc, path[:-1]) if path else None
        if op == "replace":
            parent[path[-1]] = draw(JSONISH)
        elif op == "drop" and isinstance(parent, dict):
            del parent[path[-1]]
        elif op == "drop":
            parent.pop(path[-1])
        elif op == "add" and isinstance(node, dict):
            node[draw(st.one_of(NAMES, st.text(max_size=6)))] = draw(JSONISH)
        elif op == "repeat" and isinstance(node, list) and node:
            node.append(copy.deepcopy(node[draw(st.integers(0, len(node) - 1))]))
        elif op == "empty" and isinstance(node, (dict, list)):
            node.clear()
    return doc


def _dumps(doc: Any) -> bytes:
    """JSON as cjson may meet it: NaN and Infinity literal, and a number past a double (1e400)."""
    return json.dumps(doc).replace('"1e400"', "1e400").encode()


# -- the busy mesh -------------------------------------------------------------------------------

@pytest.fixture
def fuzzer(redis_client, engine):
    fz = Fuzzer(redis_client, mesh="fz", stats=STATS[engine])
    started = time.perf_counter()
    yield fz
    SECONDS[engine] += time.perf_counter() - started


def _run(fuzzer: Fuzzer, command: str, args: list[bytes]) -> None:
    try:
        fuzzer.call(command, args)
    except Violation:
        fuzzer.rebuild()  # hypothesis shrinks on a busy mesh again
        raise


@pytest.mark.parametrize("command", scripts.COMMANDS)
def test_no_argv_makes_a_script_fail_raw_change_state_on_error_or_run_unbounded(fuzzer, engine, command):
    templates = fuzzer.busy.templates[command]

    @_settings(EXAMPLES[engine])
    @given(args=argv(templates))
    def fuzz(args):
        _run(fuzzer, command, args)

    fuzz()


def test_no_sequence_of_fuzzed_calls_breaks_a_later_call(fuzzer, engine):
    """Two to five fuzzed calls of any commands in a row on one mesh: what one call accepted
    (a policy, a re-asserted seat, a time far ahead) must not make the next one fail raw."""
    templates = fuzzer.busy.templates
    step = st.sampled_from(scripts.COMMANDS).flatmap(lambda c: st.tuples(st.just(c), argv(templates[c])))

    @_settings(SEQUENCE_EXAMPLES[engine])
    @given(steps=st.lists(step, min_size=2, max_size=5))
    def fuzz(steps):
        if not fuzzer.still_busy():
            fuzzer.rebuild()
        for command, args in steps:
            try:
                fuzzer.call(command, args, follow_up=False)
            except Violation as exc:
                fuzzer.rebuild()
                raise Violation(f"{exc}\n  after {[(c, _short(a)) for c, a in steps]}") from None

    fuzz()


def _short(args: list[bytes]) -> list[bytes]:
    return [a if len(a) <= 40 else a[:40] + b"..." for a in args]


def test_a_policy_document_the_script_refuses_changes_nothing_and_one_it_accepts_breaks_no_call(fuzzer, engine):
    base = lua_policy()
    alts = json.dumps({"m@p": ["n@p", "o@q"]}).encode()

    @_settings(POLICY_EXAMPLES[engine])
    @given(doc=mutated(base), alternatives=st.one_of(st.just(alts), JSONISH.map(_dumps)))
    def fuzz(doc, alternatives):
        _run(fuzzer, "apply_config", [b"", _dumps(doc), b"tok-fuzz", NOW.encode(), b"0", alternatives])

    fuzz()


def test_a_policy_apply_policy_refuses_changes_nothing_and_one_it_accepts_breaks_no_call(fuzzer, engine):
    client = fuzzer.client
    a = Admission(client, mesh=fuzzer.mesh, pod="pod-a", background=False, seed=1)

    @_settings(POLICY_EXAMPLES[engine])
    @given(doc=mutated(POLICY))
    def fuzz(doc):
        stats = fuzzer.stats
        stats.tried["apply_policy"] += 1
        before = fuzzer.state
        try:
            a.ops.apply_policy(doc, recovery_hold=False)
        except AdmissionError as exc:
            stats.replies["apply_policy", type(exc).__name__] += 1
            if snapshot(client) != before:
                stats.state_changes += 1
                fuzzer.rebuild()
                raise Violation(f"apply_policy refused {doc!r} ({exc}) and changed the state")
            return
        except Exception as exc:  # a TypeError, a raw ResponseError...: not one of ours
            stats.raw_errors += 1
            fuzzer.rebuild()
            raise Violation(f"apply_policy({doc!r}) raised {type(exc).__name__}: {exc}") from exc
        stats.replies["apply_policy", "ok"] += 1
        fuzzer.state = snapshot(client)
        try:
            fuzzer.sweep_templates(f"the policy {doc!r}")
        finally:
            fuzzer.rebuild()

    fuzz()


# -- atheris -------------------------------------------------------------------------------------

ATHERIS_RUNS = 200
NEEDS_ATHERIS = ("atheris is not installed (wheels: CPython 3.11-3.13 on x86_64 Linux, where "
                 "`pip install -e .[test]` brings it)")


def _harness(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict[str, Any], float]:
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, str(HERE / "fuzz_atheris.py"), "--summary", str(summary), "--artifacts", str(tmp_path),
           *args]
    started = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (
                              str(HERE.parent), os.environ.get("PYTHONPATH"))))})
    doc = json.loads(summary.read_text()) if summary.exists() else {}
    return proc, doc, time.perf_counter() - started


def test_atheris_finds_no_raw_error_no_state_change_and_no_slow_call(real_engine, server_pool, tmp_path):
    """The atheris harness, a short bounded run against the session's server (its own mesh)."""
    pytest.importorskip("atheris", reason=NEEDS_ATHERIS)
    url = server_pool.get(real_engine).url
    proc, doc, took = _harness(tmp_path, "--runs", str(ATHERIS_RUNS), "--url", url, "--engine", real_engine,
                               "--seed", "12", "--mesh", "fz-atheris")
    tail = (proc.stdout + proc.stderr)[-3000:]
    assert proc.returncode == 0, f"atheris harness exited {proc.returncode}: {doc.get('violation')}\n{tail}"
    assert doc.get("runs") == ATHERIS_RUNS, tail
    where = {"engine": real_engine, "fuzzer": "atheris (libFuzzer, seed 12)", "bound_ms": CALL_BOUND_S * 1000}
    record("fuzzing", "atheris inputs tried, total", doc["total"], settings={
        **where, "seconds": round(took, 1), "per_command": doc["tried"], "reply_classes": doc["reply_classes"]})
    for name, key in (("raw Lua errors found", "raw_errors"),
                      ("state changes on an error reply found", "state_changes"),
                      ("calls past the bound", "slow_calls"), ("doctor problems after a success", "doctor_problems")):
        record("fuzzing", f"atheris {name}", doc[key], must="0", settings=where)
        assert doc[key] == 0, doc
    record("fuzzing", "atheris slowest call", doc["slowest_ms"], unit="ms", must=f"< {CALL_BOUND_S * 1000:.0f}",
           settings={**where, "call": doc["slowest"]})
    client = redis.Redis.from_url(url)
    try:  # the harness cleans its mesh up
        assert not client.keys("adm:{fz-atheris}:*")
    finally:
        client.close()


def test_the_atheris_harness_exits_non_zero_on_a_violation_and_stops_its_own_server(tmp_path):
    """Without --url the harness starts its own server (and stops it); a property violation (here
    a bound of 1 µs that every call breaks) exits non-zero with the input written out."""
    pytest.importorskip("atheris", reason=NEEDS_ATHERIS)
    engine = next((e for e in ("redis", "valkey") if find_server(e)), None)
    if engine is None:
        pytest.skip("no redis-server or valkey-server to start")
    proc, doc, _ = _harness(tmp_path, "--runs", "50", "--engine", engine, "--bound-ms", "0.001")
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert doc["slow_calls"] == 1 and "bound" in doc["violation"], doc
    assert list(tmp_path.glob("crash-*")), "libFuzzer writes the input that broke a property"
    assert doc["server_pid"] and not Path(f"/proc/{doc['server_pid']}").exists(), "its server is stopped"


# -- what fuzzing found: one regression test per rule -----------------------------------------------

@pytest.fixture
def mesh(redis_client):
    """The busy mesh for one regression test (its calls are not counted with the fuzzing)."""
    return Fuzzer(redis_client, mesh="fz", stats=Stats())


def _fcall(client, command: str, args: list) -> Any:
    return client.execute_command("FCALL", scripts.function_name(command), 1, "adm:{fz}:config", *args)


def _refused(mesh: Fuzzer, command: str, args: list, code: str, case: str = "") -> str:
    """The call is an error reply with ``code`` (not a raw Lua error) and changes nothing."""
    before = snapshot(mesh.client)
    with pytest.raises(redis.ResponseError) as info:
        _fcall(mesh.client, command, args)
    message = without_location(str(info.value))
    assert message.startswith(code + " "), f"{case}: {message}"
    assert snapshot(mesh.client) == before, f"{case}: the state changed"
    return message


def _apply_args(doc: Any) -> list:
    return ["", doc if isinstance(doc, (str, bytes)) else _dumps(doc), "tok-x", NOW, "0", ""]


def _with(**changes: Any) -> dict[str, Any]:
    doc = lua_policy()
    for path, value in changes.items():
        node = doc
        *parents, last = path.split("__")
        for k in parents:
            node = node[int(k) if k.isdigit() else k]
        node[int(last) if last.isdigit() else last] = value
    return doc


WRONG_TYPES = {
    "a lane that is a number": (_with(lanes=[1]), "ADM_BAD_POLICY"),
    "a lane that is null": (_with(lanes=[None, {"name": "b", "floor": 0.3, "weight": 1, "priority": 1}]),
                            "ADM_BAD_POLICY"),
    "a pool that is a string": (_with(pools=["m@p"]), "ADM_BAD_POLICY"),
    "a lane name that is a number": (_with(lanes__0__name=7), "ADM_BAD_NAME"),
    "a lane name that is null": (_with(lanes__0__name=None), "ADM_BAD_NAME"),
    "a pool's provider that is a list": (_with(pools__0__provider=["p"]), "ADM_BAD_NAME"),
    "providers that are a list": (_with(providers=["p"]), "ADM_BAD_NAME"),
    "agents that are a list": (_with(agents=["rev"]), "ADM_BAD_NAME"),
    "pins.lanes that is a number": (_with(pins={"lanes": 5}), "ADM_BAD_POLICY"),
    "pins.agents that is a string": (_with(pins={"agents": "pinned"}), "ADM_BAD_POLICY"),
    "a pinned agent that is null": (_with(pins={"agents": [None]}), "ADM_BAD_NAME"),
}


def test_a_policy_entry_of_the_wrong_type_is_an_error_reply_not_a_raw_lua_error(mesh):
    """Found fuzzing apply_config: a lane or pool that is not an object, a name that is not a
    string, pins that are not lists failed raw (`attempt to index`, `attempt to get length`,
    `bad argument #1 to 'ipairs'`)."""
    for case, (doc, code) in WRONG_TYPES.items():
        _refused(mesh, "apply_config", _apply_args(doc), code, case)


NOT_STORABLE = {
    "a weight of 1e400": _dumps(lua_policy()).decode().replace('"weight": 1.0', '"weight": 1e400', 1),
    "a NaN priority": _dumps(lua_policy()).decode().replace('"priority": 2', '"priority": NaN', 1),
    "an unknown tunable that is NaN": _dumps(_with(tunables__extra=float("nan"))).decode(),
    "an unknown lane key holding infinity": _dumps(_with(lanes__0__note=[1, float("inf")])).decode(),
}


def test_a_policy_value_json_cannot_store_is_refused_before_the_first_write(mesh):
    """Found fuzzing apply_config: cjson reads NaN and 1e400 (infinity) but Redis' cannot write
    them back; the script encoded the lanes and tunables after deleting the catalog's pool
    fields, so the error reply left a mesh without its catalog. (fakeredis' cjson writes them,
    and a NaN priority then broke every later admit with `table index is NaN`.)"""
    for case, text in NOT_STORABLE.items():
        _refused(mesh, "apply_config", _apply_args(text), "ADM_BAD_POLICY", case)
        assert mesh.client.hget("adm:{fz}:config", "pool:m@p") == b"p", case


UNUSABLE = {
    "a lane's pools that are a number": _with(lanes__0__pools=5),
    "a lane's pools that are empty": _with(lanes__0__pools=[]),
    "a lane's pool not in the catalog": _with(lanes__0__pools=["x@y"]),
    "a lane's pools that are an object": _with(lanes__0__pools={"a": "m@p"}),
    "a lane declared twice": _with(lanes__1__name="a"),
    "a pool declared twice": _with(pools__1__name="m@p"),
    "a reserve of 2": _with(lanes__0__reserve=2),
}


def test_a_policy_a_later_call_could_not_use_is_refused(mesh):
    """Found fuzzing apply_config: it accepted a lane's `pools` that is not a list of catalog
    pools (plan '*' then failed raw in `ipairs`), and a lane or a pool declared twice."""
    for case, doc in UNUSABLE.items():
        _refused(mesh, "apply_config", _apply_args(doc), "ADM_BAD_POLICY", case)


def test_a_lane_without_a_reserve_has_none_and_admits_under_a_budget(mesh):
    """Found fuzzing apply_config: a lane without `reserve` (the script never required one) made
    every admit and plan on a provider with a daily budget fail raw (`attempt to perform
    arithmetic on field 'reserve'`). No reserve given is a reserve of 0."""
    doc = lua_policy()
    for lane in doc["lanes"]:
        del lane["reserve"]
    _fcall(mesh.client, "apply_config", _apply_args(doc))
    assert [l["reserve"] for l in json.loads(mesh.client.hget("adm:{fz}:config", "lanes"))] == [0, 0]
    assert _fcall(mesh.client, "admit", ["new", "b", "m@p", "pod-a", "", NOW, "0.0", "0", "", "", ""])[0] in (0, 1)
    assert _fcall(mesh.client, "plan", ["a", "3", NOW, "", "", "*"])[0] == 7
    mesh.rebuild()


def test_a_seq_is_a_whole_number(mesh):
    """Found fuzzing heartbeat: it re-asserted a seat with seq 7.5 (or 1e300) and wrote it into
    the pool's `seq`, an integer admit's HINCRBY counts on, and into the seat's tombstone, which
    a retried release then could not read back (`attempt to concatenate field 'seq'`). A seq is
    a whole number in [1, 2^53] for every command that takes one, and so is the seat count."""
    s1 = mesh.busy.seats["s1"]
    for seq in ("7.5", "1e300", "1e16", "0"):
        _refused(mesh, "heartbeat", ["pod-a", NOW, "1", "ghost", seq, "a", "m@p", NOW], "ADM_BAD_ARG", seq)
        _refused(mesh, "release", [s1.id, seq, "pod-a", "clean", "1", "", NOW, "", ""], "ADM_BAD_ARG", seq)
        _refused(mesh, "charge", [s1.id, seq, "pod-a", "a", "m@p", "5", "k9", "", NOW], "ADM_BAD_ARG", seq)
    for count in ("1.5", "1e300", "-1"):
        _refused(mesh, "heartbeat", ["pod-a", NOW, count], "ADM_BAD_ARG", count)


def test_a_sweep_limit_is_a_whole_number_within_its_bound(mesh):
    """Found fuzzing tick: a sweep limit of 1.5 (or 1e300) went on to ZRANGEBYSCORE's LIMIT,
    whose raw error ("value is not an integer or out of range") left the script. A limit is a
    whole number in [1, 10000]: one tick stays a bounded call."""
    for limit in ("1.5", "1e300", "10001", "0"):
        _refused(mesh, "tick", [NOW, limit], "ADM_BAD_ARG", limit)
    assert _fcall(mesh.client, "tick", [NOW, "10000"])[0] == 7


def test_a_callers_now_is_bounded_so_every_time_derived_from_it_stays_finite(mesh):
    """Found fuzzing closure: a caller's `now` near the largest double closed a provider "until
    the next midnight", which overflowed to infinity; the census (and tick, rollover) then
    failed raw on Redis and Valkey ("Cannot serialise number: must not be NaN or Inf"). A `now`
    is epoch seconds <= 1e11, for every command and for apply_config."""
    for now in ("1.7976931348623157e308", "1e300", "100000000001"):
        _refused(mesh, "closure", ["close", "p", "late", "", now], "ADM_BAD_ARG", now)
        _refused(mesh, "admit", ["z", "a", "m@p", "pod-a", "", now, "0.1", "1", "", "", ""], "ADM_BAD_ARG", now)
        _refused(mesh, "apply_config", ["", _dumps(lua_policy()), "tok-late", now, "0", ""], "ADM_BAD_ARG", now)
    assert _fcall(mesh.client, "closure", ["close", "p", "late", "", "1e11"])[0] == 7  # at the bound
    json.loads(_fcall(mesh.client, "census", ["1e11"]))
    mesh.rebuild()


def test_a_huge_count_is_answered_within_the_bound(mesh):
    """No count makes a call loop: a heartbeat announcing 1e9 seats is refused before it reads
    one, plan's `wanted` and tick's sweep limit are bounded, admit takes at most 1000
    alternatives. Each call is checked like a fuzzed one (ADM_ code, state, bound). (A call's
    cost may grow with its own arguments, a heartbeat's with the seats and tickets it names.)"""
    s = [x.encode() for x in ("z", "a", "m@p", "pod-a", "", NOW, "0.5", "0", "", "", "", "", "", "")]
    calls = [("heartbeat", [b"pod-a", NOW.encode(), count]) for count in (b"1000000000", b"1e15", b"9007199254740992")]
    calls += [("plan", [b"a", b"100000", NOW.encode(), b"", b"n@p o@q", b"*"]), ("tick", [NOW.encode(), b"10000"]),
              ("admit", s + [b"n@p", b"o@q"] * 500), ("admit", s + [b"n@p"] * 1001)]
    for command, args in calls:
        mesh.call(command, args, follow_up=False)
        assert mesh.stats.slowest_s < CALL_BOUND_S
    assert mesh.stats.replies["heartbeat", "ADM_BAD_ARG"] == 3 and mesh.stats.replies["admit", "ADM_BAD_ARG"] == 1
