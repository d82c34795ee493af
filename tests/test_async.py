"""The asyncio client shares the sync client's core: same scripts, same decisions."""
from __future__ import annotations

import asyncio

import pytest

from admission import AsyncAdmission, Status, WaitTimeout

from helpers import POOL, T0, policy

ONE_LANE = {"x": {"floor": 0, "weight": 1, "priority": 1}}


def test_async_admit_release_census_plan(async_client_factory):
    async def main():
        a = AsyncAdmission(async_client_factory(), mesh="t", pod="p", background=False)
        assert await a.ops.apply_policy(policy(ONE_LANE), recovery_hold=False) == 1
        d1 = await a.try_admit(lane="x", model=POOL, round_id="r1", now=T0, draw=0.0)
        d2 = await a.try_admit(lane="x", model=POOL, round_id="r2", now=T0, draw=0.0)
        d3 = await a.try_admit(lane="x", model=POOL, round_id="r3", now=T0, draw=0.0)
        assert (d1.reason, d2.reason, d3.reason) == ("borrowed", "borrowed", "full")
        rel = await a.release(d1.seat, outcome="stall", seconds=1, now=T0 + 1)
        assert rel.status == Status.RELEASED and rel.decreased
        census = await a.ops.census(now=T0 + 1)
        assert census["pools"][0]["carryingCapacity"] == 2
        assert await a.plan(lane="x", model=POOL, wanted=5, now=T0 + 1) == 0   # 1 running of 1.4
        assert await a.allowance(lane="x", now=T0 + 1) == 0
        await a.release(d2.seat, outcome="clean", seconds=1, now=T0 + 2)
        assert await a.plan(lane="x", model=POOL, wanted=5, now=T0 + 2) == 1
    asyncio.run(main())


def test_async_round_waits_and_is_woken(async_client_factory):
    async def main():
        holder = AsyncAdmission(async_client_factory(), mesh="t", pod="a", background=False)
        await holder.ops.apply_policy(policy(ONE_LANE, grow_interval=60, max_estimate=2), recovery_hold=False)
        seats = [(await holder.try_admit(lane="x", model=POOL, round_id=f"h{i}")).seat for i in range(2)]
        waiter = AsyncAdmission(async_client_factory(), mesh="t", pod="b")

        async def work():
            async with waiter.round(lane="x", model=POOL, round_id="w1", timeout=20) as r:
                return r.pool

        task = asyncio.create_task(work())
        await asyncio.sleep(1.0)
        assert not task.done()
        await holder.release(seats[0], outcome="clean", seconds=1)
        assert await asyncio.wait_for(task, 10) == POOL
        await waiter.close()
    asyncio.run(main())


def test_async_wait_timeout_removes_the_ticket(async_client_factory):
    async def main():
        client = async_client_factory()
        a = AsyncAdmission(client, mesh="t", pod="a", background=False)
        await a.ops.apply_policy(policy(ONE_LANE, grow_interval=0.2), recovery_hold=False)
        for i in range(2):
            await a.try_admit(lane="x", model=POOL, round_id=f"h{i}")
        with pytest.raises(WaitTimeout) as info:
            async with a.round(lane="x", model=POOL, round_id="w", timeout=0.5):
                pass
        assert info.value.reason in ("fair-share", "draw", "full", "reserved")  # the last refusal's word
        assert await client.zcard("adm:{t}:wait:m@p:x") == 0
    asyncio.run(main())


def test_async_release_and_charge_wait_in_the_outbox_and_count_once(async_client_factory, tmp_path):
    import time as _time

    import redis as _redis

    from admission import scripts

    async def main():
        a = AsyncAdmission(async_client_factory(), mesh="t", pod="p", background=False,
                           outbox=tmp_path / "p.outbox")
        await a.ops.apply_policy(policy(ONE_LANE), recovery_hold=False)
        real = scripts.acall

        async def down(*args, **kwargs):
            raise _redis.ConnectionError("down")

        try:
            async with a.round(lane="x", model=POOL, round_id="r1") as r:
                assert (await r.charge(0.5, key="step-1")).booked
                scripts.acall = down
                assert (await r.charge(0.25, key="step-2")).queued
                r.cost_usd = 0.125
        finally:
            scripts.acall = real
        assert len(a._pending) == 2 and a._book.seats == {}
        assert await a.flush() == 0 and await a.flush() == 0
        today = _time.strftime("%Y-%m-%d", _time.gmtime())
        assert await a.ops.ledger(today) == {"x": {"p": 0.875}, "*": {"p": 0.875}}
    asyncio.run(main())


def test_close_stops_a_clock_that_lost_a_cancel():
    """redis-py's asyncio.wait_for on Python 3.11 can swallow a cancel that lands as a command
    finishes sending; the clock then goes on. close() cancels again until the task has ended
    (one cancel hung it for ever)."""
    import fakeredis

    async def main():
        adm = AsyncAdmission(fakeredis.aioredis.FakeRedis(), mesh="t", pod="pod-a", background=False)
        swallowed = asyncio.Event()

        async def clock():
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                swallowed.set()          # lost, as inside that wait_for
            await asyncio.sleep(3600)    # the next turn of the clock

        adm._clock._task = asyncio.get_running_loop().create_task(clock())
        await asyncio.sleep(0)
        closing = asyncio.get_running_loop().create_task(adm.close())
        done, _ = await asyncio.wait({closing}, timeout=2)   # no outside cancel to help it
        assert closing in done, "close() hung on a clock that lost its cancel"
        assert swallowed.is_set() and adm._clock._task.done()

    asyncio.run(main())


# -- the drifts from the sync client, and one release path ---------------------------------------

