"""Tiers, explicit alternatives, pins and agents (DESIGN §7): validation and the default lists
(the runtime fallback that uses them: tests/test_rules_moves.py)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from admission import PolicyError
from admission import policy as policy_mod
from admission.alternatives import alternatives, may_move_to

from helpers import policy

EXAMPLE = str(Path(__file__).resolve().parent.parent / "deploy" / "policy.example.toml")

PROVIDERS = {
    "anthropic": {"route": "global", "kind": "direct"},
    "openrouter": {"route": "global", "kind": "router"},
    "azure-eu": {"route": "eu", "kind": "direct"},
    "bedrock-eu": {"route": "eu", "kind": "router"},
    "vertex": {"route": "global", "kind": "direct"},
}


def pol(pools: tuple[str, ...], **tables: Any) -> dict[str, Any]:
    raw = policy(pools=pools)
    raw["providers"] = {p.rpartition("@")[2]: PROVIDERS[p.rpartition("@")[2]] for p in pools}
    raw.update(tables)
    return raw


def alts(pools: tuple[str, ...], **tables: Any) -> dict[str, list[str]]:
    return alternatives(policy_mod.validate(pol(pools, **tables)))


# -- default alternatives -------------------------------------------------------------------------

def test_default_order_same_model_other_provider_first_then_tier_models_in_token_order_own_provider_first():
    pools = ("glm@anthropic", "glm@openrouter", "opus@openrouter", "sonnet@anthropic", "sonnet@openrouter",
             "sonnet@vertex", "gpt@vertex", "gpt@openrouter")
    got = alts(pools, tiers={"big": ["sonnet", "gpt", "glm"], "top": ["opus"]})
    # same model on other providers (by pool name), then gpt then glm (token order), each model's
    # own-provider pool first; opus is another tier.
    assert got["sonnet@openrouter"] == ["sonnet@anthropic", "sonnet@vertex",
                                        "gpt@openrouter", "gpt@vertex", "glm@openrouter", "glm@anthropic"]
    assert got["sonnet@anthropic"] == ["sonnet@openrouter", "sonnet@vertex",
                                       "gpt@openrouter", "gpt@vertex", "glm@anthropic", "glm@openrouter"]
    assert got["opus@openrouter"] == []          # alone in its tier
    assert list(got) == sorted(pools)            # every pool, deterministic order


def test_default_tier_membership_is_a_case_insensitive_substring_of_the_model_id():
    got = alts(("Claude-Sonnet-4.5@anthropic", "claude-opus@anthropic"), tiers={"mid": ["sonnet", "OPUS"]})
    assert got["Claude-Sonnet-4.5@anthropic"] == ["claude-opus@anthropic"]


def test_eu_route_may_move_to_eu_and_to_direct_never_to_a_non_eu_router():
    eu, eu_router = PROVIDERS["azure-eu"], PROVIDERS["bedrock-eu"]
    assert may_move_to(eu, eu_router)                       # EU -> EU (even a router)
    assert may_move_to(eu, PROVIDERS["anthropic"])          # EU -> direct
    assert not may_move_to(eu, PROVIDERS["openrouter"])     # EU -> non-EU router: refused
    assert may_move_to(PROVIDERS["openrouter"], eu)         # global -> anywhere
    got = alts(("sonnet@azure-eu", "sonnet@bedrock-eu", "sonnet@anthropic", "sonnet@openrouter"),
               tiers={"mid": ["sonnet"]})
    assert got["sonnet@azure-eu"] == ["sonnet@anthropic", "sonnet@bedrock-eu"]
    assert got["sonnet@openrouter"] == ["sonnet@anthropic", "sonnet@azure-eu", "sonnet@bedrock-eu"]


def test_explicit_alternatives_replace_the_defaults():
    pools = ("sonnet@anthropic", "sonnet@openrouter", "glm@openrouter", "gpt@vertex")
    tiers = {"mid": ["sonnet", "glm", "gpt"]}
    got = alts(pools, tiers=tiers, alternatives={"sonnet": ["gpt@vertex"], "glm@openrouter": []})
    assert got["sonnet@anthropic"] == ["gpt@vertex"]         # by model: every pool of the model
    assert got["sonnet@openrouter"] == ["gpt@vertex"]
    assert got["glm@openrouter"] == []                       # an empty entry: no fallback at all
    assert got["gpt@vertex"] == ["sonnet@anthropic", "sonnet@openrouter", "glm@openrouter"]  # defaults
    got = alts(pools, tiers=tiers, alternatives={"sonnet": ["gpt@vertex"], "sonnet@anthropic": ["glm@openrouter"]})
    assert got["sonnet@anthropic"] == ["glm@openrouter"]    # the pool's entry wins over its model's
    assert got["sonnet@openrouter"] == ["gpt@vertex"]
    # a model entry keeps to the EU route and never lists the pool itself
    got = alts(("sonnet@azure-eu", "sonnet@openrouter", "gpt@vertex"),
               alternatives={"sonnet": ["sonnet@openrouter", "sonnet@azure-eu", "gpt@vertex"]})
    assert got["sonnet@azure-eu"] == ["gpt@vertex"]
    assert got["sonnet@openrouter"] == ["sonnet@azure-eu", "gpt@vertex"]


def test_a_model_in_no_tier_has_no_defaults():
    got = alts(("llama@anthropic", "llama@openrouter", "sonnet@anthropic"), tiers={"mid": ["sonnet"]})
    assert got["llama@anthropic"] == [] and got["llama@openrouter"] == []
    assert alts(("llama@anthropic", "llama@openrouter"))["llama@anthropic"] == []   # default tiers: none
    assert alts(("sonnet@anthropic", "sonnet@openrouter"), tiers={})["sonnet@anthropic"] == []   # tiers off


def test_default_tiers_when_the_policy_has_none():
    """No [tiers]: one tier per model family (opus, sonnet, haiku), so a family falls back to itself
    on another provider and to its other versions, never across families."""
    got = alts(("claude-sonnet-4@anthropic", "claude-sonnet-4@openrouter", "claude-sonnet-4.5@anthropic",
                "claude-opus-4@anthropic", "claude-haiku@vertex"))
    assert got["claude-sonnet-4@anthropic"] == ["claude-sonnet-4@openrouter", "claude-sonnet-4.5@anthropic"]
    assert got["claude-opus-4@anthropic"] == [] and got["claude-haiku@vertex"] == []
    assert policy_mod.validate(policy())["tiers"] == policy_mod.DEFAULT_TIERS


# -- validation -----------------------------------------------------------------------------------

def test_absent_tables_normalize_to_empty_shapes():
    p = policy_mod.validate(policy())
    assert (p["tiers"], p["alternatives"], p["pins"], p["agents"]) == (
        policy_mod.DEFAULT_TIERS, {}, {"lanes": [], "agents": []}, {})


def test_the_tables_are_kept_in_the_normalized_policy():
    p = policy_mod.validate(pol(("sonnet@anthropic", "sonnet@openrouter"), tiers={"mid": ["sonnet"]},
                                alternatives={"sonnet@anthropic": ["sonnet@openrouter"]},
                                pins={"lanes": ["a"], "agents": ["bot-1"]}, agents={"bot-1": "b"}))
    assert p["tiers"] == {"mid": ["sonnet"]}
    assert p["alternatives"] == {"sonnet@anthropic": ["sonnet@openrouter"]}
    assert p["pins"] == {"lanes": ["a"], "agents": ["bot-1"]}
    assert p["agents"] == {"bot-1": "b"}


@pytest.mark.parametrize("tables, message", [
    ({"alternatives": {"m@p": ["nope@p"]}}, r"nope@p not in \[pools\]"),
    ({"alternatives": {"x@p": ["m@p"]}}, r"pool 'x@p' is not in \[pools\]"),
    ({"alternatives": {"x": ["m@p"]}}, "model 'x' is the model of no pool"),
    ({"alternatives": {"m@p": ["m@p"]}}, "may not list itself"),
    ({"alternatives": {"m@p": "n@p"}}, "list of names"),
])
def test_validation_unknown_pool_in_alternatives(tables, message):
    with pytest.raises(PolicyError, match=message):
        policy_mod.validate({**policy(pools=("m@p", "n@p")), **tables})


def test_validation_explicit_pool_entry_may_not_leave_the_eu_route():
    with pytest.raises(PolicyError, match="EU-routed pool to a non-EU router"):
        policy_mod.validate(pol(("m@azure-eu", "m@openrouter"), alternatives={"m@azure-eu": ["m@openrouter"]}))


@pytest.mark.parametrize("tables, message", [
    ({"pins": {"lanes": ["ghost"]}}, r"pins.lanes: ghost not declared under \[lanes\]"),
    ({"agents": {"bot": "ghost"}}, r"lane 'ghost' is not declared under \[lanes\]"),
    ({"pins": {"lanes": "a"}}, "pins.lanes must be a list"),
    ({"pins": {"lane": ["a"]}}, r"\[pins\]: unknown key\(s\) lane"),
    ({"agents": {"bot": 3}}, "must name a lane"),
])
def test_validation_unknown_lane_in_pins_or_agents(tables, message):
    with pytest.raises(PolicyError, match=message):
        policy_mod.validate({**policy(), **tables})


def test_validation_a_model_in_two_tiers():
    with pytest.raises(PolicyError, match=r"model 'claude-sonnet-opus' is in two tiers \(mid, top\)"):
        policy_mod.validate(policy(pools=("claude-sonnet-opus@p",)) | {"tiers": {"mid": ["sonnet"], "top": ["OPUS"]}})
    # overlapping tokens are fine while no model of the catalog carries both
    policy_mod.validate(policy(pools=("sonnet@p",)) | {"tiers": {"mid": ["sonnet"], "top": ["opus"]}})


@pytest.mark.parametrize("tables, message", [
    ({"tiers": {"mid": []}}, "non-empty list of model-id tokens"),
    ({"tiers": {"mid": ["sonnet", ""]}}, "non-empty list of model-id tokens"),
    ({"tiers": {"mid": ["a", "A"]}}, "listed twice"),
    ({"tiers": {"bad tier": ["x"]}}, "only letters, digits"),
    ({"tiers": ["x"]}, r"\[tiers\] must be a table"),
    ({"agents": {"bad{agent}": "a"}}, "only letters, digits"),
    ({"agents": {"bot": "a|b"}}, "only letters, digits"),
    ({"pins": {"agents": ["ok", "no space"]}}, "only letters, digits"),
    ({"pins": {"agents": ["x", "x"]}}, "listed twice"),
    ({"alternatives": {"m@p": [""]}}, "only letters, digits"),
])
def test_validation_bad_names(tables, message):
    with pytest.raises(PolicyError, match=message):
        policy_mod.validate({**policy(), **tables})


# -- CLI ------------------------------------------------------------------------------------------

def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "admission", *args], capture_output=True, text=True, timeout=60)


def test_cli_config_show_alternatives(server_url):
    conn = ["--url", server_url, "--mesh", "alts"]
    out = run("config", "show", "--alternatives", *conn)
    assert out.returncode == 4 and "no policy applied" in out.stderr   # exit 4: no policy
    assert run("config", "apply", EXAMPLE, *conn).returncode == 0
    out = run("config", "show", "--alternatives", *conn)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "glm@openrouter -> sonnet@openrouter, sonnet@anthropic, gpt@azure-eu",
        "gpt@azure-eu -> sonnet@anthropic",                       # never to the openrouter pools
        "opus@anthropic -> sonnet@anthropic (explicit)",
        "sonnet@anthropic -> sonnet@openrouter, glm@openrouter, gpt@azure-eu",
        "sonnet@openrouter -> sonnet@anthropic, glm@openrouter, gpt@azure-eu",
    ]
