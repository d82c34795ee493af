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
    ("growth interval", "include/pool.lua", "if since >= 0 and since < grow_interval(T, p) then return false end", "",
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
    ("one report per seat", "report.lua", "if s.signalled ~= '' and LOAD[what] then return {STATUS.ALREADY_REPORTED, s.pool, 0, fmt(p.est)} end",
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
    # the doctor (lua/doctor.lua): each check it makes
    ("doctor: a leased seat has its record", "doctor.lua",
     "if s then seats[id] = s else problem('seat-without-record', {id = id}) end", "if s then seats[id] = s end",
     "test_doctor.py", "stray_seat"),
    ("doctor: a leased ticket has its record", "doctor.lua",
     "if t then tickets[id] = t else problem('ticket-without-record', {id = id}) end", "if t then tickets[id] = t end",
     "test_doctor.py", "stray_ticket"),
    ("doctor: a reached seat record has its lease", "doctor.lua",
     "if is_seat and not leased_seat[id] then problem('seat-not-leased', {id = id}) end", "",
     "test_doctor.py", "seat_not_leased"),
    ("doctor: a queued ticket record has its lease", "doctor.lua",
     "problem('ticket-not-leased', {id = id, pool = t.pool or '', lane = t.lane or ''})", "",
     "test_doctor.py", "ticket_not_leased"),
    ("doctor: a record names its lane and pool", "doctor.lua",
     "problem('bad-record', {what = what, id = id, missing = f})", "", "test_doctor.py", "bad_record"),
    ("doctor: pool running and waiting match the records", "doctor.lua",
     "if n and n ~= w[f] then problem('pool-count'", "if false then problem('pool-count'",
     "test_doctor.py", "pool_running or pool_waiting"),
    ("doctor: lane counts match the records", "doctor.lua",
     "if n and n ~= c[2] then", "if false then", "test_doctor.py", "lane_running or lane_waiting or lane_delegated"),
    ("doctor: delegated seats are counted", "doctor.lua",
     "if s.delegated and s.delegated ~= '' then w.deleg = w.deleg + 1 end", "",
     "test_doctor.py", "delegated_seats"),
    ("doctor: no negative lane count", "doctor.lua",
     "if n and n < 0 then problem('negative', {key = lk", "if false then problem('negative', {key = lk",
     "test_doctor.py", "negative_lane"),
    ("doctor: no negative pool count", "doctor.lua",
     "if n and n < 0 then problem('negative', {key = pk", "if false then problem('negative', {key = pk",
     "test_doctor.py", "negative_pool"),
    ("doctor: counts are numbers", "doctor.lua",
     "problem('not-a-number', {key = k, field = field, value = v})", "", "test_doctor.py", "not_a_number"),
    ("doctor: every ticket in its own queue", "doctor.lua",
     "if not redis.call('ZSCORE', key('wait', t.pool, t.lane), id) then", "if false then",
     "test_doctor.py", "dropped_queue_member"),
    ("doctor: every queue member has a ticket", "doctor.lua",
     "problem('queue-member-without-ticket', {pool = p, lane = l, id = id})", "",
     "test_doctor.py", "queue_member_without_ticket"),
    ("doctor: a queue member waits in its ticket's queue", "doctor.lua",
     "elseif t.pool ~= p or t.lane ~= l then", "elseif false then", "test_doctor.py", "queue_member_misplaced"),
    ("doctor: a seat and a ticket never share an id", "doctor.lua",
     "if is_seat and is_ticket then problem('seat-and-ticket', {id = id}) end", "",
     "test_doctor.py", "seat_and_ticket"),
    ("doctor: pools the records name are checked", "doctor.lua",
     "for _, p in ipairs(extra_sorted) do add_pool(p) end", "", "test_doctor.py", "removed_pool"),
    ("doctor: lanes the records name are checked", "doctor.lua",
     "    for l in pairs(w.lanes) do add_lane(l) end\n", "", "test_doctor.py", "removed_lane"),
    ("doctor: lanes the count hash names are checked", "doctor.lua",
     "for _, f in ipairs(fields) do add_lane((string.gsub(f, '|[wd]$', ''))) end", "",
     "test_doctor.py", "removed_lane"),
    ("doctor: works without a policy", "doctor.lua",
     "if not raw then return {} end", "if not raw then fail(ERR.NO_CONFIG, 'no policy') end",
     "test_doctor.py", "no_policy"),
    ("doctor: an unreadable policy is reported", "doctor.lua",
     "problem('bad-config', {field = field})", "", "test_doctor.py", "bad_config"),
    # plan and the census bound in closed form (include/decide.lua in_a_row, rivals; census.lua)
    ("plan: newcomers within the floor", "include/decide.lua", "local k0 = math.max(0, g_me - run)", "local k0 = 0",
     "test_plan_bound.py", "overdraft"),
    ("plan: the floor meets a full measured pool", "include/decide.lua", "if p.exhausted == 1 and C - R0 < k0 then",
     "if false then", "test_plan_bound.py", "floor_meets_full"),
    ("plan: fair share bounds a borrower by the least borrowed", "include/decide.lua",
     "math.floor(r.theirs[r.least.name] * me.weight) + 1 - b0",
     "math.floor(r.theirs[r.least.name] * me.weight) + 4 - b0",
     "test_plan_bound.py", "fair_share"),
    ("plan: p(φ) >= 0.5 inverted with the weight exponent", "include/decide.lua", "1 - 2 * 0.5 ^ (1 / exponent)",
     "1 - 2 * 0.5", "test_plan_bound.py", "weight_exponent"),
    ("plan: the smoothstep inverted", "include/decide.lua", "math.asin(1 - 2 * 0.5 ^ (1 / exponent)) / 3)",
     "math.asin(1 - 2 * 0.5 ^ (1 / exponent)) / 2)", "test_plan_bound.py", "weight_exponent"),
    ("plan: p(φ) >= 0.5 inverted on high_free", "include/decide.lua", "p.est * (1 - T.high_free * s)",
     "p.est * (1 - 0.3 * s)", "test_plan_bound.py", "high_free"),
    ("plan: decide settles the float boundary", "include/decide.lua", "  for _ = 1, 2 do\n    if n > 0",
     "  for _ = 1, 0 do\n    if n > 0", "test_plan_bound.py", "rounding"),
    ("rivals: the least borrowed of the waiting lanes", "include/decide.lua",
     "if not least or t[l.name] < t[least.name] then least = l end", "if not least then least = l end",
     "test_plan_bound.py", "least_of_two"),
    ("rivals: the second-least higher lane", "include/decide.lua",
     "\n    or (h2 and goes_first(t[h2.name], mine, h2, me)) then", " then", "test_plan_bound.py", "one_float"),
    ("rivals: the two least are distinct", "include/decide.lua", "if t[l.name] > t[a.name] and (not b",
     "if t[l.name] >= t[a.name] and (not b", "test_plan_bound.py", "one_float"),
    ("rivals: the census compares with the higher lanes", "include/decide.lua",
     "if hi1 then above1[prio], above2[prio] = hi1, hi2 end", "", "test_plan_bound.py", "one_float"),
    ("rivals: a priority group is not higher than itself", "include/decide.lua",
     "if only == nil and l.priority ~= prio then", "if only == nil then", "test_plan_bound.py", "one_float"),
    ("census: a lane's own guaranteed as the asker", "include/census.lua",
     "local g_ask = guaranteed(cfg, {run = L.run, wait = asks, del = L.del}, C, nil)", "local g_ask = g",
     "test_plan_bound.py", "own_guaranteed"),
    ("census: a lane listed for its spend only", "include/census.lua", "if run > 0 and wait == 0 then",
     "if wait == 0 then", "test_plan_bound.py", "spend_only"),
    # issue 6: nothing orphaned, nothing over-admitted (tests/test_unbreakable.py)
    ("heartbeat renews only tickets of live lanes and pools", "heartbeat.lua",
     "if t and t.pod == pod and cfg.lane[t.lane] and redis.call('HEXISTS', KEYS[1], 'pool:' .. t.pool) == 1 then",
     "if t and t.pod == pod then", "test_unbreakable.py", "renews_only_tickets"),
    ("a live policy change never lapses a seat", "heartbeat.lua", "lane = check_name('lane', ARGV[b + 2])",
     "lane = check_lane(cfg, ARGV[b + 2])", "test_unbreakable.py", "never_lapses"),
    ("same intent drops the asker's ticket", "admit.lua",
     "    if ticket then drop_ticket(id, ticket) end\n    local p = load_pool(T, seat.pool)",
     "    local p = load_pool(T, seat.pool)", "test_unbreakable.py", "one_id_one_holder"),
    ("re-assertion drops a ticket of the same id", "heartbeat.lua", "if t then drop_ticket(s.id, t) end", "",
     "test_unbreakable.py", "one_id_one_holder"),
    ("a refused try elsewhere keeps the waiter's place", "admit.lua",
     "local elsewhere = ticket and (ticket.pool ~= pool or ticket.lane ~= lane)",
     "local elsewhere = false\n  if ticket and (ticket.pool ~= pool or ticket.lane ~= lane) then drop_ticket(id, ticket); ticket = nil end",
     "test_unbreakable.py", "keeps_the_waiters_place"),
    ("an admission wakes the next waiters", "admit.lua", "if waiting > 0 and p.running < slots(p) then wake(pool) end", "",
     "test_unbreakable.py", "wakes_the_next_waiters"),
    ("recovery hold", "admit.lua", "if now < cfg.hold_until then reason = 'recovering' end", "",
     "test_unbreakable.py", "recovery_hold"),
    ("a hold only for a mesh without a policy", "apply_config.lua", "if want_hold and current == 0 then", "if want_hold then",
     "test_unbreakable.py", "second_apply_holds_nothing"),
    ("a caller's now only on a caller-clock mesh", "include/util.lua",
     "if c[1] and c[2] ~= 'caller' then fail(ERR.BAD_ARG, CALLER_CLOCK_ONLY) end", "",
     "test_unbreakable.py", "callers_now_is_refused"),
    ("growth survives a clock that steps back", "include/pool.lua", "if since >= 0 and since < grow_interval(T, p)",
     "if since < grow_interval(T, p)", "test_unbreakable.py", "clock_that_steps_back"),
    ("one charge at most 1e6 USD", "include/outcome.lua", "if cost ~= math.floor(cost) or cost > MAX_COST_MICRO then",
     "if cost ~= math.floor(cost) then", "test_unbreakable.py", "money_out_of_range"),
    ("a ledger entry stays within 2^53", "include/outcome.lua", "if cost > MAX_LEDGER_MICRO - (tonumber(v[i]) or 0) then", "if false then",
     "test_unbreakable.py", "money_out_of_range"),
    ("policy size bounded in the script", "apply_config.lua", "need(#policy.pools <= MAX_POOLS,", "need(true,",
     "test_unbreakable.py", "policy_size_is_bounded"),
    ("spend of a removed pool booked to its provider", "include/outcome.lua",
     "or string.match(pool, '@([^@]*)$') or ''", "or ''", "test_unbreakable.py", "never_lapses"),
    # the provider's day (tests/test_rules_provider.py)
    ("closure is provider-wide", "include/provider.lua", "  return pv.closedUntil > now\n", "  return false\n",
     "test_rules_provider.py", "provider_wide"),
    ("closed until midnight for the daily limit", "include/provider.lua", "elseif CLOSE_UNTIL_MIDNIGHT[why] then",
     "elseif false then", "test_rules_provider.py", "closed_until_midnight"),
    ("one probe every probe_every while nothing runs", "include/provider.lua",
     "return p.running == 0 and now - pv.lastProbe >= T.probe_every", "return true",
     "test_rules_provider.py", "probe_cadence"),
    ("a clean probe reopens", "include/outcome.lua", "if s.probe == '1' then", "if false then",
     "test_rules_provider.py", "probe_that_ends_clean"),
    ("a closing signal closes (a refused probe re-closes)", "include/outcome.lua",
     "if CLOSING[what] then close_provider(cfg, provider_of(p.name), now, what) end", "",
     "test_rules_provider.py", "recloses or provider_wide"),
    ("a closure expires by itself", "include/provider.lua", "  return pv.closedUntil > now\n",
     "  return pv.closedUntil > 0\n", "test_rules_provider.py", "expires_by_itself"),
    ("budget reserve", "include/provider.lua", "left >= m.mc and left >= m.reserve_line", "left >= m.mc",
     "test_rules_provider.py", "budget_reserve_stops"),
    ("the budget keeps to its day", "include/provider.lua", "local spent = tonumber(redis.call('HGET', key('spend', day)",
     "local spent = tonumber(redis.call('HGET', key('spend', 'all')", "test_rules_provider.py", "keeps_to_its_day"),
    ("the day's budget spent closes the provider", "admit.lua",
     "if bud and bud.spent >= bud.limit and not is_closed(pv, now) then", "if false then",
     "test_rules_provider.py", "days_budget_spent_closes"),
    ("committed spend", "include/provider.lua",
     "committed = committed + (tonumber(v[1]) or 0) * (tonumber(v[2]) or 0)", "committed = 0",
     "test_rules_provider.py", "committed_spend"),
    ("the smaller limit", "include/provider.lua", "limit = limit and math.min(limit, pv.readLimit) or pv.readLimit",
     "limit = limit or pv.readLimit", "test_rules_provider.py", "smaller_limit"),
    ("a reading of another day stops nobody", "include/provider.lua", "local today = pv.readDay == day",
     "local today = true", "test_rules_provider.py", "smaller_limit"),
    ("a reading whose spent reached its limit closes", "budget.lua",
     "if b and b.spent >= b.limit and not is_closed(pv, now) then", "if false then",
     "test_rules_provider.py", "reading_whose_spent_reached"),
    ("a reading from the future is refused", "budget.lua", "if at > now + READING_SKEW then", "if false then",
     "test_rules_provider.py", "bad_budget_readings"),
    ("a charge counts once per key", "include/outcome.lua", "fmt(cost), 'NX', 'EX'", "fmt(cost), 'EX'",
     "test_rules_provider.py", "counts_once_per_key"),
    ("a release's cost is booked under its own key", "include/outcome.lua",
     "book(id, 'release', s.lane, p.name, at, cost_micro)", "book(id, 'release' .. now, s.lane, p.name, at, cost_micro)",
     "test_rules_provider.py", "release_cost_counts_once"),
    ("a cost is booked to the day it was incurred", "release.lua", "local at = check_at(ARGV[8], now)",
     "local at = now", "test_rules_provider.py", "booked_to_the_day"),
    ("a closing signal mid-round is not held back", "report.lua", "if s.signalled ~= '' and LOAD[what] then",
     "if s.signalled ~= '' then", "test_rules_provider.py", "closing_signal_reported_mid_round"),
    ("the roll-over runs once a day", "rollover.lua", "fmt(now), 'NX', 'EX'", "fmt(now), 'EX'",
     "test_rules_provider.py", "runs_once_per_day"),
    ("the roll-over reopens expired closures", "rollover.lua", "if pv.closedUntil > 0 and pv.closedUntil <= now then",
     "if false then", "test_rules_provider.py", "runs_once_per_day"),
    ("a closed provider with work waiting starves first", "include/census.lua", "if closed and p.waiting > 0 then",
     "if false then", "test_rules_provider.py", "starving_first"),
    ("cost guard", "include/decide.lua", "if guarded then return false, 'cost-guard', 0 end", "",
     "test_rules_provider.py", "cost_guard_per_provider"),
    ("the cost guard counts rounds in flight", "include/provider.lua",
     "if run > 0 then spent = spent + run * (tonumber(redis.call('HGET', key('pool', pool), 'meanCost')) or 0) end",
     "", "test_rules_provider.py", "rounds_in_flight"),
    ("plan counts the budget", "include/decide.lua", "if kb then n = math.min(n, kb) end", "",
     "test_rules_provider.py", "money_like_admit"),
    ("plan counts the cost guard", "include/decide.lua", "if kg then n = math.min(n, kg) end", "",
     "test_rules_provider.py", "money_like_admit"),
    ("plan of a closed provider is its probe", "plan.lua",
     "if g == 'probe' then return (wanted > 0 and L.wait[lane] == 0) and 1 or 0 end", "if g == 'probe' then return wanted end",
     "test_rules_provider.py", "closed_provider_is_its_probe"),
    ("no probe while the day's budget is spent", "include/provider.lua",
     "(not spent_out and probe_due(T, pv, p, now))", "probe_due(T, pv, p, now)", "test_rules_provider.py", "no_probe_while"),
    ("a round starts only while its mean cost is left", "include/provider.lua", "left > 0 and left >= m.mc and",
     "left > 0 and", "test_rules_provider.py", "mean_cost_is_left"),
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
