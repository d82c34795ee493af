--[[
  take — one more call of a running round takes its own request and tokens from its scope's
  buckets before it is sent (design §5.9): the admit reserved the round's first call; each later
  call of a multi-call round (a joined SDK call, an agent's next step) takes its own. Every
  bucket covers it or none is debited; refused, the call waits `wait_s` and keeps its seat.
  The seat adds the call to its reservation (cIn, cOut, cBudget, cCalls), so the round's release
  reconciles all of its calls at once. Idempotent by (seat, call key): a take retried after a
  lost reply takes once.

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  seat id (the round id)
  ARGV[2]  seq the seat was admitted with
  ARGV[3]  pod
  ARGV[4]  call key (a name, unique among the round's calls)
  ARGV[5]  input tokens: what the call will send, as the provider counts it ('' = the scope's
           learned mean per call; else a number in [0, 1e9])
  ARGV[6]  answer budget: the call's max_tokens ('' = not declared; else in [0, 1e9])
  ARGV[7]  now ('' = Redis TIME)

  Reply: {status, reason, wait_s}
    status TAKEN          the call's request and tokens are debited (reason ''; a pool without a
                          ceilings scope takes nothing and is TAKEN at once)
    status ALREADY_TAKEN  this call key took before: nothing changed
    status REFUSED        reason ceiling-<limit>: that bucket cannot cover the call for wait_s
                          more seconds (a daily one: until midnight, and the scope closes); nothing
                          debited
    status SEAT_LOST      Redis holds no seat of that id (released, or its lease lapsed and was
                          swept): nothing written; the call has no round to count in
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_NOT_YOUR_SEAT, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "events"
--- @include "seats"
--- @include "capline"
--- @include "ceilings"
local STATUS = Codes.STATUS
local check_name, clock, fmt, key = Util.check_name, Util.clock, Util.fmt, Util.key
local load_config = Config.load_config
local count_refusal = Events.count_refusal
local check_owner, read_hash, seat_args = Seats.check_owner, Seats.read_hash, Seats.seat_args
local check_declared = Capline.check_declared
local REASON, cover, debit = Ceilings.REASON, Ceilings.cover, Ceilings.debit
local load_scope, scope_for, reservation = Ceilings.load_scope, Ceilings.scope_for, Ceilings.reservation

return function()
  local id, seq, pod = seat_args()
  local call_key = check_name('call key', ARGV[4])
  local input = check_declared('input tokens', ARGV[5])
  local budget = check_declared('answer budget', ARGV[6])
  local now = clock(ARGV[7])
  local cfg = load_config(nil)
  local s = check_owner(id, read_hash(key('seat', id)), seq, pod)
  if not s then return {STATUS.SEAT_LOST, '', '0'} end
  local taken = 'take:' .. call_key
  if s[taken] then return {STATUS.ALREADY_TAKEN, '', '0'} end
  -- validated: writes may start
  local scope = (s.cScope and s.cScope ~= '') and s.cScope or scope_for(cfg, s.pool)
  local b = scope and load_scope(cfg, scope, now)
  if not b then -- no ceilings on this pool (or a learned scope with no limit yet): nothing to take
    redis.call('HSET', key('seat', id), taken, '1')
    return {STATUS.TAKEN, '', '0'}
  end
  local res = reservation(b, input, budget)
  local limit, wait = cover(b, res)
  if limit then
    count_refusal(now, s.pool, s.lane, REASON[limit])
    return {STATUS.REFUSED, REASON[limit], fmt(wait)}
  end
  debit(b, res)
  -- the round's reservation grows by the call's: its release reconciles every call at once. The
  -- budget stays a sum while every call declared one ('' as soon as one did not).
  local had = s.cScope == scope -- the seat already holds a reservation on this scope
  local calls = had and (tonumber(s.cCalls) or 1) or 0
  local old_budget = had and tonumber(s.cBudget or '') or nil
  local sum_budget = ''
  if budget and (old_budget or calls == 0) then sum_budget = fmt((old_budget or 0) + budget) end
  redis.call('HSET', key('seat', id), taken, '1', 'cScope', scope,
    'cIn', fmt((had and tonumber(s.cIn) or 0) + res.inp), 'cOut', fmt((had and tonumber(s.cOut) or 0) + res.out),
    'cBudget', sum_budget, 'cCalls', fmt(calls + 1))
  return {STATUS.TAKEN, '', '0'}
end