def _down_acall():
    import redis as _redis

    async def down(*args, **kwargs):
        raise _redis.ConnectionError("down")
    return down


def _today() -> str:
    import time as _time

    return _time.strftime("%Y-%m-%d", _time.gmtime())


def _queue_a_priced_release(client, path) -> None:
    """A pod releases a round with a price while Redis is down (the release waits in its outbox),
    then stops."""
    from admission import scripts

    async def main():
        a = AsyncAdmission(client, mesh="t", pod="p", background=False, outbox=path)
        await a.ops.apply_policy(policy(ONE_LANE), recovery_hold=False)
        seat = (await a.try_admit(lane="x", model=POOL, round_id="r1")).seat
        real, scripts.acall = scripts.acall, _down_acall()
        try:
            assert (await a.release(seat, cost_usd=0.5)).queued
        finally:
            scripts.acall = real
        a._pending.outbox.close()
    asyncio.run(main())


def test_an_async_pod_built_in_a_loop_replays_its_outbox_at_once(async_client_factory, tmp_path):
    """As the sync client: a restarted pod's clock starts at construction (no round needed)."""
    path = tmp_path / "p.outbox"
    _queue_a_priced_release(async_client_factory(), path)

    async def main():
        b = AsyncAdmission(async_client_factory(), mesh="t", pod="p", outbox=path)
        try:
            for _ in range(100):
                if not len(b._pending):
                    break
                await asyncio.sleep(0.05)
            assert len(b._pending) == 0, "the restarted pod did not replay its outbox"
            assert await b.ops.ledger(_today()) == {"x": {"p": 0.5}, "*": {"p": 0.5}}
        finally:
            await b.close()
    asyncio.run(main())


def test_an_async_pod_built_outside_a_loop_replays_its_outbox_at_its_first_awaited_call(
        async_client_factory, tmp_path):
    path = tmp_path / "p.outbox"
    _queue_a_priced_release(async_client_factory(), path)
    b = AsyncAdmission(async_client_factory(), mesh="t", pod="p", outbox=path)  # no loop runs: not yet

    async def main():
        try:
            await b.tunables()                          # the first awaited call starts the clock
            for _ in range(100):
                if not len(b._pending):
                    break
                await asyncio.sleep(0.05)
            assert len(b._pending) == 0, "the pod's clock never started"
            assert await b.ops.ledger(_today()) == {"x": {"p": 0.5}, "*": {"p": 0.5}}
        finally:
            await b.close()
    asyncio.run(main())


def test_async_apply_policy_logs_the_version_it_applied(async_client_factory, caplog):
    import logging

    async def main():
        a = AsyncAdmission(async_client_factory(), mesh="t", pod="p", background=False)
        with caplog.at_level(logging.INFO, logger="admission"):
            version = await a.ops.apply_policy(policy(ONE_LANE), recovery_hold=False)
        logs = [r.admission for r in caplog.records if getattr(r, "admission", None)]
        assert [(e["event"], e["mesh"], e["version"]) for e in logs] == [("policy_applied", "t", version)]
    asyncio.run(main())


def test_async_revision_is_a_whole_number_on_every_ask(async_client_factory):
    import inspect

    from admission import BadArgument

    for name in ("try_admit", "admit_waiting", "round"):
        assert inspect.signature(getattr(AsyncAdmission, name)).parameters["revision"].annotation == "int | None"

    async def main():
        a = AsyncAdmission(async_client_factory(), mesh="t", pod="p", background=False)
        await a.ops.apply_policy(policy(ONE_LANE), recovery_hold=False)
        async with a.round(lane="x", model=POOL, round_id="r1", revision=3) as r:
            assert r.seat.id == "r1"
        assert (await a.admit_waiting(lane="x", model=POOL, round_id="r2", revision=0)).admitted
        with pytest.raises(BadArgument):
            async with a.round(lane="x", model=POOL, round_id="r3", revision="R3"):
                pass
    asyncio.run(main())


@pytest.mark.real
def test_an_async_release_with_a_price_while_redis_is_down_is_booked_once_when_it_is_back(real_engine, tmp_path):
    """The public release and round()'s exit share one path: a release that meets an
    unreachable Redis, then an empty restarted one with no policy, waits in the outbox
    (``queued``) and is booked exactly once when Redis can apply it."""
    from admission import UnknownSeat
    from admission.tools.servers import LocalServer

    pol = policy(ONE_LANE)
    pol.pop("clock")

    async def main(srv):
        a = AsyncAdmission.from_url(srv.url, mesh="t", pod="p", background=False, outbox=tmp_path / "p.outbox")
        await a.ops.apply_policy(pol, recovery_hold=False)
        seat = (await a.try_admit(lane="x", model=POOL, round_id="r1")).seat
        srv.kill()
        r = await a.release(seat, cost_usd=0.5)
        assert r.queued and r.pool == POOL and len(a._pending) == 1 and a._book.seats == {}
        assert await a.flush() == 1                     # still down: kept
        srv.restart()                                   # empty, as an unpersisted Redis after a crash
        assert await a.flush() == 1                     # no policy yet: kept
        await a.ops.apply_policy(pol, recovery_hold=False)
        assert await a.flush() == 0
        assert await a.ops.ledger(_today()) == {"x": {"p": 0.5}, "*": {"p": 0.5}}
        with pytest.raises(UnknownSeat):                # sent again: the seat is gone, its cost booked
            await a.release(seat, cost_usd=0.5)
        assert await a.flush() == 0
        assert await a.ops.ledger(_today()) == {"x": {"p": 0.5}, "*": {"p": 0.5}}
        await a.close()

    with LocalServer(real_engine) as srv:
        asyncio.run(main(srv))
