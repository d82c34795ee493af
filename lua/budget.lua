--[[
  budget — a budget reader's reading of a provider's day (its key's daily limit and what was
  spent on it today, as the provider counts). The rules take the smaller limit (the policy's
  daily_limit_usd or the reading's) and the larger spent (our ledger's or the reading's); a
  reading of another UTC day stops nobody. A reading whose spent reached its limit closes the
  provider until midnight (budget_reached).

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  provider (declared in the policy)
  ARGV[2]  limit in integer micro-USD ('' = the reading has no limit)
  ARGV[3]  spent today in integer micro-USD ('' = not given)
  ARGV[4]  at: when the reading was taken (epoch seconds; at most 300 s ahead of the server)
  ARGV[5]  now ('' = Redis TIME)

  Reply: {status, reading's day, closed until (0 = open)}
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_UNKNOWN_PROVIDER, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "events"
--- @include "provider"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_name, check_num, clock, fail = Util.check_name, Util.check_num, Util.clock, Util.fail
local fmt, key, run, utc_day = Util.fmt, Util.key, Util.run, Util.utc_day
local load_config = Config.load_config
local event = Events.event
local READING_SKEW, budget, close_provider = Provider.READING_SKEW, Provider.budget, Provider.close_provider
local is_closed, load_provider = Provider.is_closed, Provider.load_provider

local function micro_arg(what, s)
  if s == nil or s == '' then return nil end
  local x = check_num(what, s, nil, 0)
  if x ~= math.floor(x) or x > 2 ^ 53 then fail(ERR.BAD_ARG, what .. ' must be whole micro-USD <= 2^53, got ' .. s) end
  return x
end

return function()
  local name = check_name('provider', ARGV[1])
  local limit, spent = micro_arg('limit', ARGV[2]), micro_arg('spent', ARGV[3])
  local at = check_num('at', ARGV[4], nil, 0)
  local now = clock(ARGV[5])
  local cfg = load_config(nil)
  if not cfg.providers[name] then fail(ERR.UNKNOWN_PROVIDER, 'provider ' .. name .. ' is not in the policy') end
  if at > now + READING_SKEW then fail(ERR.BAD_ARG, 'the reading is from the future (at ' .. ARGV[4] .. ')') end
  -- validated: writes may start
  local day = utc_day(at)
  redis.call('HSET', key('provider', name), 'readLimit', limit and fmt(limit) or '', 'readSpent',
    spent and fmt(spent) or '', 'readAt', fmt(at), 'readDay', day)
  event('budget', 'provider', name, 'limit', limit and fmt(limit) or '', 'spent', spent and fmt(spent) or '', 'day', day)
  local pv = load_provider(name)
  local b = budget(cfg, name, now, pv)
  if b and b.spent >= b.limit and not is_closed(pv, now) then close_provider(cfg, name, now, 'budget_reached') end
  return {STATUS.OK, day, fmt(load_provider(name).closedUntil)}
end
