-- The read model (DESIGN §9): one JSON document in the key `census`. Per pool: the estimate and
-- its history, counts, means; per lane × pool: running, waiting, guaranteed, borrowed, bound
-- (how many of the lane's rounds could run here now), oldestWaitingSince, spentTodayUsd,
-- delegated; mustYield (borrowers that will yield at their next boundary) and `starving`.
-- Arrays that can be empty are encoded by cjson as {} on some engines: readers treat {} as [].
local function census_pool(cfg, T, pool, now, day, starving)
  local p = load_pool(T, pool)
  local L = load_lanes(cfg, pool)
  local C = slots(p)
  local g = guaranteed(cfg, L, C, nil)
  local r = rivals(cfg, L, g, nil) -- once per pool: each lane's bound is then O(1)
  -- A lane's own guaranteed as the asker: guaranteed's "at least one" counts the asker as
  -- waiting, so counting every lane with work as waiting gives each lane's at once.
  local asks = {}
  for _, l in ipairs(cfg.lanes) do asks[l.name] = (L.run[l.name] > 0 or L.wait[l.name] > 0) and 1 or 0 end
  local g_ask = guaranteed(cfg, {run = L.run, wait = asks, del = L.del}, C, nil)
  local provider = check_pool(pool)
  local spend_fields = {}
  for _, l in ipairs(cfg.lanes) do spend_fields[#spend_fields + 1] = l.name .. '|' .. provider end
  local spent = redis.call('HMGET', key('spend', day), unpack(spend_fields))
  local lanes, owed, borrowers = {}, r.owed, {}
  for i, l in ipairs(cfg.lanes) do
    local run, wait = L.run[l.name], L.wait[l.name]
    local b = borrowed(L, g, l.name)
    if run > 0 or wait > 0 or spent[i] then
      local more
      if run > 0 and wait == 0 then
        more = in_a_row(cfg, T, p, r, l.name, run, g_ask[l.name], T.max_estimate)
      else
        -- 0 with waiters (oldest first); a lane listed for its spend only joins the lanes with
        -- work when it asks, which moves g: plan() builds its own context, O(lanes) per such lane
        more = plan(cfg, T, p, L, l.name, T.max_estimate)
      end
      local row = {lane = l.name, running = run, waiting = wait, guaranteed = g[l.name], borrowed = b,
        delegated = L.del[l.name], spentTodayUsd = (tonumber(spent[i]) or 0) / 1e6, bound = run + more}
      if wait > 0 then
        local oldest = redis.call('ZRANGE', key('wait', pool, l.name), 0, 0, 'WITHSCORES')
        row.oldestWaitingSince = tonumber(oldest[2])
        if run < g[l.name] and now - row.oldestWaitingSince > T.starved_after then
          starving[#starving + 1] = {kind = 'below-floor', lane = l.name, pool = pool,
            waitingSince = row.oldestWaitingSince}
        end
      end
      lanes[#lanes + 1] = row
    end
    if b > 0 then borrowers[#borrowers + 1] = {lane = l.name, borrowed = b} end
  end
  return {pool = pool, provider = provider, capacity = p.est, slots = C, carryingCapacity = p.cap,
    exhausted = p.exhausted == 1, exhaustedAt = p.exhaustedAt, why = p.why, slowStart = p.exhausted ~= 1,
    free = math.max(0, C - p.running), running = p.running, waiting = p.waiting, successes = p.succ,
    failures = p.fail, meanSeconds = p.meanSec, meanCostUsd = p.meanCost / 1e6, seq = p.seq,
    lanes = lanes, owed = owed, mustYield = owed > 0 and borrowers or {}}
end

local function build_census(cfg, now)
  local day = utc_day(now)
  local pools, starving = {}, {}
  for _, pool in ipairs(catalog()) do pools[#pools + 1] = census_pool(cfg, cfg.T, pool, now, day, starving) end
  local doc = cjson.encode({mesh = string.match(PREFIX, '{(.*)}'), at = now, configVersion = cfg.version,
    pools = pools, starving = starving})
  redis.call('SET', key('census'), doc)
  return doc
end
