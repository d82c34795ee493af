"""The operators' handle (admission.Mesh / AsyncMesh): one call per method, no seat, no waiter,
no clock and no outbox. The CLI, `admission serve` and the midnight job use it instead of a pod."""
from __future__ import annotations

import asyncio
import threading

import pytest

from admission import AsyncMesh, Mesh, NoPolicy
from admission import cli, dayjob
from admission.serve.source import CensusSource

from helpers import POOL, T0, policy


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def test_a_mesh_applies_reads_and_closes_without_a_pod(redis_client):
    before = _threads()
    m = Mesh(redis_client, mesh="t")
    with pytest.raises(NoPolicy):
        m.census(now=T0)
    assert m.policy() == {"version": 0}
    version = m.apply_policy(policy(), recovery_hold=False)
    assert version == 1 and m.policy()["version"] == 1
    doc = m.census(now=T0)
    assert [p["pool"] for p in doc["pools"]] == [POOL]
    assert m.close_provider("p", why="key_daily_limit", now=T0) > T0
    m.reopen_provider("p", why="operator", now=T0 + 1)
    assert m.tick(now=T0 + 2).swept == 0
    assert m.ledger("2026-01-01") == {}
    assert m.doctor().ok
    # nothing of a pod: no seat, no ticket, no clock thread, no outbox
    assert not any(k.startswith(b"adm:{t}:seat:") or k.startswith(b"adm:{t}:ticket:") for k in redis_client.keys())
    assert not hasattr(m, "_book") and not hasattr(m, "_pending") and not hasattr(m, "_clock")
    assert _threads() == before


def test_a_pods_mesh_handle_shares_its_connection(redis_client):
    from helpers import adm

    a = adm(redis_client)
    assert isinstance(a.ops, Mesh) and a.ops.redis is a.redis and a.ops.mesh == a.mesh
    assert not hasattr(a, "apply_policy") and not hasattr(a, "census")  # one job per class
    assert a.policy()["version"] == 1                                    # a pod reads its policy


def test_the_cli_serve_and_the_day_job_use_a_mesh(redis_client, monkeypatch):
    args = cli.build_parser().parse_args(["--url", "redis://127.0.0.1:1/0", "--mesh", "t", "census"])
    monkeypatch.setattr(Mesh, "from_url", classmethod(lambda cls, url, mesh: cls(redis_client, mesh=mesh)))
    assert isinstance(cli._connect(args), Mesh)
    source = CensusSource(redis_client, ["t"])
    assert all(isinstance(m, Mesh) for m in source.adms.values())
    m = Mesh(redis_client, mesh="t")
    m.apply_policy(policy(), recovery_hold=False)
    done, readings = dayjob.day_rollover(m, readers=[], now=T0)
    assert readings == [] and done.day


def test_an_async_mesh_is_the_same_handle_under_asyncio(async_client_factory):
    async def main():
        m = AsyncMesh(async_client_factory(), mesh="t")
        assert await m.policy() == {"version": 0}
        assert await m.apply_policy(policy(), recovery_hold=False) == 1
        doc = await m.census(now=T0)
        assert [p["pool"] for p in doc["pools"]] == [POOL]
        assert (await m.tick(now=T0 + 1)).swept == 0
        assert (await m.doctor()).ok
        await m.close()

    asyncio.run(main())


def test_a_ledger_record_holds_the_seat_in_its_fields_order():
    """ledger._seat is astuple without the deep copy: the same list, in Seat's field order."""
    import dataclasses

    from admission import Seat, ledger

    seat = Seat("r1", 3, "m@p", "a", "pod-a", 1.5)
    assert ledger._seat(seat) == list(dataclasses.astuple(seat))
    assert Seat(*ledger.release_record(seat, "clean", 1.0, None)["seat"]) == seat
