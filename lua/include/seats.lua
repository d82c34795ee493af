-- Seats and waiter tickets with leases.
--   seats            sorted set: seat id -> lease expiry
--   seat:<id>        hash: lane, pool, pod, agent, at, seq, parent, rev, delegated (delegatedBy: the
--                    parent's id), movedFrom (the pool it asked for, when it runs on an
--                    alternative), borrowedFor (the primary a borrow runs for), signalled, probe,
--                    load (rounds running on the pool when admitted, itself included), tokens
--                    (its declared size, '' = none), area0 and virt0 (the pool's load clock when
--                    it was admitted; virt0 re-anchored by its progress reports), pAt pArea pTok
--                    (its last progress report: when, the clock's area, the tokens received:
--                    capline.lua)
--   sized:<p>        sorted set: the declared rounds running on p -> tokens (capline.lua)
--   tickets          sorted set: ticket id -> lease expiry
--   ticket:<id>      hash: lane, pool, pod, agent, since
--   wait:<p>:<lane>  sorted set: ticket id -> enqueue time (oldest first)
--   pinned:<p>       sorted set: the tickets of hard-pinned rounds waiting for p -> enqueue time;
--                    pool:<p> pinnedSince: since when pinned rounds wait there without service
--                    (a probe is not service: the pinned wait goes on through it)
--   pool:<p> moved   seats running on p that moved there (movedIn/movedOut: moves ever, admit.lua)
--   gone:<id>        string "<state>|<seq>|<pod>|<pool>|<lane>" with state released or expired,
--                    kept a day, so a retried release counts once and a late one is recognised
-- Uses events.lua (a swept seat is an `expired` event): include it before this file.
--- @include "codes"
--- @include "events"
--- @include "util"
local ERR = Codes.ERR
local event = Events.event
local check_name, check_whole, fail, fmt = Util.check_name, Util.check_whole, Util.fail, Util.fmt
local key = Util.key

local GONE_TTL = 86400

-- `s.counted`: the caller wrote the pool's running already (admit, with its other pool fields).
local function add_seat(cfg, pool, lane, id, s, lease_until)
  -- s.extra: more fields of the same write (a rate-ceiling reservation, ceilings.lua seat_fields)
  redis.call('HSET', key('seat', id), 'lane', lane, 'pool', pool, 'pod', s.pod, 'agent', s.agent or '',
    'at', fmt(s.at), 'seq', s.seq, 'parent', s.parent or '', 'rev', s.rev or '',
    'delegated', s.delegated or '', 'movedFrom', s.movedFrom or '', 'borrowedFor', s.borrowedFor or '', 'signalled', s.signalled or '', 'probe', s.probe or '', 'load', s.load or '',
    unpack(s.extra or {}))
  redis.call('ZADD', key('seats'), lease_until, id)
  if s.tokens then -- a declared round (capline.lua): its size and the load clock now; the caller counted it
    redis.call('HSET', key('seat', id), 'tokens', fmt(s.tokens), 'area0', fmt(s.area0), 'virt0', fmt(s.virt0))
    redis.call('ZADD', key('sized', pool), s.tokens, id)
  end
  redis.call('HINCRBY', key('lanes', pool), lane, 1)
  if s.delegated and s.delegated ~= '' then redis.call('HINCRBY', key('lanes', pool), lane .. '|d', 1) end
  if s.movedFrom and s.movedFrom ~= '' then redis.call('HINCRBY', key('pool', pool), 'moved', 1) end
  if not s.counted then redis.call('HINCRBY', key('pool', pool), 'running', 1) end
end

local function read_hash(k)
  local raw = redis.call('HGETALL', k)
  if #raw == 0 then return nil end
  local h = {}
  for i = 1, #raw, 2 do h[raw[i]] = raw[i + 1] end
  return h
end

