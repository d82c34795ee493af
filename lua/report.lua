--[[
  report — a load signal in the middle of a round (the worker's watchdog saw the round pass its
  stall threshold, or the round cap); the seat stays and the round goes on.

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  seat id
  ARGV[2]  seq the seat was admitted with
  ARGV[3]  pod
  ARGV[4]  signal: stall | round_cap | rate_limited (load: one per seat), key_daily_limit |
           budget_reached | credit | key_rejected (closes the provider; always applied), or
           ceiling (a rate ceiling spent; always applied)
  ARGV[5]  now ('' = Redis TIME)
  ARGV[6]  retry after: seconds the provider asked to wait ('' = none); with rate_limited it
           pauses the pool until then (outcome.lua), also when the seat reported before
  ARGV[7]  ceiling: with the signal `ceiling` (a 429 naming a spent rate ceiling), the limit
           spent: rpm | tpm | itpm | otpm | rpd | tpd (ceilings.lua spent: that bucket is empty
           until the reset; not a load signal, the estimate is left alone)
  ARGV[8]  reset: seconds until that ceiling resets ('' = 0; at most 86400)

  Reply: {status, pool, decreased (0/1), est}
    status REPORTED, or ALREADY_REPORTED when this seat reported a load signal before (one per seat)
  Events (events.lua): `exhausted` when the estimate decreased, `closed` for a closing signal; a
    signal applied counts signal|<pool>|<signal> in `totals` (ALREADY_REPORTED counts nothing)
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_UNKNOWN_SEAT, ADM_NOT_YOUR_SEAT, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "pool"
--- @include "events"
--- @include "seats"
--- @include "capline"
--- @include "outcome"
--- @include "ceilings"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_num, check_one_of, clock, fail = Util.check_num, Util.check_one_of, Util.clock, Util.fail
local fmt, key, run = Util.fmt, Util.key, Util.run
local load_config = Config.load_config
local load_pool = Pool.load_pool
local count = Events.count
local check_owner, read_hash, seat_args = Seats.check_owner, Seats.read_hash, Seats.seat_args
local stall_planned = Capline.stall_planned
local LOAD, SIGNALS, pause, signal = Outcome.LOAD, Outcome.SIGNALS, Outcome.pause, Outcome.signal
local scope_for, spent = Ceilings.scope_for, Ceilings.spent

local CEILING_LIMITS = {rpm = true, tpm = true, itpm = true, otpm = true, rpd = true, tpd = true}

return function()
  local id, seq, pod = seat_args()
  local what = check_one_of('signal', ARGV[4], SIGNALS)
  local now = clock(ARGV[5])
  local retry_after = check_num('retry after', ARGV[6], 0, 0) -- 0: none
  local limit, reset
  if what == 'ceiling' then
    limit, reset = check_one_of('ceiling', ARGV[7], CEILING_LIMITS), check_num('reset', ARGV[8], 0, 0)
    if reset > 86400 then fail(ERR.BAD_ARG, 'reset must be at most 86400 seconds, got ' .. ARGV[8]) end
  end
  local cfg = load_config(nil)
  local s = check_owner(id, read_hash(key('seat', id)), seq, pod)
  if not s then fail(ERR.UNKNOWN_SEAT, 'no live seat ' .. id) end
  local p = load_pool(cfg.T, s.pool)
  if limit then -- a spent ceiling: not load, the seat's round goes on
    spent(cfg, (s.cScope and s.cScope ~= '') and s.cScope or scope_for(cfg, s.pool), limit, reset, now)
    count('signal', p.name, 'ceiling')
    return {STATUS.REPORTED, s.pool, 0, fmt(p.est)}
  end
  if s.signalled ~= '' and LOAD[what] then
    if what == 'rate_limited' then pause(cfg, p, now, retry_after) end
    return {STATUS.ALREADY_REPORTED, s.pool, 0, fmt(p.est)}
  end
  -- a stall the cap line planned is counted, not a load signal (capline.lua)
  local planned = what == 'stall' and p.exhausted == 1 and stall_planned(cfg.T, p, s, now)
  if planned then count('signal', p.name, 'stall-planned') end
  local decreased = not planned and signal(cfg, p, now, what, seq, tonumber(s.load), false, retry_after)
  if LOAD[what] then redis.call('HSET', key('seat', id), 'signalled', what) end
  return {STATUS.REPORTED, s.pool, decreased and 1 or 0, fmt(p.est)}
end
