-- What a scope's buckets were used for, kept in its own hash (ceil:<scope>, ceilings.lua) for the
-- read model (census.lua's ceilings, docs/operators.md): a few fields, constant per scope.
--   useMin useReq useTok  the current minute (floor(now / 60)) and the requests and tokens debited
--                         in it (an admit's reservation, then its release's difference)
--   prevReq prevTok       the same for the minute before
--   acc:<bin> accN        reservation accuracy (counted / reserved at each release): a histogram of
--                         log2(ratio) in bins of an eighth of an octave (bin = round(8 log2 ratio),
--                         within [-40, 40]: 1/32 .. 32), halved once it holds ACC_MAX samples, so it
--                         follows the last ACC_MAX / 2 .. ACC_MAX releases
-- The writers append their fields to the scope's one HSET (b.extra, ceilings.lua save_levels).
--- @include "util"
local fmt = Util.fmt

local ACC_BINS = 40
local ACC_MAX = 1000

local function put(b, field, value)
  b.h[field] = value
  b.extra[#b.extra + 1] = field
  b.extra[#b.extra + 1] = value
end

-- `req` requests and `tok` tokens more used now (tok < 0: a release refunded part of a reservation).
local function tally(b, req, tok)
  local h, m = b.h, math.floor(b.now / 60)
  local used_req, used_tok = h.useReq, h.useTok
  if tonumber(h.useMin) ~= m then
    local last = tonumber(h.useMin) == m - 1
    put(b, 'prevReq', last and (used_req or '0') or '0')
    put(b, 'prevTok', last and (used_tok or '0') or '0')
    put(b, 'useMin', fmt(m))
    used_req, used_tok = nil, nil
  end
  put(b, 'useReq', fmt((used_req and tonumber(used_req) or 0) + req))
  put(b, 'useTok', fmt((used_tok and tonumber(used_tok) or 0) + tok))
end

-- One release's accuracy: what the provider counted over what the admit reserved (nothing when
-- nothing was reserved: the first calls of a scope that learned no mean yet).
local function sample(b, counted, reserved)
  if not (reserved > 0) or counted < 0 then return end
  local ratio = math.max(counted / reserved, 2 ^ -6)
  local bin = math.max(-ACC_BINS, math.min(ACC_BINS, math.floor(8 * math.log(ratio) / math.log(2) + 0.5)))
  local n = (tonumber(b.h.accN) or 0) + 1
  local f = 'acc:' .. bin
  put(b, f, fmt((tonumber(b.h[f]) or 0) + 1))
  if n >= ACC_MAX then -- halve every bin: old releases fade out, the hash stays small
    n = 0
    for i = -ACC_BINS, ACC_BINS do
      local v = tonumber(b.h['acc:' .. i])
      if v then
        v = math.floor(v / 2)
        n = n + v
        put(b, 'acc:' .. i, fmt(v))
      end
    end
  end
  put(b, 'accN', fmt(n))
end

-- Use over the last minute (h: the scope's hash): the current minute's plus the part of the
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

return {tally = tally, sample = sample, last_minute = last_minute, accuracy = accuracy}
