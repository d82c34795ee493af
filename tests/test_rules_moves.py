"""Moving between pools (docs/design.md §5 step 0, §7): the fallback to an alternative in one
atomic call with a Thompson ranking, hard pins, delegated rounds, the lane of an agent, and plan
honouring them. One test per rule, named after it; each runs on fakeredis, Redis 7 and Valkey 8."""
from __future__ import annotations

import asyncio
import functools
import json
import random

import pytest

from admission import scripts
from admission.alternatives import Thompson
from admission.core import Core
from admission.errors import UnknownLane, WaitTimeout
from admission.view import render_census

from helpers import T0, adm, policy, snapshot

A, B, C = "m@pa", "m@pb", "m@pc"          # one model on three providers
X = "m@px"                                # a non-EU router (off the EU route from pa)
LANES = {"a": {"floor": 0, "weight": 1, "priority": 2}, "b": {"floor": 0, "weight": 1, "priority": 1}}


def anywhere(pool):
    """``move_to`` of a caller that can call every pool (a round moves only where its caller can call)."""
    return True


def moves_policy(alternatives=None, pins=None, agents=None, eu=False, **tunables):
    pol = policy(LANES, pools=(A, B, C, X), **tunables)
    pol["tiers"] = {}  # only what a test declares
    pol["alternatives"] = {A: [B, C]} if alternatives is None else alternatives
    if pins:
        pol["pins"] = pins
    if agents:
        pol["agents"] = agents
    if eu:
        pol["providers"]["pa"] = {"route": "eu", "kind": "direct"}
        pol["providers"]["px"] = {"route": "global", "kind": "router"}
    return pol


class Ask:
    def __init__(self, a, now=T0):
        self.a, self.now, self.n = a, now, 0

    def __call__(self, lane="a", pool=A, rid=None, wait=False, **kw):
        self.n += 1
        return self.a.try_admit(lane=lane, model=pool, round_id=rid or f"r{self.n}", now=self.now, draw=0.0,
                                wait=wait, **kw)

    def fill(self, pool, k=2, lane="b"):
        seats = []
        for _ in range(k):
            d = self(lane=lane, pool=pool, alternatives=[])
            assert d.admitted and d.pool == pool, d
            seats.append(d.seat)
        return seats


def seat(client, rid):
    return {k.decode(): v.decode() for k, v in client.hgetall(f"adm:{{t}}:seat:{rid}").items()}


def row(census, pool):
    return next(p for p in census["pools"] if p["pool"] == pool)


# -- the fallback ---------------------------------------------------------------------------------

def test_fallback_a_refused_round_moves_to_the_first_ranked_alternative_that_admits_it(redis_client):
    a = adm(redis_client, pol=moves_policy())
    ask = Ask(a)
    ask.fill(A)                                        # A is full (seed estimate 2)
    d = ask(rid="x", alternatives=[C, B])
    assert d.admitted and d.pool == C and d.moved_from == A and d.asked == A
    assert seat(redis_client, "x")["movedFrom"] == A
    ask.fill(C, k=1)                                   # now C is full too: B is next in the ranking
    d = ask(rid="y", alternatives=[C, B])
    assert d.admitted and d.pool == B and d.moved_from == A


def test_a_raw_round_stays_on_the_pool_asked_for(redis_client):
    """A round moves only where its caller can call: A lists B, A is full. A raw ``try_admit``,
    ``admit_waiting`` or ``round()`` stays on A (its caller may call only A's provider: a seat on B
    would count there while the call goes to A); ``move_to=`` or an ``alternatives`` list moves it."""
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B]}))
    ask = Ask(a)
    ask.fill(A)
    d = ask(rid="raw")
    assert not d.admitted and d.pool == A and d.reason == "full"
    with pytest.raises(WaitTimeout):
        a.admit_waiting(lane="a", model=A, round_id="raw-wait", timeout=0.3)
    with pytest.raises(WaitTimeout):
        with a.round(lane="a", model=A, round_id="raw-round", timeout=0.3):
            pass
    assert redis_client.zscore("adm:{t}:seats", "raw-round") is None
    for rid, how in (("moved-to", {"move_to": anywhere}), ("moved-alt", {"alternatives": [B]})):
        d = ask(rid=rid, **how)
        assert d.admitted and d.pool == B and d.moved_from == A, (how, d)
        a.release(d.seat, now=T0)
    with a.round(lane="a", model=A, round_id="moved-round", timeout=1, move_to=anywhere) as r:
        assert r.pool == B


