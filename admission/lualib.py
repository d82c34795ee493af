"""Build the ONE Redis Functions library from ``lua/``: a file per command, shared modules in
``lua/include/``.

Every file names the includes it calls directly with ``--- @include "name"`` lines (as BullMQ's
commands do) and takes what it uses from them with plain Lua import lines, the include's name
capitalized::

    --- @include "util"
    local key, fail = Util.key, Util.fail

An include is a module: its helpers are locals of its own chunk and it ends with
``return {name = name, ...}``, the names other files may import. A command ends with
``return function() ... end``, its body, run once per call. The loader

* resolves the includes each file declares, transitively, and orders them so every module comes
  after the modules it includes; a missing include, a cycle, an import from an undeclared include
  or of a name the include does not export is a ``LibraryError`` at build time;
* wraps each file in a function of its own, run once at FUNCTION LOAD, so the library's top level
  holds one local per module and per command (Lua 5.1 allows 200 locals per function and 60
  upvalues per closure: ``tests/test_lua_library.py`` measures the headroom);
* registers each command under a versioned name (``adm_<command>_<version>``), so two versions
  of the code can run side by side during a rolling upgrade.

The helpers are defined once, at FUNCTION LOAD, not on every call (an EVAL script re-runs its
definitions each time; on a small machine that was a third of an admit's cost).
"""
from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from ._paths import lua_dir

COMMANDS = ("admit", "release", "report", "heartbeat", "tick", "census", "plan", "apply_config", "withdraw",
            "doctor", "charge", "budget", "closure", "rollover", "retry", "bind", "health", "progress", "take")
#: what the library's top level holds for every file: the current call's keys and arguments
#: (util.lua's bind sets them) and the key prefix derived from KEYS[1]
PROLOGUE = "local KEYS, ARGV, PREFIX"

_INCLUDE = re.compile(r'^--- @include "([\w-]+)"\s*$', re.M)
_IMPORT = re.compile(r"^local ([\w, ]+?) = ((?:[A-Z]\w*\.\w+)(?:, [A-Z]\w*\.\w+)*)\s*$", re.M)
_EXPORTS = re.compile(r"\nreturn \{([^{}]*)\}\s*$")
_BODY = re.compile(r"\nreturn function\(\)\n")


class LibraryError(ValueError):
    """The Lua folder does not build: a missing include, a cycle, a bad import or export."""


def module_name(include: str) -> str:
    """The table an include is imported from: its name capitalized (``util`` -> ``Util``), never
    the name of a helper or a variable (those are lower case or upper case constants)."""
    return include[0].upper() + include[1:]


@dataclass(frozen=True)
class Source:
    name: str               # file stem
    kind: str               # 'include' | 'command'
    text: str
    includes: tuple[str, ...]                  # declared, in order
    imports: tuple[tuple[str, str], ...]       # (include, name) pairs
    exports: tuple[str, ...]                   # an include's return table


def parse(name: str, kind: str, text: str) -> Source:
    where = f"{'include/' if kind == 'include' else ''}{name}.lua"
    includes = tuple(_INCLUDE.findall(text))
    if len(set(includes)) != len(includes):
        raise LibraryError(f"{where}: an include is declared twice")
    by_module = {module_name(i): i for i in includes}
    imports = []
    for lhs, rhs in _IMPORT.findall(text):
        names = [n.strip() for n in lhs.split(",")]
        refs = [r.strip().split(".") for r in rhs.split(",")]
        if len(names) != len(refs):
            raise LibraryError(f"{where}: import line binds {len(names)} names to {len(refs)} values")
        for n, (mod, member) in zip(names, refs):
            if mod not in by_module:
                raise LibraryError(f"{where}: imports {mod}.{member} without --- @include \"{mod.lower()}\"")
            if n != member:
                raise LibraryError(f"{where}: imports {mod}.{member} as {n!r}: keep the name")
            imports.append((by_module[mod], member))
    exports: tuple[str, ...] = ()
    if kind == "include":
        m = _EXPORTS.search(text)
        if not m:
            raise LibraryError(f"{where}: an include ends with `return {{name = name, ...}}`")
        pairs = [p.strip() for p in m.group(1).replace("\n", " ").split(",") if p.strip()]
        for p in pairs:
            k, _, v = (x.strip() for x in p.partition("="))
            if k != v:
                raise LibraryError(f"{where}: exports {v!r} as {k!r}: keep the name")
        exports = tuple(p.partition("=")[0].strip() for p in pairs)
    elif not _BODY.search(text):
        raise LibraryError(f"{where}: a command ends with `return function() ... end`")
    return Source(name, kind, text, includes, tuple(imports), exports)


