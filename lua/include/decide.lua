-- Deciding one round on one pool (DESIGN §5, checks 4–8), a pure function of the pool state `p`,
-- the lane counts `L`, the draw `u` and whether the lane reached its cost guard. Returns
-- admitted, reason, p_phi. With u == nil (plan) a marginal admission is counted when p(φ) >= 0.5.
-- The checks before it (delegation, closure, the budget and its reserve, oldest first) run in
-- admit.lua; plan and the census count them with the money context `m` (provider.lua money()).
-- plan() and the census count the newcomers decide would admit in a row without running it once
-- per newcomer (in_a_row): O(lanes) per pool, then O(1) per lane, whatever the estimate.
--- @include "capline"
--- @include "lanes"
--- @include "pool"
--- @include "provider"
local ceiling_room, under_ceiling = Capline.ceiling_room, Capline.under_ceiling
local borrowed, guaranteed, quota = Lanes.borrowed, Lanes.guaranteed, Lanes.quota
local slots = Pool.slots
local budget_ok = Provider.budget_ok

-- p(φ): 1 while φ >= high_free, smoothstep of φ/high_free below, 0 at φ <= 0.
local function p_phi(T, phi)
  if phi >= T.high_free then return 1 end
  if phi <= 0 then return 0 end
  local x = phi / T.high_free
  return x * x * (3 - 2 * x)
end

-- The weight exponent of p(φ): a lighter lane needs more free room to borrow.
local function weight_exponent(cfg, me)
  local exponent = math.min(4, math.max(1, cfg.max_weight / me.weight))
  return exponent
end

-- Fair share (check 7) against one waiting lane l: it goes first when it borrowed less per
-- weight than the asker, or as much with a higher priority.
local function goes_first(theirs, mine, l, me)
  return theirs < mine - 1e-12 or (math.abs(theirs - mine) <= 1e-12 and l.priority > me.priority)
end

-- a, b: the lanes of the least and the second-least distinct `theirs` (t), with lane l added.
local function two_least(t, a, b, l)
  if not l then return a, b end
  if not a or t[l.name] < t[a.name] then return l, a end
  if t[l.name] > t[a.name] and (not b or t[l.name] < t[b.name]) then return a, l end
  return a, b
end

-- What a decision needs of the other lanes (with work waiting, `except` left out: the asker; nil
-- for a census of lanes without waiters), for guaranteed slots g. O(lanes), once per pool:
--   owed    free slots owed to them while below their floors (reserved)
--   theirs  their borrowed per weight, by name
--   least   one of them with the least `theirs`: some lane goes first by `theirs < mine - 1e-12`
--           exactly when this one does
--   above1, above2  per priority P: those of the least and second-least distinct `theirs` among
--           them with priority > P. The tie window |theirs - mine| <= 1e-12 starts at most one
--           float above the least `theirs` that passes the first test, so a higher lane ties
--           exactly when one of these two does.
-- `only`: the one priority an admit asks for (cheaper); nil: every priority (the census).
local function rivals(cfg, L, g, except, only)
  local t, above1, above2, owed, least = {}, {}, {}, 0, nil
  local hi1, hi2, grp1, grp2, prio = nil, nil, nil, nil, nil
  for _, l in ipairs(cfg.lanes) do -- by priority desc: the higher groups come first
    if only == nil and l.priority ~= prio then
      if grp1 then
        hi1, hi2 = two_least(t, hi1, hi2, grp1)
        hi1, hi2 = two_least(t, hi1, hi2, grp2)
        grp1, grp2 = nil, nil
      end
      prio = l.priority
      if hi1 then above1[prio], above2[prio] = hi1, hi2 end
    end
    if l.name ~= except and L.wait[l.name] > 0 then
      owed = owed + math.max(0, g[l.name] - L.run[l.name])
      t[l.name] = borrowed(L, g, l.name) / l.weight
      if only == nil then
        grp1, grp2 = two_least(t, grp1, grp2, l)
      elseif l.priority > only then
        hi1, hi2 = two_least(t, hi1, hi2, l)
      end
      if not least or t[l.name] < t[least.name] then least = l end
    end
  end
  if only ~= nil then above1[only], above2[only] = hi1, hi2 end
  return {owed = owed, theirs = t, least = least, above1 = above1, above2 = above2}
