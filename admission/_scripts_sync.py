# GENERATED from admission/_scripts_async.py by scripts/unasync.py: do not edit by hand.
# Edit admission/_scripts_async.py and run `python scripts/unasync.py` (tests/test_unasync.py fails while this is stale).
"""The script calls (FCALL a command, load the library when the server lacks it, FCALL then WAIT
on one connection), written once, for redis.asyncio, in ``_scripts_async.py``; the sync calls
(redis-py's client, and its Cluster) are generated from it into ``_scripts_sync.py`` by
``scripts/unasync.py``. ``admission.scripts`` exports both flavours (the asyncio names are the
sync ones with an ``a`` in front).
"""
from __future__ import annotations

from typing import Any

import redis
from redis.cluster import RedisCluster

from .scripts import _MISSING, _confirm_reply, _fcall_and_wait, _fcall_args, _missing, _moved, _not_loaded, \
    _target, library


def load(client: Any) -> None:
    """FUNCTION LOAD REPLACE the library (on every primary of a cluster)."""
    code = library()[0]
    if isinstance(client, RedisCluster):
        client.execute_command("FUNCTION", "LOAD", "REPLACE", code, target_nodes=RedisCluster.PRIMARIES)
    else:
        client.function_load(code, replace=True)


def _load_missing(client: Any) -> None:
    """A call found its function missing: load the library, or say the mesh has no rules yet."""
    try:
        load(client)
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


def call_confirmed(client: Any, command: str, keys: list[str], args: list[Any], replicas: int,
                   timeout_ms: int) -> tuple[Any, int]:
    """FCALL one command, then WAIT on the same connection: the reply, and how many replicas
    have acknowledged the write (and every earlier one: the replication stream is in order).
    On a (sync) cluster both go to the node of KEYS[1]; when the slot has moved (a failover) the
    call goes through the cluster client, which follows the move, and counts as confirmed by
    none. The asyncio client confirms on a single server or one found through Sentinel."""
    node = client.get_redis_connection(client.get_node_from_key(keys[0])) if isinstance(client, RedisCluster) \
        else client
    replies = _fcall_and_wait(node, command, keys, args, replicas, timeout_ms).execute(raise_on_error=False)
    if _missing(replies[0]):
        _load_missing(client)
        replies = _fcall_and_wait(node, command, keys, args, replicas, timeout_ms).execute(raise_on_error=False)
    if _moved(replies[0]):
        return call(client, command, keys, args), 0
    return _confirm_reply(replies)
