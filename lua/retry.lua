--[[
  retry — an attempt of a seated round failed and it wants to try again: the retry spends the
  budget of the plane where the attempt ran (the seat's pool), never another plane's
  (docs/design.md §8). The count of retries is kept beside the intent (`intent:<id>`, a day), not
  in a pod's memory, so a restarted pod or a round moved elsewhere cannot start it again.

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  seat id (the round id)
  ARGV[2]  seq: the admission sequence of the seat
  ARGV[3]  pod
  ARGV[4]  now ('' = Redis TIME)
  ARGV[5]  attempt key (may be empty): a retry sent again with the same key (after a lost reply)
           answers what the first one decided and spends nothing more

  Reply: {status, decision, retries left on the plane ('' = no budget set), retries of the intent, plane}
    status OK with decision retry_same_plane (one token of the seat's plane spent; try again
    there) or compensate_or_shed (none left: compensate or drop inside that plane; nothing spent)
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_UNKNOWN_SEAT, ADM_NOT_YOUR_SEAT, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "seats"
--- @include "fence"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_name, clock, fail, fmt, key = Util.check_name, Util.clock, Util.fail, Util.fmt, Util.key
local run = Util.run
local load_config = Config.load_config
local check_owner, read_hash, seat_args = Seats.check_owner, Seats.read_hash, Seats.seat_args
local load_plane, read_intent, spend_retry = Fence.load_plane, Fence.read_intent, Fence.spend_retry
local write_intent = Fence.write_intent

return function()
  local id, seq, pod = seat_args()
  local now = clock(ARGV[4])
  local attempt = check_name('attempt key', ARGV[5], true)
  local cfg = load_config(nil)
  local s = check_owner(id, read_hash(key('seat', id)), seq, pod)
  if not s then fail(ERR.UNKNOWN_SEAT, 'no live seat ' .. id .. ': a retry needs the attempt\'s seat') end
  -- validated: writes may start
  local st = load_plane(cfg, s.pool, now)
  if attempt ~= '' then
    local done = redis.call('HGET', key('intent', id), 'attempt:' .. attempt)
    if done then return {STATUS.OK, done, st.retries and fmt(st.retries) or '', read_intent(id).retries, s.pool} end
  end
  local decision = spend_retry(st, now)
  local retries = read_intent(id).retries
  if decision == 'retry_same_plane' then
    retries = redis.call('HINCRBY', key('intent', id), 'retries', 1)
    write_intent(id, 'plane', s.pool)
  end
  if attempt ~= '' then write_intent(id, 'attempt:' .. attempt, decision) end
  return {STATUS.OK, decision, st.retries and fmt(st.retries) or '', retries, s.pool}
end
