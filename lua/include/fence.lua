-- The fence between planes (docs/design.md §8). Each pool is a plane, a failure domain of its own:
--   plane:<p>   hash: retries (tokens left when last spent), retriesAt (their time), and the last
--               health sample: healthAt, healthOk (1/0), healthDepth, healthRunning
--   intent:<id> hash: the intent's record, kept a day: decision and until (a borrow's refusal,
--               answered again while it lives), rev (the revision watermark), retries (attempts
--               retried), plane (where they ran)
-- A plane's settings are the policy's (config `planes`): depthLimit, retryBudget, refill
-- (tokens per second), healthRequired, healthMaxAge. An unset limit does not fence.
-- The invariant: a borrow never spends the primary plane's budgets, and a shed borrow changes
-- nothing on the primary. Only the borrowed plane and the intent's own record are written.
--- @include "codes"
--- @include "util"
local ERR = Codes.ERR
local check_num, fail, fmt, key = Util.check_num, Util.fail, Util.fmt, Util.key

local INTENT_TTL = 86400

-- A plane's health max age: the pool's, else the tunable.
local function max_age(cfg, pool)
  return (cfg.planes[pool] or {}).healthMaxAge or cfg.T.health_max_age
end

-- A pool's own queue (waiting tickets), the part of a plane's depth admission counts itself.
local function waiting_of(pool)
  return tonumber(redis.call('HGET', key('pool', pool), 'waiting')) or 0
end

-- A plane's state at `now`: the retry tokens refilled from Redis time (no background job), the
-- health sample and whether it is capacity.
local function load_plane(cfg, pool, now)
  local c = cfg.planes[pool] or {}
  local v = redis.call('HMGET', key('plane', pool), 'retries', 'retriesAt', 'healthAt', 'healthOk', 'healthDepth',
    'healthRunning')
  local st = {pool = pool, conf = c, maxAge = max_age(cfg, pool)}
  if c.retryBudget then
    local tokens, at = tonumber(v[1]), tonumber(v[2]) or now
    if tokens == nil then tokens = c.retryBudget
    else tokens = math.min(c.retryBudget, tokens + math.max(0, now - at) * (c.refill or 0)) end
    st.retries = tokens
  end
  st.healthAt, st.healthOk, st.healthDepth = tonumber(v[3]), v[4] == '1', tonumber(v[5]) or 0
  st.healthRunning = tonumber(v[6])
  -- a sample older than its max age is not capacity, and no sample at all is not either
  st.fresh = st.healthAt ~= nil and st.healthOk and now - st.healthAt <= st.maxAge
  return st
end

-- The plane's depth: its own queue, or the server's when a fresh sample says more.
local function plane_depth(st, waiting)
  if st.fresh and st.healthDepth > waiting then return st.healthDepth end
  return waiting
end

local function health_ok(st) return not st.conf.healthRequired or st.fresh end
local function depth_ok(st, waiting) return not st.conf.depthLimit or plane_depth(st, waiting) < st.conf.depthLimit end
local function retries_ok(st) return not st.conf.retryBudget or st.retries >= 1 end

-- The fence for a borrow, in the seed fixture's order (nil: admit). `primary` may be nil: a round
-- moving off its own pool (fallback) is checked on the plane it borrows only — moving away from a
-- saturated or closed pool is what fallback is for, and it spends nothing there.
local function fence(primary, p_waiting, borrowed, b_waiting)
  if primary then
    if not health_ok(primary) then return 'reject_stale_primary_health' end
    if not depth_ok(primary, p_waiting) then return 'reject_primary_depth' end
    if not retries_ok(primary) then return 'reject_primary_retry_exhausted' end
  end
  if not health_ok(borrowed) then return 'reject_stale_borrowed_health' end
  if not depth_ok(borrowed, b_waiting) then return 'shed_borrowed_depth' end
  if not retries_ok(borrowed) then return 'shed_borrowed_retry' end
  return nil
end

-- One retry of an attempt that ran on plane `st`: spent there, or none is left.
local function spend_retry(st, now)
  if not st.conf.retryBudget then return 'retry_same_plane' end
  if st.retries < 1 then return 'compensate_or_shed' end
  st.retries = st.retries - 1
  redis.call('HSET', key('plane', st.pool), 'retries', fmt(st.retries), 'retriesAt', fmt(now))
  return 'retry_same_plane'
end

local function read_intent(id)
  local v = redis.call('HMGET', key('intent', id), 'decision', 'until', 'rev', 'retries')
  return {decision = v[1], until_ = tonumber(v[2]) or 0, rev = tonumber(v[3]), retries = tonumber(v[4]) or 0}
end

local function write_intent(id, ...)
  redis.call('HSET', key('intent', id), ...)
  redis.call('EXPIRE', key('intent', id), INTENT_TTL)
end

-- A revision argument: a whole number >= 0, or '' (none).
local function check_revision(s)
  if s == nil or s == '' then return nil end
  local r = check_num('revision', s, nil, 0)
  if r ~= math.floor(r) or r > 2 ^ 53 then fail(ERR.BAD_ARG, 'revision must be a whole number >= 0, got ' .. s) end
  return r
end

-- The plane figures for the census.
local function plane_view(st, waiting, now)
  local c = st.conf
  if not (c.depthLimit or c.retryBudget or c.healthRequired or st.healthAt) then return nil end
  return {depth = plane_depth(st, waiting), depthLimit = c.depthLimit, retriesLeft = st.retries,
    retryBudget = c.retryBudget, healthRequired = c.healthRequired == true,
    healthAgeSeconds = st.healthAt and (now - st.healthAt) or nil, healthOk = st.healthAt and st.healthOk or nil,
    healthFresh = st.fresh, healthMaxAge = st.maxAge}
end

return {
  max_age = max_age,
  waiting_of = waiting_of,
  load_plane = load_plane,
  fence = fence,
  spend_retry = spend_retry,
  read_intent = read_intent,
  write_intent = write_intent,
  check_revision = check_revision,
  plane_view = plane_view,
}
