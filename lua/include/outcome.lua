-- What a round reports, applied to its pool and its provider (docs/design.md §4 "Signals", §6),
-- and the spend ledger.
--- @include "capline"
--- @include "codes"
--- @include "events"
--- @include "pool"
--- @include "provider"
--- @include "util"
local CLOCK_FIELDS, FIT_FIELDS = Capline.CLOCK_FIELDS, Capline.FIT_FIELDS
local ERR = Codes.ERR
local count, event = Events.count, Events.event
local DECREASE_FIELDS, count_outcome, decrease = Pool.DECREASE_FIELDS, Pool.count_outcome, Pool.decrease
local ewma, save_pool = Pool.ewma, Pool.save_pool
local READING_SKEW, close_provider = Provider.READING_SKEW, Provider.close_provider
local is_closed, load_provider = Provider.is_closed, Provider.load_provider
local reopen_provider = Provider.reopen_provider
local check_num, concat, fail, fmt, key = Util.check_num, Util.concat, Util.fail, Util.fmt, Util.key
local rewrite, utc_day = Util.rewrite, Util.utc_day

local LOAD = {rate_limited = true, stall = true, round_cap = true}
-- closing signals: every pool of the provider closes (provider.lua says for how long)
local CLOSING = {key_daily_limit = true, budget_reached = true, credit = true, key_rejected = true}
-- `ceiling`: a 429 that says a rate ceiling is spent (ceilings.lua spent): neither load nor a
-- closing signal, the estimate is left alone
local OUTCOMES = {clean = true, rate_limited = true, stall = true, round_cap = true, error = true,
  key_daily_limit = true, budget_reached = true, credit = true, key_rejected = true, ceiling = true}
local SIGNALS = {rate_limited = true, stall = true, round_cap = true,
  key_daily_limit = true, budget_reached = true, credit = true, key_rejected = true, ceiling = true}
local SIGNAL_FIELDS = {'succ', 'fail', 'meanSec', 'meanCost', 'priced', 'clean'}
-- what a release saves of its pool: the outcome's fields and the cap line's clock, and its fit
-- when the round was a point of it (capline.lua)
local SIGNAL_CLOCK_FIELDS = concat(SIGNAL_FIELDS, CLOCK_FIELDS)
local SIGNAL_FIT_FIELDS = concat(SIGNAL_CLOCK_FIELDS, FIT_FIELDS)

-- The spend ledger: `spend:<day>` hash, `<lane>|<provider>` -> micro-USD, and `*|<provider>` the
-- provider's total (the budget reads it in O(1)). Every booking has an idempotency key,
-- `charged:<seat>:<seq>:<key>` (a release books under the key `release`), kept as long as the
-- ledger, so a charge replayed from a pod's outbox counts once, also after its seat is long gone.
-- The admission's seq is part of it: a round id used again for a later round (a new admission,
-- a new seq) books that round's costs too.
local SPEND_DAYS = 8 -- spend ledgers of older days expire
-- Money bounds, checked before a script's first write: one charge at most 1e6 USD, a ledger
-- entry at most 2^53 micro-USD (exact in a Lua number and a Redis integer).
local MAX_COST_MICRO = 1e12
local MAX_LEDGER_MICRO = 2 ^ 53

