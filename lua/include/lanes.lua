-- Per-lane counts of one pool, in the hash `lanes:<p>`: `<lane>` running (delegated included),
-- `<lane>|w` waiting, `<lane>|d` delegated. One HMGET reads every lane: O(lanes).
-- A decision reads running and waiting per lane; the census (`delegated`) the delegated too.
--- @include "util"
local key = Util.key

local function load_lanes(cfg, pool, delegated)
  local per = delegated and 3 or 2
  local v = redis.call('HMGET', key('lanes', pool), unpack(delegated and cfg.lane_fields_d or cfg.lane_fields))
  local L = {run = {}, wait = {}, del = delegated and {} or nil}
  for i, l in ipairs(cfg.lanes) do
    L.run[l.name] = tonumber(v[per * i - per + 1]) or 0
    L.wait[l.name] = tonumber(v[per * i - per + 2]) or 0
    if delegated then L.del[l.name] = tonumber(v[per * i]) or 0 end
  end
  return L
end

-- A lane's quota of C slots, floor share × C; the lane's own part is floor(quota).
local function quota(l, C)
  return l.floor * C + 1e-9 -- absorb float noise (0.7 * 10 = 7.000000000000001)
end

-- Guaranteed slots (DESIGN §5.4): among the lanes that have work (running or waiting; `asking`
-- counts as waiting), q = floor share × C; each gets floor(q), the floor(Σq) − Σfloor(q) slots
-- left go one each to the largest remainders (ties to priority), then a lane with waiting work
-- and a non-zero floor that got none gets one. Lanes without work get none.
local function guaranteed(cfg, L, C, asking)
  local g, rem, with_work, sum_q, sum_g = {}, {}, {}, 0, 0
  for _, l in ipairs(cfg.lanes) do
    g[l.name] = 0
    if L.run[l.name] > 0 or L.wait[l.name] > 0 or l.name == asking then
      local q = quota(l, C)
      g[l.name] = math.floor(q)
      rem[l.name] = q - g[l.name]
      sum_q = sum_q + q
      sum_g = sum_g + g[l.name]
      with_work[#with_work + 1] = l
    end
  end
  local left = math.floor(sum_q) - sum_g
  if left > 0 then
    -- largest remainder first, ties to the earlier lane (cfg.lanes is sorted by priority desc,
    -- then name): one number per lane, sorted by the C comparison (no Lua comparator per pair).
    -- Remainders count in millionths of a slot, rounded: equal ones differ by float noise
    -- (0.7 x 4 - 2 and 0.2 x 4), which truncation could split the wrong way; a floor share of at
    -- most six decimals times C has a remainder that is a whole number of millionths
    local keys, lane_of = {}, {}
    for i, l in ipairs(with_work) do
      local k = -(math.floor(rem[l.name] * 1e6 + 0.5) * 1024 + (1023 - i))
      keys[i], lane_of[k] = k, l.name
    end
    table.sort(keys)
    for i = 1, math.min(left, #keys) do g[lane_of[keys[i]]] = g[lane_of[keys[i]]] + 1 end
  end
  for _, l in ipairs(with_work) do
    local waiting = L.wait[l.name] > 0 or l.name == asking
    if waiting and l.floor > 0 and g[l.name] == 0 then g[l.name] = 1 end
  end
  return g
end

-- Borrowed = running above guaranteed.
local function borrowed(L, g, lane)
  return math.max(0, L.run[lane] - g[lane])
end

return {load_lanes = load_lanes, quota = quota, guaranteed = guaranteed, borrowed = borrowed}
