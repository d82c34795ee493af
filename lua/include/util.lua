-- Keys, clock and argument validation shared by every command.
-- KEYS[1] is always the mesh's config key `adm:{<mesh>}:config`; every other key is derived from it,
-- so all keys carry the mesh's hash tag and a Redis Cluster routes the call by KEYS[1].
-- The library binds KEYS, ARGV and PREFIX at the start of every call (see bind below).
--- @include "codes"
local ERR = Codes.ERR

local function key(...)
  return PREFIX .. table.concat({...}, ':')
end

local function fail(code, msg)
  error({err = code .. ' ' .. msg}, 0)
end

-- A name may carry letters, digits and . _ - / : @ # and nothing that breaks a key or a field
-- separator: no braces (hash tags), spaces, control characters or '|'.
local function check_name(what, s, optional)
  if s == nil or s == '' then
    if optional then return '' end
    fail(ERR.BAD_NAME, what .. ' is empty')
  end
  -- a policy's JSON may hold a number, a list or null where a name belongs
  if type(s) ~= 'string' then fail(ERR.BAD_NAME, what .. ' must be a string, got ' .. type(s)) end
  if #s > 200 then fail(ERR.BAD_NAME, what .. ' is longer than 200 characters') end
  if not string.match(s, '^[%w%._%-/:@#]+$') then
    fail(ERR.BAD_NAME, what .. ' ' .. string.format('%q', s) ..
      ' may only hold letters, digits and . _ - / : @ #')
  end
  return s
end

-- A finite number, optionally bounded below; '' gives the default (nil: required).
local function check_num(what, s, default, min)
  if s == nil or s == '' then
    if default ~= nil then return default end
    fail(ERR.BAD_ARG, what .. ' is required')
  end
  local x = tonumber(s)
  if x == nil or x ~= x or x == math.huge or x == -math.huge then
    fail(ERR.BAD_ARG, what .. ' must be a finite number, got ' .. tostring(s))
  end
  if min ~= nil and x < min then
    fail(ERR.BAD_ARG, what .. ' must be >= ' .. min .. ', got ' .. tostring(s))
  end
  return x
end

-- A whole number in [min, max] (check_num's rules otherwise).
local function check_whole(what, s, default, min, max)
  local x = check_num(what, s, default, min)
  if x ~= math.floor(x) or x > max then
    fail(ERR.BAD_ARG, what .. ' must be a whole number in [' .. min .. ', ' .. string.format('%.0f', max) ..
      '], got ' .. tostring(s))
  end
  return x
end

local function check_one_of(what, s, allowed)
  if allowed[s] then return s end
  local names = {}
  for k in pairs(allowed) do names[#names + 1] = k end
  table.sort(names)
  fail(ERR.BAD_ARG, what .. ' must be one of ' .. table.concat(names, ', ') .. ', got ' .. tostring(s))
end

-- One clock for all pods: Redis' own TIME. A caller's `now` (tests, the simulator) is accepted
-- only on a mesh whose policy says clock = "caller": a `now` ahead of the server must never
-- judge (and sweep) another pod's live lease.
local CALLER_CLOCK_ONLY = 'now is accepted only on a mesh whose policy sets clock = "caller" ' ..
  '(tests, simulator); leases are judged on the server\'s TIME'
-- A caller's `now` (epoch seconds) stays below the year 5000: every time derived from it (a
-- lease, the next midnight, a closure) is then a finite number that JSON can hold.
local MAX_NOW = 1e11
local function check_now(s)
  local now = check_num('now', s, nil, 0)
  if now > MAX_NOW then fail(ERR.BAD_ARG, 'now must be epoch seconds <= 1e11, got ' .. tostring(s)) end
  return now
end
local function clock(s)
  if s == nil or s == '' then
    local t = redis.call('TIME')
    return tonumber(t[1]) + tonumber(t[2]) / 1e6
  end
  local c = redis.call('HMGET', KEYS[1], 'token', 'clock')
  if c[1] and c[2] ~= 'caller' then fail(ERR.BAD_ARG, CALLER_CLOCK_ONLY) end
  return check_now(s)
end

-- Floats leave a script as strings (Lua numbers become integers in a reply).
-- The fields of `a` then those of `b`, as one new list (a plain loop: field lists are built when
-- the library loads, where no global such as ipairs may be read).
local function concat(a, b)
  local out = {}
  for i = 1, #a do out[i] = a[i] end
  for i = 1, #b do out[#a + i] = b[i] end
  return out
end

local function fmt(x)
  return string.format('%.17g', x)
end

-- UTC day YYYY-MM-DD of an epoch second (civil-from-days; scripts have no os.date). The last
-- day asked is kept: nearly every call asks for today.
local LAST_DAY, LAST_DAY_TEXT = nil, nil
local function utc_day(t)
  local days = math.floor(t / 86400)
  if days == LAST_DAY then return LAST_DAY_TEXT end
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local d = doy - math.floor((153 * mp + 2) / 5) + 1
  local m = mp < 10 and mp + 3 or mp - 9
  local y = yoe + era * 400 + (m <= 2 and 1 or 0)
  LAST_DAY, LAST_DAY_TEXT = days, string.format('%04d-%02d-%02d', y, m, d)
  return LAST_DAY_TEXT
end

-- A replay that changes nothing writes its record back as it is (value and TTL): a client that
-- confirms ledger writes (WAIT, confirm_replicas) waits for its connection's last write, and
-- the record's first application may have come over another connection (a lost reply, a
-- restarted pod), so without a write here the WAIT could answer for something older.
local function rewrite(k)
  local v = redis.call('GET', k)
  if v then redis.call('SET', k, v, 'KEEPTTL') end
end

-- Bind one call's keys and arguments; a malformed KEYS[1] is an error reply.
local function bind(keys, args)
  KEYS, ARGV = keys, args
  local k = KEYS[1] or ''
  PREFIX = string.sub(k, 1, -7)
  if string.sub(k, -7) ~= ':config' or not string.match(PREFIX, '^adm:{[^{}]+}:$') then
    return redis.error_reply(ERR.BAD_ARG .. ' KEYS[1] must be adm:{<mesh>}:config')
  end
  return nil
end

-- Run the command body; a fail() anywhere becomes a clean error reply. Every body validates its
-- arguments before its first write, so an error reply means nothing changed.
local function run(body)
  local ok, res = pcall(body)
  if ok then return res end
  if type(res) == 'table' and res.err then return redis.error_reply(res.err) end
  error(res, 0)
end

return {
  key = key,
  fail = fail,
  check_name = check_name,
  check_num = check_num,
  check_whole = check_whole,
  check_one_of = check_one_of,
  CALLER_CLOCK_ONLY = CALLER_CLOCK_ONLY,
  check_now = check_now,
  clock = clock,
  concat = concat,
  fmt = fmt,
  utc_day = utc_day,
  rewrite = rewrite,
  bind = bind,
  run = run,
}
