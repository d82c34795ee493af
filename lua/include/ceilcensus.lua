-- The rate ceilings in the read model (census.lua; docs/operators.md "Rate ceilings"): one entry
-- per scope of the policy, in the census document's `ceilings` list:
--   scope, pools (the pools on it), closedUntil, closedWhy (a daily bucket ran out)
--   limits      one per limit configured or learned: limit, configured, learned (the provider's
--               header, ceil:<scope> learned:<limit>; absent: none), effective (min(configured,
--               learned) x headroom), level, capacity, refillPerSecond, heldUntil (a 429's hold)
--   reservedRequests reservedInputTokens reservedOutputTokens reservedTokens
--               what the rounds in flight reserved (a sum over the seats, cScope cIn cOut)
--   usedLastMinute {requests, tokens}: what the provider counted for the calls whose rounds ended
--               in the sliding minute (ceiluse.lua; the rounds in flight: the reserved counts)
--   reading     the last header reading (absent: none): at, ageSeconds, remaining {limit: n}
--               (ceil:<scope> readAt, remaining:<limit>)
--   waitSeconds how long until a one-request round of the scope's mean size could pass (0: now)
--   refusals    {ceiling-<limit>: n}: the totals of its pools' refusals on each ceiling
--   accuracy    {samples, median, p95} of counted / reserved at the releases (absent: none yet)
--- @include "ceilings"
--- @include "ceiluse"
--- @include "util"
local LIMITS, REASON, cost = Ceilings.LIMITS, Ceilings.REASON, Ceilings.cost
local load_scope, next_midnight, reservation = Ceilings.load_scope, Ceilings.next_midnight, Ceilings.reservation
local accuracy, last_minute, load_use = Ceiluse.accuracy, Ceiluse.last_minute, Ceiluse.load_use
local key = Util.key

local DAILY = {rpd = true, tpd = true}
local EPS = 1e-9

-- The rounds in flight's reservations, per scope: one pass over the seats (an operator's read,
-- O(rounds running); nothing is kept on the hot path for it).
local function reserved_by_scope()
  local by = {}
  for _, id in ipairs(redis.call('ZRANGE', key('seats'), 0, -1)) do
    local s = redis.call('HMGET', key('seat', id), 'cScope', 'cIn', 'cOut')
    if s[1] and s[1] ~= '' then
      local r = by[s[1]] or {n = 0, inp = 0, out = 0}
      r.n, r.inp, r.out = r.n + 1, r.inp + (tonumber(s[2]) or 0), r.out + (tonumber(s[3]) or 0)
      by[s[1]] = r
    end
  end
  return by
end

-- The wait of a one-request round of the scope's mean size: the longest of its buckets' (the
-- admit's rule, ceilings.lua cover, read without writing).
local function wait_of(b)
  if b.closedUntil > b.now then return b.closedUntil - b.now end
  local res, wait = reservation(b, nil, nil), 0
  for _, l in ipairs(LIMITS) do
    local level = b.level[l]
    if level then
      local need = math.min(cost(l, res), b.cap[l])
      if level + EPS < need then
        local w
        if DAILY[l] then w = next_midnight(b.now) - b.now
        else w = math.max(0, b.hold[l] - b.now) + (need - level) / b.rate[l] end
        wait = math.max(wait, w)
      end
    end
  end
  return wait
end

local function limits_of(b, now)
  local c, h, rows = b.c, b.h, {}
  local named = {}
  for _, l in ipairs(LIMITS) do named[#named + 1] = l end
  for f in pairs(h) do -- a learned limit the policy does not name (the headers' own kinds)
    local kind = string.match(f, '^learned:(.+)$')
    if kind and not c[kind] and not REASON[kind] then named[#named + 1] = kind end
  end
  for _, l in ipairs(named) do
    local conf, learned = c[l], tonumber(h['learned:' .. l])
    if conf or learned then
      local eff = (conf and learned) and math.min(conf, learned) or conf or learned
      local hold = b.hold[l] or 0
      rows[#rows + 1] = {limit = l, configured = conf, learned = learned, effective = eff * c.headroom,
        level = b.level[l], capacity = b.cap[l], refillPerSecond = b.rate[l],
        outsidePerSecond = b.shape.drain[l], heldUntil = hold > now and hold or nil}
    end
  end
  return rows
end

local function reading_of(h, now)
  local at = tonumber(h.readAt)
  if not at then return nil end
  local remaining = {}
  for f, v in pairs(h) do
    local kind = string.match(f, '^remaining:(.+)$')
    if kind then remaining[kind] = tonumber(v) end
  end
  return {at = at, ageSeconds = math.max(0, now - at), remaining = remaining}
end

local function refusals_of(cfg, pools)
  local fields, names = {}, {}
  for _, pool in ipairs(pools) do
    for _, l in ipairs(cfg.lanes) do
      for _, limit in ipairs(LIMITS) do
        fields[#fields + 1] = 'refused|' .. pool .. '|' .. l.name .. '|' .. REASON[limit]
        names[#names + 1] = REASON[limit]
      end
    end
  end
  local out = {}
  if #fields == 0 then return out end
  local got = redis.call('HMGET', key('totals'), unpack(fields))
  for i, name in ipairs(names) do
    local n = tonumber(got[i])
    if n then out[name] = (out[name] or 0) + n end
  end
  return out
end

-- Every scope of the policy, by name.
local function ceilings_view(cfg, now)
  local names, pools_of = {}, {}
  for name in pairs(cfg.ceilings) do names[#names + 1] = name end
  table.sort(names)
  for pool, scope in pairs(cfg.scope_of) do
    pools_of[scope] = pools_of[scope] or {}
    table.insert(pools_of[scope], pool)
  end
  if #names == 0 then return {} end
  local reserved = reserved_by_scope()
  local view = {}
  for _, name in ipairs(names) do
    local b = load_scope(cfg, name, now)
    local pools = pools_of[name] or {}
    table.sort(pools)
    local r = reserved[name] or {n = 0, inp = 0, out = 0}
    local closed = b.closedUntil > now
    local use = load_use(name).h
    view[#view + 1] = {scope = name, pools = pools, limits = limits_of(b, now),
      closedUntil = closed and b.closedUntil or 0, closedWhy = closed and b.why or '',
      reservedRequests = r.n, reservedInputTokens = r.inp, reservedOutputTokens = r.out,
      reservedTokens = r.inp + r.out, usedLastMinute = last_minute(use, now), reading = reading_of(b.h, now),
      waitSeconds = wait_of(b), refusals = refusals_of(cfg, pools), accuracy = accuracy(use)}
  end
  return view
end

return {ceilings_view = ceilings_view}
