-- A provider's rate-limit headers, read by the client (admission/ratelimits.py encode) and
-- carried with a release or a progress report: the ceilings learn from them (docs/design.md
-- §5.9, "Learned from the headers"). In the scope's hash ceil:<scope> (ceilings.lua):
--   learned:<limit>  the provider's limit, from the newest reading (a reading older than
--                    readAt, one replayed from an outbox, learns no limit)
--   readAt           that reading's time (at most the call's now)
--   learnedBurst     the provider's request bucket's burst, in seconds of its rate: what a
--                    reading says remains (a whole count, floored: one more) plus what refills
--                    until its reset, over the rate; the least any reading has shown (the
--                    request bucket's burst_s when smaller, ceilings.lua)
-- A fresh reading (|now - at| < FRESH_S on the server's clock) also lowers each bucket to what
-- the provider says remains, minus its rounding; never raises it. The provider counted its
-- `remaining` at `at`; the rounds this mesh admitted since are debited from our level but not
-- from that count, and the refill since `at` is not credited either: within FRESH_S the two
-- offset each other up to the refill rate, and the next reading corrects the rest.
-- The traffic from outside the mesh (another client on the same key) drains the provider's
-- bucket between readings while ours refills at its whole rate; each fresh reading lowers ours
-- by that gap. Over a window of at least NET_MIN_DT (netAt: its start) the gaps lowered
-- (low:<limit>; each less what our bucket refilled since the provider counted, the reading's
-- age), less a shortfall of ours at its end, over the window's length are what the
-- drain estimate (net:<limit>, per second) missed: it moves by NET_GAIN of that, within [0,
-- (1 - MIN_NET) x rate], and the bucket refills at its rate less the drain (ceilings.lua), so
-- the next admits already leave the outside traffic its share instead of meeting its 429s.
-- A reading's retry-after (ra) and spent ceiling (sp) are checked but not used here: the
-- release's ARGV[9] and its `ceiling` outcome carry them.
--- @include "codes"
--- @include "util"
--- @include "ceilings"
local ERR = Codes.ERR
local fail, fmt, key = Util.fail, Util.fmt, Util.key
local LIMITS, load_scope, save_levels = Ceilings.LIMITS, Ceilings.load_scope, Ceilings.save_levels
local DAILY, MIN_NET, NET_WINDOW = Ceilings.DAILY, Ceilings.MIN_NET, Ceilings.NET_WINDOW

local FRESH_S = 2
local NET_MIN_DT = 5 -- a drain is measured over at least this many seconds (one gap is noise)
local NET_GAIN = 0.5 -- the share of a window's error the drain estimate takes
local MAX_TEXT = 1000
local MAX_LIMIT = 1e12
local MAX_RESET = 2 * 86400
local KIND = {rpm = true, tpm = true, itpm = true, otpm = true, rpd = true, tpd = true}

-- One number of a reading: '' = unknown (nil); else finite, in [0, max].
local function number(what, s, max)
  if s == '' then return nil end
  local x = tonumber(s)
  if x == nil or x ~= x or x < 0 or x > max then
    fail(ERR.BAD_ARG, 'bad rate-limit reading: ' .. what .. ' must be a number in [0, ' .. fmt(max) .. '], got ' ..
      string.format('%q', s))
  end
  return x
end

-- The reading `s` (the wire format of admission/ratelimits.py encode) checked whole, nothing
-- written: {at, limits = {limit = {limit, remaining, reset, rounding}}}; nil for ''.
local function parse_reading(s)
  if s == nil or s == '' then return nil end
  if #s > MAX_TEXT then fail(ERR.BAD_ARG, 'bad rate-limit reading: longer than ' .. MAX_TEXT .. ' characters') end
  local fields, n = {}, 0
  for part in (s .. ';'):gmatch('([^;]*);') do
    local k, v = part:match('^([^=]+)=(.*)$')
    if not k or fields[k] then fail(ERR.BAD_ARG, 'bad rate-limit reading: ' .. string.format('%q', part)) end
    fields[k], n = v, n + 1
  end
  if fields.v ~= '1' then fail(ERR.BAD_ARG, 'bad rate-limit reading: version must be 1') end
  local r = {at = number('at', fields.at or '', 1e11), limits = {}}
  if not r.at then fail(ERR.BAD_ARG, 'bad rate-limit reading: no time (at)') end
  if fields.ra then number('ra', fields.ra, MAX_RESET) end
  if fields.sp and not KIND[fields.sp] then fail(ERR.BAD_ARG, 'bad rate-limit reading: sp=' .. fields.sp) end
  local known = 2 + (fields.ra and 1 or 0) + (fields.sp and 1 or 0)
  for _, l in ipairs(LIMITS) do
    local v = fields[l]
    if v then
      known = known + 1
      local x = {}
      for item in (v .. ','):gmatch('([^,]*),') do x[#x + 1] = item end
      if #x ~= 4 then fail(ERR.BAD_ARG, 'bad rate-limit reading: ' .. l .. ' needs limit,remaining,reset,rounding') end
      r.limits[l] = {limit = number(l .. ' limit', x[1], MAX_LIMIT), remaining = number(l .. ' remaining', x[2], MAX_LIMIT),
        reset = number(l .. ' reset', x[3], MAX_RESET), rounding = number(l .. ' rounding', x[4], MAX_LIMIT) or 0}
    end
  end
  if known ~= n then fail(ERR.BAD_ARG, 'bad rate-limit reading: unknown fields') end
  return r
end

local function push(args, field, value)
  args[#args + 1] = field
  args[#args + 1] = value
end

-- Learn the reading `r` into `scope` (a pool's configured scope, else the pool's own: created
-- here): the provider's limits (a limit of 0 says nothing), then, fresh, the remainings.
local function learn(cfg, scope, r, now)
  local k = key('ceil', scope)
  local old = redis.call('HMGET', k, 'readAt', 'learnedBurst')
  local read_at = tonumber(old[1])
  if not read_at or r.at >= read_at then
    local args = {'readAt', fmt(math.min(r.at, now))}
    for l, x in pairs(r.limits) do
      if x.limit and x.limit > 0 then
        args[#args + 1] = 'learned:' .. l
        args[#args + 1] = fmt(x.limit)
      end
    end
    local x = r.limits.rpm
    if x and x.limit and x.limit > 0 and x.remaining and x.reset then
      local burst = (x.remaining + math.max(1, x.rounding)) * 60 / x.limit + x.reset
      burst = math.max(0.001, math.min(burst, 3600)) -- burst_s's bounds
      local was = tonumber(old[2])
      if not was or burst < was then push(args, 'learnedBurst', fmt(burst)) end
    end
    if #args > 2 then redis.call('HSET', k, unpack(args)) end
    -- a pool that configures no scope learns one named after it: its admits find it by this mark
    if not read_at and not cfg.ceilings[scope] then redis.call('HSET', key('pool', scope), 'learnedScope', '1') end
  end
  if math.abs(now - r.at) >= FRESH_S then return end
  local b = load_scope(cfg, scope, now)
  if not b then return end
  local h, extra = b.h, b.extra
  local net_at = tonumber(h.netAt)
  local dt = net_at and now - net_at
  local since = math.max(0, now - r.at) -- the reading's age (under FRESH_S)
  -- a new window, measuring nothing yet: none, or none fresh within NET_WINDOW (its drain lapsed too)
  local restart = not dt or dt < 0 or dt > NET_WINDOW
  local close = not restart and dt >= NET_MIN_DT      -- the window ends here: the drain moves
  local lowered = false
  for l, x in pairs(r.limits) do
    if x.remaining and b.level[l] then
      local left = math.max(0, x.remaining - x.rounding)
      local gap = b.level[l] - left
      if gap > 0 then b.level[l], lowered = left, true end
      if not DAILY[l] then
        -- what our bucket refilled since the provider counted is no outside traffic
        local missed = gap - b.rate[l] * since
        local low = (not restart and tonumber(h['low:' .. l]) or 0) + math.max(missed, 0)
        if close then
          local err = (low + math.min(missed, 0)) / dt
          local d = math.max(0, math.min((tonumber(h['net:' .. l]) or 0) + NET_GAIN * err, (1 - MIN_NET) * b.shape.gross[l]))
          push(extra, 'net:' .. l, fmt(d))
          low = 0
        end
        if restart or close or missed > 0 then push(extra, 'low:' .. l, fmt(restart and 0 or low)) end
      end
    end
  end
  if restart or close then push(extra, 'netAt', fmt(now)) end
  if lowered or #extra > 0 then save_levels(b) end
end

return {
  FRESH_S = FRESH_S,
  parse_reading = parse_reading,
  learn = learn,
}