-- Remove a seat and heal the counts; `state` is written to its tombstone.
local function drop_seat(id, s, state)
  redis.call('DEL', key('seat', id))
  redis.call('ZREM', key('seats'), id)
  if s.tokens and s.tokens ~= '' then
    redis.call('ZREM', key('sized', s.pool), id)
    redis.call('HINCRBY', key('pool', s.pool), 'sized', -1)
  end
  redis.call('HINCRBY', key('lanes', s.pool), s.lane, -1)
  if s.delegated and s.delegated ~= '' then redis.call('HINCRBY', key('lanes', s.pool), s.lane .. '|d', -1) end
  if s.movedFrom and s.movedFrom ~= '' then redis.call('HINCRBY', key('pool', s.pool), 'moved', -1) end
  redis.call('HINCRBY', key('pool', s.pool), 'running', -1)
  redis.call('SET', key('gone', id), table.concat({state, s.seq, s.pod, s.pool, s.lane}, '|'), 'EX', GONE_TTL)
end

local function read_gone(id)
  local v = redis.call('GET', key('gone', id))
  if not v then return nil end
  local state, seq, pod, pool, lane = string.match(v, '^(%a+)|(%d+)|([^|]*)|([^|]*)|(.*)$')
  return {state = state, seq = tonumber(seq), pod = pod, pool = pool, lane = lane}
end

-- A seat's admission sequence: a whole number (the pool's `seq` is an integer that HINCRBY
-- counts on, and a tombstone writes it back as digits).
local MAX_SEQ = 2 ^ 53
local function check_seq(s)
  return check_whole('seq', s, nil, 1, MAX_SEQ)
end

-- The seat a release or a report names in ARGV[1..3]: id, seq (the admission it was given), pod.
local function seat_args()
  return check_name('seat id', ARGV[1]), check_seq(ARGV[2]), check_name('pod', ARGV[3])
end

-- A seat record (live, or its tombstone) must be this pod's, from this admission.
local function check_owner(id, rec, seq, pod)
  if rec and (rec.pod ~= pod or tonumber(rec.seq) ~= seq) then
    fail(ERR.NOT_YOUR_SEAT, 'seat ' .. id .. ' is held by pod ' .. rec.pod .. ' at seq ' .. rec.seq)
  end
  return rec
end

-- A new waiter queues after every waiter already there, even at the same `now`: its enqueue
-- time is nudged past the newest one, so the queue is first come, first served for every pod.
-- Returns the enqueue time.
local function add_ticket(pool, lane, id, pod, agent, now, lease_until)
  local since = now
  local newest = redis.call('ZRANGE', key('wait', pool, lane), -1, -1, 'WITHSCORES')[2]
  if newest and tonumber(newest) >= since then since = tonumber(newest) + 1e-6 end
  redis.call('HSET', key('ticket', id), 'lane', lane, 'pool', pool, 'pod', pod, 'agent', agent, 'since', fmt(since))
  redis.call('ZADD', key('tickets'), lease_until, id)
  redis.call('ZADD', key('wait', pool, lane), since, id)
  redis.call('HINCRBY', key('lanes', pool), lane .. '|w', 1)
  redis.call('HINCRBY', key('pool', pool), 'waiting', 1)
  return since
end

local function drop_ticket(id, t)
  redis.call('DEL', key('ticket', id))
  redis.call('ZREM', key('tickets'), id)
  redis.call('ZREM', key('wait', t.pool, t.lane), id)
  -- the last pinned waiter gone without service (given up, expired): the pinned wait ends
  if redis.call('ZREM', key('pinned', t.pool), id) == 1 and redis.call('ZCARD', key('pinned', t.pool)) == 0 then
    redis.call('HDEL', key('pool', t.pool), 'pinnedSince')
  end
  redis.call('HINCRBY', key('lanes', t.pool), t.lane .. '|w', -1)
  redis.call('HINCRBY', key('pool', t.pool), 'waiting', -1)
end