def test_a_raw_async_round_stays_on_the_pool_asked_for(async_client_factory):
    async def main():
        from admission import AsyncAdmission
        client = async_client_factory()
        a = AsyncAdmission(client, mesh="t", pod="pod-a", background=False, seed=1)
        await a.ops.apply_policy(moves_policy(alternatives={A: [B]}), recovery_hold=False)
        ask = functools.partial(a.try_admit, lane="a", model=A, now=T0, draw=0.0)
        for i in range(2):
            assert (await ask(lane="b", round_id=f"fill{i}")).pool == A
        d = await ask(round_id="raw")
        assert not d.admitted and d.pool == A and d.reason == "full"
        with pytest.raises(WaitTimeout):
            await a.admit_waiting(lane="a", model=A, round_id="raw-wait", timeout=0.3)
        with pytest.raises(WaitTimeout):
            async with a.round(lane="a", model=A, round_id="raw-round", timeout=0.3):
                pass
        for rid, how in (("moved-to", {"move_to": anywhere}), ("moved-alt", {"alternatives": [B]})):
            d = await ask(round_id=rid, **how)
            assert d.admitted and d.pool == B and d.moved_from == A, (how, d)
            await a.release(d.seat, now=T0)
        async with a.round(lane="a", model=A, round_id="moved-round", timeout=1, move_to=anywhere) as r:
            assert r.pool == B
        await a.close()
        await client.aclose()
    asyncio.run(main())


def test_fallback_a_round_its_own_pool_admits_does_not_move(redis_client):
    a = adm(redis_client, pol=moves_policy())
    d = Ask(a)(alternatives=[B, C])
    assert d.admitted and d.pool == A and d.moved_from is None and seat(redis_client, "r1")["movedFrom"] == ""


def test_fallback_only_the_pools_configured_alternatives_are_tried(redis_client):
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B]}))
    ask = Ask(a)
    ask.fill(A)
    d = ask(rid="x", alternatives=[C, X])            # neither is an alternative of A: skipped
    assert not d.admitted and d.reason == "full" and d.pool == A
    assert ask(rid="y", alternatives=[C, B]).pool == B


def test_fallback_never_off_the_eu_route_even_when_the_client_asks(redis_client):
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B]}, eu=True))
    ask = Ask(a)
    ask.fill(A)
    d = ask(rid="x", alternatives=[X])
    assert not d.admitted and d.pool == A
    # nor can a hand-made apply declare it: the script checks the route too
    core = Core("t", "pod-a")
    pol = a.policy()
    pol.pop("version")
    call = core.apply(pol)
    call.args[5] = json.dumps({A: [X]})
    before = snapshot(redis_client)
    with pytest.raises(Exception, match="EU-routed pool to a non-EU router"):
        scripts.call(redis_client, call.script, call.keys, call.args)
    assert snapshot(redis_client) == before


def test_fallback_every_check_applies_on_each_candidate(redis_client):
    """Closure, oldest first and the lane rules run on each candidate: a closed alternative and one
    where the lane has an older waiter are passed over."""
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B, C]}))
    ask = Ask(a)
    ask.fill(A)
    a.ops.close_provider("pb", why="test", now=T0)
    ask.fill(C)
    waiter = ask(lane="a", pool=C, rid="older", wait=True, alternatives=[])
    assert not waiter.admitted
    for s in a._book.seats.values():
        if s.seat.pool == C:
            a.release(s.seat, now=T0)
            break
    d = ask(rid="x", alternatives=[B, C])
    assert not d.admitted and d.reason == "full" and d.pool == A    # B closed, C: behind-older
    assert ask(lane="a", pool=C, rid="older", alternatives=[]).admitted


def test_fallback_refused_everywhere_waits_on_its_own_pool_with_its_own_reason(redis_client):
    a = adm(redis_client, pol=moves_policy())
    ask = Ask(a)
    ask.fill(A), ask.fill(B), ask.fill(C)
    d = ask(rid="w", wait=True, alternatives=[B, C])
    assert not d.admitted and d.reason == "full" and d.pool == A
    assert redis_client.zscore("adm:{t}:wait:m@pa:a", "w") is not None
    assert redis_client.zcard("adm:{t}:wait:m@pb:a") == 0 and redis_client.zcard("adm:{t}:wait:m@pc:a") == 0


