-- The cap line (docs/design.md §4 "The cap line"): a round that declares its size (tokens, at
-- admit) is planned to end before its cap. What the pool measures, in `pool:<p>`:
--   sized                the declared rounds running there (what `sized:<p>` holds)
--   clockAt, area, virt  the load clock: area = ∫ running dt; virt = ∫ r̂(running) dt, the tokens one
--                        round has received since the clock began, by the fit (0 while no fit). It
--                        runs only while declared rounds run (only their differences are read), so
--                        a pool whose rounds declare nothing pays nothing for it
--   fitW fitX fitY fitXX fitXY fitN fitLo fitHi  a least-squares fit of seconds per token (y)
--                        against the mean rounds in flight during the round (x), from the clean
--                        releases of declared rounds, older ones weighted down (FIT_DECAY); fitLo
--                        and fitHi: the range of x seen
--   ceiling              the most rounds in flight at which every declared round running still
--                        ends by CAP_SHARE of round_cap, by the fit and its progress so far (0 =
--                        no line); the tick computes it
-- and `sized:<p>`, a sorted set of the declared rounds running there (seat id -> tokens). A seat
-- keeps tokens, area0 and virt0 (the clock when it was admitted).
-- Seconds per token growing linearly with the rounds in flight is processor sharing with a cost
-- per round; the fit's two numbers are measured, nothing of a provider is assumed beyond that.
--- @include "codes"
--- @include "util"
local ERR = Codes.ERR
local check_num, concat, fail, fmt, key = Util.check_num, Util.concat, Util.fail, Util.fmt, Util.key

local CAP_SHARE = 0.95 -- plan to end by 95 % of the cap: the fit and the ceiling lag by a tick
local FIT_DECAY = 0.95 -- a point's weight after each newer one (about the last 20 rounds count)
local FIT_MIN_POINTS = 3
local FIT_MIN_SPREAD = 1 -- rounds in flight between the least and the most loaded point
local SIZED_SCAN = 1000 -- the tick reads at most this many declared rounds per pool (largest first)
local MAX_TOKENS = 1e9
local CLOCK_FIELDS = {'clockAt', 'area', 'virt'}
local FIT_FIELDS = {'fitW', 'fitX', 'fitY', 'fitXX', 'fitXY', 'fitN', 'fitLo', 'fitHi'}
local CEILING_FIELDS = concat(CLOCK_FIELDS, {'ceiling'}) -- what the tick saves
local CLOCK_FIT_FIELDS = concat(CLOCK_FIELDS, FIT_FIELDS) -- what a progress report saves

-- The clock's and the fit's fields as numbers (load_pool leaves them as read: an admit of a
-- pool whose rounds declare nothing never needs them).
local CLOCK_NUM = concat(CLOCK_FIELDS, FIT_FIELDS)
local function clock_numbers(p)
  if p.clockRead then return end
  for _, f in ipairs(CLOCK_NUM) do p[f] = tonumber(p[f]) or 0 end
  p.clockRead = true
end

-- A count of tokens: a finite number in [min, MAX_TOKENS].
local function check_token_count(what, s, min)
  local x = check_num(what, s, nil, min)
  if x > MAX_TOKENS then fail(ERR.BAD_ARG, what .. ' must be at most 1e9, got ' .. s) end
  return x
end

-- A declared size: '' = none (nil), else a count of tokens in [1, MAX_TOKENS].
local function check_tokens(s)
  if s == nil or s == '' then return nil end
  return check_token_count('tokens', s, 1)
end

-- A count declared to the rate ceilings (input tokens, an answer budget): '' = none (nil), else
-- a count of tokens in [0, MAX_TOKENS].
local function check_declared(what, s)
  if s == nil or s == '' then return nil end
  return check_token_count(what, s, 0)
end

-- The fit {a, b}: seconds per token = a + b * rounds in flight; nil until it has its points and
-- spread, or when rounds are not slower at more load (then the load does not decide their end).
local function fit_of(p)
  clock_numbers(p)
  if p.fitN < FIT_MIN_POINTS or p.fitHi - p.fitLo < FIT_MIN_SPREAD then return nil end
  local d = p.fitW * p.fitXX - p.fitX * p.fitX
  if d <= 1e-12 * p.fitW * p.fitW then return nil end
  local b = (p.fitW * p.fitXY - p.fitX * p.fitY) / d
  if b <= 0 then return nil end
  return {a = (p.fitY - b * p.fitX) / p.fitW, b = b}
end

-- Tokens per second of one round at n rounds in flight, by the fit.
local function rate_at(f, n)
  return 1 / math.max(1e-9, f.a + f.b * n)
end

-- Move the load clock to `now` with the rounds that ran since (p.running, before any change).
-- With no declared round running it only restarts at `now`: nothing reads what it would add.
local function advance_clock(p, now)
  clock_numbers(p)
  if p.sized <= 0 then
    p.clockAt = now
    return
  end
  if p.clockAt > 0 and now > p.clockAt then
    local dt = now - p.clockAt
    p.area = p.area + p.running * dt
    local f = p.running > 0 and fit_of(p)
    if f then p.virt = p.virt + rate_at(f, p.running) * dt end
  end
  if now > p.clockAt then p.clockAt = now end
end

-- How many more rounds the ceiling lets start on p with `running` rounds in flight (math.huge:
-- no line). A ceiling is at least 1, so a round alone on its pool always starts; with no declared
-- round running there is no line (a ceiling the tick has not cleared yet included).
local function ceiling_room(p, running)
  if p.ceiling <= 0 or p.sized <= 0 then return math.huge end
  return math.max(0, math.floor(p.ceiling) - running)
end

local function under_ceiling(p, running)
  return ceiling_room(p, running) >= 1
