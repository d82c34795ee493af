"""Reply codes are defined once (lua/include/codes.lua); Python's mirror must agree with the file
and with what a server running the scripts returns."""
from __future__ import annotations

import re

from admission import ADMIT_REASONS, REFUSE_REASONS, Status
from admission._paths import lua_dir
from admission.codes import BIND_DECISIONS, ERRORS, FENCE_REASONS, RETRY_DECISIONS
from admission.errors import _BY_PREFIX
from admission.scripts import COMMANDS, library


def lua_tables() -> tuple[dict[str, int], dict[str, str]]:
    text = (lua_dir() / "include" / "codes.lua").read_text()
    status = dict((k, int(v)) for k, v in re.findall(r"^\s*(\w+) = (\d+),", text, re.M))
    errors = dict(re.findall(r"^\s*(\w+) = '(ADM_\w+)',", text, re.M))
    return status, errors


def test_status_codes_match_the_lua_file():
    status, _ = lua_tables()
    assert status == {s.name: s.value for s in Status}


def test_error_prefixes_match_the_lua_file_and_each_maps_to_an_exception():
    _, errors = lua_tables()
    assert errors == ERRORS
    assert set(_BY_PREFIX) == set(ERRORS.values())


def test_the_server_agrees_with_python(redis_client):
    # run the codes include on the engine itself and read the tables back
    script = "local Codes = (function()\n" + (lua_dir() / "include" / "codes.lua").read_text() + "\nend)()\n" \
        "local out = {}\nfor k, v in pairs(Codes.STATUS) do out[#out + 1] = k .. '=' .. v end\n" \
        "for k, v in pairs(Codes.ERR) do out[#out + 1] = k .. '=' .. v end\nreturn out"
    got = dict(x.decode().split("=") for x in redis_client.eval(script, 0))
    assert {k: int(v) for k, v in got.items() if k in Status.__members__} == {s.name: s.value for s in Status}
    assert {k: v for k, v in got.items() if k not in Status.__members__} == ERRORS


def test_every_reason_word_is_produced_by_the_lua():
    lua = library()[0]
    for word in ADMIT_REASONS + REFUSE_REASONS + FENCE_REASONS + RETRY_DECISIONS + BIND_DECISIONS:
        assert f"'{word}'" in lua, word


def test_every_script_has_a_header_listing_keys_argv_and_reply():
    for name in COMMANDS:
        head = (lua_dir() / f"{name}.lua").read_text().split("]]")[0]
        assert "KEYS[1]" in head and "ARGV" in head and "Reply:" in head, name


def test_the_library_registers_one_function_per_command_with_a_versioned_name():
    code, version = library()
    assert code.startswith(f"#!lua name=admission_{version}")
    for name in COMMANDS:
        assert f"redis.register_function('adm_{name}_{version}'" in code


def test_the_ceilings_defaults_match_the_lua_files():
    # a scope's defaults live in the policy's schema, apply_config.lua (a policy stored without
    # them) and ceilings.lua (a scope learned from the headers alone): one fact, three places
    from admission.policy import SCHEMA
    keys = SCHEMA["ceilings.<name>"]
    want = {k: keys[k].default for k in ("burst_s", "jitter_s", "headroom")}
    apply_text = (lua_dir() / "apply_config.lua").read_text()
    stored = {k: float(v) for k, v in re.findall(r"c\.(burst_s|jitter_s|headroom) or ([0-9.]+)", apply_text)}
    assert stored == want
    ceil_text = (lua_dir() / "include" / "ceilings.lua").read_text()
    learned = re.findall(r"local LEARNED_\w+ = \{headroom = ([0-9.]+), burst_s = ([0-9.]+), jitter_s = ([0-9.]+), "
                         r"cache_reads_count = (\w+)", ceil_text)
    assert len(learned) == 2
    for headroom, burst, jitter, reads in learned:
        assert {"headroom": float(headroom), "burst_s": float(burst), "jitter_s": float(jitter)} == want
        assert (reads == "true") is keys["cache_reads_count"].default
