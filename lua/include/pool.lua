-- The estimate of one pool: seed-and-grow (DESIGN §4). State lives in the hash `pool:<p>`:
--   est K̂, cap K (0 = never measured), slow (1 while in slow start), exhausted, exhaustedAt, why,
--   seq (admission sequence), holdSeq (seq at the last decrease), lastGrow, clean (clean rounds
--   since the last growth step), atCap (growth steps at K without a load signal), lastDemand,
--   succ, fail, meanSec, meanCost (micro-USD), running, waiting; ceilingAt (the last refusal on a
--   rate ceiling: its waiters are no demand for concurrency); moved (running here after a
--   move), movedIn and movedOut (moves ever, to and from this pool); probeFrom (K before the
--   upward probe in progress, 0 = none), probeFails (probes refused in a row: the back-off),
--   probeRuns (rounds admitted above probeFrom since the probe began); the cap line's load clock,
--   fit and ceiling (capline.lua).
--- @include "capline"
--- @include "util"
local ceiling_room = Capline.ceiling_room
local fmt, key = Util.fmt, Util.key

local POOL_NUM = {'est', 'cap', 'slow', 'exhausted', 'exhaustedAt', 'seq', 'holdSeq', 'lastGrow',
  'clean', 'atCap', 'probeFrom', 'probeFails', 'probeRuns', 'lastDemand', 'succ', 'fail', 'meanSec', 'meanCost', 'running', 'waiting', 'priced', 'moved', 'movedIn', 'movedOut', 'pausedUntil',
  'ceilingAt', 'sized', 'ceiling'} -- the cap line's clock and fit: read as numbers only when used (capline.lua)

local function load_pool(T, pool)
  local raw = redis.call('HGETALL', key('pool', pool))
  local p = {name = pool, why = ''}
  for i = 1, #raw, 2 do p[raw[i]] = raw[i + 1] end
  for _, f in ipairs(POOL_NUM) do p[f] = tonumber(p[f]) or 0 end
  if p.est == 0 then -- never seen: seed, slow start
    p.est = T.seed_estimate
    p.slow = 1
  end
  return p
end

