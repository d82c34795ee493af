--[[
  health — a health sample of a plane (a pool): its depth (requests waiting at the server), what
  runs there, and whether the sampler found it answering. The sample is a lease: it counts as
  capacity for health_max_age after it was taken (the pool's, else the tunable) and then ages
  out by itself, so a sampler that stops writing makes its plane shed borrows (fence.lua).

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  pool (in the catalog)
  ARGV[2]  depth: requests waiting (a whole number >= 0)
  ARGV[3]  running ('' = unknown; a whole number >= 0)
  ARGV[4]  ok: 1 = the plane answered, 0 = it did not (not capacity)
  ARGV[5]  at: when the sample was taken ('' = now; at most 300 s ahead of the server's clock)
  ARGV[6]  now ('' = Redis TIME)

  Reply: {status, fresh until (epoch seconds)}
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_UNKNOWN_POOL, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "provider"
--- @include "fence"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_num, check_one_of, clock, fail = Util.check_num, Util.check_one_of, Util.clock, Util.fail
local fmt, key, run = Util.fmt, Util.key, Util.run
local check_pool, load_config = Config.check_pool, Config.load_config
local READING_SKEW = Provider.READING_SKEW
local max_age = Fence.max_age

local function count_arg(what, s, optional)
  if optional and (s == nil or s == '') then return nil end
  local x = check_num(what, s, nil, 0)
  if x ~= math.floor(x) or x > 1e9 then fail(ERR.BAD_ARG, what .. ' must be a whole number in [0, 1e9], got ' .. s) end
  return x
end

return function()
  local pool = ARGV[1]
  local cfg = load_config(pool)
  check_pool(pool, cfg.provider)
  local depth = count_arg('depth', ARGV[2])
  local running = count_arg('running', ARGV[3], true)
  local ok = check_one_of('ok', ARGV[4], {['0'] = true, ['1'] = true})
  local now = clock(ARGV[6])
  local at = now
  if ARGV[5] ~= nil and ARGV[5] ~= '' then
    at = check_num('at', ARGV[5], nil, 0)
    if at > now + READING_SKEW then fail(ERR.BAD_ARG, 'at ' .. ARGV[5] .. ' is in the future') end
  end
  -- validated: writes may start
  local last = tonumber(redis.call('HGET', key('plane', pool), 'healthAt'))
  if last and last > at then -- an older sample than the one kept (a slow sampler) changes nothing
    return {STATUS.OK, fmt(last + max_age(cfg, pool))}
  end
  redis.call('HSET', key('plane', pool), 'healthAt', fmt(at), 'healthOk', ok, 'healthDepth', depth,
    'healthRunning', running and fmt(running) or '')
  return {STATUS.OK, fmt(at + max_age(cfg, pool))}
end
