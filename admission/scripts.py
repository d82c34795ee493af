"""The Lua scripts: one per command in ``lua/``, shared code in ``lua/include/``.

A script names its includes with ``--@include "name"`` lines; the loader inlines each include
once, in order, so the server runs one self-contained script and no rule is written twice.
Clients register the sources with redis-py (``register_script``), whose Script objects call
EVALSHA and reload the script on NOSCRIPT: one round trip on the common path.
"""
from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path

from ._paths import lua_dir

COMMANDS = ("admit", "release", "report", "heartbeat", "tick", "census", "plan", "apply_config", "withdraw")
_INCLUDE = re.compile(r'^--@include "([\w-]+)"\s*$', re.MULTILINE)


def _inline(text: str, include_dir: Path, seen: set[str]) -> str:
    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return f"-- (include {name}: already inlined)"
        seen.add(name)
        path = include_dir / f"{name}.lua"
        if not path.is_file():
            raise FileNotFoundError(f"Lua include {name!r} not found at {path}")
        body = _inline(path.read_text(), include_dir, seen)
        return f"-- >>> include {name}\n{body.rstrip()}\n-- <<< include {name}"

    return _INCLUDE.sub(replace, text)


@functools.cache
def source(command: str) -> str:
    """The full source of one command, includes inlined."""
    if command not in COMMANDS:
        raise ValueError(f"unknown script {command!r}; known: {', '.join(COMMANDS)}")
    root = lua_dir()
    return _inline((root / f"{command}.lua").read_text(), root / "include", set())


def sha(command: str) -> str:
    return hashlib.sha1(source(command).encode()).hexdigest()


def register(client) -> dict[str, object]:
    """redis-py Script objects (sync, asyncio or cluster) for every command."""
    return {name: client.register_script(source(name)) for name in COMMANDS}
