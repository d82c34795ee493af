--[[
  charge — book a cost to the spend ledger mid-round (long rounds), or the cost of a release
  whose seat Redis no longer knows (a replay from a pod's outbox after a restart lost the seat
  and its tombstone). Idempotent by (seat, key): a charge replayed twice counts once, for as
  long as the ledger keeps its days.

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  seat id (the round id)
  ARGV[2]  seq the seat was admitted with
  ARGV[3]  pod
  ARGV[4]  lane    } the seat's: checked against a live seat; what a seat Redis no longer
  ARGV[5]  pool    } knows is booked to (its provider: the catalog's, or the part after '@')
  ARGV[6]  cost in integer micro-USD (0..1e12)
  ARGV[7]  charge key (unique per charge of the seat; `release` is the release's own)
  ARGV[8]  at: when the cost was incurred ('' = now): the UTC day it is booked to
  ARGV[9]  now ('' = Redis TIME)

  Reply: {status, provider, day}   status CHARGED, or ALREADY_CHARGED (nothing changed: the charge
    key is written back as it is, util.lua rewrite)
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_NOT_YOUR_SEAT, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "events"
--- @include "seats"
--- @include "outcome"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_name, clock, fail, fmt, key = Util.check_name, Util.clock, Util.fail, Util.fmt, Util.key
local run, utc_day = Util.run, Util.utc_day
local load_config = Config.load_config
local event = Events.event
local check_owner, read_hash, seat_args = Seats.check_owner, Seats.read_hash, Seats.seat_args
local book, check_at, check_cost = Outcome.book, Outcome.check_at, Outcome.check_cost
local provider_of = Outcome.provider_of

return function()
  local id, seq, pod = seat_args()
  local lane = check_name('lane', ARGV[4])
  local pool = check_name('pool', ARGV[5])
  if ARGV[6] == nil or ARGV[6] == '' then fail(ERR.BAD_ARG, 'cost is required') end
  local charge_key = check_name('charge key', ARGV[7])
  local now = clock(ARGV[9])
  local at = check_at(ARGV[8], now)
  load_config(nil)
  local live = check_owner(id, read_hash(key('seat', id)), seq, pod)
  if live and (live.lane ~= lane or live.pool ~= pool) then
    fail(ERR.BAD_ARG, 'seat ' .. id .. ' runs on ' .. live.lane .. ' / ' .. live.pool .. ', not ' .. lane .. ' / ' .. pool)
  end
  local cost = check_cost(ARGV[6], lane, pool, at)
  -- validated: writes may start
  local provider, day = provider_of(pool), utc_day(at)
  if not book(id, seq, charge_key, lane, pool, at, cost) then return {STATUS.ALREADY_CHARGED, provider, day} end
  event('charged', 'round', id, 'lane', lane, 'pool', pool, 'key', charge_key, 'micro', fmt(cost))
  return {STATUS.CHARGED, provider, day}
end
