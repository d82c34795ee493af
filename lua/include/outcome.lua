-- What a round reports, applied to its pool (DESIGN §4 "Signals", §6 load signals).
local LOAD = {rate_limited = true, stall = true, round_cap = true}
local OUTCOMES = {clean = true, rate_limited = true, stall = true, round_cap = true, error = true}
local SIGNAL_FIELDS = {'succ', 'fail', 'meanSec', 'meanCost', 'priced', 'clean'}
local SPEND_DAYS = 8 -- spend ledgers of older days expire
-- Money bounds, checked before a script's first write: one charge at most 1e6 USD, a ledger
-- entry at most 2^53 micro-USD (exact in a Lua number and a Redis integer).
local MAX_COST_MICRO = 1e12
local MAX_LEDGER_MICRO = 2 ^ 53

-- The provider a pool's spend is booked to: the catalog's, or (a pool removed from the policy
-- while its rounds ran) the part after '@' of its name.
local function provider_of(pool)
  return redis.call('HGET', KEYS[1], 'pool:' .. pool) or string.match(pool, '@([^@]*)$') or ''
end

-- A cost argument in whole micro-USD ('' = not priced), and the ledger field it will be added
-- to, checked so that the HINCRBY after the first write cannot fail. Returns cost or nil.
local function check_cost(s, lane, pool, now)
  if s == nil or s == '' then return nil end
  local cost = check_num('cost', s, nil, 0)
  if cost ~= math.floor(cost) or cost > MAX_COST_MICRO then
    fail(ERR.BAD_ARG, 'cost must be whole micro-USD in [0, ' .. string.format('%.0f', MAX_COST_MICRO) .. '], got ' .. s)
  end
  local spent = tonumber(redis.call('HGET', key('spend', utc_day(now)), lane .. '|' .. provider_of(pool))) or 0
  if cost > MAX_LEDGER_MICRO - spent then fail(ERR.BAD_ARG, 'the ledger entry would pass 2^53 micro-USD') end
  return cost
end

-- A load signal from the seat with admission sequence `seq`; true when the estimate decreased.
local function load_signal(T, p, now, why, seq)
  local decreased = decrease(T, p, now, why, seq)
  if decreased then
    save_pool(p, DECREASE_FIELDS)
    event('exhausted', 'pool', p.name, 'why', why, 'running', p.running, 'est', fmt(p.est))
  end
  return decreased
end

-- The end of a round: its outcome, duration and price. A load signal the round's watchdog
-- already reported mid-round is not applied twice: that report moved holdSeq to or past the
-- seat's seq, so once-per-burst holds it. Spend is kept per lane per provider per UTC day.
-- Returns true when the estimate decreased.
local function apply_outcome(cfg, p, lane, now, outcome, seconds, cost_micro, seq)
  local decreased = false
  if LOAD[outcome] then decreased = load_signal(cfg.T, p, now, outcome, seq) end
  if outcome == 'clean' then
    p.meanSec = ewma(p.meanSec, p.succ, seconds)
    p.clean = p.clean + 1
  end
  count_outcome(p, outcome == 'clean')
  if cost_micro ~= nil then
    p.meanCost = ewma(p.meanCost, p.priced, cost_micro)
    p.priced = math.min(p.priced + 1, 1000000)
    local day = key('spend', utc_day(now))
    redis.call('HINCRBY', day, lane .. '|' .. provider_of(p.name), string.format('%.0f', cost_micro))
    redis.call('EXPIRE', day, SPEND_DAYS * 86400)
  end
  save_pool(p, SIGNAL_FIELDS)
  return decreased
end