-- The provider a pool's spend is booked to: the catalog's, or (a pool removed from the policy
-- while its rounds ran) the part after '@' of its name.
-- Read once per call: a release and a charge ask it for the same pool two or three times (the
-- call's ARGV table tells one call from the next).
local PROVIDER_OF = {}
local function provider_of(pool)
  if PROVIDER_OF.argv == ARGV and PROVIDER_OF.pool == pool then return PROVIDER_OF.provider end
  local provider = redis.call('HGET', KEYS[1], 'pool:' .. pool) or string.match(pool, '@([^@]*)$') or ''
  PROVIDER_OF.argv, PROVIDER_OF.pool, PROVIDER_OF.provider = ARGV, pool, provider
  return provider
end

-- When a cost was incurred ('' = now): it decides the UTC day it is booked to. A replayed
-- record keeps its day; one older than the ledger's days or from the future is refused.
local function check_at(s, now)
  if s == nil or s == '' then return now end
  local at = check_num('at', s, nil, 0)
  if at > now + READING_SKEW then fail(ERR.BAD_ARG, 'at ' .. s .. ' is in the future') end
  if at < now - (SPEND_DAYS - 1) * 86400 then fail(ERR.BAD_ARG, 'at ' .. s .. ' is older than the ledger keeps') end
  return at
end

-- A cost argument in whole micro-USD ('' = not priced), checked with the ledger entries it will
-- be added to, so that no write after the first can fail. Returns cost or nil.
local function check_cost(s, lane, pool, at)
  if s == nil or s == '' then return nil end
  local cost = check_num('cost', s, nil, 0)
  if cost ~= math.floor(cost) or cost > MAX_COST_MICRO then
    fail(ERR.BAD_ARG, 'cost must be whole micro-USD in [0, ' .. string.format('%.0f', MAX_COST_MICRO) .. '], got ' .. s)
  end
  local provider = provider_of(pool)
  local v = redis.call('HMGET', key('spend', utc_day(at)), lane .. '|' .. provider, '*|' .. provider)
  for i = 1, 2 do
    if cost > MAX_LEDGER_MICRO - (tonumber(v[i]) or 0) then fail(ERR.BAD_ARG, 'the ledger entry would pass 2^53 micro-USD') end
  end
  return cost
end

-- Book a cost once per (seat, key); false when that key was booked before.
local function book(seat_id, seq, charge_key, lane, pool, at, cost)
  -- a booking made before the key carried the seq (kept SPEND_DAYS) still counts it once
  local old = key('charged', seat_id, charge_key)
  if redis.call('EXISTS', old) == 1 then rewrite(old) return false end
  local k = key('charged', seat_id, string.format('%d', tonumber(seq)), charge_key)
  if redis.call('SET', k, fmt(cost), 'NX', 'EX', SPEND_DAYS * 86400) == false then rewrite(k) return false end
  local provider = provider_of(pool)
  local day = key('spend', utc_day(at))
  redis.call('HINCRBY', day, lane .. '|' .. provider, string.format('%.0f', cost))
  redis.call('HINCRBY', day, '*|' .. provider, string.format('%.0f', cost))
  redis.call('EXPIRE', day, SPEND_DAYS * 86400)
  return true
end

-- A rate limit that said when to come back (`retry_after` seconds: the provider's Retry-After
-- with a 429 or 529) pauses new admissions on the pool until then, for every pod (provider.lua
-- gate: reason `paused`), bounded by retry_after_max (0: Retry-After is ignored). A later,
-- shorter Retry-After never shortens a pause.
local function pause(cfg, p, now, retry_after)
  local most = cfg.T.retry_after_max
  if retry_after <= 0 or most <= 0 then return end
  local until_ = now + math.min(retry_after, most)
  if until_ <= p.pausedUntil then return end
  p.pausedUntil = until_
  redis.call('HSET', key('pool', p.name), 'pausedUntil', fmt(until_))
  count('paused', p.name)
  event('paused', 'pool', p.name, 'seconds', fmt(until_ - now), 'until', fmt(until_))
end

-- A load signal from the seat with admission sequence `seq`; true when the estimate decreased.
local function load_signal(T, p, now, why, seq, load)
  local decreased = decrease(T, p, now, why, seq, load)
  if decreased then
    save_pool(p, DECREASE_FIELDS)
    event('exhausted', 'pool', p.name, 'why', why, 'running', p.running, 'est', fmt(p.est), 'cap', fmt(p.cap))
  end
  return decreased
end

-- A signal (load or closing) seen by a round of pool p, mid-round or at its end. A closing
-- signal closes the provider for every pod at once (a probe refused again re-closes it). Each
-- load or closing signal counts signal|<pool>|<signal> in `totals` (events.lua), whether or not
-- it decreased the estimate (clean and error are not signals), once: `reported` = the round
-- reported this load signal mid-round already.
local function signal(cfg, p, now, what, seq, load, reported, retry_after)
  if (LOAD[what] or CLOSING[what]) and not reported then count('signal', p.name, what) end
  if what == 'rate_limited' then pause(cfg, p, now, retry_after) end
  if LOAD[what] then return load_signal(cfg.T, p, now, what, seq, load) end
  if CLOSING[what] then close_provider(cfg, provider_of(p.name), now, what) end
  return false
end

-- The end of a round: its outcome, duration and price. A load signal the round's watchdog
-- already reported mid-round is not applied twice: that report moved holdSeq to or past the
-- seat's seq, so once-per-burst holds it. A probe that ends clean reopens its provider.
-- `more`: further pool fields the caller changed, saved in the same write. Returns true when the
-- estimate decreased.
local function apply_outcome(cfg, p, s, id, now, outcome, seconds, cost_micro, at, retry_after, more)
  local decreased = signal(cfg, p, now, outcome, tonumber(s.seq), tonumber(s.load), s.signalled == outcome,
    retry_after)
  if outcome == 'clean' then
    p.meanSec = ewma(p.meanSec, p.succ, seconds)
    p.clean = p.clean + 1
    if s.probe == '1' then
      local provider = provider_of(p.name)
      if is_closed(load_provider(provider), now) then reopen_provider(cfg, provider, now, 'probe') end
    end
  end
  count_outcome(p, outcome == 'clean')
  if cost_micro ~= nil then
    p.meanCost = ewma(p.meanCost, p.priced, cost_micro)
    p.priced = math.min(p.priced + 1, 1000000)
    book(id, s.seq, 'release', s.lane, p.name, at, cost_micro)
  end
  save_pool(p, more or SIGNAL_FIELDS)
  return decreased
end

return {
  LOAD = LOAD,
  OUTCOMES = OUTCOMES,
  SIGNALS = SIGNALS,
  SIGNAL_FIELDS = SIGNAL_FIELDS,
  SIGNAL_CLOCK_FIELDS = SIGNAL_CLOCK_FIELDS,
  SIGNAL_FIT_FIELDS = SIGNAL_FIT_FIELDS,
  provider_of = provider_of,
  check_at = check_at,
  check_cost = check_cost,
  book = book,
  pause = pause,
  signal = signal,
  apply_outcome = apply_outcome,
}
