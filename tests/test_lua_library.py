"""The Lua library (admission/lualib.py): modules that declare what they include, built into one
Functions library with room to grow, checked at build time and against the real Lua 5.1
compiler (tests/luabytecode.py)."""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from admission._paths import lua_dir
from admission.lualib import COMMANDS, LibraryError, build, module_name, read_sources

from helpers import T0, adm, policy
from luabytecode import MAX_LOCALS, MAX_UPVALUES, compile_chunk, library_chunk

#: what the library may read that it does not define: Lua's and the server's own globals
BUILTINS = {"cjson", "error", "ipairs", "math", "next", "pairs", "pcall", "redis", "select", "string", "table",
            "tonumber", "tostring", "type", "unpack"}
HEADROOM = 0.6  # a limit's share the library may use: room for the next includes


@pytest.fixture(scope="module")
def chunk():
    return library_chunk(build(lua_dir())[0])


def test_the_library_keeps_room_under_lua_5_1s_limits(chunk):
    """Lua 5.1 allows 200 locals per function and 60 upvalues per closure; FUNCTION LOAD fails
    past either. The library's top level and its largest closure use at most 60 % of each."""
    top = chunk.live_at_end()
    widest = max(chunk.walk(), key=lambda f: f.upvalues)
    print(f"top-level locals {len(top)} of {MAX_LOCALS}; upvalues of the widest closure {widest.upvalues} of "
          f"{MAX_UPVALUES} (library line {widest.line})")
    assert len(top) <= HEADROOM * MAX_LOCALS, top
    assert widest.upvalues <= HEADROOM * MAX_UPVALUES, f"the closure at library line {widest.line}"


def test_the_library_reads_no_global_but_lua_and_the_servers(chunk):
    """A helper used without its import line would be a global read: an error at run time on
    Redis ('nonexistent global variable'). Here it fails the build's test instead."""
    used = chunk.globals()
    assert {n for kind, n in used if kind == "set"} == set()
    assert {n for kind, n in used if kind == "get"} <= BUILTINS


def test_each_file_declares_exactly_the_includes_it_imports_from():
    includes, commands = read_sources(lua_dir())
    for src in (*includes.values(), *commands.values()):
        assert set(src.includes) == {inc for inc, _ in src.imports}, src.name
    for src in includes.values():
        compile_chunk(src.text, f"={src.name}")  # each include is a chunk of its own


def test_each_include_exports_what_it_defines_at_its_top_level():
    includes, _ = read_sources(lua_dir())
    for name, src in includes.items():
        defined = set(compile_chunk(src.text, f"={name}").live_at_end())
        assert set(src.exports) <= defined, (name, set(src.exports) - defined)


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "lua"
    shutil.copytree(lua_dir(), root)
    return root


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_a_missing_include_is_an_error_at_build_time(tmp_path):
    root = _folder(tmp_path)
    (root / "include" / "lanes.lua").unlink()
    with pytest.raises(LibraryError, match=r"'lanes' not found.*included by"):
        build(root)


def test_a_cycle_of_includes_is_an_error_at_build_time(tmp_path):
    root = _folder(tmp_path)
    _edit(root / "include" / "util.lua", '--- @include "codes"\n', '--- @include "codes"\n--- @include "events"\n')
    with pytest.raises(LibraryError, match=r"cycle: .*util -> events -> util"):
        build(root)


def test_an_import_from_an_include_not_declared_is_an_error(tmp_path):
    root = _folder(tmp_path)
    _edit(root / "withdraw.lua", "local ERR, STATUS = Codes.ERR, Codes.STATUS\n",
          "local ERR, STATUS = Codes.ERR, Codes.STATUS\nlocal slots = Pool.slots\n")
    with pytest.raises(LibraryError, match=r'imports Pool.slots without --- @include "pool"'):
        build(root)


def test_an_import_the_include_does_not_export_is_an_error(tmp_path):
    root = _folder(tmp_path)
    _edit(root / "withdraw.lua", "local ERR, STATUS = Codes.ERR, Codes.STATUS\n",
          "local ERR, STATUS, NOPE = Codes.ERR, Codes.STATUS, Codes.NOPE\n")
    with pytest.raises(LibraryError, match=r"imports Codes.NOPE, which include/codes.lua does not export"):
        build(root)


def test_includes_come_after_what_they_include():
    code = build(lua_dir())[0]
    includes, _ = read_sources(lua_dir())
    at = {m.group(1): m.start() for m in re.finditer(r"^-- >>> include (\w+)$", code, re.M)}
    assert set(at) == set(includes)
    for name, src in includes.items():
        for dep in src.includes:
            assert at[dep] < at[name], (dep, name)
        assert f"local {module_name(name)} = (function()" in code


def _argv_documented(head: str) -> tuple[set[int], list[int]]:
    doc = re.findall(r"^\s*ARGV\[(\d+)(\.\.)?\]", head, re.M)
    return {int(n) for n, dots in doc if not dots}, [int(n) for n, dots in doc if dots]


def test_every_header_documents_the_keys_and_argv_its_body_reads():
    """The header's ARGV lines are the body's: every literal ARGV[n] read (seat_args reads
    1..3) is documented, every documented position is read, and a range (ARGV[13..]) is read
    past its start. Every command takes KEYS[1] alone."""
    for name in COMMANDS:
        text = (lua_dir() / f"{name}.lua").read_text()
        head, body = text.split("]]", 1)
        singles, ranges = _argv_documented(head)
        read = {int(n) for n in re.findall(r"ARGV\[(\d+)\]", body)}
        if "seat_args()" in body:
            read |= {1, 2, 3}
        assert read <= singles | {n for r in ranges for n in read if n >= r}, (name, read - singles)
        assert singles <= read, (name, "documented but never read", singles - read)
        for start in ranges:
            assert "#ARGV" in body, (name, f"ARGV[{start}..] documented but never read")
        assert set(re.findall(r"KEYS\[(\d+)\]", head)) == {"1"}, name
    for path in [*lua_dir().glob("*.lua"), *lua_dir().glob("include/*.lua")]:
        assert set(re.findall(r"KEYS\[(\d+)\]", path.read_text().split("]]")[-1])) <= {"1"}, path.name


def test_a_policy_stored_before_a_tunable_existed_keeps_its_old_default(redis_client):
    """config.lua fills once what an older stored policy lacks: retry_after_max 60 s (a
    Retry-After of an hour pauses a minute), decision_ttl 30 s."""
    pol = policy(pools=("m@p",), seed_estimate=4)
    a = adm(redis_client, pol=pol)
    tunables = json.loads(redis_client.hget("adm:{t}:config", "tunables"))
    for k in ("retry_after_max", "decision_ttl", "slow_start_step"):
        del tunables[k]
    redis_client.hset("adm:{t}:config", mapping={"tunables": json.dumps(tunables), "token": "older"})
    d = a.try_admit(lane="a", model="m@p", round_id="r1", now=T0, draw=0.0)
    a.release(d.seat, outcome="rate_limited", seconds=1, now=T0, retry_after=3600)
    assert float(redis_client.hget("adm:{t}:pool:m@p", "pausedUntil")) == T0 + 60
