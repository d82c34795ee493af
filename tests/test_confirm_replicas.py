"""Ledger writes confirmed on replicas (``confirm_replicas``): after each release and charge the
client sends WAIT on the same connection; a write that too few replicas have within
``confirm_timeout`` waits in the outbox and is applied again (it counts once) until they do, so
a failover cannot lose it (tests/chaos/test_chaos_failover.py shows that under load). The replica
is frozen with SIGSTOP: it stays connected but acknowledges nothing."""
from __future__ import annotations

import asyncio
import os
import signal
import time
from contextlib import contextmanager

import pytest
import redis
import redis.asyncio as aredis

from admission import Admission, AsyncAdmission
from admission.errors import BadArgument
from admission.tools.servers import LocalServer, wait_replicas_online

from helpers import POOL, Rounds, policy

MESH = "t"
T0 = time.time()  # the server checks `at` against its own clock
DAY = time.strftime("%Y-%m-%d", time.gmtime(T0))


@pytest.fixture
def pair(real_engine):
    """A primary and one replica in sync."""
    primary = LocalServer(real_engine, extra_args=["--repl-diskless-sync-delay", "0"]).start()
    replica = LocalServer(real_engine, extra_args=["--replicaof", "127.0.0.1", str(primary.port)])
    try:
        replica.start()
        wait_replicas_online(primary, timeout=10)
        yield primary, replica
    finally:
        if replica.running:
            os.kill(replica.pid, signal.SIGCONT)
        replica.stop()
        primary.stop()


@contextmanager
def frozen(server: LocalServer):
    """The server stops answering, its connections stay open (a replica that acknowledges nothing)."""
    os.kill(server.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.pid, signal.SIGCONT)


def confirmed(primary: LocalServer, outbox, *, timeout: float = 0.05, apply: bool = True) -> Admission:
    a = Admission(primary.client(), mesh=MESH, pod="pod-a", background=False, seed=1, outbox=str(outbox),
                  confirm_replicas=1, confirm_timeout=timeout)
    if apply:
        a.ops.apply_policy(policy(), recovery_hold=False)
    return a


def spent(server: LocalServer) -> int:
    """The day's ledger, all providers, in micro-USD."""
    raw = server.client().hgetall(f"adm:{{{MESH}}}:spend:{DAY}")
    return sum(int(v) for f, v in raw.items() if f.startswith(b"*|"))


def settle(a: Admission, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while a.flush():
        assert time.monotonic() < deadline, "records still unconfirmed"
        time.sleep(0.05)


def test_a_confirmed_ledger_write_is_on_the_replica_when_the_call_returns(pair, tmp_path):
    primary, replica = pair
    a = confirmed(primary, tmp_path / "pod.outbox", timeout=2.0)  # a busy 2-core machine
    seat = Rounds(a, now=T0).fill("a", 1)[0]
    assert not a.charge(seat, cost_usd=0.25, key="step", at=T0).queued
    a.release(seat, cost_usd=0.5, now=T0, at=T0)
    assert a.flush() == 0
    assert spent(replica) == spent(primary) == 750_000


def test_a_ledger_write_no_replica_confirms_waits_in_the_outbox_and_counts_once(pair, tmp_path):
    primary, replica = pair
    a = confirmed(primary, tmp_path / "pod.outbox")
    seat = Rounds(a, now=T0).fill("a", 1)[0]
    with frozen(replica):
        assert a.charge(seat, cost_usd=0.25, key="step", at=T0).booked  # applied on the primary
        assert a.flush() == 1  # but not confirmed: it waits, and a replay does not confirm it either
        a.release(seat, cost_usd=0.5, now=T0, at=T0)
        assert a.flush() == 2
        assert spent(primary) == 750_000
    settle(a)  # the replica caught up: the replays confirm, and count nothing twice
    assert spent(primary) == spent(replica) == 750_000


def test_while_records_wait_unconfirmed_a_new_ledger_write_does_not_wait_for_a_replica(pair, tmp_path):
    """A missing replica costs one round's end the timeout, not every round's."""
    primary, replica = pair
    a = confirmed(primary, tmp_path / "pod.outbox", timeout=1.0)
    s1, s2 = Rounds(a, now=T0).fill("a", 2)
    with frozen(replica):
        t0 = time.monotonic()
        a.release(s1, cost_usd=0.5, now=T0, at=T0)
        first = time.monotonic() - t0
        t0 = time.monotonic()
        a.release(s2, cost_usd=0.5, now=T0, at=T0)
        second = time.monotonic() - t0
    assert first >= 0.9 and second < 0.5, (first, second)
    settle(a)
    assert spent(replica) == 1_000_000


@pytest.mark.parametrize("op", ["release", "charge"])
def test_a_replay_that_changes_nothing_still_writes_so_its_wait_covers_the_first_write(pair, tmp_path, op):
    """WAIT counts from its connection's last write. A pod restarted on its outbox replays over a
    fresh connection a record its first life applied: the replay must write (the record, as it
    is), or the WAIT answers at once for nothing and the record is dropped unconfirmed."""
    primary, replica = pair
    outbox = tmp_path / "pod.outbox"
    a = confirmed(primary, outbox)
    seat = Rounds(a, now=T0).fill("a", 1)[0]
    with frozen(replica):
        if op == "release":
            a.release(seat, cost_usd=0.5, now=T0, at=T0)
        else:
            a.charge(seat, cost_usd=0.5, key="step", at=T0)
        assert a.flush() == 1
        a._pending.outbox.close()
        restarted = confirmed(primary, outbox, apply=False)
        assert restarted.flush() == 1
    settle(restarted)
    assert spent(replica) == 500_000


def test_the_asyncio_client_confirms_ledger_writes_too(pair, tmp_path):
    primary, replica = pair

    async def main():
        a = AsyncAdmission(aredis.Redis(port=primary.port), mesh=MESH, pod="pod-a", background=False, seed=1,
                           outbox=str(tmp_path / "pod.outbox"), confirm_replicas=1, confirm_timeout=0.05)
        await a.ops.apply_policy(policy(), recovery_hold=False)
        d = await a.try_admit(lane="a", model=POOL, round_id="r1", now=T0, draw=0.0, wait=False)
        with frozen(replica):
            await a.release(d.seat, cost_usd=0.5, now=T0, at=T0)
            assert await a.flush() == 1
        deadline = time.monotonic() + 10
        while await a.flush():
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        await a.redis.aclose()

    asyncio.run(main())
    assert spent(replica) == 500_000


@pytest.mark.parametrize("bad", [{"confirm_replicas": -1}, {"confirm_replicas": 1.5}, {"confirm_replicas": True},
                                 {"confirm_timeout": 0}, {"confirm_timeout": float("nan")}])
def test_confirm_options_are_checked(bad):
    with pytest.raises(BadArgument):
        Admission(redis.Redis(), mesh=MESH, pod="p", background=False, **bad)
