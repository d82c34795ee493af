-- Deciding one round on one pool (DESIGN §5, checks 4–8), a pure function of the pool state `p`,
-- the lane counts `L` and the draw `u`. Returns admitted, reason, p_phi. With u == nil (plan) a
-- marginal admission is counted when p(φ) >= 0.5. The checks before it (delegation, closure,
-- budget reserve, oldest first) run in admit.lua; the cost guard's seam is marked below.

-- p(φ): 1 while φ >= high_free, smoothstep of φ/high_free below, 0 at φ <= 0.
local function p_phi(T, phi)
  if phi >= T.high_free then return 1 end
  if phi <= 0 then return 0 end
  local x = phi / T.high_free
  return x * x * (3 - 2 * x)
end

local function decide(cfg, T, p, L, lane, u)
  local C = slots(p)
  local free = C - p.running
  local g = guaranteed(cfg, L, C, lane)
  local me = cfg.lane[lane]
  -- 4. Within floor: admitted while a slot is free; on a never-exhausted pool even when full.
  if L.run[lane] < g[lane] then
    if free > 0 then return true, 'within-floor', 1 end
    if p.exhausted ~= 1 then return true, 'overdraft', 1 end
    return false, 'full', 0
  end
  -- 5. Reserved: free slots owed to other lanes below their floors with work waiting.
  local owed = 0
  for _, l in ipairs(cfg.lanes) do
    if l.name ~= lane and L.wait[l.name] > 0 then owed = owed + math.max(0, g[l.name] - L.run[l.name]) end
  end
  if owed > 0 and free <= owed then return false, 'reserved', 0 end
  -- 6. Cost guard: seam for the provider-budget issue (needs the spend ledger and a budget reading).
  -- 7. Fair share: the borrowed part goes to the waiting lane with the least borrowed per weight.
  local mine = borrowed(L, g, lane) / me.weight
  for _, l in ipairs(cfg.lanes) do
    if l.name ~= lane and L.wait[l.name] > 0 then
      local theirs = borrowed(L, g, l.name) / l.weight
      if theirs < mine - 1e-12 or (math.abs(theirs - mine) <= 1e-12 and l.priority > me.priority) then
        return false, 'fair-share', 0
      end
    end
  end
  -- 8. Probability: a borrow never takes the pool past its slots.
  if free <= 0 then return false, 'full', 0 end
  local exponent = math.min(4, math.max(1, cfg.max_weight / me.weight))
  local prob = p_phi(T, 1 - p.running / p.est) ^ exponent
  if u == nil then return prob >= 0.5, prob >= 0.5 and 'borrowed' or 'draw', prob end
  if u < prob then return true, 'borrowed', prob end
  return false, 'draw', prob
end

-- How many of `wanted` newcomers of `lane` would start now (nothing seated): the decision run on
-- a copy of the counts. Newcomers wait behind the lane's own waiters (oldest first).
local function plan(cfg, T, p, L, lane, wanted)
  if L.wait[lane] > 0 then return 0 end
  local q = {running = p.running, est = p.est, exhausted = p.exhausted}
  local run = {}
  for k, v in pairs(L.run) do run[k] = v end
  local copy = {run = run, wait = L.wait, del = L.del}
  local n = 0
  while n < wanted do
    local ok = decide(cfg, T, q, copy, lane, nil)
    if not ok then break end
    n = n + 1
    q.running = q.running + 1
    run[lane] = run[lane] + 1
  end
  return n
end