end

-- Checks 4–8 for a round of `lane` with `run` of the lane's rounds running and `g_me`
-- guaranteed to it, on pool `p` (running, est, exhausted), against the other lanes `r` (rivals).
local function decide_at(cfg, T, p, r, lane, run, g_me, u, guarded)
  local C = slots(p)
  local free = C - p.running
  local me = cfg.lane[lane]
  -- 4. Within floor: admitted while a slot is free; on a never-exhausted pool even when full.
  if run < g_me then
    if free > 0 then return true, 'within-floor', 1 end
    if p.exhausted ~= 1 then return true, 'overdraft', 1 end
    return false, 'full', 0
  end
  -- 5. Reserved: free slots owed to other lanes below their floors with work waiting.
  local owed = r.owed
  if owed > 0 and free <= owed then return false, 'reserved', 0 end
  -- 6. Cost guard: a lane whose spend today on the provider reached its floor share of the
  -- provider's budget borrows nothing more here (it keeps its floor).
  if guarded then return false, 'cost-guard', 0 end
  -- 7. Fair share: the borrowed part goes to the waiting lane with the least borrowed per weight.
  local mine = (run - g_me) / me.weight -- borrowed: run >= g_me here
  local t, least, h1, h2 = r.theirs, r.least, r.above1[me.priority], r.above2[me.priority]
  if (least and goes_first(t[least.name], mine, least, me)) or (h1 and goes_first(t[h1.name], mine, h1, me))
    or (h2 and goes_first(t[h2.name], mine, h2, me)) then
    return false, 'fair-share', 0
  end
  -- 8. Probability: a borrow never takes the pool past its slots.
  if free <= 0 then return false, 'full', 0 end
  local exponent = weight_exponent(cfg, me)
  local prob = p_phi(T, 1 - p.running / p.est) ^ exponent
  if u == nil then return prob >= 0.5, prob >= 0.5 and 'borrowed' or 'draw', prob end
  if u < prob then return true, 'borrowed', prob end
  return false, 'draw', prob
end

local function decide(cfg, T, p, L, lane, u, guarded)
  -- the lane's own floor part, floor(share x C), is guaranteed whatever the other lanes hold (the
  -- remainders and the one-slot rule only add): below it, check 4 decides without building g
  local C = slots(p)
  local own = math.floor(quota(cfg.lane[lane], C))
  if L.run[lane] < own then return decide_at(cfg, T, p, nil, lane, L.run[lane], own, u, guarded) end
  local g = guaranteed(cfg, L, C, lane)
  local run, g_me = L.run[lane], g[lane]
  -- below its floor, check 4 decides alone: the other lanes' rivalry is not built
  if run < g_me then return decide_at(cfg, T, p, nil, lane, run, g_me, u, guarded) end
  return decide_at(cfg, T, p, rivals(cfg, L, g, lane, cfg.lane[lane].priority), lane, run, g_me, u, guarded)
end

-- The money checks along a run of newcomers: newcomer k (0-based) has k more rounds in flight on
-- this pool, each committed at the pool's mean round cost `m.mc` (budget_ok: provider.lua).
local function guarded_at(m, k) -- check 6
  return m ~= nil and m.guard_line ~= nil and m.lane_spend + k * m.mc >= m.guard_line
end
-- The first k at which an increasing `value + k * step` reaches `line` (nil: never).
local function first_reach(value, step, line)
  if value >= line then return 0 end
  if step <= 0 then return nil end
  return math.max(0, math.floor((line - value) / step))
