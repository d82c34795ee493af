--[[
  apply_config — store a validated policy atomically and bump its version. The Python side
  (admission/policy.py) validates the policy's meaning with clear messages; this script checks
  its shape again before the first write, so a malformed call changes nothing.

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  expected current version ('' = any; a mismatch is ADM_STALE_VERSION)
  ARGV[2]  policy JSON: {lanes: [{name, floor, weight, priority, reserve, pools?}],
             tunables: {name: number}, providers: {name: {...}}, pools: [{name, provider}], ...}
           (every lane and pool an object, each name once; a lane's reserve in [0, 1], 0 when
           absent; its pools a non-empty list of the catalog's; lanes and tunables hold finite
           numbers only: NaN and infinity, which cjson reads, are refused)
  ARGV[3]  token: a unique id of this apply (the client draws it), so caches see a new policy
  ARGV[4]  now ('' = Redis TIME; a `now` only with the policy's clock = "caller")
  ARGV[5]  recovery hold: 1 = when the mesh had no policy (new, or wiped by a restart without
           persistence), refuse new admissions (`recovering`) for one heartbeat period
           (lease_ttl / 3 + 1 s) so the pods' heartbeats re-assert the rounds still running
           before anything is admitted on top of them; 0 = no hold (a mesh known to be new).
           A policy applied to a mesh whose hold still runs keeps that hold.
  ARGV[6]  each pool's alternatives, JSON {pool: [pool, ...]} in order (admission/alternatives.py
           computes them from the policy's tiers and [alternatives]; '' = none). Checked here
           too: every name in the catalog, no pool its own alternative, never off the EU route.
  Each pool's plane settings (depth_limit, retry_budget, retry_refill_per_s, health_required,
  health_max_age) are stored in the field `planes` (fence.lua).
  The policy's `ceilings` ({name: {rpm, tpm, itpm, otpm, rpd, tpd, burst_s, jitter_s, headroom,
  output_charge, cache_reads_count}}) and each pool's `ceilings` (its scope's name) are stored in
  the field `ceilings` as {scopes, pools} (ceilings.lua); every limit a positive finite number.
  The policy's `pins` ({lanes, agents}) and `agents` (agent -> lane) are stored with the
  alternatives in the field `moves` (config.lua), checked against the lanes.

  Reply: {status, new version, hold until (0 = none)}
  Errors: ADM_BAD_POLICY, ADM_BAD_NAME, ADM_STALE_VERSION
]]
--- @include "codes"
--- @include "util"
--- @include "events"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local CALLER_CLOCK_ONLY, check_name, check_now = Util.CALLER_CLOCK_ONLY, Util.check_name, Util.check_now
local check_one_of, clock, fail, fmt, run = Util.check_one_of, Util.clock, Util.fail, Util.fmt, Util.run
local event = Events.event

local MAX_LANES, MAX_POOLS = 1000, 1000 -- bounds every later write needs (one HSET, one HMGET)
local RECOVERY_MARGIN = 1 -- seconds past one heartbeat period

local TUNABLES = {'seed_estimate', 'max_estimate', 'slow_start_factor', 'slow_start_step', 'grow_interval', 'growth_rate',
  'probe_after', 'decrease_factor', 'high_free', 'lease_ttl', 'stall_after', 'round_cap', 'starved_after',
  'probe_every', 'closed_for', 'aging_unit', 'cost_scale', 'health_max_age', 'decision_ttl', 'retry_after_max'}