def read_sources(root: Path) -> tuple[dict[str, Source], dict[str, Source]]:
    """(includes needed by the commands, commands), parsed; a missing include is an error."""
    commands = {c: parse(c, "command", (root / f"{c}.lua").read_text()) for c in COMMANDS}
    includes: dict[str, Source] = {}
    pending = [i for c in commands.values() for i in c.includes]
    while pending:
        name = pending.pop()
        if name in includes:
            continue
        path = root / "include" / f"{name}.lua"
        if not path.is_file():
            users = sorted(s.name for s in (*commands.values(), *includes.values()) if name in s.includes)
            raise LibraryError(f"Lua include {name!r} not found at {path} (included by {', '.join(users)})")
        includes[name] = parse(name, "include", path.read_text())
        pending += includes[name].includes
    for src in (*includes.values(), *commands.values()):
        for inc, member in src.imports:
            if member not in includes[inc].exports:
                raise LibraryError(f"{src.name}.lua imports {module_name(inc)}.{member}, which include/{inc}.lua "
                                   f"does not export (add it to its return table)")
    return includes, commands


def include_order(includes: dict[str, Source], commands: dict[str, Source]) -> list[str]:
    """Every include after the includes it declares (depth first, in the order of declaration,
    commands in COMMANDS order); a cycle is an error."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "open":
            cycle = path[path.index(name):] + (name,)
            raise LibraryError(f"Lua includes form a cycle: {' -> '.join(cycle)}")
        state[name] = "open"
        for dep in includes[name].includes:
            visit(dep, path + (name,))
        state[name] = "done"
        order.append(name)

    for c in COMMANDS:
        for dep in commands[c].includes:
            visit(dep, (f"{c} (command)",))
    return order


def build(root: Path) -> tuple[str, str]:
    """(library code, version) built from a Lua folder."""
    includes, commands = read_sources(root)
    parts = [PROLOGUE]
    for name in include_order(includes, commands):
        parts.append(f"-- >>> include {name}\nlocal {module_name(name)} = (function()\n"
                     f"{includes[name].text.strip()}\nend)()\n-- <<< include {name}")
    for c in COMMANDS:
        parts.append(f"-- >>> command {c}\nlocal command_{c} = (function()\n{commands[c].text.strip()}\nend)()\n"
                     f"-- <<< command {c}")
    body = "\n\n".join(parts)
    version = hashlib.sha1(body.encode()).hexdigest()[:12]
    registry = "\n".join(
        f"redis.register_function('{function_name(c, version)}', function(keys, args)\n"
        f"  local bad = bind(keys, args)\n  if bad then return bad end\n  return run(command_{c})\nend)"
        for c in COMMANDS)
    glue = "local bind, run = Util.bind, Util.run"
    return f"#!lua name=admission_{version}\n{body}\n\n{glue}\n{registry}\n", version


@functools.cache
def library() -> tuple[str, str]:
    """(library code, version) built from the Lua folder (``ADMISSION_LUA_DIR`` or the package's)."""
    return build(lua_dir())


def function_name(command: str, version: str | None = None) -> str:
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}; known: {', '.join(COMMANDS)}")
    return f"adm_{command}_{version or library()[1]}"
