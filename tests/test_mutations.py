"""Every rule has a test that fails when the rule is removed: each mutation below removes or
breaks one rule in a copy of the Lua, and the named tests must turn red (on fakeredis, in a
subprocess pointed at the copy with ADMISSION_LUA_DIR)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from admission._paths import lua_dir

TESTS = Path(__file__).resolve().parent

# (rule, file, text to find, replacement, test file, -k expression of the tests that must fail)
MUTATIONS = [
    ("seed", "include/pool.lua", "p.est = T.seed_estimate", "p.est = 1", "test_rules_estimate.py", "seed_estimate"),
    ("growth needs demand", "include/pool.lua", "if not has_demand(T, p, now) then return false end", "",
     "test_rules_estimate.py", "needs_demand"),
    ("slow start", "include/pool.lua", "p.est * T.slow_start_factor", "(p.est + 1)", "test_rules_estimate.py", "slow_start"),
    ("growth interval", "include/pool.lua", "if now - p.lastGrow < grow_interval(T, p) then return false end", "",
     "test_rules_estimate.py", "slow_start"),
    ("logistic growth", "include/pool.lua", "local step = math.max(T.growth_rate * p.est * (1 - p.est / p.cap), 0.25)\n      p.est",
     "local step = 1\n      p.est", "test_rules_estimate.py", "logistic_growth_once_measured"),
    ("growth at least a quarter", "include/pool.lua", "(1 - p.est / p.cap), 0.25)\n      p.est", "(1 - p.est / p.cap), 0)\n      p.est",
     "test_rules_estimate.py", "at_least_a_quarter"),
    ("growth waits for a clean round", "include/pool.lua", "if p.clean < 1 then return false end", "",
     "test_rules_estimate.py", "clean_round_since"),
    ("growth waits half the mean round time", "include/pool.lua", "return math.max(T.grow_interval, p.meanSec / 2)",
     "return T.grow_interval", "test_rules_estimate.py", "half_the_mean"),
    ("upward probing", "include/pool.lua", "p.cap = math.min(T.max_estimate, p.cap + 1)", "p.cap = p.cap",
     "test_rules_estimate.py", "upward_probing"),
    ("decrease to factor·n", "include/pool.lua", "p.est = math.max(1, T.decrease_factor * n)", "p.est = math.max(1, n)",
     "test_rules_estimate.py", "decrease_on_a_load_signal"),
    ("once per burst", "include/pool.lua", "if seat_seq <= p.holdSeq then return false end", "",
     "test_rules_estimate.py", "once_per_burst"),
    ("counts halve", "include/pool.lua", "if p.succ + p.fail > 200 then", "if false then", "test_rules_estimate.py", "halve"),
    ("ewma", "include/pool.lua", "return mean + EWMA * (x - mean)", "return x", "test_rules_estimate.py", "ewma"),
    ("rate limit is load", "include/outcome.lua", "local LOAD = {rate_limited = true,", "local LOAD = {",
     "test_rules_estimate.py", "load_signals"),
    ("one report per seat", "report.lua", "if s.signalled ~= '' then return {STATUS.ALREADY_REPORTED, s.pool, 0, fmt(p.est)} end",
     "", "test_rules_estimate.py", "stall_reported_mid_round"),
    ("remainder ties to priority", "include/lanes.lua", "(1023 - i))", "i)", "test_rules_lanes.py", "ties_to_priority"),
    ("floors by floor share", "include/lanes.lua", "g[l.name] = math.floor(q)", "g[l.name] = 0", "test_rules_lanes.py", "floors"),
    ("largest remainder", "include/lanes.lua", "for i = 1, math.min(left, #keys) do", "for i = 1, 0 do",
     "test_rules_lanes.py", "largest_remainder"),
    ("floors only for lanes with work", "include/lanes.lua", "if L.run[l.name] > 0 or L.wait[l.name] > 0 or l.name == asking then",
     "if true then", "test_rules_lanes.py", "only_for_lanes"),
    ("at least one for a waiting lane", "include/lanes.lua", "if waiting and l.floor > 0 and g[l.name] == 0 then g[l.name] = 1 end",
     "", "test_rules_lanes.py", "at_least_one"),
    ("within floor", "include/decide.lua", "if free > 0 then return true, 'within-floor', 1 end", "",
     "test_rules_lanes.py", "within_floor"),
    ("overdraft", "include/decide.lua", "if p.exhausted ~= 1 then return true, 'overdraft', 1 end", "",
     "test_rules_lanes.py", "overdraft_on"),
    ("no overdraft once measured", "include/decide.lua", "if p.exhausted ~= 1 then return true, 'overdraft', 1 end",
     "return true, 'overdraft', 1", "test_rules_lanes.py", "overdraft_not_on"),
    ("reserved", "include/decide.lua", "if owed > 0 and free <= owed then return false, 'reserved', 0 end", "",
     "test_rules_lanes.py", "reserved or reclaim"),
    ("fair share", "include/decide.lua", "return false, 'fair-share', 0", "local _ = 0", "test_rules_lanes.py", "fair_share"),
    ("fair share ties to priority", "include/decide.lua",
     " or (math.abs(theirs - mine) <= 1e-12 and l.priority > me.priority)", "", "test_rules_lanes.py", "ties"),
    ("probability", "include/decide.lua", "local prob = p_phi(T, 1 - p.running / p.est) ^ exponent", "local prob = 1",
     "test_rules_lanes.py", "smoothstep or weight_exponent"),
    ("certain above high_free", "include/decide.lua", "if phi >= T.high_free then return 1 end", "",
     "test_rules_lanes.py", "certain_while"),
    ("weight exponent", "include/decide.lua", "local exponent = math.min(4, math.max(1, cfg.max_weight / me.weight))",
     "local exponent = 1", "test_rules_lanes.py", "raised_to_the_weight"),
    ("exponent clamped to 4", "include/decide.lua", "math.min(4, math.max(1,", "math.min(400, math.max(1,",
     "test_rules_lanes.py", "clamped"),
    ("no borrow past the slots", "include/decide.lua", "if free <= 0 then return false, 'full', 0 end", "",
     "test_rules_lanes.py", "zero_at_a_full_pool"),
    ("plan counts p >= 0.5", "include/decide.lua", "return prob >= 0.5, prob >= 0.5", "return prob >= 0.9, prob >= 0.9",
     "test_rules_lanes.py", "plan_counts"),
    ("first come, first served at the same moment", "include/seats.lua",
     "if newest and tonumber(newest) >= since then since = tonumber(newest) + 1e-6 end", "",
     "test_rules_lanes.py", "same_moment"),
    ("oldest first", "admit.lua", "if oldest ~= id then reason = 'behind-older' end", "", "test_rules_lanes.py", "oldest_first"),
    ("starvation", "include/census.lua", "now - row.oldestWaitingSince > T.starved_after", "false",
     "test_rules_lanes.py", "starvation"),
    ("must yield listed", "include/census.lua", "mustYield = owed > 0 and borrowers or {}", "mustYield = {}",
     "test_rules_lanes.py", "reclaim"),
    ("one decision per intent", "admit.lua", "  if seat then\n", "  if false then\n", "test_rules_lanes.py", "same_intent"),
    ("sweep of expired leases", "include/seats.lua", "key('seats'), '-inf', now, 'LIMIT', 0, limit)",
     "key('seats'), '-inf', 0, 'LIMIT', 0, limit)", "test_client.py", "killed_pod"),
    ("bounded sweep", "include/seats.lua", "'-inf', now, 'LIMIT', 0, limit)", "'-inf', now)", "test_client.py", "bounded"),
    ("heartbeat renews", "heartbeat.lua", "redis.call('ZADD', key('seats'), until_, s.id)", "", "test_client.py", "heartbeat_renews"),
    ("release counts once", "release.lua", "if gone.state == 'released' then return {STATUS.ALREADY_RELEASED, gone.pool, 0, ''} end",
     "", "test_client.py", "release_retried"),
    ("admit sweeps before deciding", "admit.lua", "  sweep(now, SWEEP_PER_ADMIT)\n", "", "test_client.py", "admit_sweeps"),
]


def _mutant(tmp: Path, file: str, find: str, replace: str) -> Path:
    root = tmp / "lua"
    shutil.copytree(lua_dir(), root)
    path = root / file
    text = path.read_text()
    assert find in text, f"mutation target not found in {file}: {find!r}"
    path.write_text(text.replace(find, replace, 1))
    return root


def _run(root: Path, test_file: str, expr: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "ADMISSION_LUA_DIR": str(root), "ADMISSION_ENGINES": "fakeredis"}
    env.pop("ADMISSION_REQUIRE_ENGINES", None)
    return subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:randomly",
                           str(TESTS / test_file), "-k", expr], env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_every_rule_has_a_test_that_fails_when_the_rule_is_removed(tmp_path):
    def one(i_m):
        i, (rule, file, find, replace, test_file, expr) = i_m
        root = _mutant(tmp_path / str(i), file, find, replace)
        out = _run(root, test_file, expr)
        ran = "passed" in out.stdout or "failed" in out.stdout
        return rule, out.returncode, ran, out.stdout[-400:]

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(one, enumerate(MUTATIONS)))
    survivors = [(rule, tail) for rule, code, ran, tail in results if code == 0 or not ran]
    assert not survivors, "mutations that no test caught:\n" + "\n".join(f"- {r}: {t}" for r, t in survivors)


def test_the_unmutated_lua_passes_the_same_selections(tmp_path):
    """The control: the selections pass on an unmutated copy, so a red mutant means the rule."""
    root = _mutant(tmp_path, "admit.lua", "--", "--")
    for test_file in sorted({m[4] for m in MUTATIONS}):
        out = _run(root, test_file, " or ".join(sorted({m[5] for m in MUTATIONS if m[4] == test_file})))
        assert out.returncode == 0, out.stdout[-2000:]