def test_fallback_a_waiter_admitted_on_an_alternative_leaves_its_own_queue(redis_client):
    a = adm(redis_client, pol=moves_policy())
    ask = Ask(a)
    ask.fill(A)
    b_seats = ask.fill(B)
    ask.fill(C)
    assert not ask(rid="w", wait=True, alternatives=[B, C]).admitted
    a.release(b_seats[0], now=T0)
    d = ask(rid="w", wait=True, alternatives=[B, C])
    assert d.admitted and d.pool == B and d.moved_from == A
    assert redis_client.exists("adm:{t}:ticket:w") == 0 and redis_client.zcard("adm:{t}:wait:m@pa:a") == 0


def test_fallback_a_newcomer_does_not_move_past_an_older_waiter_of_its_lane_that_could_move(redis_client):
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B]}, pins={"agents": ["bot"]}))
    ask = Ask(a)
    ask.fill(A)
    b_seats = ask.fill(B)
    assert not ask(lane="a", rid="older", wait=True, alternatives=[B]).admitted
    a.release(b_seats[0], now=T0)                         # B frees a slot: the older waiter's
    d = ask(lane="a", rid="new", alternatives=[B])
    assert not d.admitted and d.reason == "behind-older" and d.pool == A
    assert ask(lane="a", rid="older", wait=True, alternatives=[B]).pool == B
    # a pinned older waiter does not hold the lane's other rounds back
    a.release(b_seats[1], now=T0)
    assert not ask(lane="a", rid="pinned", wait=True, agent="bot", alternatives=[B]).admitted
    d = ask(lane="a", rid="new2", alternatives=[B])
    assert d.admitted and d.pool == B


def test_move_is_atomic_one_seat_on_one_pool(redis_client):
    a = adm(redis_client, pol=moves_policy())
    ask = Ask(a)
    ask.fill(A)
    d = ask(rid="x", alternatives=[B, C])
    again = ask(rid="x", alternatives=[C, B])             # same intent: the same decision
    assert again.reason == "same-intent" and again.pool == d.pool == B and again.asked == A
    seats = [rid.decode() for rid in redis_client.zrange("adm:{t}:seats", 0, -1)]
    assert seats.count("x") == 1
    running = {p: int(redis_client.hget(f"adm:{{t}}:pool:{p}", "running") or 0) for p in (A, B, C)}
    assert running == {A: 2, B: 1, C: 0}


def test_census_counts_moved_rounds_per_pool(redis_client):
    a = adm(redis_client, pol=moves_policy())
    ask = Ask(a)
    ask.fill(A)
    d1, d2 = ask(alternatives=[B, C]), ask(alternatives=[B, C])
    assert (d1.pool, d2.pool) == (B, B)
    c = a.ops.census(now=T0)
    assert (row(c, B)["moved"], row(c, B)["movedIn"], row(c, A)["movedOut"]) == (2, 2, 2)
    assert row(c, A)["alternatives"] == [B, C]
    a.release(d1.seat, now=T0)
    c = a.ops.census(now=T0)
    assert (row(c, B)["moved"], row(c, B)["movedIn"]) == (1, 2)


# -- Thompson sampling ------------------------------------------------------------------------------

def test_thompson_explores_an_unexplored_pool():
    core = Thompson(seed=7)
    stats = {B: (5.0, 5.0, 0.0)}                          # C never ran: Beta(1, 1)
    first = [core.rank([B, C], stats, 1.0)[0] for _ in range(1000)]
    assert 0.3 < first.count(C) / 1000 < 0.7
    stats = {B: (20.0, 0.0, 0.0)}                         # B proven: C is still tried sometimes
    first = [core.rank([B, C], stats, 1.0)[0] for _ in range(2000)]
    assert 0 < first.count(C) < 400


def test_thompson_discounts_by_mean_cost():
    core = Thompson(seed=3)
    stats = {B: (50.0, 0.0, 3.0), C: (50.0, 0.0, 0.1)}  # as good; B costs 30 times as much
    first = [core.rank([B, C], stats, 1.0)[0] for _ in range(500)]
    assert first.count(C) == 500
    first = [core.rank([B, C], stats, 1000.0)[0] for _ in range(500)]   # cost hardly matters
    assert 150 < first.count(C) < 350


