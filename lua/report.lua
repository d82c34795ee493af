--[[
  report — a load signal in the middle of a round (the worker's watchdog saw the round pass its
  stall threshold, or the round cap); the seat stays and the round goes on.

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  seat id
  ARGV[2]  seq the seat was admitted with
  ARGV[3]  pod
  ARGV[4]  signal: stall | round_cap | rate_limited (load: one per seat), or key_daily_limit |
           budget_reached | credit | key_rejected (closes the provider; always applied)
  ARGV[5]  now ('' = Redis TIME)
  ARGV[6]  retry after: seconds the provider asked to wait ('' = none); with rate_limited it
           pauses the pool until then (outcome.lua), also when the seat reported before

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
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_num, check_one_of, clock, fail = Util.check_num, Util.check_one_of, Util.clock, Util.fail
local fmt, key, run = Util.fmt, Util.key, Util.run
local load_config = Config.load_config
local load_pool = Pool.load_pool
local count = Events.count
local check_owner, read_hash, seat_args = Seats.check_owner, Seats.read_hash, Seats.seat_args
local stall_planned = Capline.stall_planned
local LOAD, SIGNALS, pause, signal = Outcome.LOAD, Outcome.SIGNALS, Outcome.pause, Outcome.signal

return function()
  local id, seq, pod = seat_args()
  local what = check_one_of('signal', ARGV[4], SIGNALS)
  local now = clock(ARGV[5])
  local retry_after = check_num('retry after', ARGV[6], 0, 0) -- 0: none
  local cfg = load_config(nil)
  local s = check_owner(id, read_hash(key('seat', id)), seq, pod)
  if not s then fail(ERR.UNKNOWN_SEAT, 'no live seat ' .. id) end
  local p = load_pool(cfg.T, s.pool)
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
