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


def load(client: Any) -> None:
    """FUNCTION LOAD REPLACE the library (on every primary of a cluster)."""
    code = library()[0]
    if isinstance(client, RedisCluster):
        client.execute_command("FUNCTION", "LOAD", "REPLACE", code, target_nodes=RedisCluster.PRIMARIES)
    else:
        client.function_load(code, replace=True)


async def aload(client: Any) -> None:
    await client.function_load(library()[0], replace=True)


def _load_missing(client: Any) -> None:
    """A call found its function missing: load the library, or say the mesh has no rules yet."""
    try:
        load(client)
    except redis.exceptions.NoPermissionError as exc:
        raise _not_loaded(exc) from None


async def _aload_missing(client: Any) -> None:
    try:
        await aload(client)
    except redis.exceptions.NoPermissionError as exc:
        raise _not_loaded(exc) from None


def call(client: Any, command: str, keys: list[str], args: list[Any]) -> Any:
    """FCALL one command; load the library once if the server lacks it."""
    try:
        return client.execute_command(*_fcall_args(command, keys, args), **_target(client, keys))
    except redis.ResponseError as exc:
        if _MISSING not in str(exc):
            raise
    _load_missing(client)
    return client.execute_command(*_fcall_args(command, keys, args), **_target(client, keys))


async def acall(client: Any, command: str, keys: list[str], args: list[Any]) -> Any:
    try:
        return await client.execute_command(*_fcall_args(command, keys, args))
    except redis.ResponseError as exc:
        if _MISSING not in str(exc):
            raise
    await _aload_missing(client)
    return await client.execute_command(*_fcall_args(command, keys, args))


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


def call_confirmed(client: Any, command: str, keys: list[str], args: list[Any], replicas: int,
                   timeout_ms: int) -> tuple[Any, int]:
    """FCALL one command, then WAIT on the same connection: the reply, and how many replicas
    have acknowledged the write (and every earlier one: the replication stream is in order).
    On a cluster both go to the node of KEYS[1]; when the slot has moved (a failover) the call
    goes through the cluster client, which follows the move, and counts as confirmed by none."""
    node = client.get_redis_connection(client.get_node_from_key(keys[0])) if isinstance(client, RedisCluster) \
        else client
    replies = _fcall_and_wait(node, command, keys, args, replicas, timeout_ms).execute(raise_on_error=False)
    if _missing(replies[0]):
        _load_missing(client)
        replies = _fcall_and_wait(node, command, keys, args, replicas, timeout_ms).execute(raise_on_error=False)
    if _moved(replies[0]):
        return call(client, command, keys, args), 0
    return _confirm_reply(replies)


async def acall_confirmed(client: Any, command: str, keys: list[str], args: list[Any], replicas: int,
                          timeout_ms: int) -> tuple[Any, int]:
    """``call_confirmed`` for redis.asyncio (a single server, or one found through Sentinel)."""
    replies = await _fcall_and_wait(client, command, keys, args, replicas, timeout_ms).execute(raise_on_error=False)
    if _missing(replies[0]):
        await _aload_missing(client)
        replies = await _fcall_and_wait(client, command, keys, args, replicas,
                                        timeout_ms).execute(raise_on_error=False)
    return _confirm_reply(replies)


def pipe_call(pipe: Any, command: str, keys: list[str], args: list[Any]) -> None:
    """Queue one command on a pipeline (the library must be loaded: see ``load``)."""
    pipe.execute_command(*_fcall_args(command, keys, args))