def test_thompson_bandit_the_better_alternative_takes_over_80_percent_after_200_rounds(redis_client):
    """Two alternatives, one failing half its rounds: after 200 rounds the better one has taken
    more than 80 % (the client's draws read the counts each release returns)."""
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B, C]}))
    a.ops.close_provider("pa", why="test", now=T0)
    luck, taken = random.Random(5), {B: 0, C: 0}
    for i in range(200):
        now = T0 + i * 0.01                                 # inside probe_every: A's probe never comes
        d = a.try_admit(lane="a", model=A, round_id=f"r{i}", now=now, draw=0.0, move_to=anywhere)
        assert d.admitted and d.moved_from == A, d
        taken[d.pool] += 1
        bad = d.pool == B and luck.random() < 0.5
        a.release(d.seat, outcome="error" if bad else "clean", seconds=1, now=now)
    assert taken[C] / 200 > 0.8, taken


# -- hard pins --------------------------------------------------------------------------------------

def test_pin_a_pinned_lane_waits_for_its_model(redis_client):
    a = adm(redis_client, pol=moves_policy(pins={"lanes": ["a"]}))
    ask = Ask(a)
    ask.fill(A)
    d = ask(lane="a", rid="pinned", wait=True, alternatives=[B, C])
    assert not d.admitted and d.pool == A
    assert ask(lane="b", alternatives=[B, C]).pool == B   # an unpinned lane still moves
    hp = row(a.ops.census(now=T0), A)["hardPinned"]
    assert hp == {"to": A, "waiting": 1, "oldestWaitingSince": T0, "waitingSince": T0}


def test_pin_a_pinned_agent_waits_for_its_model(redis_client):
    a = adm(redis_client, pol=moves_policy(pins={"agents": ["bot"]}))
    ask = Ask(a)
    ask.fill(A)
    assert not ask(lane="a", agent="bot", alternatives=[B, C]).admitted
    assert ask(lane="a", agent="other", alternatives=[B, C]).pool == B


def test_pin_starving_a_pinned_round_waiting_past_starved_after(redis_client):
    a = adm(redis_client, pol=moves_policy(pins={"lanes": ["a"]}, starved_after=60))
    ask = Ask(a)
    ask.fill(A)
    ask(lane="a", rid="pinned", wait=True)
    assert a.ops.census(now=T0 + 30)["starving"] == []
    doc = a.ops.census(now=T0 + 61)
    assert doc["starving"] == [{"kind": "pinned", "pool": A, "waiting": 1, "waitingSince": T0}]
    text = render_census(doc)
    assert f"hard-pinned to {A}: 1 waiting, oldest 61s" in text and f"STARVING pinned: 1 hard-pinned" in text
    a._exec(a.core.withdraw("pinned"))                  # the pinned waiter gives up
    c = a.ops.census(now=T0 + 62)
    assert c["starving"] == [] and row(c, A)["hardPinned"] is None


# -- delegated rounds --------------------------------------------------------------------------------

def test_delegated_round_is_admitted_at_once_on_its_parents_lane_and_counted(redis_client):
    a = adm(redis_client, pol=moves_policy(alternatives={}))
    ask = Ask(a)
    ask(lane="a", pool=A, rid="parent")
    ask.fill(A, k=1)
    assert not ask(lane="b", pool=A).admitted            # A is full for an ordinary round
    for i in range(3):                                    # nothing bounds the fan-out
        d = ask(lane="b", pool=A, rid=f"parent/{i}", parent="parent")
        assert d.admitted and d.reason == "delegated" and d.lane == "a", d
    assert seat(redis_client, "parent/0")["delegated"] == "parent"
    lane_a = next(l for l in row(a.ops.census(now=T0), A)["lanes"] if l["lane"] == "a")
    assert (lane_a["running"], lane_a["delegated"]) == (4, 3)


