"""Calling the Lua: each command is a function of ONE Redis Functions library, built by
``lualib`` from ``lua/`` and registered under a versioned name (``adm_<command>_<version>``).

Like redis-py's Script objects on NOSCRIPT, a call that finds its function missing (a new or
restarted server) loads the library and tries once more: one round trip on the common path.
"""
from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster

from .lualib import COMMANDS, LibraryError, function_name, library  # noqa: F401 (the loader's names)

_MISSING = "Function not found"


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
