"""The operators' handle on one mesh (``AsyncMesh`` here, the source; ``Mesh`` in
``admission/mesh.py``, which scripts/unasync.py generates from it): the policy, the read model, the spend ledger, the provider's day,
the roll-over, the pool clock's step and the doctor.

A ``Mesh`` holds no seat, no waiter, no clock and no outbox: each method is one call (one
atomic function in Redis, or one read), and an unreachable Redis raises ``Unavailable`` at once.
The CLI, ``admission serve`` and the midnight job use it; a pod's ``Admission`` has one too
(``adm.mesh``), on the pod's own connection.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import redis  # noqa: F401 (the sync flavour's client)
import redis.asyncio as aredis

from . import doctor as doctor_mod
from . import scripts
from ._log import get_logger
from .base import CONNECT_TIMEOUT, SOCKET_TIMEOUT, fail_fast_options, policy_of, translated
from .core import MeshCalls, Rollover, Tick, decode_ledger, mesh_key

log = get_logger("admission")


def decode_policy(raw: Any) -> dict[str, Any]:
    """The stored policy (HMGET version, policy) as a dict with its version (0: none applied)."""
    version, doc = raw
    return {"version": int(version or 0), **(json.loads(doc) if doc else {})}


class AsyncMesh:
    """One mesh, for operators: ``AsyncMesh(client, mesh="prod")`` on a redis-py client (its
    asyncio flavour for ``AsyncMesh``), or ``from_url``."""

    def __init__(self, client: aredis.Redis, *, mesh: str):
        self.calls = MeshCalls(mesh)  # validates the mesh's name
        self.redis = client
        self.mesh = mesh

    @classmethod
    def from_url(cls, url: str, *, mesh: str, connect_timeout: float = CONNECT_TIMEOUT,
                 socket_timeout: float = SOCKET_TIMEOUT) -> "AsyncMesh":
        """A mesh on its own connection, failing fast when Redis cannot be reached."""
        return cls(aredis.Redis.from_url(url, **fail_fast_options(connect_timeout, socket_timeout)), mesh=mesh)

    async def _run(self, call: Any) -> Any:
        with translated():
            reply = await scripts.acall(self.redis, call.script, call.keys, call.args)
        return call.decode(reply)

    def key(self, *parts: Any) -> str:
        """A key of this mesh (``adm:{<mesh>}:<part>:...``)."""
        return mesh_key(self.mesh, *parts)

    # -- the policy ----------------------------------------------------------------------------
    async def apply_policy(self, policy: str | Path | Mapping[str, Any], expected_version: int | None = None, *,
                           recovery_hold: bool = True, now: float | None = None) -> int:
        """Validate and apply a policy (a TOML path or its dict form); returns the new version.
        ``expected_version``: apply only over that version (``StaleVersion`` otherwise). On a
        mesh without a policy (new, or wiped by a restart) new admissions wait one heartbeat
        period unless ``recovery_hold=False`` (see apply_config.lua)."""
        applied = await self._run(self.calls.apply(policy_of(policy), expected_version,
                                                   recovery_hold=recovery_hold, now=now))
        log.info("policy_applied", mesh=self.mesh, version=applied.version, hold_until=applied.hold_until)
        return applied.version

    async def policy(self) -> dict[str, Any]:
        """The live policy with its ``version`` (0 and nothing else: none applied)."""
        with translated():
            return decode_policy(await self.redis.hmget(self.calls.config_key, "version", "policy"))

    # -- reading -------------------------------------------------------------------------------
    async def census(self, now: float | None = None) -> dict[str, Any]:
        """Rebuild and return the read model (also stored in the ``census`` key)."""
        return await self._run(self.calls.census(now))

    async def ledger(self, day: str) -> dict[str, dict[str, float]]:
        """The spend ledger of a UTC day (YYYY-MM-DD): {lane: {provider: USD}}."""
        with translated():
            return decode_ledger(await self.redis.hgetall(self.key("spend", day)))

    # -- the pool clock's step -----------------------------------------------------------------
    async def tick(self, now: float | None = None, sweep_limit: int = 100) -> Tick:
        """Growth steps, a bounded sweep of lapsed leases (``sweep_limit``), wake-ups, the census.
        Idempotent across pods: every pod's clock runs it, and so may an operator."""
        return await self._run(self.calls.tick(now, sweep_limit=sweep_limit))

    # -- the provider's day --------------------------------------------------------------------
    async def report_budget(self, reading: Any, now: float | None = None) -> dict[str, Any]:
        """Store a budget reader's reading (``admission.budget.Reading``) of a provider's day."""
        return await self._run(self.calls.budget(provider=reading.provider, limit_usd=reading.limit_usd,
                                                 spent_usd=reading.spent_usd, at=reading.at, now=now))

    async def close_provider(self, provider: str, *, why: str, seconds: float | None = None,
                             now: float | None = None) -> float:
        """Close every pool of a provider by hand (until midnight UTC, or ``seconds``)."""
        return await self._run(self.calls.closure(action="close", provider=provider, why=why, seconds=seconds,
                                                  now=now))

    async def reopen_provider(self, provider: str, *, why: str, now: float | None = None) -> None:
        """Reopen a closed provider by hand."""
        await self._run(self.calls.closure(action="reopen", provider=provider, why=why, now=now))

    async def rollover(self, now: float | None = None) -> Rollover:
        """The midnight roll-over (idempotent per UTC day); see ``admission day-rollover``."""
        return await self._run(self.calls.rollover(now))

    # -- the doctor ----------------------------------------------------------------------------
    async def doctor(self) -> doctor_mod.Report:
        """Check the counts against the records (lua/doctor.lua: one atomic, read-only call)."""
        with translated():
            return doctor_mod.decode(await scripts.acall(self.redis, "doctor", [self.calls.config_key], []))

    async def close(self) -> None:
        """Close the connection (a mesh made by ``from_url``)."""
        await self.redis.aclose()