def test_delegated_needs_a_parent_holding_a_live_seat(redis_client):
    a = adm(redis_client, pol=moves_policy(alternatives={}, lease_ttl=100))
    ask = Ask(a)
    parent = ask(lane="a", pool=A, rid="parent")
    ask.fill(A, k=1)
    a.release(parent.seat, now=T0)
    ask.fill(A, k=1)
    assert not ask(lane="a", rid="child", parent="parent").admitted   # released parent: ordinary
    # a parent whose lease ran out (its pod froze) is not live, even before a sweep removes it:
    # four older lapsed entries take this admit's sweep (it sweeps four per call)
    p2 = ask(lane="a", pool=X, rid="p2")
    redis_client.zadd("adm:{t}:seats", {"p2": T0 + 5, **{f"ghost{i}": T0 + 1 for i in range(4)}})
    redis_client.hdel("adm:{t}:config", "sweepAt")  # leases written behind the scripts' back
    ask.now = T0 + 10
    d = ask(lane="b", pool=X, rid="child2", parent="p2")
    assert redis_client.hget("adm:{t}:seat:p2", "lane") is not None   # not swept yet
    assert d.reason != "delegated" and d.lane == "b" and seat(redis_client, "child2")["delegated"] == ""
    assert p2.admitted


def test_delegated_a_parent_released_does_not_strand_its_children(redis_client):
    a = adm(redis_client, pol=moves_policy(alternatives={}))
    ask = Ask(a)
    parent = ask(lane="a", rid="parent")
    child = ask(lane="a", rid="child", parent="parent")
    a.release(parent.seat, now=T0)
    assert redis_client.zscore("adm:{t}:seats", "child") is not None
    hb = a.heartbeat(now=T0 + 1)
    assert hb.lost == [] and a.release(child.seat, now=T0 + 2).status.name == "RELEASED"


def test_delegated_closure_moves_a_delegated_round(redis_client):
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B]}))
    ask = Ask(a)
    ask(lane="a", pool=C, rid="parent")
    a.ops.close_provider("pa", why="test", now=T0)
    d = ask(lane="b", pool=A, rid="child", parent="parent", alternatives=[B])
    assert d.admitted and d.reason == "delegated" and d.pool == B and d.lane == "a"


def test_delegated_closure_refuses_a_pinned_delegated_round(redis_client):
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B]}, pins={"lanes": ["a"]}))
    ask = Ask(a)
    ask(lane="a", pool=C, rid="parent")
    a.ops.close_provider("pa", why="test", now=T0)
    d = ask(lane="a", pool=A, rid="child", parent="parent", alternatives=[B])
    assert not d.admitted and d.reason == "provider-closed"


def test_delegated_a_nested_round_passes_its_parent_by_itself(redis_client):
    a = adm(redis_client, pol=moves_policy(alternatives={}, seed_estimate=1))
    with a.round(lane="a", model=A, round_id="outer", timeout=1) as outer:
        with a.round(lane="b", model=A, round_id="outer/sub", timeout=0.5) as sub:
            assert sub.decision.reason == "delegated" and sub.seat.lane == "a"
            assert seat(redis_client, "outer/sub")["parent"] == "outer"
        with pytest.raises(WaitTimeout):                  # parent="" opts out: an ordinary round
            with a.round(lane="b", model=A, round_id="solo", timeout=0.3, parent=""):
                pass
    assert outer.seat.id == "outer"


def test_delegated_a_nested_async_round_passes_its_parent_by_itself(async_client_factory):
    async def main():
        from admission import AsyncAdmission
        client = async_client_factory()
        a = AsyncAdmission(client, mesh="t", pod="pod-a", background=False, seed=1)
        await a.ops.apply_policy(moves_policy(alternatives={}, seed_estimate=1), recovery_hold=False)
        async with a.round(lane="a", model=A, round_id="outer", timeout=1):
            async def child(i):
                async with a.round(lane="b", model=A, round_id=f"outer/{i}", timeout=0.5) as sub:
                    return sub.decision.reason, sub.seat.lane
            got = await asyncio.gather(*(asyncio.create_task(child(i)) for i in range(3)))
        assert got == [("delegated", "a")] * 3
        await client.aclose()
    asyncio.run(main())


# -- lane of agent --------------------------------------------------------------------------------------

def test_lane_of_agent_a_round_may_ask_by_agent_alone(redis_client):
    a = adm(redis_client, pol=moves_policy(agents={"reviewer": "b"}))
    d = a.try_admit(model=A, round_id="r1", agent="reviewer", now=T0, draw=0.0)
    assert d.admitted and d.lane == "b" and seat(redis_client, "r1")["agent"] == "reviewer"
    d = a._exec(a.core.admit(lane=None, model=A, round_id="r0", agent="reviewer", now=T0, draw=0.0))
    assert d.admitted and d.lane == "b"                                 # the script resolves it too
    before = snapshot(redis_client)
    with pytest.raises(UnknownLane, match="agent stranger has no lane"):
        a.try_admit(model=A, round_id="r2", agent="stranger", now=T0, draw=0.0)
    assert snapshot(redis_client) == before


