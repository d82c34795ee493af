--[[
  release — a round ended: free its seat, count its outcome, book its cost. Idempotent: a release
  retried after a lost reply finds the seat's tombstone and changes nothing; its cost is booked
  under the charge key `release` of the seat, so a replay counts it once (charge.lua books the
  cost of a release whose seat Redis lost).

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  seat id (the round id)
  ARGV[2]  seq: the admission sequence the seat was given (binds the release to that admission)
  ARGV[3]  pod
  ARGV[4]  outcome: clean | rate_limited | stall | round_cap | error | key_daily_limit |
           budget_reached | credit | key_rejected (a closing outcome closes the provider)
  ARGV[5]  seconds the round ran (>= 0); counted at most round_cap: a round runs no longer (it is
           cut there), and one release that said it ran for years (a client's bad clock) would
           otherwise set the pool's mean round time, and with it the wait between growth steps
           (pool.lua), for good. Bounded, not refused: a refused release would leave its seat
           held until the lease ran out
  ARGV[6]  cost in integer micro-USD (0..1e12; '' = not priced; the day's ledger entry stays <= 2^53)
  ARGV[7]  now ('' = Redis TIME)
  ARGV[8]  at: when the round ended ('' = now): the UTC day its cost is booked to (a replay from
           the outbox keeps its day)
  ARGV[9]  retry after: seconds the provider asked to wait (its Retry-After with a 429 or 529;
           '' = none): a rate_limited outcome pauses the pool until then (outcome.lua)
  ARGV[10] received: the tokens the round received in all ('' or absent = its declared size): a
           declared round's clean release measures its last stretch with it (capline.lua), so a
           size declared as an upper bound (an answer budget) does not read as a fast round
  ARGV[11] uncached input tokens the provider counted ('' = not reported)
  ARGV[12] cache creation tokens ('' = 0)
  ARGV[13] cache read tokens ('' = 0)
  ARGV[14] output tokens ('' = 0). Each usage a number in [0, 1e9]. Given any of 11-14, a seat
           that reserved against its scope's ceilings is reconciled: the buckets are refunded or
           charged the difference (ceilings.lua reconcile), once: a retry finds the tombstone
  ARGV[15] ceiling: with outcome `ceiling` (a 429 that names a spent rate ceiling), the limit
           spent: rpm | tpm | itpm | otpm | rpd | tpd; that bucket of the pool's scope is empty
           until the reset (a daily one closes the scope until midnight) and the estimate is
           left alone
  ARGV[16] reset: seconds until the provider's ceiling resets ('' = 0; at most 86400)
  ARGV[17] reading: the provider's rate-limit headers of the round's last response ('' or
           absent = none; admission/ratelimits.py encode: v=1;at=...;tpm=limit,remaining,
           reset_s,rounding;...): the pool's scope learns the provider's limits from it, and a
           fresh one lowers its buckets to what remains (readings.lua); a pool with no
           configured scope learns one of its own, named after the pool. Malformed: ADM_BAD_ARG

  Reply: {status, pool, decreased (0/1), est, successes, failures, mean cost (micro-USD)}
    (the pool's outcome counts after this one: what the client's Thompson draws read; '' on a
    retry)
    status RELEASED, ALREADY_RELEASED (retry; nothing changed: the tombstone is written back as
    it is, util.lua rewrite) or EXPIRED (lease had run out: the outcome counts, the counts were
    already healed by the sweep)
  Events (events.lua): `released`; `exhausted` when the estimate decreased, `closed` for a closing
    outcome, `reopened` when a probe ends clean; a load or closing outcome counts
    signal|<pool>|<outcome> in `totals` (not again for the load signal the round reported)
  Wake-up: PUBLISH <pool> on `wake` only when a waiter can use the freed slot (a waiter of the
    pool, or of a pool that lists it as an alternative)
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_UNKNOWN_SEAT, ADM_NOT_YOUR_SEAT, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "pool"
--- @include "capline"
--- @include "events"
--- @include "seats"
--- @include "outcome"
--- @include "ceilings"
--- @include "readings"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_num, check_one_of, clock, fail = Util.check_num, Util.check_one_of, Util.clock, Util.fail
local fmt, key, rewrite, run = Util.fmt, Util.key, Util.rewrite, Util.run
local load_config = Config.load_config
local load_pool = Pool.load_pool
local advance_clock, check_token_count = Capline.advance_clock, Capline.check_token_count
local fit_release = Capline.fit_release
local event = Events.event
local check_owner, drop_seat, read_gone = Seats.check_owner, Seats.drop_seat, Seats.read_gone
local read_hash, seat_args, wake_if_waited = Seats.read_hash, Seats.seat_args, Seats.wake_if_waited
local OUTCOMES, SIGNAL_CLOCK_FIELDS = Outcome.OUTCOMES, Outcome.SIGNAL_CLOCK_FIELDS
local SIGNAL_FIELDS, SIGNAL_FIT_FIELDS = Outcome.SIGNAL_FIELDS, Outcome.SIGNAL_FIT_FIELDS
local apply_outcome, check_at, check_cost = Outcome.apply_outcome, Outcome.check_at, Outcome.check_cost
local reconcile, scope_for, spent = Ceilings.reconcile, Ceilings.scope_for, Ceilings.spent
local learn, parse_reading = Readings.learn, Readings.parse_reading

local CEILING_LIMITS = {rpm = true, tpm = true, itpm = true, otpm = true, rpd = true, tpd = true}
local MAX_RESET = 86400

-- What the provider counted (ARGV[11..14]); nil when nothing was reported.
local function usage_args()
  if #ARGV < 11 then return nil end -- the common release sends none: no table built
  local given = {uncached = ARGV[11], creation = ARGV[12], reads = ARGV[13], output = ARGV[14]}
  local u, any = {uncached = 0, creation = 0, reads = 0, output = 0}, false
  for f, s in pairs(given) do
    if s ~= '' then any = true end
    u[f] = s ~= '' and check_token_count(f .. ' tokens', s, 0) or 0
  end
  return any and u or nil
end

-- The spent ceiling of a `ceiling` outcome (ARGV[15..16]): its limit and reset, else nil.
local function ceiling_args(outcome)
  if outcome ~= 'ceiling' then return nil end
  local limit = check_one_of('ceiling', ARGV[15], CEILING_LIMITS)
  local reset = check_num('reset', ARGV[16], 0, 0)
  if reset > MAX_RESET then fail(ERR.BAD_ARG, 'reset must be at most 86400 seconds, got ' .. ARGV[16]) end
  return limit, reset
end

-- The call, every argument checked before the first write (Redis does not roll a script back).
local function read_call()
  local id, seq, pod = seat_args()
  local outcome = check_one_of('outcome', ARGV[4], OUTCOMES)
  local seconds = check_num('seconds', ARGV[5], 0, 0)
  if ARGV[6] ~= '' then check_num('cost', ARGV[6], nil, 0) end
  local now = clock(ARGV[7])
  local at = check_at(ARGV[8], now)
  local retry_after = check_num('retry after', ARGV[9], 0, 0) -- 0: none
  local received = ARGV[10] and ARGV[10] ~= '' and check_token_count('tokens received', ARGV[10], 0) or nil
  local usage = usage_args()
  local limit, reset = ceiling_args(outcome)
  local reading = parse_reading(ARGV[17])
  return {id = id, seq = seq, pod = pod, outcome = outcome, seconds = seconds, now = now, at = at,
    retry_after = retry_after, received = received, usage = usage, limit = limit, reset = reset, reading = reading}
end

return function()
  local r = read_call()
  local id, seq, pod, outcome, seconds, now, at = r.id, r.seq, r.pod, r.outcome, r.seconds, r.now, r.at
  local retry_after, received, usage, limit, reset, reading = r.retry_after, r.received, r.usage, r.limit,
    r.reset, r.reading
  local cfg = load_config(nil)
  seconds = math.min(seconds, cfg.T.round_cap) -- a round runs at most round_cap (header)

  local s = check_owner(id, read_hash(key('seat', id)), seq, pod)
  local cost
  if not s then
    local gone = check_owner(id, read_gone(id), seq, pod)
    if not gone then fail(ERR.UNKNOWN_SEAT, 'no seat ' .. id .. ' (never admitted, or gone for a day)') end
    if gone.state == 'released' then
      rewrite(key('gone', id))
      return {STATUS.ALREADY_RELEASED, gone.pool, 0, '', '', '', ''}
    end
    cost = check_cost(ARGV[6], gone.lane, gone.pool, at)
    -- expired under a live round (a slow heartbeat): the counts were healed by the sweep; the
    -- round still ran, so count what it saw, once
    local p = load_pool(cfg.T, gone.pool)
    -- its reservation stays charged (the seat that held it is gone); a spent ceiling still holds
    -- what the provider said of its ceilings first: a pool that configures none learns its scope
    -- here, and the spent ceiling then holds a bucket of it
    if reading then learn(cfg, cfg.scope_of[gone.pool] or gone.pool, reading, now) end
    if limit then spent(cfg, scope_for(cfg, gone.pool), limit, reset, now) end
    local decreased = apply_outcome(cfg, p, gone, id, now, outcome, seconds, cost, at, retry_after)
    redis.call('SET', key('gone', id), table.concat({'released', gone.seq, gone.pod, gone.pool, gone.lane}, '|'),
      'KEEPTTL')
    return {STATUS.EXPIRED, gone.pool, decreased and 1 or 0, fmt(p.est), fmt(p.succ), fmt(p.fail), fmt(p.meanCost)}
  end

  cost = check_cost(ARGV[6], s.lane, s.pool, at)
  local p = load_pool(cfg.T, s.pool)
  -- the cap line: the load clock moves with the rounds that ran until now (this one included); a
  -- declared round that ended clean is a point of the fit
  local fields = SIGNAL_FIELDS
  if p.sized > 0 then
    advance_clock(p, now)
    fields = SIGNAL_CLOCK_FIELDS
    if outcome == 'clean' and s.tokens and s.tokens ~= '' and fit_release(p, s, now, seconds, received) then
      fields = SIGNAL_FIT_FIELDS
    end
  end
  local decreased = apply_outcome(cfg, p, s, id, now, outcome, seconds, cost, at, retry_after, fields)
  -- the ceilings: what the provider counted against what the admit reserved, once (the seat goes)
  if usage then reconcile(cfg, s, usage, now) end
  local scope = (s.cScope and s.cScope ~= '') and s.cScope or nil
  -- what the provider said of its ceilings, after the reconciliation (it may lower what that
  -- left), then the spent ceiling: a pool that configures none learns its scope here first
  if reading then learn(cfg, scope or cfg.scope_of[s.pool] or s.pool, reading, now) end
  if limit then spent(cfg, scope or scope_for(cfg, s.pool), limit, reset, now) end
  drop_seat(id, s, 'released')
  wake_if_waited(cfg, s.pool, p.waiting)
  event('released', 'round', id, 'pool', s.pool, 'lane', s.lane, 'outcome', outcome, 'seconds', fmt(seconds))
  return {STATUS.RELEASED, s.pool, decreased and 1 or 0, fmt(p.est), fmt(p.succ), fmt(p.fail), fmt(p.meanCost)}
end
