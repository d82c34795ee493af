-- The audit stream: a capped stream of decisions and transitions.
local EVENTS_MAX = 10000
local function event(kind, ...)
  redis.call('XADD', key('events'), 'MAXLEN', '~', EVENTS_MAX, '*', 'kind', kind, ...)
end
