--[[
  closure — an operator closes or reopens a provider by hand (audited in events). A closure by
  hand lasts `seconds`, or until the next 00:00 UTC when `seconds` is empty; a reopen wakes the
  waiters of every pool of the provider.

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  action: close | reopen
  ARGV[2]  provider (declared in the policy)
  ARGV[3]  why (a word: letters, digits and . _ - / : @ #)
  ARGV[4]  seconds the closure lasts ('' = until midnight UTC; close only)
  ARGV[5]  now ('' = Redis TIME)

  Reply: {status, closed until (0 = open)}
  Events (events.lua): `closed` (why operator:<why>) or `reopened` (by operator:<why>), counted in
    `totals` as closed|<provider>|operator:<why> or reopened|<provider>|operator:<why>
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_UNKNOWN_PROVIDER, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "provider"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_name, check_num, check_one_of = Util.check_name, Util.check_num, Util.check_one_of
local clock, fail, fmt, run = Util.clock, Util.fail, Util.fmt, Util.run
local load_config = Config.load_config
local close_provider, next_midnight = Provider.close_provider, Provider.next_midnight
local reopen_provider = Provider.reopen_provider

return function()
  local action = check_one_of('action', ARGV[1], {close = true, reopen = true})
  local name = check_name('provider', ARGV[2])
  local why = check_name('why', ARGV[3])
  local seconds = nil
  if ARGV[4] ~= nil and ARGV[4] ~= '' then
    seconds = check_num('seconds', ARGV[4], nil, 1)
    if seconds > 7 * 86400 then fail(ERR.BAD_ARG, 'seconds must be at most a week, got ' .. ARGV[4]) end
  end
  local now = clock(ARGV[5])
  local cfg = load_config(nil)
  if not cfg.providers[name] then fail(ERR.UNKNOWN_PROVIDER, 'provider ' .. name .. ' is not in the policy') end
  -- validated: writes may start
  if action == 'reopen' then
    reopen_provider(cfg, name, now, 'operator:' .. why)
    return {STATUS.OK, '0'}
  end
  local until_ = close_provider(cfg, name, now, 'operator:' .. why, seconds or (next_midnight(now) - now))
  return {STATUS.OK, fmt(until_)}
end
