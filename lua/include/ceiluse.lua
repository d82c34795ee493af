-- What a scope's calls used, kept for the read model (census.lua's ceilings, docs/operators.md) in
-- a hash of its own beside the buckets' (the admit reads the buckets' hash only):
--   ceiluse:<scope>        hash, a few fields, constant per scope, written at a round's end only
--   useMin useReq useTok  the current minute (floor(now / 60)) and the requests and tokens the
--                         provider counted (as the scope counts them) for the calls whose rounds
--                         ended in it; the rounds still in flight are the census' reserved counts
--   prevReq prevTok       the same for the minute before
--   acc:<bin> accN        reservation accuracy (counted / reserved at each release): a histogram of
--                         log2(ratio) in bins of an eighth of an octave (bin = round(8 log2 ratio),
--                         within [-40, 40]: 1/32 .. 32), halved once it holds ACC_MAX samples, so it
--                         follows the last ACC_MAX / 2 .. ACC_MAX releases
--- @include "util"
local key = Util.key

local ACC_BINS = 40
local ACC_MAX = 1000

-- The scope's use, read: u.h its fields, u.extra what the round's end writes (save).
local function load_use(scope)
  local k = key('ceiluse', scope)
  local raw = redis.call('HGETALL', k)
  local h = {}
  for i = 1, #raw, 2 do h[raw[i]] = raw[i + 1] end
  return {key = k, h = h, extra = {}}
end

local function put(u, field, value)
  u.h[field] = value
  local extra = u.extra
  local n = #extra
  extra[n + 1], extra[n + 2] = field, value
end

-- `req` requests and `tok` tokens more counted at `now`.
local function tally(u, now, req, tok)
  local h, m = u.h, math.floor(now / 60)
  local used_req, used_tok = h.useReq, h.useTok
  if tonumber(h.useMin) ~= m then
    local last = tonumber(h.useMin) == m - 1
    put(u, 'prevReq', last and (used_req or '0') or '0')
    put(u, 'prevTok', last and (used_tok or '0') or '0')
    put(u, 'useMin', m)
    used_req, used_tok = nil, nil
  end
  -- numbers, not text: the HSET writes them exactly (ceilings.lua save_levels)
  put(u, 'useReq', (used_req and tonumber(used_req) or 0) + req)
  put(u, 'useTok', (used_tok and tonumber(used_tok) or 0) + tok)
end

-- One release's accuracy: what the provider counted over what the admit reserved (nothing when
-- nothing was reserved: the first calls of a scope that learned no mean yet).
local function sample(u, counted, reserved)
  if not (reserved > 0) or counted < 0 then return end
  local ratio = math.max(counted / reserved, 2 ^ -6)
  local bin = math.max(-ACC_BINS, math.min(ACC_BINS, math.floor(8 * math.log(ratio) / math.log(2) + 0.5)))
  local n = (tonumber(u.h.accN) or 0) + 1
  local f = 'acc:' .. bin
  put(u, f, (tonumber(u.h[f]) or 0) + 1)
  if n >= ACC_MAX then -- halve every bin: old releases fade out, the hash stays small
    n = 0
    for i = -ACC_BINS, ACC_BINS do
      local v = tonumber(u.h['acc:' .. i])
      if v then
        v = math.floor(v / 2)
        n = n + v
        put(u, 'acc:' .. i, v)
      end
    end
  end
  put(u, 'accN', n)
end

-- Use over the last minute (h: the scope's use, load_use): the current minute's plus the part of the
-- previous one still inside the sliding minute (prev x (1 - elapsed fraction)).
local function last_minute(h, now)
  local m, cur = math.floor(now / 60), tonumber(h.useMin)
  local frac = now / 60 - m
  local req, tok = 0, 0
  if cur == m then
    req = (tonumber(h.useReq) or 0) + (tonumber(h.prevReq) or 0) * (1 - frac)
    tok = (tonumber(h.useTok) or 0) + (tonumber(h.prevTok) or 0) * (1 - frac)
  elseif cur == m - 1 then
    req = (tonumber(h.useReq) or 0) * (1 - frac)
    tok = (tonumber(h.useTok) or 0) * (1 - frac)
  end
  return {requests = math.max(0, req), tokens = math.max(0, tok)}
end

-- The histogram's quantile q: the ratio at the centre of the bin that holds it.
local function quantile(h, n, q)
  local want, seen = q * n, 0
  for i = -ACC_BINS, ACC_BINS do
    seen = seen + (tonumber(h['acc:' .. i]) or 0)
    if seen >= want then return 2 ^ (i / 8) end
  end
  return 2 ^ (ACC_BINS / 8)
end

-- Reservation accuracy: samples, median and p95 of counted / reserved (nil: no sample yet).
local function accuracy(h)
  local n = 0
  for i = -ACC_BINS, ACC_BINS do n = n + (tonumber(h['acc:' .. i]) or 0) end
  if n == 0 then return nil end
  return {samples = n, median = quantile(h, n, 0.5), p95 = quantile(h, n, 0.95)}
end

-- The round's end's writes, in one HSET.
local function save_use(u)
  if #u.extra > 0 then redis.call('HSET', u.key, unpack(u.extra)) end
  u.extra = {}
end

return {load_use = load_use, tally = tally, sample = sample, save_use = save_use, last_minute = last_minute,
  accuracy = accuracy}