local function save_pool(p, fields)
  local args = {}
  for _, f in ipairs(fields) do
    local v = p[f]
    args[#args + 1] = f
    args[#args + 1] = type(v) == 'number' and fmt(v) or v
  end
  redis.call('HSET', key('pool', p.name), unpack(args))
end

local function slots(p)
  return math.max(1, math.floor(p.est))
end

-- Demand: a waiter, the pool full, or a refusal within the last interval. Waiters whose last
-- refusal was a rate ceiling (ceilingAt, ceilings.lua) wait for tokens, not for concurrency.
local function has_demand(T, p, now)
  return (p.waiting > 0 and p.ceilingAt <= p.lastDemand) or p.running >= slots(p)
    or (p.lastDemand > 0 and now - p.lastDemand < T.grow_interval)
end

-- Growth waits for its evidence: once measured, steps come at most every
-- max(grow_interval, half the mean round time).
local function grow_interval(T, p)
  if p.exhausted == 1 then return math.max(T.grow_interval, p.meanSec / 2) end
  return T.grow_interval
end

-- One growth step if due; true when the estimate (or K) changed. Idempotent per interval: every
-- pod's tick may call it, only the first one after the interval takes effect.
local GROW_FIELDS = {'est', 'cap', 'lastGrow', 'clean', 'atCap', 'slow', 'probeFrom', 'probeFails', 'probeRuns'}
-- a refused probe doubles the wait before the next one, up to 2^PROBE_BACKOFF_MAX times
local PROBE_BACKOFF_MAX = 3
local function probe_backoff(p) -- the wait's multiplier: 1, 2, 4 or 8
  return 2 ^ math.min(p.probeFails, PROBE_BACKOFF_MAX)
end
local function grow(T, p, now)
  -- a tick before the last step (ticks out of order on a caller clock) is not due and leaves
  -- lastGrow; a clock more than an interval behind it stepped back (a failover): growth restarts
  -- from now, so it waits one interval on the new clock instead of freezing until the old returns
  local since, interval = now - p.lastGrow, grow_interval(T, p)
  if since < -interval then
    p.lastGrow = now
    save_pool(p, {'lastGrow'})
    return false
  end
  if since < interval then return false end
  if not has_demand(T, p, now) then return false end -- an idle pool keeps its estimate
  -- the cap line holds the load below K̂ (capline.lua): the rounds do not reach K̂, so nothing
  -- tests a higher one
  if ceiling_room(p, 0) < slots(p) then return false end
  if p.exhausted ~= 1 then
    -- limited slow start: a step adds at most slow_start_step rounds (no limit for a policy
    -- stored before the tunable existed: config.lua)
    p.est = math.min(T.max_estimate, p.est * T.slow_start_factor, p.est + T.slow_start_step)
  else
    if p.clean < 1 then return false end -- no clean round since the last step: no evidence yet
    if p.est < p.cap - 0.5 then
      local step = math.max(T.growth_rate * p.est * (1 - p.est / p.cap), 0.25)
      p.est = math.min(p.cap, p.est + step)
    else
      -- at K: upward probing grows K by one after probe_after steps without a load signal
      p.est = math.min(T.max_estimate, math.max(p.est, p.cap))
      p.atCap = p.atCap + 1
      -- the probe before held only once as many rounds as it probed from ran above that level
      -- without a refusal (a wait with few rounds at the new level is no evidence): its level is
      -- then K, with no back-off
      local tested = p.probeFrom == 0 or p.probeRuns >= p.probeFrom
      if tested and p.atCap >= T.probe_after * probe_backoff(p) then
        if p.probeFrom > 0 then p.probeFails = 0 end
        p.probeFrom = p.cap
        p.probeRuns = 0
        p.cap = math.min(T.max_estimate, p.cap + 1)
        p.atCap = 0
        local step = math.max(T.growth_rate * p.est * (1 - p.est / p.cap), 0.25)
        p.est = math.min(p.cap, p.est + step)
      end
    end
  end
  p.lastGrow = now
  p.clean = 0
  return true
end

-- A load signal measures the load n the provider refused: for a 429, the rounds that ran when the
-- refused one was admitted (its `load` - 1: the refused round is the one too many); for a stall or
-- a cut, the rounds running now. Then, in order:
--   * a refused upward probe (a 429 at or above the K it probed from) is the probe's own
--     overshoot: K and K̂ go back to that K, and the next probe waits twice as long;
--   * a 429 a little below K (n in [factor·K, K)) refines K: K was measured high (one refusal only
--     bounds it), so K comes down to n and K̂ at most to it, in any burst;
--   * once per burst: a round admitted before the last decrease (its seq <= holdSeq) does not
--     decrease again;
--   * a stall on a measured pool lowers K̂ to at most factor·n and leaves K;
--   * otherwise K = n, K̂ = max(1, factor·n), slow start ends.
local DECREASE_FIELDS = {'est', 'cap', 'slow', 'exhausted', 'exhaustedAt', 'why', 'holdSeq',
  'lastGrow', 'clean', 'atCap', 'probeFrom', 'probeFails', 'probeRuns'}
local function decrease(T, p, now, why, seat_seq, load)
  local refused = why == 'rate_limited' and load ~= nil
  local n = math.max(1, refused and load - 1 or p.running)
  local measured = refused and p.exhausted == 1
  if measured and p.probeFrom > 0 and n >= p.probeFrom then -- a refused probe: back to where it began
    p.cap = p.probeFrom
    p.est = math.min(p.est, p.probeFrom)
    p.probeFails = p.probeFails + 1
  elseif measured and n < p.cap and n >= T.decrease_factor * p.cap then
    p.cap = n
    p.est = math.min(p.est, n)
    p.probeFrom = 0
    return true
  elseif seat_seq <= p.holdSeq then
    return false
  elseif why == 'stall' and p.exhausted == 1 then
    -- a stall says the round is long for the load it ran at, not that the provider refused a
    -- round: K̂ makes room for it, K stays what the refusals measured
    p.est = math.min(p.est, math.max(1, T.decrease_factor * n))
  else
    p.cap = n
    p.est = math.max(1, T.decrease_factor * n)
    p.probeFails = 0
  end
  p.probeFrom = 0
  p.slow = 0
  p.exhausted = 1
  p.exhaustedAt = now
  p.why = why
  p.holdSeq = p.seq
  p.lastGrow = now
  p.clean = 0
  p.atCap = 0
  return true
end

-- Outcome counts for Thompson sampling; halved past 200 so they follow a provider that changes.
local function count_outcome(p, success)
  if success then p.succ = p.succ + 1 else p.fail = p.fail + 1 end
  if p.succ + p.fail > 200 then
    p.succ = p.succ / 2
    p.fail = p.fail / 2
  end
end

local EWMA = 0.1
local function ewma(mean, n, x)
  if n <= 0 then return x end
  return mean + EWMA * (x - mean)
end

return {
  load_pool = load_pool,
  save_pool = save_pool,
  slots = slots,
  GROW_FIELDS = GROW_FIELDS,
  probe_backoff = probe_backoff,
  grow = grow,
  DECREASE_FIELDS = DECREASE_FIELDS,
  decrease = decrease,
  count_outcome = count_outcome,
  ewma = ewma,
}
