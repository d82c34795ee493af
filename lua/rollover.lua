--[[
  rollover — the midnight roll-over (a cron at 00:00 UTC; safe to run late, twice or not at
  all: every day-scoped thing is keyed by its UTC day, and a closure expires by itself at its
  closedUntil). The first run of a UTC day reopens the closures whose time has passed (recorded
  in events), wakes the waiters of every pool, writes the new day's census and records that it
  ran; a second run the same day does nothing and says so. (The budget readers run before it,
  from the client: `admission day-rollover` does both.)

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  now ('' = Redis TIME)

  Reply: {status, ran (1) or already ran today (0), day, {reopened providers}, ran at}
  Errors: ADM_BAD_ARG, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "events"
--- @include "seats"
--- @include "provider"
--- @include "census"
local STATUS = Codes.STATUS
local clock, fmt, key, run, utc_day = Util.clock, Util.fmt, Util.key, Util.run, Util.utc_day
local catalog, load_config = Config.catalog, Config.load_config
local event = Events.event
local wake = Seats.wake
local load_provider, reopen_provider = Provider.load_provider, Provider.reopen_provider
local build_census = Census.build_census

return function()
  local now = clock(ARGV[1])
  local cfg = load_config(nil)
  local day = utc_day(now)
  -- validated: writes may start
  if not redis.call('SET', key('rollover', day), fmt(now), 'NX', 'EX', 8 * 86400) then
    return {STATUS.OK, 0, day, {}, redis.call('GET', key('rollover', day))}
  end
  local names = {}
  for name in pairs(cfg.providers) do names[#names + 1] = name end
  table.sort(names)
  local reopened = {}
  for _, name in ipairs(names) do
    local pv = load_provider(name)
    if pv.closedUntil > 0 and pv.closedUntil <= now then
      reopen_provider(cfg, name, now, 'expired')
      reopened[#reopened + 1] = name
    end
  end
  for _, pool in ipairs(catalog()) do wake(pool) end
  build_census(cfg, now)
  redis.call('SET', key('census', 'at'), fmt(now))
  event('rollover', 'day', day, 'reopened', table.concat(reopened, ','))
  return {STATUS.OK, 1, day, reopened, fmt(now)}
end
