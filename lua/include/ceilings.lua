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
--     net:<limit> netAt low:<limit>
--                       the traffic on the same key from outside the mesh, learned from the fresh
--                       readings (readings.lua): per second, per per-minute limit, as of the
--                       window that began at netAt; a bucket refills at its rate less that
--                       (at least MIN_NET of it) while netAt is within NET_WINDOW
--     meanIn meanOut n  the learned tokens per call (what the provider counted, input as its
--                       itpm counts it, output as output_charge counts it): an undeclared
--                       round reserves them; none learned yet, it reserves no tokens
--   seat:<id> cScope cIn cOut cBudget cCalls take:<call key>
--                     the reservation the admit debited: its scope, input and output tokens
--                     reserved, and the answer budget declared ('' = none); each later call of
--                     the round adds its own (take.lua: cCalls calls in all, absent = 1, and
--                     each call key that took); the release reconciles it once (the seat's
--                     tombstone makes a replay count nothing)
--   useMin useReq useTok prevReq prevTok acc:<bin> accN
--                     the use per minute and the reservation accuracy, for the read model (ceiluse.lua)
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
local sample, tally = Ceiluse.sample, Ceiluse.tally
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
local function learned_config(h)
  return {headroom = 0.97, burst_s = 1, jitter_s = 0.05, cache_reads_count = false,
    output_charge = h['learned:otpm'] and 'received' or 'max_tokens'}
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

-- The scope's buckets refilled to `now` (nothing written): b.level[limit], b.rate, b.cap,
-- b.hold per limit in force; nil for a scope with no bucket (a pool that has learned nothing
-- yet). `full` (the read model, readings.lua) adds per limit b.configured, b.learned, b.limit
-- (the limit in force), b.gross (the refill before the outside drain) and b.drain.
local function load_scope(cfg, name, now, full)
  local raw = redis.call('HGETALL', key('ceil', name))
  local h = {}
  for i = 1, #raw, 2 do h[raw[i]] = raw[i + 1] end
  local c = cfg.ceilings[name] or learned_config(h)
  local day = math.floor(now / 86400)
  local at = tonumber(h.at) or now
  local net_at = h.netAt and tonumber(h.netAt)
  local net_on = net_at ~= nil and now - net_at <= NET_WINDOW
  local new_day = tonumber(h.day) ~= day
  local headroom, burst, jitter = c.headroom, c.burst_s, c.jitter_s or 0 -- (a policy stored before jitter_s: none)
  local learned_burst = h.learnedBurst and tonumber(h.learnedBurst)
  if learned_burst and learned_burst < burst then burst = learned_burst end -- the provider's, when smaller
  local level, rate, cap, hold = per_limit(), per_limit(), per_limit(), per_limit()
  local b = {name = name, c = c, now = now, day = day, new_day = new_day, level = level, rate = rate, cap = cap,
    hold = hold, netAt = net_at, meanIn = h.meanIn and tonumber(h.meanIn), meanOut = h.meanOut and tonumber(h.meanOut),
    n = tonumber(h.n) or 0, closedUntil = tonumber(h.closedUntil) or 0, why = h.why or '', h = h, extra = {}}
  if full then b.configured, b.learned, b.limit, b.gross, b.drain = {}, {}, {}, {}, {} end
  local any = false
  for i = 1, 6 do
    local l = LIMITS[i]
    local conf, learned = c[l], h[LEARNED_F[l]]
    if learned then learned = tonumber(learned) end
    local value = conf -- the limit in force: the lower of the configured and the learned one
    if learned and (not conf or learned < conf) then value = learned end
    if full then b.configured[l], b.learned[l], b.limit[l] = conf, learned, value end
    if value then
      any = true
      -- its refill rate (per second) and capacity: a per-minute bucket refills limit x headroom / 60
      -- a second and holds a minute's worth (requests: burst_s seconds of rate, at least one); a
      -- daily one holds limit x headroom
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
      if full then b.gross[l] = r end
      if net_on and not daily then -- the outside traffic takes its share of the refill
        local net = h[NET_F[l]]
        local drain = net and math.min(tonumber(net) or 0, (1 - MIN_NET) * r) or 0
        if drain > 0 then
          r = r - drain
          if full then b.drain[l] = drain end
        end
      end
      local lv, hd = h[l], h[HOLD_F[l]]
      hd = hd and tonumber(hd) or 0
      lv = lv and tonumber(lv)
      if lv == nil or (daily and new_day) then lv = cp -- new, or a new UTC day
      elseif not daily then
        local from = at > hd and at or hd
        if now > from then lv = lv + (now - from) * r end
      end
      level[l], rate[l], cap[l], hold[l] = lv < cp and lv or cp, r, cp, hd
    end
  end
  return any and b or nil
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
  return {inp = input or b.meanIn or 0, out = budget or b.meanOut or 0, budget = budget}
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

local function save_levels(b)
  local args = {'at', fmt(b.now)}
  if b.new_day then -- the day is written when it changes (each write is a number formatted)
    args[3], args[4] = 'day', fmt(b.day)
    b.new_day = false
  end
  for l, v in pairs(b.level) do
    args[#args + 1] = l
    args[#args + 1] = fmt(v)
  end
  for _, v in ipairs(b.extra) do args[#args + 1] = v end -- the read model's (ceiluse.lua)
  b.extra = {}
  redis.call('HSET', key('ceil', b.name), unpack(args))
end

-- Debit the round from every bucket at once (the caller checked them all with cover). A daily
-- bucket left without one more request (or any token) closes the scope now.
local function debit(b, res)
  local level, inp, out = b.level, res.inp, res.out
  local tokens = inp + out
  for l, v in pairs(level) do -- cost(l, res), inlined
    if REQUESTS[l] then level[l] = v - 1
    elseif l == 'itpm' then level[l] = v - inp
    elseif l == 'otpm' then level[l] = v - out
    else level[l] = v - tokens end
  end
  tally(b, 1, res.inp + res.out)
  save_levels(b)
  if b.level.rpd and b.level.rpd + EPS < 1 then close_scope(b, 'rpd')
  elseif b.level.tpd and b.level.tpd <= EPS then close_scope(b, 'tpd') end
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
  b.n = math.min(b.n + 1, 1000000)
  local w = math.max(1 / b.n, MEAN_WEIGHT)
  b.meanIn = b.meanIn and b.meanIn + w * (inp / calls - b.meanIn) or inp / calls
  b.meanOut = b.meanOut and b.meanOut + w * (out / calls - b.meanOut) or out / calls
  tally(b, 0, res.inp + res.out)
  sample(b, inp + out, (tonumber(s.cIn) or 0) + (tonumber(s.cOut) or 0))
  local extra = b.extra -- the mean goes in the levels' one write
  for _, v in ipairs({'meanIn', fmt(b.meanIn), 'meanOut', fmt(b.meanOut), 'n', fmt(b.n)}) do extra[#extra + 1] = v end
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
