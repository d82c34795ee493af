-- The read model (DESIGN §9): one JSON document in the key `census`. Per pool: the estimate and
-- its history, counts, means; per lane × pool: running, waiting, guaranteed, borrowed, bound
-- (how many of the lane's rounds could run here now), oldestWaitingSince, spentTodayUsd,
-- delegated, reserveLeftUsd; mustYield (borrowers that will yield at their next boundary); the
-- provider's day on every pool of it: closedUntil, closedWhy, budgetSpentUsd, budgetLimitUsd,
-- budgetAt, committedUsd (absent: no budget today); moving between pools: alternatives (in the
-- policy's order), moved (running here after a move), movedIn, movedOut (moves ever),
-- hardPinned {to, waiting, oldestWaitingSince} (absent: no pinned waiter); and `starving`,
-- closed providers first, then lanes below their floor and hard-pinned rounds waiting longer than
-- starved_after (kind `pinned`); plane (absent: no fence settings and no health sample): depth,
-- depthLimit, retriesLeft, retryBudget, healthRequired, healthAgeSeconds, healthOk, healthFresh,
-- healthMaxAge; ceilingScope (absent: no rate ceilings). Per rate-ceiling scope, the document's
-- `ceilings` list (ceilcensus.lua).
-- Arrays that can be empty are encoded by cjson as {} on some engines: readers treat {} as [].
--- @include "ceilcensus"
--- @include "config"
--- @include "decide"
--- @include "fence"
--- @include "lanes"
--- @include "pool"
--- @include "provider"
--- @include "util"
local ceilings_view = Ceilcensus.ceilings_view
local catalog, check_pool = Config.catalog, Config.check_pool
local in_a_row, plan, rivals = Decide.in_a_row, Decide.plan, Decide.rivals
local load_plane, plane_view = Fence.load_plane, Fence.plane_view
local borrowed, guaranteed, load_lanes = Lanes.borrowed, Lanes.guaranteed, Lanes.load_lanes
local load_pool, probe_backoff, slots = Pool.load_pool, Pool.probe_backoff, Pool.slots
local budget, gate, is_closed = Provider.budget, Provider.gate, Provider.is_closed
local load_provider, money = Provider.load_provider, Provider.money
local key, utc_day = Util.key, Util.utc_day

local function census_pool(cfg, T, pool, now, day, starving, p, L, in_flight)
  local C = slots(p)
  local g = guaranteed(cfg, L, C, nil)
  local r = rivals(cfg, L, g, nil) -- once per pool: each lane's bound is then O(1)
  -- A lane's own guaranteed as the asker: guaranteed's "at least one" counts the asker as
  -- waiting, so counting every lane with work as waiting gives each lane's at once.
  local asks = {}
  for _, l in ipairs(cfg.lanes) do asks[l.name] = (L.run[l.name] > 0 or L.wait[l.name] > 0) and 1 or 0 end
  local g_ask = guaranteed(cfg, {run = L.run, wait = asks, del = L.del}, C, nil)
  local provider = check_pool(pool)
  local pv = load_provider(provider)
  local bud = budget(cfg, provider, now, pv)
  local closed = is_closed(pv, now)
  if closed and p.waiting > 0 then
    starving[#starving + 1] = {kind = 'provider-closed', provider = provider, pool = pool, why = pv.why,
      closedUntil = pv.closedUntil, waiting = p.waiting}
  end
  local spend_fields = {}
  for _, l in ipairs(cfg.lanes) do spend_fields[#spend_fields + 1] = l.name .. '|' .. provider end
  local spent = redis.call('HMGET', key('spend', day), unpack(spend_fields))
  local pinned_n = redis.call('ZCARD', key('pinned', pool))
  local hard_pinned
  if pinned_n > 0 then
    local oldest = tonumber(redis.call('ZRANGE', key('pinned', pool), 0, 0, 'WITHSCORES')[2])
    -- the pinned wait: since pinned rounds last got service here (a probe refused by the provider
    -- and its retry's new ticket do not restart it), else the oldest pinned ticket
    local since = math.min(oldest, tonumber(redis.call('HGET', key('pool', pool), 'pinnedSince')) or oldest)
    hard_pinned = {to = pool, waiting = pinned_n, oldestWaitingSince = oldest, waitingSince = since}
    if now - since > T.starved_after then
      starving[#starving + 1] = {kind = 'pinned', pool = pool, waiting = pinned_n, waitingSince = since}
    end
  end
  local lanes, owed, borrowers = {}, r.owed, {}
  for i, l in ipairs(cfg.lanes) do
    local run, wait = L.run[l.name], L.wait[l.name]
    local b = borrowed(L, g, l.name)
    if run > 0 or wait > 0 or spent[i] then
      local more
      local m = money(cfg, bud, l.name, (tonumber(spent[i]) or 0) + (in_flight[provider][l.name] or 0), p.meanCost)
      local gated = gate(T, pv, bud, p, now, m)
      if now < cfg.hold_until then
        more = 0 -- the recovery hold
      elseif gated then
        more = (gated == 'probe' and wait == 0) and 1 or 0 -- a closed provider's probe, or a refusal
      elseif run > 0 and wait == 0 then
        more = in_a_row(cfg, T, p, r, l.name, run, g_ask[l.name], T.max_estimate, m)
      else
        -- 0 with waiters (oldest first); a lane listed for its spend only joins the lanes with
        -- work when it asks, which moves g: plan() builds its own context, O(lanes) per such lane
        more = plan(cfg, T, p, L, l.name, T.max_estimate, m)
      end
      local row = {lane = l.name, running = run, waiting = wait, guaranteed = g[l.name], borrowed = b,
        delegated = L.del[l.name], spentTodayUsd = (tonumber(spent[i]) or 0) / 1e6, bound = run + more,
        reserveLeftUsd = bud and math.max(0, bud.left - l.reserve * bud.limit) / 1e6 or nil}
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
    probingFrom = p.probeFrom, probeRuns = p.probeRuns, probeBackoff = probe_backoff(p),
    capLine = p.ceiling > 0 and p.ceiling or nil, -- capline.lua: the ceiling of the declared rounds
    free = math.max(0, C - p.running), running = p.running, waiting = p.waiting, successes = p.succ,
    failures = p.fail, meanSeconds = p.meanSec, meanCostUsd = p.meanCost / 1e6, seq = p.seq,
    lanes = lanes, owed = owed, mustYield = owed > 0 and borrowers or {},
    closedUntil = closed and pv.closedUntil or 0, closedWhy = closed and pv.why or '',
    pausedUntil = p.pausedUntil > now and p.pausedUntil or 0,
    budgetSpentUsd = bud and bud.spent / 1e6 or nil, budgetLimitUsd = bud and bud.limit / 1e6 or nil,
    budgetAt = bud and bud.at or nil, committedUsd = bud and bud.committed / 1e6 or nil,
    alternatives = cfg.moves.alts[pool] or {}, moved = p.moved, movedIn = p.movedIn, movedOut = p.movedOut,
    hardPinned = hard_pinned, ceilingScope = cfg.scope_of[pool], plane = plane_view(load_plane(cfg, pool, now), p.waiting, now)}
end

local EMPTY_LISTS = {'pools', 'starving', 'lanes', 'mustYield', 'alternatives', 'ceilings', 'limits'}
local function build_census(cfg, now)
  local day = utc_day(now)
  local pools, starving, loaded = {}, {}, {}
  -- each lane's rounds in flight per provider at their pools' mean costs (the cost guard's
  -- committed part): one pass over the pools, O(pools × lanes)
  local in_flight = {}
  for i, pool in ipairs(catalog()) do
    local p, L = load_pool(cfg.T, pool), load_lanes(cfg, pool, true)
    loaded[i] = {pool = pool, p = p, L = L}
    local provider = check_pool(pool)
    in_flight[provider] = in_flight[provider] or {}
    for _, l in ipairs(cfg.lanes) do
      if L.run[l.name] > 0 then
        in_flight[provider][l.name] = (in_flight[provider][l.name] or 0) + L.run[l.name] * p.meanCost
      end
    end
  end
  for _, x in ipairs(loaded) do
    pools[#pools + 1] = census_pool(cfg, cfg.T, x.pool, now, day, starving, x.p, x.L, in_flight)
  end
  -- closed providers first, then the rest in pool order
  local first, rest = {}, {}
  for _, s in ipairs(starving) do
    if s.kind == 'provider-closed' then first[#first + 1] = s else rest[#rest + 1] = s end
  end
  for _, s in ipairs(rest) do first[#first + 1] = s end
  starving = first
  local doc = cjson.encode({mesh = string.match(PREFIX, '{(.*)}'), at = now, configVersion = cfg.version,
    pools = pools, starving = starving, ceilings = ceilings_view(cfg, now)})
  -- cjson writes an empty table as {}: the lists of the document stay lists for `redis-cli GET`
  -- readers (a name never holds a quote, so these strings are only ever these keys)
  for _, list in ipairs(EMPTY_LISTS) do doc = string.gsub(doc, '"' .. list .. '":{}', '"' .. list .. '":[]') end
  redis.call('SET', key('census'), doc)
  return doc
end

return {build_census = build_census}
