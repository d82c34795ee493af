"""The policy file: TOML read with tomllib, validated, versioned, applied atomically, live."""
from __future__ import annotations

from pathlib import Path

import pytest

from admission import PolicyError, StaleVersion
from admission import policy as policy_mod

from helpers import POOL, T0, Rounds, adm, policy

EXAMPLE = Path(__file__).resolve().parent.parent / "deploy" / "policy.example.toml"


def test_the_example_policy_has_the_seeds_lanes():
    p = policy_mod.load(EXAMPLE)
    names = [l["name"] for l in p["lanes"]]
    assert set(names) == {"express", "watchdog", "babysitter", "reviews", "bugfix", "triage", "embeddings"}
    assert names[0] == "express"                    # sorted by priority, highest first
    assert sum(l["floor"] for l in p["lanes"]) <= 1


def test_defaults_fill_every_tunable_and_reserve():
    p = policy_mod.validate(policy({"triage": {"floor": 0.1}, "other": {}}))
    assert set(p["tunables"]) == set(policy_mod.TUNABLES)
    assert p["tunables"]["grow_interval"] == 15 and p["tunables"]["seed_estimate"] == 2
    reserves = {l["name"]: l["reserve"] for l in p["lanes"]}
    assert reserves == {"triage": 0.30, "other": 0.15}


def test_malformed_toml_is_a_clear_error(tmp_path):
    f = tmp_path / "p.toml"
    f.write_text("[lanes.a\nfloor = ")
    with pytest.raises(PolicyError, match="not valid TOML"):
        policy_mod.load(f)
    with pytest.raises(PolicyError, match="not found"):
        policy_mod.load(tmp_path / "missing.toml")


def test_retired_max_concurrent_agents_warns_why():
    with pytest.warns(UserWarning, match="no absolute number of concurrent rounds"):
        with pytest.raises(PolicyError, match="retired"):
            policy_mod.validate({**policy(), "maxConcurrentAgents": 8})


def test_apply_bumps_the_version_and_is_compare_and_set(redis_client):
    a = adm(redis_client)
    assert a.policy()["version"] == 1
    assert a.ops.apply_policy(policy(), expected_version=1) == 2
    with pytest.raises(StaleVersion):
        a.ops.apply_policy(policy(), expected_version=1)


def test_apply_from_a_file(redis_client):
    a = adm(redis_client, apply=False)
    assert a.ops.apply_policy(str(EXAMPLE)) == 1
    assert len(a.policy()["lanes"]) == 7


def test_running_clients_pick_up_a_new_version_without_restart(redis_client):
    a = adm(redis_client, pol=policy({"x": {"floor": 0, "weight": 1, "priority": 1}}))
    other_pod = adm(redis_client, pod="pod-b", apply=False)
    r = Rounds(a)
    r.fill("x", 2)
    assert not r.ask("x").admitted                 # seed 2: full
    a.ops.apply_policy(policy({"x": {"floor": 0, "weight": 1, "priority": 1},
                           "new": {"floor": 0.5, "weight": 1, "priority": 2}}))
    d = other_pod.try_admit(lane="new", model=POOL, round_id="n1", now=T0, draw=0.0)
    assert d.admitted and d.config_version == 2   # the new lane is known at once, floor overdraft
    assert a.tunables()["grow_interval"] == 15


def test_removed_pools_leave_the_catalog(redis_client):
    a = adm(redis_client, pol=policy(pools=("m@p", "n@p")))
    a.ops.apply_policy(policy(pools=("m@p",)))
    assert [p["pool"] for p in a.ops.census(now=T0)["pools"]] == ["m@p"]


@pytest.mark.parametrize("key", policy_mod.PRICE_KEYS)
@pytest.mark.parametrize("bad", [-0.01, "1.0", True, float("nan"), float("inf"), 2e6])
def test_pool_prices_are_checked_with_a_clear_error(key, bad):
    pol = policy()
    pol["pools"][POOL] = {key: bad}
    with pytest.raises(PolicyError, match=f"pools.{POOL}.{key}"):
        policy_mod.validate(pol)


def test_pool_prices_are_kept_and_a_bad_one_changes_nothing_in_redis(redis_client):
    from helpers import snapshot
    a = adm(redis_client)
    good = policy()
    good["pools"][POOL] = {"price_input": 2.5, "price_output": 10, "price_cached_input": 0.25}
    a.ops.apply_policy(good, recovery_hold=False)
    assert next(p for p in a.policy()["pools"] if p["name"] == POOL)["price_output"] == 10
    before = snapshot(redis_client)
    bad = policy()
    bad["pools"][POOL] = {"price_input": -1}
    with pytest.raises(PolicyError, match="price_input"):
        a.ops.apply_policy(bad, recovery_hold=False)
    assert snapshot(redis_client) == before
