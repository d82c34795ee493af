--[[
  admit — decide whether one round may start now on one pool; seat it, or give it a ticket.

  KEYS[1]  adm:{<mesh>}:config   (every other key is derived from it, same hash tag)
  ARGV[1]  round id (the intent id; also the seat id)
  ARGV[2]  lane
  ARGV[3]  pool  (model@provider, in the catalog)
  ARGV[4]  pod
  ARGV[5]  agent (may be empty)
  ARGV[6]  now, epoch seconds ('' = Redis TIME)
  ARGV[7]  draw u in [0, 1) for the marginal admission (the client draws it)
  ARGV[8]  wait: 1 = a refused round becomes a waiter (ticket with a lease), 0 = only try
  ARGV[9]  parent round id (may be empty)
  ARGV[10] revision (may be empty)

  Reply: {status, reason, pool, seat id, seq, lane, est, running, slots, config version, at, pod}
    at: when admitted, the admission time; when refused, the waiter's enqueue time (its place in
    the queue; `now` when it holds no ticket)
    pod: the pod that holds the seat (same-intent: possibly another pod than the asker)
    status ADMITTED with reason probe | within-floor | overdraft | borrowed | same-intent
    status REFUSED  with reason recovering | provider-closed | budget-reserve | budget-spent |
                    behind-older | reserved | fair-share | cost-guard | full | draw
    (a refused try, wait = 0, leaves a waiter's ticket on another pool or lane where it is)
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_UNKNOWN_LANE, ADM_UNKNOWN_POOL, ADM_NO_CONFIG
]]
--@include "codes"
--@include "util"
--@include "config"
--@include "pool"
--@include "lanes"
--@include "seats"
--@include "events"
--@include "provider"
--@include "decide"

local SWEEP_PER_ADMIT = 4

return run(function()
  local id = check_name('round id', ARGV[1])
  local pool = ARGV[3]
  local cfg = load_config(pool)
  local lane = check_lane(cfg, ARGV[2])
  check_pool(pool, cfg.provider)
  local pod = check_name('pod', ARGV[4])
  local agent = check_name('agent', ARGV[5], true)
  local now = clock(ARGV[6])
  local u = check_num('draw', ARGV[7])
  if u < 0 or u >= 1 then fail(ERR.BAD_ARG, 'draw must be in [0, 1), got ' .. ARGV[7]) end
  local want_wait = check_one_of('wait', ARGV[8], {['0'] = true, ['1'] = true}) == '1'
  local parent = check_name('parent', ARGV[9], true)
  local rev = check_name('revision', ARGV[10], true)
  local T = cfg.T
  -- validated: writes may start

  local function reply(status, reason, seq, p, at)
    return {status, reason, pool, id, seq, lane, fmt(p.est), p.running, slots(p), cfg.version, fmt(at), pod}
  end

  sweep(now, SWEEP_PER_ADMIT)

  local ticket = read_hash(key('ticket', id))

  -- One decision per intent: a live seat answers again with the same decision. A seat and a
  -- ticket never exist for one id: the asker's ticket goes (it asked after a lapse, say).
  local seat = read_hash(key('seat', id))
  if seat then
    if ticket then drop_ticket(id, ticket) end
    local p = load_pool(T, seat.pool)
    return {STATUS.ADMITTED, 'same-intent', seat.pool, id, tonumber(seat.seq), seat.lane,
      fmt(p.est), p.running, slots(p), cfg.version, seat.at, seat.pod}
  end

  -- A waiter asking on another pool or lane keeps its place unless it is admitted there, or
  -- asks to wait there (then it moves).
  local elsewhere = ticket and (ticket.pool ~= pool or ticket.lane ~= lane)

  -- Seam for the later issue, in docs/design.md §5 order: 0 delegated.

  local p = load_pool(T, pool)
  local L = load_lanes(cfg, pool)
  local admitted, reason, probe = false, nil, false
  local provider = cfg.provider

  -- After a restart the pods' running rounds are unknown until their heartbeats re-assert them.
  if now < cfg.hold_until then reason = 'recovering' end
  local pv = load_provider(provider)
  local bud = budget(cfg, provider, now, pv)
  local m = money(cfg, bud, lane, bud and lane_spend(cfg, provider, lane, bud.day), p.meanCost)
  if not reason then
    -- 1. and 2. The provider's day (provider.lua gate): the day's budget spent closes the
    -- provider until midnight; a closed one admits one probe every probe_every while nothing
    -- runs on this pool; the budget, committed spend counted, and the lane's reserve.
    if bud and bud.spent >= bud.limit and not is_closed(pv, now) then
      close_provider(cfg, provider, now, 'budget_reached')
      pv = load_provider(provider)
    end
    local g = gate(T, pv, bud, p, now, m)
    if g == 'probe' then probe = true else reason = g end
  end
  -- 3. Oldest first: a newcomer does not pass the older waiters of its own lane.
  if not reason and L.wait[lane] > 0 then
    local oldest = redis.call('ZRANGE', key('wait', pool, lane), 0, 0)[1]
    if oldest ~= id then reason = 'behind-older' end
  end
  if not reason and probe then admitted, reason = true, 'probe'
  elseif not reason then admitted, reason = decide(cfg, T, p, L, lane, u, guarded_at(m, 0)) end

  if admitted then
    if ticket then drop_ticket(id, ticket) end
    p.seq = redis.call('HINCRBY', key('pool', pool), 'seq', 1)
    add_seat(cfg, pool, lane, id, {pod = pod, agent = agent, at = now, seq = p.seq, parent = parent, rev = rev,
      probe = probe and '1' or ''}, now + T.lease_ttl)
    if probe then redis.call('HSET', key('provider', provider), 'lastProbe', fmt(now)) end
    redis.call('DEL', key('gone', id))
    p.running = p.running + 1
    -- more waiters and a slot still free: wake them now (every pod), not at the next clock
    local waiting = p.waiting - ((ticket and not elsewhere) and 1 or 0)
    if waiting > 0 and p.running < slots(p) then wake(pool) end
    event('admitted', 'round', id, 'lane', lane, 'pool', pool, 'pod', pod, 'reason', reason)
    return reply(STATUS.ADMITTED, reason, p.seq, p, now)
  end

  redis.call('HSET', key('pool', pool), 'lastDemand', fmt(now))
  local since = now
  if elsewhere then
    if want_wait then
      drop_ticket(id, ticket)
      since = add_ticket(pool, lane, id, pod, agent, now, now + T.lease_ttl)
    end
  elseif ticket then
    since = tonumber(ticket.since)
    if want_wait then redis.call('ZADD', key('tickets'), now + T.lease_ttl, id) end
  elseif want_wait then
    since = add_ticket(pool, lane, id, pod, agent, now, now + T.lease_ttl)
  end
  event('refused', 'round', id, 'lane', lane, 'pool', pool, 'pod', pod, 'reason', reason)
  return reply(STATUS.REFUSED, reason, 0, p, since)
end)
