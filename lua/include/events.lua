-- What operators read (README "State in Redis"): a stream of transitions, and counters.
--   events             stream, capped at ~EVENTS_MAX: admitted, released, expired, probe, exhausted,
--                      grew, closed, reopened, config, budget, charged, rollover (not refusals)
--   refusals:<minute>  hash, kept a day: `<pool>|<lane>|<reason>` -> refusals that minute (minute =
--                      floor(now / 60) * 60), a borrow's sheds included; `admission events --refusals`
--   totals             hash, never expires: cumulative counts (the metrics endpoint reads it):
--                      admitted|<pool>|<lane>|<reason>, refused|<pool>|<lane>|<reason>,
--                      signal|<pool>|<signal>, closed|<provider>|<why>, reopened|<provider>|<by>,
--                      probe|<pool>, moved|<from>|<to>
-- Refusals are counted, not streamed: a busy mesh refuses far more often than anything changes,
-- and one entry per refusal would push hours of transitions out of the capped stream.
-- Names never hold '|' (check_name), so the fields split back unambiguously.
--- @include "util"
local key = Util.key

local EVENTS_MAX = 10000
local REFUSALS_TTL = 86400

local function event(kind, ...)
  redis.call('XADD', key('events'), 'MAXLEN', '~', EVENTS_MAX, '*', 'kind', kind, ...)
end

-- One more of a cumulative count (`totals`), field = the parts joined by '|'.
local function count(...)
  redis.call('HINCRBY', key('totals'), table.concat({...}, '|'), 1)
end

-- A refusal (or a borrow's shed) of a round of `lane` on `pool`: counted in its minute's hash and
-- in the totals: two HINCRBYs, and an EXPIRE only when the field is new in that minute (every
-- minute's hash is made by such a call, so each one expires).
local function count_refusal(now, pool, lane, reason)
  local field = pool .. '|' .. lane .. '|' .. reason
  local minute = key('refusals', string.format('%d', math.floor(now / 60) * 60))
  if redis.call('HINCRBY', minute, field, 1) == 1 then redis.call('EXPIRE', minute, REFUSALS_TTL) end
  count('refused', field)
end

return {event = event, count = count, count_refusal = count_refusal}