-- The sweep's marker, `sweepAt` in the config hash: no lease expires before it, so an admit skips
-- the sweep's two range reads until `now` reaches it. Every lease written lowers it to the lease
-- when earlier (keep_sweep_before); a sweep that found every expired lease sets it to the earliest
-- lease left. A renewal may leave it earlier than any lease: the next sweep finds nothing and
-- moves it. Values: a number, '' (no lease at all) or absent (unknown: sweep).
local function sweep_due(marker, now)
  if not marker then return true end -- absent (HMGET's false)
  return marker ~= '' and now >= tonumber(marker)
end

-- After writing leases ending at `until_` (one call's leases all end then): `marker` is the
-- marker as this call knows it.
local function keep_sweep_before(marker, until_)
  if not marker then return end -- unknown: the next admit sweeps anyway
  if marker == '' or until_ < tonumber(marker) then redis.call('HSET', KEYS[1], 'sweepAt', fmt(until_)) end
end

-- The earliest lease left, as the marker's value.
local function earliest_lease()
  local s = redis.call('ZRANGE', key('seats'), 0, 0, 'WITHSCORES')[2]
  local t = redis.call('ZRANGE', key('tickets'), 0, 0, 'WITHSCORES')[2]
  if not s and not t then return '' end
  if not s or (t and tonumber(t) < tonumber(s)) then return t end
  return s
end

-- Sweep at most `limit` expired seats and tickets (a dead pod's leases): bounded cost per call.
-- Each seat swept is an `expired` event (its pool, lane and pod); a lapsed ticket is not.
-- Returns the pools whose counts changed, so callers can wake their waiters, the leases swept,
-- and the sweep's marker after it.
local function sweep(now, limit)
  local touched, n = {}, 0
  for _, id in ipairs(redis.call('ZRANGEBYSCORE', key('seats'), '-inf', now, 'LIMIT', 0, limit)) do
    local s = read_hash(key('seat', id))
    if s then
      drop_seat(id, s, 'expired')
      touched[s.pool] = true
      event('expired', 'round', id, 'pool', s.pool, 'lane', s.lane, 'pod', s.pod)
    else
      redis.call('ZREM', key('seats'), id)
    end
    n = n + 1
  end
  if n < limit then
    for _, id in ipairs(redis.call('ZRANGEBYSCORE', key('tickets'), '-inf', now, 'LIMIT', 0, limit - n)) do
      local t = read_hash(key('ticket', id))
      if t then drop_ticket(id, t) else redis.call('ZREM', key('tickets'), id) end
      n = n + 1
    end
  end
  local marker = false -- more may have expired: the marker stays where it is (at or before now)
  if n < limit then
    marker = earliest_lease()
    redis.call('HSET', KEYS[1], 'sweepAt', marker)
  end
  return touched, n, marker
end

local function wake(pool)
  redis.call('PUBLISH', key('wake'), pool)
end

-- A freed slot of `pool` is news only to a waiter: one of the pool's (`waiting`), or one of a
-- pool that lists it as an alternative (those waiters re-ask across their alternatives). No
-- waiter, no wake-up: a release then publishes nothing.
local function wake_if_waited(cfg, pool, waiting)
  if waiting > 0 then return wake(pool) end
  for _, q in ipairs(cfg.moves.movers[pool] or {}) do
    if (tonumber(redis.call('HGET', key('pool', q), 'waiting')) or 0) > 0 then return wake(pool) end
  end
end

return {
  add_seat = add_seat,
  read_hash = read_hash,
  drop_seat = drop_seat,
  read_gone = read_gone,
  MAX_SEQ = MAX_SEQ,
  check_seq = check_seq,
  seat_args = seat_args,
  check_owner = check_owner,
  add_ticket = add_ticket,
  drop_ticket = drop_ticket,
  sweep_due = sweep_due,
  keep_sweep_before = keep_sweep_before,
  earliest_lease = earliest_lease,
  sweep = sweep,
  wake = wake,
  wake_if_waited = wake_if_waited,
}
