-- The provider's rate ceilings (docs/design.md §5.9): one continuous token bucket per limit of a
-- scope (a provider key and model class, [ceilings.<name>] in the policy; a pool names its scope
-- with `ceilings = "<name>"`), checked and debited in the same atomic admit as concurrency.
--   ceil:<scope>  hash, one per scope (memory constant per scope, nothing per request):
--     at                when the per-minute buckets were last refilled (the call's `now`)
--     day               the UTC day number (floor(now / 86400)) of the daily levels
--     rpm tpm itpm otpm rpd tpd
--                       each configured bucket's level (requests or tokens; may go below 0
--                       when a round's end charges more than it reserved: the debt refills)
--     hold:<limit>      a per-minute bucket emptied by the provider's 429 on that ceiling
--                       refills only from then on
--     closedUntil why   a daily bucket ran out: the scope's pools are closed until midnight UTC
--                       (why: rpd or tpd); the next call after midnight reopens it
--     learned:<limit>   the provider's own limit, from its rate-limit headers (readings.lua)
--     learnedBurst      the provider's request bucket's burst (s of its rate), the least its
--                       headers have shown (readings.lua): the request bucket's burst_s when
--                       smaller (not learned:<limit>: no limit of its own in the read model)
--     readAt            the time of the newest reading learned from (an older one, replayed
--                       from an outbox, learns no limit)
--     net:<limit> netAt from:<limit> low:<limit>
--                       the traffic on the same key from outside the mesh, learned from the fresh
--                       readings (readings.lua): per second, per per-minute limit, measured over
--                       windows (from: the current one's start; low: its sum so far); a bucket
--                       refills at its rate less that (at least MIN_NET of it) while the newest
--                       fresh reading (netAt) is within NET_WINDOW
--     meanIn meanOut n  the learned tokens per call (what the provider counted, input as its
--                       itpm counts it, output as output_charge counts it): an undeclared
--                       round reserves them; none learned yet, it reserves no tokens
--   seat:<id> cScope cIn cOut cBudget cCalls take:<call key>
--                     the reservation the admit debited: its scope, input and output tokens
--                     reserved, and the answer budget declared ('' = none); each later call of
--                     the round adds its own (take.lua: cCalls calls in all, absent = 1, and
--                     each call key that took); the release reconciles it once (the seat's
--                     tombstone makes a replay count nothing)
--   ceiluse:<scope>   the use per minute and the reservation accuracy, for the read model
--                     (ceiluse.lua: a hash of its own, written at the rounds' ends; the admit reads
--                     only the buckets')
-- A limit's effective value is min(configured, learned) x headroom: the policy's or the
-- provider's, the lower. A pool without a configured scope learns one from the headers alone:
-- its scope is the pool's own name (scope_for), with the default headroom and burst.
-- Buckets: a per-minute one refills limit x headroom / 60 per second; its capacity is burst_s
-- seconds of rate for requests (at least one request; less jitter_s of rate, the spread of the
-- delay between an admit and its call's arrival, or, with less than one request left, that much
-- longer between calls) and one minute's worth for tokens. A daily one holds limit x headroom
-- and is full again at 00:00 UTC. A round needs min(cost,
-- capacity) of each: a round larger than a bucket passes when the bucket is full.
--- @include "ceiluse"
--- @include "events"
--- @include "util"
local load_use, sample, save_use, tally = Ceiluse.load_use, Ceiluse.sample, Ceiluse.save_use, Ceiluse.tally
local count, event = Events.count, Events.event
local fmt, key = Util.fmt, Util.key

local LIMITS = {'rpm', 'tpm', 'itpm', 'otpm', 'rpd', 'tpd'}
local DAILY = {rpd = true, tpd = true}
local REQUESTS = {rpm = true, rpd = true}
local EPS = 1e-9 -- float dust: a bucket exactly full enough covers its round
local MEAN_WEIGHT = 0.1 -- the learned mean's weight of one new call, once it has ten
-- a learned outside drain applies while its window is this recent (s): with no readings coming
-- (no traffic of ours), the bucket goes back to its whole rate
local NET_WINDOW = 60
local MIN_NET = 0.1 -- the least share of its rate a bucket refills at, whatever drain was learned
-- the refusal of each limit (admit's reason; admission/codes.py CEILING_REASONS)
local REASON = {rpm = 'ceiling-rpm', tpm = 'ceiling-tpm', itpm = 'ceiling-itpm', otpm = 'ceiling-otpm',
  rpd = 'ceiling-rpd', tpd = 'ceiling-tpd'}

-- A learned scope's configuration (no [ceilings.<name>] of its own): the policy's defaults;
-- output counted as produced when the provider announces an output ceiling (Anthropic's
-- otpm), else on arrival as max_tokens (OpenAI, Azure).
-- (Two constant tables, read only: a scope's kept shape knows its configuration by identity.)
local LEARNED_RECEIVED = {headroom = 0.97, burst_s = 1, jitter_s = 0.05, cache_reads_count = false,
  output_charge = 'received'}
local LEARNED_MAX_TOKENS = {headroom = 0.97, burst_s = 1, jitter_s = 0.05, cache_reads_count = false,
  output_charge = 'max_tokens'}
local function learned_config(h)
  return h['learned:otpm'] and LEARNED_RECEIVED or LEARNED_MAX_TOKENS
end

-- Each limit's fields in the scope's hash (built once: a field name is not concatenated per call).
local LEARNED_F = {rpm = 'learned:rpm', tpm = 'learned:tpm', itpm = 'learned:itpm', otpm = 'learned:otpm',
  rpd = 'learned:rpd', tpd = 'learned:tpd'}
local HOLD_F = {rpm = 'hold:rpm', tpm = 'hold:tpm', itpm = 'hold:itpm', otpm = 'hold:otpm', rpd = 'hold:rpd',
  tpd = 'hold:tpd'}
local NET_F = {rpm = 'net:rpm', tpm = 'net:tpm', itpm = 'net:itpm', otpm = 'net:otpm', rpd = 'net:rpd', tpd = 'net:tpd'}

-- A table for one value per limit, its room made at once (a table grown key by key is rebuilt
-- at each power of two: on the admit's path that cost more than the buckets' arithmetic).
local function per_limit()
  return {rpm = nil, tpm = nil, itpm = nil, otpm = nil, rpd = nil, tpd = nil}
end

-- The fields a scope's shape derives from, besides the policy: what the readings learned and the
-- provider's 429s held (readAt, low:<limit> and the levels are not: they change no rate).
local SHAPE_F = {['learned:rpm'] = true, ['learned:tpm'] = true, ['learned:itpm'] = true,
  ['learned:otpm'] = true, ['learned:rpd'] = true, ['learned:tpd'] = true, learnedBurst = true,
  ['hold:rpm'] = true, ['hold:tpm'] = true, ['hold:itpm'] = true, ['hold:otpm'] = true, ['hold:rpd'] = true,
  ['hold:tpd'] = true, ['net:rpm'] = true, ['net:tpm'] = true, ['net:itpm'] = true, ['net:otpm'] = true,
  ['net:rpd'] = true, ['net:tpd'] = true}

-- The scope's shape: the limits in force (in LIMITS order), each one's refill rate (per second)
-- and capacity, its hold, and for the read model its gross refill (before the outside drain)
-- and drain. A pure function of the policy `c`, the shape
-- fields of the hash `h` and whether the drain applies (`net_on`).
local function shape(c, h, net_on)
  local headroom, burst, jitter = c.headroom, c.burst_s, c.jitter_s or 0 -- (a policy stored before jitter_s: none)
  local learned_burst = h.learnedBurst and tonumber(h.learnedBurst)
  if learned_burst and learned_burst < burst then burst = learned_burst end -- the provider's, when smaller
  local s = {list = {}, rate = per_limit(), cap = per_limit(), hold = per_limit(), gross = per_limit(),
    drain = per_limit()}
  for i = 1, 6 do
    local l = LIMITS[i]
    local conf, learned = c[l], h[LEARNED_F[l]]
    if learned then learned = tonumber(learned) end
    local value = conf -- the limit in force: the lower of the configured and the learned one
    if learned and (not conf or learned < conf) then value = learned end
    if value then
      s.list[#s.list + 1] = l
      -- a per-minute bucket refills limit x headroom / 60 a second and holds a minute's worth
      -- (requests: burst_s seconds of rate, at least one); a daily one holds limit x headroom
      local daily, eff = DAILY[l], value * headroom
      local r, cp = 0, eff
      if not daily then
        r = eff / 60
        if REQUESTS[l] then
          -- a call reaches the provider up to jitter_s later or sooner than its admit's spacing
          -- says: the bucket keeps that much of its burst as room, or, with less than one
          -- request left, spaces the calls jitter_s further apart
          local room = r * (burst - jitter)
          if room >= 1 then cp = room else cp, r = 1, 1 / (1 / r + jitter) end
        end
      end
      s.gross[l] = r
      if net_on and not daily then -- the outside traffic takes its share of the refill
        local net = h[NET_F[l]]
        -- (less the room a configured limit below the provider's leaves it)
        local slack = learned and learned > value and (learned - value) * headroom / 60 or 0
        local drain = net and math.min((tonumber(net) or 0) - slack, (1 - MIN_NET) * r) or 0
        if drain > 0 then
          r = r - drain
          s.drain[l] = drain
        end
      end
      local hd = h[HOLD_F[l]]
      s.rate[l], s.cap[l], s.hold[l] = r, cp, hd and tonumber(hd) or 0
    end
  end
  s.n = #s.list
  return s
end

-- Shapes kept across calls, per mesh and scope, with what they derive from: the scope's
-- configuration (by identity: a policy decoded again is a new table), the shape fields' text and
-- net_on. State decides: the same hash and policy give the
-- same shape, kept or not (a stale one is never used: its key would differ).
local SHAPES = {}

local function shape_of(name, c, h, sig, net_on)
  local mesh = SHAPES[KEYS[1]]
  if not mesh then mesh = {}; SHAPES[KEYS[1]] = mesh end
  local s = mesh[name]
  if s and s.c == c and s.sig == sig and s.net_on == net_on then return s end
  s = shape(c, h, net_on)
  s.sig, s.net_on, s.c = sig, net_on, c
  mesh[name] = s
  return s
end

-- The current UTC day number and its text, kept: nearly every call is in the last one.
local DAY, DAY_TEXT = nil, nil

-- The scope's buckets refilled to `now` (nothing written): b.level[limit], and from its shape
-- b.rate, b.cap, b.hold per limit in force and b.shape (read only: it is kept across calls);
-- b.h the hash as stored (the learned means: text, read when a call needs them);
-- nil for a scope with no bucket (a pool that has learned nothing yet).
local function load_scope(cfg, name, now)
  local k = key('ceil', name)
  local raw = redis.call('HGETALL', k)
  -- (the table made with room for the fields a scope holds: one grown key by key is rebuilt at
  -- each power of two)
  local h = {at = nil, day = nil, rpm = nil, tpm = nil, itpm = nil, otpm = nil, rpd = nil, tpd = nil,
    meanIn = nil, meanOut = nil, n = nil, closedUntil = nil, why = nil, readAt = nil, learnedBurst = nil, netAt = nil}
  local sig = '' -- the shape fields' text (shape_of)
  for i = 1, #raw, 2 do
    local f, v = raw[i], raw[i + 1]
    h[f] = v
    if SHAPE_F[f] then sig = sig .. f .. '=' .. v .. ' ' end
  end
  local c = cfg.ceilings[name] or learned_config(h)
  local net_at = h.netAt and tonumber(h.netAt)
  local net_on = net_at ~= nil and now - net_at <= NET_WINDOW
  local s = shape_of(name, c, h, sig, net_on)
  if s.n == 0 then return nil end
  local day = math.floor(now / 86400)
  if day ~= DAY then DAY, DAY_TEXT = day, fmt(day) end
  local at = tonumber(h.at) or now
  local new_day = h.day ~= DAY_TEXT
  local level, rate, cap, hold, list = per_limit(), s.rate, s.cap, s.hold, s.list
  for i = 1, s.n do
    local l = list[i]
    local lv, cp, daily = h[l], cap[l], DAILY[l]
    lv = lv and tonumber(lv)
    if lv == nil or (daily and new_day) then lv = cp -- new, or a new UTC day
    elseif not daily then
      local hd = hold[l]
      local from = at > hd and at or hd
      if now > from then lv = lv + (now - from) * rate[l] end
    end
    level[l] = lv < cp and lv or cp
  end
  -- (at most 16 fields: a table of more is made with room for 32)
  return {name = name, key = k, c = c, now = now, day = day, new_day = new_day, level = level, rate = rate, cap = cap,
    hold = hold, closedUntil = tonumber(h.closedUntil) or 0, why = h.why or '', h = h, extra = {}, shape = s}
end

-- The scope a pool's rounds count against: its configured one, else the one it learned from
-- the providers' headers (named after the pool; readings.lua creates it and marks the pool's
-- hash `learnedScope`), else nil. With the pool's state `p` (an admit has it) the mark is read
-- from it: a pool without ceilings pays no command for them.
local function scope_for(cfg, pool, p)
  local scope = cfg.scope_of[pool]
  if scope then return scope end
  if p then return p.learnedScope == '1' and pool or nil end
  if redis.call('EXISTS', key('ceil', pool)) == 1 then return pool end
  return nil
end

-- What a round reserves: its declared input and answer budget, else the scope's learned mean
-- per call (none learned: no tokens, only its request).
local function reservation(b, input, budget)
  return {inp = input or tonumber(b.h.meanIn) or 0, out = budget or tonumber(b.h.meanOut) or 0, budget = budget}
end

local function cost(l, res)
  if REQUESTS[l] then return 1 end
  if l == 'itpm' then return res.inp end
  if l == 'otpm' then return res.out end
  return res.inp + res.out
end

local function next_midnight(now)
  return (math.floor(now / 86400) + 1) * 86400
end

-- A daily bucket ran out: the scope's pools are closed until midnight (a closure of its own,
-- recorded like a provider's: a `closed` event and closed|<scope>|<why> in totals).
local function close_scope(b, why)
  local until_ = next_midnight(b.now)
  if b.closedUntil >= until_ then return end
  b.closedUntil, b.why = until_, why
  redis.call('HSET', key('ceil', b.name), 'closedUntil', fmt(until_), 'why', why)
  event('closed', 'scope', b.name, 'why', REASON[why], 'until', fmt(until_))
  count('closed', b.name, REASON[why])
end

-- A closure whose midnight has passed reopens (the daily buckets are full again).
local function reopen_if_due(b)
  if b.closedUntil > 0 and b.closedUntil <= b.now then
    b.closedUntil, b.why = 0, ''
    redis.call('HSET', key('ceil', b.name), 'closedUntil', '0', 'why', '')
    event('reopened', 'scope', b.name, 'by', 'midnight')
    count('reopened', b.name, 'midnight')
  end
end

-- Can every bucket cover the round? nil when it can, else the binding limit and the wait until
-- it could (the shortfall over the refill rate; a daily bucket: until midnight). A daily bucket
-- that cannot closes the scope.
local function cover(b, res)
  reopen_if_due(b)
  local now = b.now
  if b.closedUntil > now then return b.why, b.closedUntil - now end
  local level, cap, rate = b.level, b.cap, b.rate
  local inp, out = res.inp, res.out
  local worst, wait = nil, -1
  for i = 1, 6 do
    local l = LIMITS[i]
    local lv = level[l]
    if lv then
      local need = REQUESTS[l] and 1 or l == 'itpm' and inp or l == 'otpm' and out or inp + out -- cost(l, res)
      if need > cap[l] then need = cap[l] end
      -- one microsecond of refill is within the float error of an epoch's seconds
      if lv + EPS + rate[l] * 1e-6 < need then
        local w
        if DAILY[l] then w = next_midnight(now) - now
        else w = math.max(0, b.hold[l] - now) + (need - lv) / rate[l] end
        if w > wait then worst, wait = l, w end
      end
    end
  end
  if worst and DAILY[worst] then close_scope(b, worst) end
  return worst, worst and wait or nil
end

-- Write the levels (every bucket's), `at`, the day when it changed and the read model's fields
-- (b.extra, ceiluse.lua) in one HSET. Its arguments' room is made at once (a table grown key by
-- key is rebuilt at each power of two). The numbers go to Redis as numbers: the server writes
-- them exactly ('%.17g' in Redis 7.0, the shortest exact text in 7.2+ and Valkey), faster than
-- string.format here.
local function save_levels(b)
  local args = {'at', b.now, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
    nil, nil, nil, nil, nil, nil}
  local n = 2
  if b.new_day then -- the day is written when it changes (each write is a number formatted)
    args[3], args[4], n = 'day', b.day, 4
    b.new_day = false
  end
  local level = b.level
  for i = 1, 6 do
    local l = LIMITS[i]
    local v = level[l]
    if v then args[n + 1], args[n + 2], n = l, v, n + 2 end
  end
  local extra = b.extra
  for i = 1, #extra do args[n + i] = extra[i] end
  n = n + #extra
  b.extra = {}
  redis.call('HSET', b.key, unpack(args, 1, n))
end

-- Debit the round from every bucket at once (the caller checked them all with cover). A daily
-- bucket left without one more request (or any token) closes the scope now.
local function debit(b, res)
  local level, inp, out = b.level, res.inp, res.out
  local tokens = inp + out
  for i = 1, 6 do -- cost(l, res), inlined
    local l = LIMITS[i]
    local v = level[l]
    if v then
      if REQUESTS[l] then level[l] = v - 1
      elseif l == 'itpm' then level[l] = v - inp
      elseif l == 'otpm' then level[l] = v - out
      else level[l] = v - tokens end
    end
  end
  save_levels(b)
  if level.rpd and level.rpd + EPS < 1 then close_scope(b, 'rpd')
  elseif level.tpd and level.tpd <= EPS then close_scope(b, 'tpd') end
end

-- The reservation kept on the seat, for its release. A count the round declared is kept as the
-- caller wrote it (res.inp_text, res.out_text: the same number, not formatted again).
local function seat_fields(scope, res)
  local out = res.out_text or fmt(res.out)
  return {'cScope', scope, 'cIn', res.inp_text or fmt(res.inp), 'cOut', out, 'cBudget', res.budget and out or ''}
end

-- What the provider counted of a call (u: uncached input, cache creation, cache reads, output),
-- as the scope counts it: input for itpm (cache reads only with cache_reads_count), output as
-- output_charge says ("max_tokens": the declared budget, counted on arrival; "received": what
-- was produced).
local function counted(c, u, budget)
  local inp = u.uncached + u.creation + (c.cache_reads_count and u.reads or 0)
  local out = u.output
  if c.output_charge == 'max_tokens' and budget then out = math.max(budget, u.output) end
  return inp, out
end

-- The read model's fields a scope's hash held before they had a hash of their own (ceiluse.lua):
-- dropped at a round's end (not moved: the use and accuracy start again).
local OLD_USE_F = {useMin = true, useReq = true, useTok = true, prevReq = true, prevTok = true, accN = true}
for i = -40, 40 do OLD_USE_F['acc:' .. i] = true end

-- A round's end: refund or charge the difference between what it reserved (seat s) and what the
-- provider counted, and learn the mean per call. Called once per seat (its release). A bucket
-- held by the provider's 429 gets no refund before its reset: the provider's word wins.
local function reconcile(cfg, s, u, now)
  local scope = s.cScope
  if not scope or scope == '' then return end
  local b = load_scope(cfg, scope, now)
  if not b then return end -- the scope left the policy
  local budget = tonumber(s.cBudget or '')
  local inp, out = counted(b.c, u, budget)
  local res = {inp = inp - (tonumber(s.cIn) or 0), out = out - (tonumber(s.cOut) or 0)}
  for l, v in pairs(b.level) do
    local more = REQUESTS[l] and 0 or cost(l, res)
    -- a bucket the provider said is spent (held) takes a charge but no refund before its reset
    if more < 0 and b.hold[l] > now then more = 0 end
    b.level[l] = math.min(b.cap[l], v - more)
  end
  -- the mean is per call: a round of several calls (take.lua) teaches its average call
  local calls = math.max(1, tonumber(s.cCalls) or 1)
  local n = math.min((tonumber(b.h.n) or 0) + 1, 1000000)
  local w = math.max(1 / n, MEAN_WEIGHT)
  local mean_in, mean_out = tonumber(b.h.meanIn), tonumber(b.h.meanOut)
  mean_in = mean_in and mean_in + w * (inp / calls - mean_in) or inp / calls
  mean_out = mean_out and mean_out + w * (out / calls - mean_out) or out / calls
  b.h.meanIn, b.h.meanOut = mean_in, mean_out
  b.h.n = n
  local use = load_use(scope) -- the read model's: what the provider counted, and the accuracy
  tally(use, now, calls, inp + out)
  sample(use, inp + out, (tonumber(s.cIn) or 0) + (tonumber(s.cOut) or 0))
  save_use(use)
  if b.h.useMin or b.h.accN then -- once, for a hash written before ceiluse:<scope>
    local old = {}
    for f in pairs(b.h) do
      if OLD_USE_F[f] then old[#old + 1] = f end
    end
    redis.call('HDEL', b.key, unpack(old))
  end
  local extra = b.extra -- the mean goes in the levels' one write
  local k = #extra
  extra[k + 1], extra[k + 2], extra[k + 3], extra[k + 4], extra[k + 5], extra[k + 6] =
    'meanIn', mean_in, 'meanOut', mean_out, 'n', n
  save_levels(b)
end

-- The provider said a ceiling is spent (a 429 naming it): that bucket is empty until `reset`
-- seconds from now and refills from then on; a daily one closes the scope until midnight. Not
-- a load signal: the estimate is not touched.
local function spent(cfg, scope, limit, reset, now)
  if not scope then return false end
  local b = load_scope(cfg, scope, now)
  if not b or not b.level[limit] then return false end
  b.level[limit] = 0
  save_levels(b)
  if DAILY[limit] then close_scope(b, limit)
  else redis.call('HSET', key('ceil', scope), 'hold:' .. limit, fmt(now + reset)) end
  count('ceiling', scope, limit)
  return true
end

return {
  LIMITS = LIMITS,
  DAILY = DAILY,
  REQUESTS = REQUESTS,
  EPS = EPS,
  MIN_NET = MIN_NET,
  NET_WINDOW = NET_WINDOW,
  REASON = REASON,
  load_scope = load_scope,
  scope_for = scope_for,
  reservation = reservation,
  cost = cost,
  next_midnight = next_midnight,
  close_scope = close_scope,
  reopen_if_due = reopen_if_due,
  cover = cover,
  save_levels = save_levels,
  debit = debit,
  seat_fields = seat_fields,
  counted = counted,
  reconcile = reconcile,
  spent = spent,
}
