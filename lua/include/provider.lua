-- The provider's day (docs/design.md §5 steps 1, 2, 6; §6): closure with probes, and the budget.
--   provider:<p>  hash: closedUntil, why, closedAt, lastProbe, and the last budget reading:
--                 readLimit, readSpent (micro-USD, '' = not given), readAt, readDay (its UTC day)
-- A closure is provider-wide state: every pool of the provider reads it, so one write closes
-- them all, and it expires by itself at closedUntil (nothing has to run at midnight).
--- @include "events"
--- @include "seats"
--- @include "util"
local count, event = Events.count, Events.event
local read_hash, wake = Seats.read_hash, Seats.wake
local fmt, key, utc_day = Util.fmt, Util.key, Util.utc_day

local CLOSE_UNTIL_MIDNIGHT = {key_daily_limit = true, budget_reached = true}
local CLOSE_FOR = {credit = true, key_rejected = true}
local READING_SKEW = 300 -- seconds a reading may be stamped ahead of the server's clock

local function next_midnight(now)
  return (math.floor(now / 86400) + 1) * 86400
end

local PROVIDER_NUM = {'closedUntil', 'closedAt', 'lastProbe', 'readAt'}
local function load_provider(name)
  local pv = read_hash(key('provider', name)) or {}
  for _, f in ipairs(PROVIDER_NUM) do pv[f] = tonumber(pv[f]) or 0 end
  pv.readLimit, pv.readSpent = tonumber(pv.readLimit or ''), tonumber(pv.readSpent or '')
  pv.why = pv.why or ''
  pv.name = name
  return pv
end

local function is_closed(pv, now)
  return pv.closedUntil > now
end

local function wake_provider(cfg, name)
  local pv = cfg.providers[name]
  for _, pool in ipairs(pv and pv.pools or {}) do wake(pool) end
end

-- Close the provider for `why` (a closing signal, or an operator's word with `seconds`);
-- returns the time it reopens by itself.
local function close_provider(cfg, name, now, why, seconds)
  local until_
  if seconds then until_ = now + seconds
  elseif CLOSE_UNTIL_MIDNIGHT[why] then until_ = next_midnight(now)
  else until_ = now + cfg.T.closed_for end
  -- the refusal that closed it counts as the last probe: the first probe comes probe_every later
  redis.call('HSET', key('provider', name), 'closedUntil', fmt(until_), 'why', why, 'closedAt', fmt(now),
    'lastProbe', fmt(now))
  event('closed', 'provider', name, 'why', why, 'until', fmt(until_))
  count('closed', name, why)
  return until_
end

local function reopen_provider(cfg, name, now, by)
  redis.call('HSET', key('provider', name), 'closedUntil', '0', 'why', '', 'closedAt', fmt(now))
  event('reopened', 'provider', name, 'by', by)
  count('reopened', name, by)
  wake_provider(cfg, name)
end

-- The day's budget of a provider, in micro-USD, or nil when it has no limit today:
--   limit     the policy's daily_limit_usd and today's reading's limit, the smaller when both
--   spent     the larger of our own ledger's total for the provider today and the reading's
--   committed the rounds in flight on its pools, each at its pool's mean round cost
-- A reading of another UTC day stops nobody.
local function budget(cfg, name, now, pv)
  local pc = cfg.providers[name]
  if not pc then return nil end
  pv = pv or load_provider(name)
  if not pc.limit and not pv.readLimit then return nil end -- no limit, whatever the day
  local day = utc_day(now)
  local today = pv.readDay == day
  local limit = pc.limit
  if today and pv.readLimit then limit = limit and math.min(limit, pv.readLimit) or pv.readLimit end
  if not limit then return nil end
  local spent = tonumber(redis.call('HGET', key('spend', day), '*|' .. name)) or 0
  if today and pv.readSpent and pv.readSpent > spent then spent = pv.readSpent end
  local committed = 0
  for _, pool in ipairs(pc.pools) do
    local v = redis.call('HMGET', key('pool', pool), 'running', 'meanCost')
    committed = committed + (tonumber(v[1]) or 0) * (tonumber(v[2]) or 0)
  end
  return {limit = limit, spent = spent, committed = committed, left = limit - spent - committed,
    at = today and pv.readAt or nil, day = day}
end

-- What one lane has spent today on a provider, its rounds in flight included (the cost guard).
local function lane_spend(cfg, name, lane, day)
  local spent = tonumber(redis.call('HGET', key('spend', day), lane .. '|' .. name)) or 0
  for _, pool in ipairs(cfg.providers[name].pools) do
    local run = tonumber(redis.call('HGET', key('lanes', pool), lane)) or 0
    if run > 0 then spent = spent + run * (tonumber(redis.call('HGET', key('pool', pool), 'meanCost')) or 0) end
  end
  return spent
end

-- A closed provider's one probe: probe_every after the last one, while nothing runs on the pool.
local function probe_due(T, pv, p, now)
  return p.running == 0 and now - pv.lastProbe >= T.probe_every
end

-- The money context of a lane's newcomers on a pool (decide.lua's `m`), nil without a budget
-- today: what is left of the day (committed spend counted), the lane's reserve line, the pool's
-- mean round cost (each newcomer commits it), and the cost guard: the lane's spend on the
-- provider (`spend`, in flight included) against its floor share of the budget. A lane without a
-- floor has no share to guard: the budget and its reserve limit it.
local function money(cfg, bud, lane, spend, mc)
  if not bud then return nil end
  local l = cfg.lane[lane]
  return {left = bud.left, reserve_line = l.reserve * bud.limit, mc = mc, lane_spend = spend,
    guard_line = l.floor > 0 and l.floor * bud.limit or nil}
end

-- Check 2 for the k-th newcomer (0-based) of a run: k more rounds in flight, each committed at
-- the pool's mean round cost: a round's mean cost left, and more than the lane's reserve.
local function budget_ok(m, k)
  if not m then return true end
  local left = m.left - k * m.mc
  return left > 0 and left >= m.mc and left >= m.reserve_line
end

-- Checks 1 and 2 (docs/design.md §5) for a lane's round on pool p, in one place for admit, plan
-- and the census: nil (on to the lane rules), 'probe' (a closed provider's one probe), or the
-- refusal: provider-closed, paused, budget-spent, budget-reserve. `m` is the lane's money context
-- (money() above; plan walks budget_ok along a run of newcomers in decide.lua).
-- No probe while our own count says the day's budget is spent: a probe proves nothing about
-- that (a new reading with a higher limit does).
local function gate(T, pv, bud, p, now, m)
  local spent_out = bud ~= nil and bud.spent >= bud.limit
  local paused = p.pausedUntil > now
  if is_closed(pv, now) or spent_out then
    return (not spent_out and not paused and probe_due(T, pv, p, now)) and 'probe' or 'provider-closed'
  end
  -- the provider's Retry-After (outcome.lua pause): no new round on this pool until then
  if paused then return 'paused' end
  if budget_ok(m, 0) then return nil end
  -- rounds in flight count at their pool's mean cost, so the day's limit is overshot by at most
  -- the rounds already running; a round starts only while one more round's mean cost is left,
  -- and a lane whose reserve is no longer left stops there
  return (m.left <= 0 or m.left < m.mc) and 'budget-spent' or 'budget-reserve'
end

return {
  READING_SKEW = READING_SKEW,
  next_midnight = next_midnight,
  load_provider = load_provider,
  is_closed = is_closed,
  close_provider = close_provider,
  reopen_provider = reopen_provider,
  budget = budget,
  lane_spend = lane_spend,
  money = money,
  budget_ok = budget_ok,
  gate = gate,
}