# -- plan and allowance ----------------------------------------------------------------------------------

def test_plan_honours_closures_alternatives_and_pins(redis_client):
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B]}, pins={"agents": ["bot"]}))
    plan_pools = functools.partial(a.plan_pools, move_to=anywhere)
    assert plan_pools(lane="a", pools=[A], wanted=3, now=T0) == {A: 2, B: 1}      # 2 here, the rest moves
    a.ops.close_provider("pa", why="test", now=T0)
    assert plan_pools(lane="a", pools=[A], wanted=3, now=T0) == {A: 0, B: 2}      # closed: all move
    assert a.plan(lane="a", model=A, wanted=3, now=T0, agent="bot", move_to=anywhere) == 0   # pinned: waits
    assert plan_pools(lane="a", pools=[A, B], wanted=3, now=T0) == {A: 0, B: 2}   # each pool once
    assert a.allowance(lane="a", now=T0, move_to=anywhere) == 2 + 2 + 2            # B, C, X (A closed)


def test_plan_counts_only_the_pools_the_caller_can_call(redis_client):
    """Plan and allowance move as admission does: only to the alternatives ``move_to`` keeps, to
    none without it (a round whose caller did not say where it can call stays where it asked)."""
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B, C]}))
    assert a.plan_pools(lane="a", pools=[A], wanted=3, now=T0) == {A: 2}
    assert a.plan_pools(lane="a", pools=[A], wanted=3, now=T0, move_to=lambda pool: pool == C) == {A: 2, C: 1}
    assert a.plan(lane="a", model=A, wanted=5, now=T0) == 2
    assert a.plan(lane="a", model=A, wanted=5, now=T0, move_to=lambda pool: pool == C) == 4
    assert a.allowance(lane="a", now=T0) == 2 * 4                 # each pool of the catalog once


def test_plan_of_an_async_caller_counts_only_the_pools_it_can_call(async_client_factory):
    async def main():
        from admission import AsyncAdmission
        client = async_client_factory()
        a = AsyncAdmission(client, mesh="t", pod="pod-a", background=False, seed=1)
        await a.ops.apply_policy(moves_policy(alternatives={A: [B, C]}), recovery_hold=False)
        assert await a.plan_pools(lane="a", pools=[A], wanted=3, now=T0) == {A: 2}
        assert await a.plan_pools(lane="a", pools=[A], wanted=3, now=T0, move_to=lambda p: p == C) == {A: 2, C: 1}
        assert await a.plan(lane="a", model=A, wanted=9, now=T0, move_to=anywhere) == 6   # A, B, C
        await a.close()
        await client.aclose()
    asyncio.run(main())


def test_policy_bad_moves_are_refused_with_a_clear_error_and_change_nothing(redis_client):
    a = adm(redis_client, pol=moves_policy())
    before = snapshot(redis_client)
    for bad, msg in [({"agents": {"bot": "nope"}}, "lane 'nope' is not declared"),
                     ({"pins": {"lanes": ["nope"]}}, "nope not declared"),
                     ({"alternatives": {A: ["z@pa"]}}, r"z@pa not in \[pools\]")]:
        pol = moves_policy()
        pol.update(bad)
        with pytest.raises(Exception, match=msg):
            a.ops.apply_policy(pol)
    assert snapshot(redis_client) == before


# -- a waiter re-asks across its alternatives --------------------------------------------------------

def test_waiter_a_wake_up_of_an_alternative_wakes_the_waiters_of_its_pool(redis_client):
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B], C: [B]}))
    a.tunables()
    a._wake(B)                                            # what a release on B publishes
    assert (a._gens.get(A), a._gens.get(B), a._gens.get(C), a._gens.get(X)) == (1, 1, 1, None)


