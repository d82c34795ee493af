"""The Lua: one file per command in ``lua/``, shared code in ``lua/include/``, served as ONE Redis
Functions library.

A command file opens with a header (KEYS, ARGV, reply), names the includes it uses with
``--@include "name"`` lines, and ends with ``return run(function() ... end)``. The loader puts
every include once at the top of the library and wraps each command as a function registered
under a versioned name (``adm_<command>_<version>``), so:

* no rule is written twice (the includes are shared by every command);
* the server defines the helpers once, at FUNCTION LOAD, not on every call (an EVAL script
  re-runs its definitions each time; on a small machine that was a third of an admit's cost);
* two versions of the code can run side by side during a rolling upgrade.

Like redis-py's Script objects on NOSCRIPT, a call that finds its function missing (a new or
restarted server) loads the library and tries once more: one round trip on the common path.
"""
from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from typing import Any

import redis
from redis.cluster import RedisCluster

from ._paths import lua_dir

COMMANDS = ("admit", "release", "report", "heartbeat", "tick", "census", "plan", "apply_config", "withdraw",
            "doctor", "charge", "budget", "closure", "rollover", "retry", "bind", "health", "progress")
_INCLUDE = re.compile(r'^--@include "([\w-]+)"\s*$', re.MULTILINE)
_MISSING = "Function not found"


def _read(root: Path, command: str) -> tuple[list[str], str]:
    text = (root / f"{command}.lua").read_text()
    return _INCLUDE.findall(text), _INCLUDE.sub("", text)


@functools.cache
def library() -> tuple[str, str]:
    """(library code, version) built from the Lua folder."""
    root = lua_dir()
    includes: list[str] = []
    bodies = {}
    for command in COMMANDS:
        names, bodies[command] = _read(root, command)
        includes += [n for n in names if n not in includes]
    parts = []
    for name in includes:
        path = root / "include" / f"{name}.lua"
        if not path.is_file():
            raise FileNotFoundError(f"Lua include {name!r} not found at {path}")
        parts.append(f"-- >>> include {name}\n{path.read_text().rstrip()}\n-- <<< include {name}")
    for command in COMMANDS:
        parts.append(f"-- >>> command {command}\nlocal function command_{command}()\n"
                     f"{bodies[command].strip()}\nend\n-- <<< command {command}")
    body = "\n\n".join(parts)
    version = hashlib.sha1(body.encode()).hexdigest()[:12]
    registry = "\n".join(
        f"redis.register_function('{function_name(c, version)}', function(keys, args)\n"
        f"  local bad = bind(keys, args)\n  if bad then return bad end\n  return command_{c}()\nend)"
        for c in COMMANDS)
    return f"#!lua name=admission_{version}\n{body}\n\n{registry}\n", version


def function_name(command: str, version: str | None = None) -> str:
    if command not in COMMANDS:
        raise ValueError(f"unknown command {command!r}; known: {', '.join(COMMANDS)}")
    return f"adm_{command}_{version or library()[1]}"


def _fcall_args(command: str, keys: list[str], args: list[Any]) -> list[Any]:
    return ["FCALL", function_name(command), len(keys), *keys, *args]


def _target(client: Any, keys: list[str]) -> dict[str, Any]:
    """A cluster routes the call by KEYS[1] (one round trip, no COMMAND GETKEYS)."""
    if isinstance(client, RedisCluster):
        return {"target_nodes": client.get_node_from_key(keys[0])}
    return {}


def _not_loaded(exc: redis.exceptions.NoPermissionError) -> redis.ResponseError:
    """The library is missing (a new or wiped server, an upgrade) and this user may not load it
    (the pod user): the mesh has no rules yet, as with no policy. The operator's `admission config
    apply` loads it; until then a release or charge waits in the outbox instead of being lost."""
    return redis.ResponseError(f"ADM_NO_CONFIG the library {library()[1]} is not loaded on this server and this "
                               f"user may not load it (run `admission config apply` as the admin): {exc}")


def _fcall_and_wait(target: Any, command: str, keys: list[str], args: list[Any], replicas: int,
                    timeout_ms: int) -> Any:
    pipe = target.pipeline(transaction=False)
    pipe.execute_command(*_fcall_args(command, keys, args))
    pipe.execute_command("WAIT", replicas, timeout_ms)
    return pipe


def _missing(reply: Any) -> bool:
    return isinstance(reply, redis.ResponseError) and _MISSING in str(reply)


def _moved(reply: Any) -> bool:
    return isinstance(reply, redis.ResponseError) and str(reply).startswith(("MOVED ", "ASK "))


def _confirm_reply(replies: list[Any]) -> tuple[Any, int]:
    for r in replies:
        if isinstance(r, Exception):
            raise r
    return replies[0], int(replies[1])


def pipe_call(pipe: Any, command: str, keys: list[str], args: list[Any]) -> None:
    """Queue one command on a pipeline (the library must be loaded: see ``load``)."""
    pipe.execute_command(*_fcall_args(command, keys, args))


# The calls (load, call, call_confirmed), written once for redis.asyncio and generated for the
# sync client by scripts/unasync.py; imported last, as they use the helpers above.
from ._scripts_sync import _load_missing, call, call_confirmed, load  # noqa: E402
from ._scripts_async import _aload_missing, acall, acall_confirmed, aload  # noqa: E402