end

-- Check 3b: refused ('cap-line') when one more round would take the pool past its ceiling, or a
-- round of `tokens` would not end by CAP_SHARE of the cap at the load it makes.
local function cap_line_refuses(T, p, tokens)
  if p.running < 1 then return false end
  if not under_ceiling(p, p.running) then return true end
  if tokens then
    local f = fit_of(p)
    if f and tokens > rate_at(f, p.running + 1) * CAP_SHARE * T.round_cap then return true end
  end
  return false
end

-- One point of the fit, weighted w (a whole round's life is weight 1): older points are weighted
-- down by FIT_DECAY per round's worth of newer ones, so a round reported in pieces counts as much
-- as one reported once at its end.
local function fit_add(p, x, y, w)
  local d = FIT_DECAY ^ w
  p.fitW = p.fitW * d + w
  p.fitX = p.fitX * d + w * x
  p.fitY = p.fitY * d + w * y
  p.fitXX = p.fitXX * d + w * x * x
  p.fitXY = p.fitXY * d + w * x * y
  if p.fitN == 0 then p.fitLo, p.fitHi = x, x else p.fitLo, p.fitHi = math.min(p.fitLo, x), math.max(p.fitHi, x) end
  p.fitN = math.min(p.fitN + 1, 1e6)
end

-- Where a declared round's measured part ends: its last progress report (pAt, pArea, pTok) or,
-- with none, its admission.
local function progress_anchor(p, s)
  local at = tonumber(s.pAt) or tonumber(s.at)
  local area0 = tonumber(s.pArea) or tonumber(s.area0) or p.area
  return at, area0, tonumber(s.pTok) or 0
end

-- A running declared round reports `got` tokens received by `now`: the stretch since its last
-- report is a point of the fit (the clock already advanced), and its progress so far re-anchors
-- virt0, so the ceiling counts what it really received. Returns the seat's new fields, or nil
-- when nothing new came (no tokens since, or no time).
local function fit_progress(p, s, now, got)
  clock_numbers(p)
  local tokens = tonumber(s.tokens)
  local at, area0, before = progress_anchor(p, s)
  if not tokens or not at or got <= before or now <= at then return nil end
  fit_add(p, (p.area - area0) / (now - at), (now - at) / (got - before), math.min(1, (got - before) / tokens))
  return {'pAt', fmt(now), 'pArea', fmt(p.area), 'pTok', fmt(got), 'virt0', fmt(p.virt - math.min(got, tokens))}
end

-- A clean release of a declared round adds its point to the fit (the clock already advanced):
-- the stretch since its last progress report, or its whole life (then its own seconds), over the
-- tokens it received in all (`received`, else its declared size); true when it did.
local function fit_release(p, s, now, seconds, received)
  clock_numbers(p)
  local tokens = received or tonumber(s.tokens)
  local at, area0, before = progress_anchor(p, s)
  if not tokens or not at or seconds <= 0 or now <= at or tokens <= before then return false end
  local y = s.pAt and (now - at) / (tokens - before) or seconds / tokens
  fit_add(p, (p.area - area0) / (now - at), y, (tokens - before) / tokens)
  return true
end

-- A stall the cap line planned: the declared round s, by the fit and its progress so far, still
-- ends by CAP_SHARE of its cap at the load running now. Its watchdog's stall threshold is then not
-- news about the provider: the line already holds the room it needs. (It moves p's clock to now;
-- the caller does not save it.)
local function stall_planned(T, p, s, now)
  local tokens, at, virt0 = tonumber(s.tokens), tonumber(s.at), tonumber(s.virt0)
  local f = tokens and at and virt0 and p.sized > 0 and p.running > 0 and fit_of(p)
  if not f then return false end
  advance_clock(p, now)
  local left = CAP_SHARE * T.round_cap - (now - at)
  return left > 0 and tokens - (p.virt - virt0) <= rate_at(f, p.running) * left
end

-- The ceiling of pool p now (0 = none): for each declared round running, the most rounds in
-- flight at which its tokens still to come arrive by CAP_SHARE of the cap; the least of them,
-- at least 1. A round past that share of its cap no longer binds (it ends or is cut either way).
local function ceiling_of(T, p, now)
  local f = fit_of(p)
  if not f then return 0 end
  local sized = redis.call('ZRANGE', key('sized', p.name), -SIZED_SCAN, -1, 'WITHSCORES')
  local m = math.huge
  for i = 1, #sized, 2 do
    local v = redis.call('HMGET', key('seat', sized[i]), 'at', 'virt0')
    local at, virt0 = tonumber(v[1]), tonumber(v[2])
    if at and virt0 then
      local left = CAP_SHARE * T.round_cap - (now - at)
      local need = (tonumber(sized[i + 1]) - (p.virt - virt0)) / math.max(left, 1e-9)
      if left > 0 and need > 0 then m = math.min(m, (1 / need - f.a) / f.b) end
    end
  end
  if m == math.huge then return 0 end
  return math.max(1, m)
end

return {
  CLOCK_FIELDS = CLOCK_FIELDS,
  FIT_FIELDS = FIT_FIELDS,
  CEILING_FIELDS = CEILING_FIELDS,
  CLOCK_FIT_FIELDS = CLOCK_FIT_FIELDS,
  check_token_count = check_token_count,
  check_declared = check_declared,
  check_tokens = check_tokens,
  advance_clock = advance_clock,
  ceiling_room = ceiling_room,
  under_ceiling = under_ceiling,
  cap_line_refuses = cap_line_refuses,
  fit_progress = fit_progress,
  fit_release = fit_release,
  stall_planned = stall_planned,
  ceiling_of = ceiling_of,
}