def test_waiter_a_release_on_an_alternative_wakes_the_waiter_of_its_pool(real_engine, server_pool):
    """A waiter on A (full) whose alternative B is full too: a release on B wakes it at once (not at
    the pool clock, 60 s here) and it is seated on B."""
    import threading
    import time

    import redis

    from admission import Admission

    url = server_pool.get(real_engine).url
    client = redis.Redis.from_url(url)
    client.flushall()
    pol = moves_policy(alternatives={A: [B]}, grow_interval=60, high_free=0.01, max_estimate=2)
    pol.pop("clock")
    holder = Admission(client, mesh="t", pod="holder", background=False)
    holder.ops.apply_policy(pol, recovery_hold=False)
    held = {p: [holder.try_admit(lane="b", model=p, round_id=f"h-{p}-{i}", draw=0.0, alternatives=[]).seat
                for i in range(2)] for p in (A, B)}
    pod = Admission(redis.Redis.from_url(url), mesh="t", pod="waiter")
    got = {}
    t = threading.Thread(target=lambda: got.update(d=pod.admit_waiting(lane="a", model=A, round_id="w", timeout=20,
                                                                       move_to=anywhere)))
    t.start()
    deadline = time.monotonic() + 10
    while client.hget(f"adm:{{t}}:pool:{A}", "waiting") != b"1" and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.6)                                       # the pod's clock subscribes
    start = time.monotonic()
    holder.release(held[B][0])
    t.join(10)
    took = time.monotonic() - start
    assert got["d"].admitted and got["d"].pool == B and got["d"].moved_from == A
    assert took < 1.0, took
    pod.release(got["d"].seat)
    for s in held[A] + held[B][1:]:
        holder.release(s)
    pod.close()


def test_pin_starving_through_refused_probes_and_new_tickets(redis_client):
    """A pinned lane on a closed provider: its probe is refused by the provider and the retry
    waits with a new ticket. The pinned wait goes on from the first ticket, not the newest; a
    round of it served normally ends it."""
    a = adm(redis_client, pol=moves_policy(alternatives={}, pins={"lanes": ["a"]}, starved_after=60))
    a.ops.close_provider("pa", why="key_daily_limit", now=T0)
    assert not a.try_admit(lane="a", model=A, round_id="p1", now=T0, draw=0.0, wait=True).admitted
    probe = a.try_admit(lane="a", model=A, round_id="p1", now=T0 + 50, draw=0.0, wait=True)
    assert probe.admitted and probe.reason == "probe"
    a.release(probe.seat, outcome="key_daily_limit", seconds=1, now=T0 + 51)     # refused again
    assert not a.try_admit(lane="a", model=A, round_id="p2", now=T0 + 52, draw=0.0, wait=True).admitted
    doc = a.ops.census(now=T0 + 70)
    assert doc["starving"][0]["kind"] == "provider-closed"        # closed providers first
    assert doc["starving"][1:] == [{"kind": "pinned", "pool": A, "waiting": 1, "waitingSince": T0}]
    a.ops.reopen_provider("pa", why="test", now=T0 + 80)
    assert a.try_admit(lane="a", model=A, round_id="p2", now=T0 + 81, draw=0.0, wait=True).admitted
    c = a.ops.census(now=T0 + 81)
    assert c["starving"] == [] and row(c, A)["hardPinned"] is None
    assert a.try_admit(lane="a", model=A, round_id="p3", now=T0 + 82, draw=0.0).admitted    # A is full now
    assert not a.try_admit(lane="a", model=A, round_id="p4", now=T0 + 83, draw=0.0, wait=True).admitted
    c = a.ops.census(now=T0 + 130)                                     # a new pinned wait, 47 s old
    assert c["starving"] == [] and row(c, A)["hardPinned"]["waitingSince"] == T0 + 83


def test_move_to_keeps_only_the_alternatives_the_caller_can_run_on(redis_client):
    """An SDK client calls its own provider's pools: ``move_to`` drops the other alternatives
    from the ranking, so the round moves only where the caller can run it, or waits at home."""
    a = adm(redis_client, pol=moves_policy(alternatives={A: [B, C]}))
    ask = Ask(a)
    ask.fill(A)
    for _ in range(5):  # whatever the Thompson draw ranks first, B is never tried
        d = ask(lane="a", pool=A, move_to=lambda pool: pool == C)
        assert d.admitted and d.pool == C, d
        a.release(d.seat, outcome="clean", seconds=1, now=T0)
    d = ask(lane="a", pool=A, move_to=lambda pool: False)
    assert not d.admitted and d.pool == A                  # nowhere it can run: it stays
    assert ask(lane="a", pool=A, move_to=anywhere).admitted  # a caller that can call every pool moves