end

-- The running count up to which p(φ)^exponent >= 0.5: φ/high_free >= s with smoothstep(s) =
-- 0.5^(1/exponent), and smoothstep⁻¹(x) = 1/2 − sin(asin(1 − 2x)/3).
local function borrow_limit(T, p, exponent)
  local s = 0.5 - math.sin(math.asin(1 - 2 * 0.5 ^ (1 / exponent)) / 3)
  return p.est * (1 - T.high_free * s)
end

-- How many newcomers of `lane` (no waiters of its own) decide would admit one after another,
-- each seated before the next asks, up to `wanted`; `run` and `g_me` are the lane's running and
-- guaranteed as the asker. Along that sequence nothing but the pool's and the lane's running
-- changes (+1 each): g, the rivals and the slots stay. Each check, once it refuses, refuses
-- every later newcomer, so the count is the first refusal: the least of the checks' first
-- refusals, each found by inverting its test, then settled by decide_at itself at the boundary
-- (the inversions can be one off where floats round). O(1).
local function in_a_row(cfg, T, p, r, lane, run, g_me, wanted, m)
  local R0, C, me = p.running, slots(p), cfg.lane[lane]
  local function admits(k)
    return budget_ok(m, k) and under_ceiling(p, R0 + k) and (decide_at(cfg, T,
      {running = R0 + k, est = p.est, exhausted = p.exhausted}, r, lane, run + k, g_me, nil, guarded_at(m, k)))
  end
  local k0 = math.max(0, g_me - run) -- newcomers within the floor
  local n
  if p.exhausted == 1 and C - R0 < k0 then
    n = math.max(0, C - R0) -- the floor meets a full measured pool
  else
    local b0 = run + k0 - g_me -- borrowed when the first borrower asks
    n = C - R0 -- full
    if r.owed > 0 then n = math.min(n, C - R0 - r.owed) end -- reserved: free <= owed
    if r.least then n = math.min(n, k0 + math.floor(r.theirs[r.least.name] * me.weight) + 1 - b0) end -- mine > least
    local hi = r.above1[me.priority]
    if hi then n = math.min(n, k0 + math.ceil(r.theirs[hi.name] * me.weight) - b0) end -- a tie with a higher lane
    n = math.min(n, math.floor(borrow_limit(T, p, weight_exponent(cfg, me)) - R0) + 1) -- p(φ) < 0.5
    local kg = m and m.guard_line and first_reach(m.lane_spend, m.mc, m.guard_line)
    if kg then n = math.min(n, kg) end -- the cost guard stops the borrowers
    n = math.max(n, k0)
  end
  n = math.min(n, ceiling_room(p, R0)) -- the cap line (capline.lua) stops every newcomer, within its floor too
  if m then -- the budget stops every newcomer, within its floor too
    local kb
    if m.mc > 0 then kb = first_reach(-m.left, m.mc, -math.max(m.reserve_line, m.mc))
    elseif not budget_ok(m, 0) then kb = 0 end
    if kb then n = math.min(n, kb) end
  end
  for _ = 1, 2 do
    if n > 0 and not admits(n - 1) then n = n - 1 elseif admits(n) then n = n + 1 else break end
  end
  return math.min(wanted, n)
end

-- How many of `wanted` newcomers of `lane` would start now (nothing seated). Newcomers wait
-- behind the lane's own waiters (oldest first).
local function plan(cfg, T, p, L, lane, wanted, m)
  if L.wait[lane] > 0 then return 0 end
  local g = guaranteed(cfg, L, slots(p), lane)
  return in_a_row(cfg, T, p, rivals(cfg, L, g, lane, cfg.lane[lane].priority), lane, L.run[lane], g[lane], wanted,
    m)
end

return {rivals = rivals, decide = decide, guarded_at = guarded_at, in_a_row = in_a_row, plan = plan}
