-- The validated policy, as apply_config.lua stored it in the `config` hash:
--   version   integer, +1 per apply
--   lanes     JSON array of {name, floor, weight, priority, reserve, pools} sorted by priority desc
--   tunables  JSON object: every tunable of DESIGN §4 with its value
--   pools     JSON array of pool names (the catalog)
--   pool:<p>  the provider of pool p (membership of the catalog in O(1))
--   policy    the whole policy as JSON, for clients and the census
--   token     a unique id of this apply (a new policy, even after a wipe, has a new token)
--   clock     server | caller: whose `now` the scripts take (util.lua clock)
--   holdUntil the recovery hold after a policy was applied to a mesh without one (0 = none)
--   sweepAt   no lease (seat or ticket) expires before it: an admit sweeps only from then on
--             ('' = no lease; absent = unknown, sweep; seats.lua sweep_due)
--   providers JSON object: provider -> {limit (daily, micro-USD; absent = none), pools}
--   moves     JSON object: alternatives {pool: [pool, ...]} (ordered), pinLanes, pinAgents (lists),
--             agents {agent: lane} (DESIGN §7: moving between pools)
--   planes    JSON object: pool -> {depthLimit, retryBudget, refill, healthRequired, healthMaxAge}
--             (the fence between planes, fence.lua)
--   ceilings  JSON object: scopes {name: {rpm, tpm, itpm, otpm, rpd, tpd (each optional), burst_s,
--             jitter_s, headroom, output_charge, cache_reads_count}}, pools {pool: scope} (ceilings.lua)
--
-- The library keeps the decoded policy per mesh across calls: a call reads the token (and the
-- pool's provider) and decodes the policy again only when the token changed. State decides:
-- the same hash gives the same policy, cached or not.
--- @include "codes"
--- @include "util"
local ERR = Codes.ERR
local check_name, fail = Util.check_name, Util.fail

local CONFIG_CACHE = {}

-- Tunables a policy stored before they existed lacks, filled once here, where the policy is
-- decoded: what that policy did before (a slow-start step was not bounded; a Retry-After was
-- bounded by 60 s; a borrow's refusal was answered again for 30 s). Applying it again stores
-- the current defaults (admission/policy.py). (1 / 0 is math.huge: no global may be read while
-- the library loads.)
local OLD_POLICY_DEFAULTS = {slow_start_step = 1 / 0, retry_after_max = 60, decision_ttl = 30}

local function load_config(pool)
  local v = redis.call('HMGET', KEYS[1], 'token', pool and ('pool:' .. pool) or 'token', 'sweepAt')
  if not v[1] then fail(ERR.NO_CONFIG, 'no policy applied to this mesh; run `admission config apply FILE`') end
  local c = CONFIG_CACHE[KEYS[1]]
  if not c or c.token ~= v[1] then
    local raw = redis.call('HMGET', KEYS[1], 'version', 'lanes', 'tunables', 'holdUntil', 'providers', 'moves',
      'planes', 'ceilings')
    c = {token = v[1], version = tonumber(raw[1]), lanes = cjson.decode(raw[2]), T = cjson.decode(raw[3]),
      lane = {}, max_weight = 0, hold_until = tonumber(raw[4]) or 0, providers = cjson.decode(raw[5] or '{}')}
    for k, default in pairs(OLD_POLICY_DEFAULTS) do
      if c.T[k] == nil then c.T[k] = default end
    end
    c.planes = cjson.decode(raw[7] or '{}')
    -- the rate ceilings (a policy stored before them has none)
    local ceil = cjson.decode(raw[8] or '{}')
    c.ceilings = type(ceil.scopes) == 'table' and ceil.scopes or {}
    c.scope_of = type(ceil.pools) == 'table' and ceil.pools or {}
    local mv = cjson.decode(raw[6] or '{}')
    -- movers: for each pool, the pools that list it as an alternative (their waiters re-ask it)
    c.moves = {alts = {}, alt_set = {}, movers = {}, pin_lane = {}, pin_agent = {}, agents = {}}
    for pool, list in pairs(type(mv.alternatives) == 'table' and mv.alternatives or {}) do
      c.moves.alts[pool], c.moves.alt_set[pool] = list, {}
      for _, a in ipairs(list) do
        c.moves.alt_set[pool][a] = true
        c.moves.movers[a] = c.moves.movers[a] or {}
        table.insert(c.moves.movers[a], pool)
      end
    end
    for _, l in ipairs(type(mv.pinLanes) == 'table' and mv.pinLanes or {}) do c.moves.pin_lane[l] = true end
    for _, a in ipairs(type(mv.pinAgents) == 'table' and mv.pinAgents or {}) do c.moves.pin_agent[a] = true end
    for a, l in pairs(type(mv.agents) == 'table' and mv.agents or {}) do c.moves.agents[a] = l end
    -- what load_lanes reads of a pool's lane counts: running and waiting per lane (a decision),
    -- and delegated too (the census)
    c.lane_fields, c.lane_fields_d = {}, {}
    for _, l in ipairs(c.lanes) do
      c.lane[l.name] = l
      if l.weight > c.max_weight then c.max_weight = l.weight end
      local running, waiting, m, n = l.name, l.name .. '|w', #c.lane_fields, #c.lane_fields_d
      c.lane_fields[m + 1], c.lane_fields[m + 2] = running, waiting
      c.lane_fields_d[n + 1], c.lane_fields_d[n + 2], c.lane_fields_d[n + 3] = running, waiting, l.name .. '|d'
    end
    CONFIG_CACHE[KEYS[1]] = c
  end
  -- this call's readings ride on the cached policy (no table built per call); every call sets them
  c.provider = pool and v[2] or nil -- the pool's provider (nil: not in the catalog)
  c.sweep_at = v[3] -- the sweep's marker (seats.lua sweep_due)
  return c
end

-- A round's lane: the one it names, else its agent's (laneOfAgent, [agents]).
local function lane_of(cfg, lane, agent)
  if lane == nil or lane == '' then
    local own = agent ~= nil and agent ~= '' and cfg.moves.agents[agent]
    if not own then
      fail(ERR.UNKNOWN_LANE, 'no lane given, and agent ' .. (agent ~= '' and agent or '(none)') .. ' has no lane in [agents]')
    end
    return own
  end
  return lane
end

-- A hard pin (DESIGN §7): the lane or the agent is pinned; its rounds never move.
local function pinned(cfg, lane, agent)
  return cfg.moves.pin_lane[lane] == true or (agent ~= nil and agent ~= '' and cfg.moves.pin_agent[agent] == true)
end

local function check_lane(cfg, lane)
  check_name('lane', lane)
  if not cfg.lane[lane] then fail(ERR.UNKNOWN_LANE, 'lane ' .. lane .. ' is not in the policy') end
  return lane
end

-- A pool of the catalog; returns its provider. `provider` is what the caller already read for it
-- (load_config(pool) does), so the common path costs no extra call.
local function check_pool(pool, provider)
  check_name('pool', pool)
  provider = provider or redis.call('HGET', KEYS[1], 'pool:' .. pool)
  if not provider then fail(ERR.UNKNOWN_POOL, 'pool ' .. pool .. ' is not in the catalog') end
  return provider
end

local function catalog()
  return cjson.decode(redis.call('HGET', KEYS[1], 'pools') or '[]')
end

return {
  load_config = load_config,
  lane_of = lane_of,
  pinned = pinned,
  check_lane = check_lane,
  check_pool = check_pool,
  catalog = catalog,
}