local ZERO_OK = {retry_after_max = true} -- 0 turns the Retry-After pause off
local CEILING_LIMITS = {'rpm', 'tpm', 'itpm', 'otpm', 'rpd', 'tpd'}
local MAX_LIMIT = 1e12 -- requests or tokens per minute or per day (admission/policy.py's bound)

return function()
  local token = check_name('token', ARGV[3])
  local ok, policy = pcall(cjson.decode, ARGV[2] or '')
  if not ok or type(policy) ~= 'table' then fail(ERR.BAD_POLICY, 'policy is not a JSON object') end
  local function need(cond, msg) if not cond then fail(ERR.BAD_POLICY, msg) end end
  need(type(policy.lanes) == 'table' and #policy.lanes > 0, 'policy needs at least one lane')
  need(#policy.lanes <= MAX_LANES, 'policy has more than ' .. MAX_LANES .. ' lanes')
  local function finite(v) return type(v) == 'number' and v == v and v > -math.huge and v < math.huge end
  local lane_names = {}
  for _, l in ipairs(policy.lanes) do
    need(type(l) == 'table', 'each lane must be an object')
    check_name('lane', l.name)
    need(not lane_names[l.name], 'lane ' .. l.name .. ' is declared twice')
    lane_names[l.name] = true
    need(type(l.floor) == 'number' and l.floor >= 0 and l.floor <= 1, 'lane ' .. l.name .. ': floor must be in [0, 1]')
    need(type(l.weight) == 'number' and l.weight > 0 and finite(l.weight), 'lane ' .. l.name .. ': weight must be > 0')
    need(finite(l.priority), 'lane ' .. l.name .. ': priority must be a number')
    -- the budget's reserve line (provider.lua money); none given: no reserve
    need(l.reserve == nil or (finite(l.reserve) and l.reserve >= 0 and l.reserve <= 1),
      'lane ' .. l.name .. ': reserve must be in [0, 1]')
    l.reserve = l.reserve or 0
  end
  need(type(policy.tunables) == 'table', 'policy needs tunables')
  for _, t in ipairs(TUNABLES) do
    local v = policy.tunables[t]
    local zero = ZERO_OK[t] and v == 0
    need(type(v) == 'number' and v == v and (v > 0 or zero) and v < math.huge,
      'tunable ' .. t .. ' must be a number ' .. (ZERO_OK[t] and '>= 0' or '> 0'))
  end
  need(type(policy.pools) == 'table' and #policy.pools > 0, 'policy needs at least one pool')
  need(#policy.pools <= MAX_POOLS, 'policy has more than ' .. MAX_POOLS .. ' pools')
  local clock_mode = policy.clock or 'server'
  need(clock_mode == 'server' or clock_mode == 'caller', 'clock must be server or caller')
  local now
  if ARGV[4] == nil or ARGV[4] == '' then now = clock('')
  elseif clock_mode ~= 'caller' then fail(ERR.BAD_ARG, CALLER_CLOCK_ONLY)
  else now = check_now(ARGV[4]) end
  local want_hold = check_one_of('recovery hold', ARGV[5] or '0', {['0'] = true, ['1'] = true}) == '1'
  -- providers: their daily limit (micro-USD) and their pools, for the budget rules
  need(policy.providers == nil or type(policy.providers) == 'table', 'providers must be an object')
  local providers = {}
  for name, pv in pairs(policy.providers or {}) do
    check_name('provider', name)
    need(type(pv) == 'table', 'provider ' .. name .. ' must be an object')
    local limit = pv.daily_limit_usd
    need(limit == nil or (type(limit) == 'number' and limit >= 0 and limit <= 1e9),
      'provider ' .. name .. ': daily_limit_usd must be in [0, 1e9]')
    providers[name] = {pools = {}, limit = limit and math.floor(limit * 1e6 + 0.5) or nil}
  end
  -- the rate ceilings (ceilings.lua): each scope's limits and how its buckets count
  need(policy.ceilings == nil or type(policy.ceilings) == 'table', 'ceilings must be an object')
  local scopes, scope_of = {}, {}
  for name, c in pairs(policy.ceilings or {}) do
    check_name('ceilings scope', name)
    need(type(c) == 'table', 'ceilings.' .. name .. ' must be an object')
    local sc = {}
    for _, l in ipairs(CEILING_LIMITS) do
      local v = c[l]
      need(v == nil or (finite(v) and v > 0 and v <= MAX_LIMIT),
        'ceilings.' .. name .. '.' .. l .. ' must be a number in (0, 1e12]')
      sc[l] = v
    end
    need(next(sc) ~= nil, 'ceilings.' .. name .. ' sets no limit (rpm, tpm, itpm, otpm, rpd or tpd)')
    local burst, headroom, jitter = c.burst_s or 1, c.headroom or 0.97, c.jitter_s or 0.05
    need(finite(burst) and burst >= 0.001 and burst <= 3600, 'ceilings.' .. name .. '.burst_s must be in [0.001, 3600]')
    need(finite(jitter) and jitter >= 0 and jitter <= 60, 'ceilings.' .. name .. '.jitter_s must be in [0, 60]')
    need(finite(headroom) and headroom > 0 and headroom <= 1, 'ceilings.' .. name .. '.headroom must be in (0, 1]')
    local charge = c.output_charge or 'max_tokens'
    need(charge == 'max_tokens' or charge == 'received', 'ceilings.' .. name .. '.output_charge must be max_tokens or received')
    need(c.cache_reads_count == nil or type(c.cache_reads_count) == 'boolean',
      'ceilings.' .. name .. '.cache_reads_count must be a boolean')
    sc.burst_s, sc.jitter_s, sc.headroom, sc.output_charge, sc.cache_reads_count = burst, jitter, headroom, charge, c.cache_reads_count == true
    scopes[name] = sc
  end
  local names, planes = {}, {}
  local function bounded(p, k, lo, hi, whole)
    local v = p[k]
    if v == nil then return nil end
    need(type(v) == 'number' and v >= lo and v <= hi and (not whole or v == math.floor(v)),
      'pool ' .. p.name .. ': ' .. k .. ' must be a number in [' .. lo .. ', ' .. hi .. ']')
    return v
  end
  local in_catalog = {}
  for _, p in ipairs(policy.pools) do
    need(type(p) == 'table', 'each pool must be an object')
    check_name('pool', p.name)
    check_name('provider', p.provider)
    need(not in_catalog[p.name], 'pool ' .. p.name .. ' is declared twice')
    in_catalog[p.name] = p.provider
    need(string.find(p.name, '@', 1, true) ~= nil, 'pool ' .. p.name .. ' must be written model@provider')
    -- the pool's plane (docs/design.md §8): the fence's limits, all optional
    need(p.health_required == nil or type(p.health_required) == 'boolean', 'pool ' .. p.name .. ': health_required must be a boolean')
    local plane = {depthLimit = bounded(p, 'depth_limit', 1, 1e9, true), retryBudget = bounded(p, 'retry_budget', 0, 1e9, true),
      refill = bounded(p, 'retry_refill_per_s', 0, 1e6), healthMaxAge = bounded(p, 'health_max_age', 0.1, 1e6),
      healthRequired = p.health_required or nil}
    if next(plane) then planes[p.name] = plane end
    if p.ceilings ~= nil then
      need(type(p.ceilings) == 'string' and scopes[p.ceilings], 'pool ' .. p.name .. ': ceilings ' ..
        tostring(p.ceilings) .. ' is not a scope under [ceilings]')
      scope_of[p.name] = p.ceilings
    end
    if not providers[p.provider] then providers[p.provider] = {pools = {}} end
    table.insert(providers[p.provider].pools, p.name)
    names[#names + 1] = p.name
  end
  -- a lane's own pools (plan's '*'): a non-empty list of pools of the catalog
  for _, l in ipairs(policy.lanes) do
    local own = l.pools
    need(own == nil or (type(own) == 'table' and #own > 0), 'lane ' .. l.name .. ': pools must be a non-empty list')
    for i, x in pairs(own or {}) do
      need(type(i) == 'number' and type(x) == 'string' and in_catalog[x],
        'lane ' .. l.name .. ': pools: ' .. tostring(x) .. ' is not a pool of the catalog')
    end
  end
  -- moving between pools (DESIGN §7): alternatives, pins, the lane of an agent
  local ok_alts, alts = pcall(cjson.decode, (ARGV[6] == nil or ARGV[6] == '') and '{}' or ARGV[6])
  need(ok_alts and type(alts) == 'table', 'alternatives must be a JSON object')
  local pv_of = policy.providers or {}
  local function route(name) return type(pv_of[name]) == 'table' and pv_of[name].route or 'global' end
  local function kind(name) return type(pv_of[name]) == 'table' and pv_of[name].kind or 'direct' end
  local moves = {alternatives = {}, pinLanes = {}, pinAgents = {}, agents = {}}
  for pool, list in pairs(alts) do
    need(type(pool) == 'string' and in_catalog[pool], 'alternatives: ' .. tostring(pool) .. ' is not in the catalog')
    need(type(list) == 'table', 'alternatives of ' .. pool .. ' must be a list')
    local src = in_catalog[pool]
    for _, dst in ipairs(list) do
      need(type(dst) == 'string' and in_catalog[dst] and dst ~= pool,
        'alternatives of ' .. pool .. ': ' .. tostring(dst) .. ' is not another pool of the catalog')
      local d = in_catalog[dst]
      need(route(src) ~= 'eu' or route(d) == 'eu' or kind(d) == 'direct',
        'alternatives of ' .. pool .. ': ' .. dst .. ' would take an EU-routed pool to a non-EU router')
    end
    if #list > 0 then moves.alternatives[pool] = list end
  end
  local pins = policy.pins or {}
  need(type(pins) == 'table', 'pins must be an object')
  need(pins.lanes == nil or type(pins.lanes) == 'table', 'pins.lanes must be a list')
  need(pins.agents == nil or type(pins.agents) == 'table', 'pins.agents must be a list')
  for _, l in ipairs(pins.lanes or {}) do
    need(type(l) == 'string' and lane_names[l], 'pins.lanes: ' .. tostring(l) .. ' is not a lane of the policy')
    moves.pinLanes[#moves.pinLanes + 1] = l
  end
  for _, a in ipairs(pins.agents or {}) do moves.pinAgents[#moves.pinAgents + 1] = check_name('agent', a) end
  need(policy.agents == nil or type(policy.agents) == 'table', 'agents must be an object')
  for a, l in pairs(policy.agents or {}) do
    check_name('agent', a)
    need(type(l) == 'string' and lane_names[l], 'agents.' .. a .. ': ' .. tostring(l) .. ' is not a lane of the policy')
    moves.agents[a] = l
  end
  -- everything stored is encoded before the first write: a value JSON cannot hold (NaN or
  -- infinity, read from the policy's text; some cjson builds write them, Redis' does not) or a
  -- sparse list is refused, not a write half done
  local function finite_only(v, depth)
    if type(v) == 'number' then return finite(v) end
    if type(v) ~= 'table' then return true end
    if depth > 16 then return false end
    for _, x in pairs(v) do
      if not finite_only(x, depth + 1) then return false end
    end
    return true
  end
  need(finite_only(policy.lanes, 0) and finite_only(policy.tunables, 0),
    'lanes and tunables may hold finite numbers only (no NaN, no infinity), nested at most 16 deep')
  local function encode(what, v)
    local done, text = pcall(cjson.encode, v)
    need(done, what .. ' cannot be stored as JSON (NaN, infinity or a sparse list)')
    return text
  end
  local stored = {lanes = encode('lanes', policy.lanes), tunables = encode('tunables', policy.tunables),
    pools = encode('pools', names), providers = encode('providers', providers), moves = encode('moves', moves),
    planes = encode('planes', planes), ceilings = encode('ceilings', {scopes = scopes, pools = scope_of})}
  local current = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
  if ARGV[1] ~= '' and tonumber(ARGV[1]) ~= current then
    fail(ERR.STALE_VERSION, 'expected version ' .. ARGV[1] .. ', found ' .. current)
  end
  -- validated: writes may start
  local stale = {}
  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
    if string.sub(f, 1, 5) == 'pool:' then stale[#stale + 1] = f end
  end
  for i = 1, #stale, 500 do -- chunks: unpack has a stack limit
    redis.call('HDEL', KEYS[1], unpack(stale, i, math.min(i + 499, #stale)))
  end
  -- A mesh without a policy is new or was wiped: its pods' rounds may still run, unknown to
  -- Redis until their next heartbeat. Hold new admissions for one heartbeat period.
  -- Applied again while that hold runs (a retried apply job, a policy change), the hold goes on:
  -- the pods may not have re-asserted their rounds yet.
  local hold = 0
  if want_hold and current == 0 then hold = now + policy.tunables.lease_ttl / 3 + RECOVERY_MARGIN
  elseif current > 0 then
    local running = tonumber(redis.call('HGET', KEYS[1], 'holdUntil')) or 0
    if running > now then hold = running end
  end
  local fields = {'version', current + 1, 'token', token, 'lanes', stored.lanes,
    'tunables', stored.tunables, 'pools', stored.pools, 'policy', ARGV[2],
    'clock', clock_mode, 'holdUntil', fmt(hold), 'providers', stored.providers, 'moves', stored.moves,
    'planes', stored.planes, 'ceilings', stored.ceilings}
  for _, p in ipairs(policy.pools) do
    fields[#fields + 1] = 'pool:' .. p.name
    fields[#fields + 1] = p.provider
  end
  redis.call('HSET', KEYS[1], unpack(fields))
  event('config', 'version', current + 1, 'holdUntil', fmt(hold))
  return {STATUS.OK, current + 1, fmt(hold)}
end
