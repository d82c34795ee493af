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
-- the provider says remains, minus its rounding and the headroom's share of its bucket (so a full
-- one of the provider's is a full one of ours); never raises it. The provider counted its
-- `remaining` at `at`; the rounds this mesh admitted since are debited from our level but not
-- from that count, and the refill since `at` is not credited either: within FRESH_S the two
-- offset each other up to the refill rate, and the next reading corrects the rest.
-- The traffic from outside the mesh (another client on the same key) drains the provider's
-- bucket between readings while ours refills at its whole rate: `window` measures its rate per
-- limit over a window of fresh readings, and the bucket refills at its rate less that drain
-- (net:<limit>, ceilings.lua), so the next admits already leave the outside traffic its share
-- instead of meeting its 429s. netAt: the newest fresh reading (a drain lapses NET_WINDOW after).
-- A reading's retry-after (ra) and spent ceiling (sp) are checked but not used here: the
-- release's ARGV[9] and its `ceiling` outcome carry them.
--- @include "codes"
--- @include "util"
--- @include "ceilings"
local ERR = Codes.ERR
local fail, fmt, key = Util.fail, Util.fmt, Util.key
local LIMITS, load_scope, save_levels = Ceilings.LIMITS, Ceilings.load_scope, Ceilings.save_levels
local DAILY, REQUESTS, EPS = Ceilings.DAILY, Ceilings.REQUESTS, Ceilings.EPS
local MIN_NET, NET_WINDOW = Ceilings.MIN_NET, Ceilings.NET_WINDOW

local FRESH_S = 2
local NET_MIN_DT = 5 -- a drain is measured over at least this many seconds (one gap is noise)
local NET_GAIN = 0.5 -- the share of a window's error the drain estimate takes
local NET_UNITS = 20 -- a window holds at least this many of a reading's units of refill
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

-- One limit's outside traffic, measured over a window of fresh readings (from:<limit> its start;
-- low:<limit> the levels lowered in it less ours above the provider's at its start). Over the
-- window ours changed by its refill (rate dt) less our debits, the provider's by its refill
-- (rate_p dt) less our debits and the outside's use; so the outside's use is (rate_p - rate) dt
-- plus what was lowered plus the change of (ours - the provider's). A constant offset of the two
-- (the rounding, the headroom's share) cancels out. A window that ends full (the provider's
-- bucket: it lost refill, our estimate may be too high, so it decays; or ours) measures nothing.
local function window(b, l, x, lv, since, burst, lapsed)
  local h, extra, now = b.h, b.extra, b.now
  local limit = x.limit and x.limit > 0 and x.limit or tonumber(h['learned:' .. l]) or b.c[l]
  local rate_p = limit / 60
  local cap_p = REQUESTS[l] and burst * rate_p or limit
  local err = lv - (x.remaining + rate_p * since) -- ours less the provider's, before the lowering
  local low = tonumber(h['low:' .. l])
  local from = tonumber(h['from:' .. l])
  local net = tonumber(h['net:' .. l]) or 0
  local unit = math.max(1, x.rounding) -- a reading's unit: a whole count, or its rounding
  -- the shortest window: 5 s, or long enough that the reading's unit is a twentieth of its refill
  local min_dt = math.min(NET_WINDOW / 2, math.max(NET_MIN_DT, NET_UNITS * unit / rate_p))
  local d
  if x.remaining + unit > cap_p then -- the provider's bucket is full
    if net > 0 then d = net * (1 - NET_GAIN) end
  elseif lv >= b.cap[l] - EPS or lapsed or not low or not from or now < from then
    d = nil -- ours full (its refill lost), or no window open: one starts here
  elseif now - from < min_dt then -- inside the window: what is lowered is added
    if lv > b.level[l] then push(extra, 'low:' .. l, low + lv - b.level[l]) end
    return
  else
    local outside = rate_p - b.rate[l] + (low + err) / (now - from)
    d = math.max(0, math.min(net + NET_GAIN * (outside - net), (1 - MIN_NET) * rate_p))
  end
  if d then push(extra, 'net:' .. l, d) end
  push(extra, 'from:' .. l, now)
  push(extra, 'low:' .. l, lv - b.level[l] - err) -- minus (ours less the provider's) after the lowering
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
  local h, extra, level, cap, c = b.h, b.extra, b.level, b.cap, b.c
  local since = math.max(0, now - r.at) -- the reading's age (under FRESH_S)
  local keep = (1 - c.headroom) / c.headroom -- the headroom's share of the provider's bucket
  local net_at = tonumber(h.netAt)
  local lapsed = not net_at or now - net_at > NET_WINDOW or now < net_at
  local burst = tonumber(h.learnedBurst) or c.burst_s
  local received = c.output_charge == 'received'
  for l, x in pairs(r.limits) do
    local lv = level[l]
    if x.remaining and lv then
      -- ours no higher than what the provider says remains (less its rounding), less the
      -- headroom's share of its bucket: a full provider's bucket is a full one of ours
      local left = math.max(0, x.remaining - x.rounding - keep * cap[l])
      if lv > left then level[l] = left end
      -- a drain is measured on a bucket the provider counts on arrival (an output counted as
      -- produced is in flight in ours and not in the provider's: no measure of anyone's use)
      if not DAILY[l] and (REQUESTS[l] or l == 'itpm' or not received) then
        window(b, l, x, lv, since, burst, lapsed)
      end
    end
  end
  push(extra, 'netAt', now)
  save_levels(b)
end

return {
  FRESH_S = FRESH_S,
  parse_reading = parse_reading,
  learn = learn,
}
