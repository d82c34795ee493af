--[[
  tick — the pool clock. Every pod's background clock calls it; it is idempotent: at most one
  growth step per pool per interval takes effect across all pods. It sweeps a bounded number of
  expired leases (dead pods), moves each pool's load clock and sets its cap line's ceiling
  (capline.lua), takes the growth steps that are due, wakes the waiters of pools with free slots,
  and refreshes the census at most once per grow_interval.

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  now ('' = Redis TIME)
  ARGV[2]  sweep limit (expired seats + tickets removed at most; a whole number in [1, 10000]; default 100)

  Reply: {status, swept, {pool, est, pool, est, ...} of the pools that grew, census refreshed (0/1)}
  Events (events.lua): `expired` for each seat whose lease ran out (pool, lane, pod), `grew` for
    each growth step (pool, est, cap)
  Errors: ADM_BAD_ARG, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "pool"
--- @include "capline"
--- @include "events"
--- @include "seats"
--- @include "census"
local STATUS = Codes.STATUS
local check_whole, clock, fmt, key, run = Util.check_whole, Util.clock, Util.fmt, Util.key, Util.run
local catalog, load_config = Config.catalog, Config.load_config
local GROW_FIELDS, grow, load_pool, save_pool = Pool.GROW_FIELDS, Pool.grow, Pool.load_pool, Pool.save_pool
local slots = Pool.slots
local CEILING_FIELDS, advance_clock = Capline.CEILING_FIELDS, Capline.advance_clock
local ceiling_of = Capline.ceiling_of
local event = Events.event
local sweep, wake = Seats.sweep, Seats.wake
local build_census = Census.build_census

local MAX_SWEEP = 10000 -- leases swept in one call at most: a bounded call (the CLI sweeps 1000 a call)

return function()
  local now = clock(ARGV[1])
  local limit = check_whole('sweep limit', ARGV[2], 100, 1, MAX_SWEEP) -- ZRANGEBYSCORE LIMIT takes an integer
  local cfg = load_config(nil)
  local T = cfg.T
  local _, swept = sweep(now, limit)
  local grew = {}
  for _, pool in ipairs(catalog()) do
    local p = load_pool(T, pool)
    -- the cap line: the load clock and the ceiling of the declared rounds running (capline.lua)
    if p.sized > 0 then
      advance_clock(p, now)
      p.ceiling = ceiling_of(T, p, now)
      save_pool(p, CEILING_FIELDS)
    elseif p.ceiling ~= 0 then
      p.ceiling = 0
      save_pool(p, {'ceiling'})
    end
    if grow(T, p, now) then
      save_pool(p, GROW_FIELDS)
      grew[#grew + 1] = pool
      grew[#grew + 1] = fmt(p.est)
      event('grew', 'pool', pool, 'est', fmt(p.est), 'cap', fmt(p.cap))
    end
    if p.waiting > 0 and p.running < slots(p) then wake(pool) end
  end
  local refreshed = 0
  local last = tonumber(redis.call('GET', key('census', 'at')) or '0') or 0
  if now - last >= T.grow_interval or now < last then
    build_census(cfg, now)
    redis.call('SET', key('census', 'at'), fmt(now))
    refreshed = 1
  end
  return {STATUS.OK, swept, grew, refreshed}
end
