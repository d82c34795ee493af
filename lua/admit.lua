--[[
  admit — decide whether one round may start now, on the pool it asks for or on one of that
  pool's alternatives; seat it, or give it a ticket on the pool it asked for.

  KEYS[1]  adm:{<mesh>}:config   (every other key is derived from it, same hash tag)
  ARGV[1]  round id (the intent id; also the seat id)
  ARGV[2]  lane ('' = the lane of the agent, [agents] in the policy)
  ARGV[3]  pool  (model@provider, in the catalog): the pool asked for
  ARGV[4]  pod
  ARGV[5]  agent (may be empty)
  ARGV[6]  now, epoch seconds ('' = Redis TIME)
  ARGV[7]  draw u in [0, 1) for the marginal admission (the client draws it)
  ARGV[8]  wait: 1 = a refused round becomes a waiter (ticket with a lease), 0 = only try
  ARGV[9]  parent round id (may be empty): a round whose parent holds a live seat is delegated
  ARGV[10] revision: a whole number (may be empty); the intent's watermark moves up to it, and a
           borrow for an older revision than the watermark is refused (reject_stale_revision)
  ARGV[11] borrow: a pool to borrow ('' = none). The round runs there on behalf of the pool asked
           for (the primary), if the fence lets it (fence.lua), and never waits; a refusal or a
           shed changes nothing on the primary and is answered again while it lives
           (decision_ttl)
  ARGV[12] tokens: the round's declared size ('' = not declared; else a number in [1, 1e9]): the
           cap line (capline.lua) plans it to end before its cap
  ARGV[13] input tokens: what the round's call will send, as the provider counts it against its
           input ceilings ('' = not declared; else a number in [0, 1e9]; ceilings.lua)
  ARGV[14] answer budget: the call's max_tokens ('' = not declared; else in [0, 1e9]). A round on
           a pool with ceilings reserves one request and these tokens (undeclared: the scope's
           learned mean per call) in every bucket of its scope; its release reconciles them
  ARGV[15..] the pool's alternatives as the client ranked them (Thompson sampling, best first;
           at most 1000). Only the pool's configured alternatives are tried, in this order; a
           hard-pinned lane or agent tries none.

  Order (docs/design.md §5, §7, §8): 0 delegated (parent seated: admitted at once on the parent's
  lane, only a closed provider refuses it); then on the pool asked for and, while refused, on
  each ranked alternative: the fence on the borrowed plane (an alternative is a borrow), 1-2 the
  provider's day, 3 oldest first, 3b the cap line, 4-8 the lane rules. The round is seated on the first candidate
  that admits it, in this one call; refused everywhere, it waits on the pool it asked for (the
  refusal is that pool's). A borrow (ARGV[11]) is decided on the borrowed pool alone, after the
  fence on both planes.

  Reply: {status, reason, pool, seat id, seq, lane, est, running, slots, config version, at, pod,
          asked, stats[, paused for, wait]}
    paused for: refused with reason paused, the seconds left of the pool's pause (the provider's
      Retry-After, bounded by retry_after_max)
    wait: refused with a reason ceiling-<limit>, the seconds until that bucket could cover the
      round (its shortfall over its refill rate; a daily one: until midnight UTC); '' otherwise
    pool: where the round runs (admitted) or waits (refused); asked: the pool asked for
    at: when admitted, the admission time; when refused, the waiter's enqueue time (its place in
      the queue; `now` when it holds no ticket)
    pod: the pod that holds the seat (same-intent: possibly another pod than the asker)
    stats: {pool, successes, failures, mean cost (micro-USD), ...} of every alternative this call
      looked at (what the client's next Thompson draw needs)
    status ADMITTED with reason probe | within-floor | overdraft | borrowed | delegated | same-intent
    status REFUSED  with reason recovering | provider-closed | paused | budget-reserve | budget-spent |
                    behind-older | cap-line | reserved | fair-share | cost-guard | full | draw |
                    ceiling-rpm | ceiling-tpm | ceiling-itpm | ceiling-otpm | ceiling-rpd |
                    ceiling-tpd (after the lane rules would admit: ceilings.lua); a
                    borrow also
                    reject_stale_primary_health | reject_primary_depth |
                    reject_primary_retry_exhausted | reject_stale_borrowed_health |
                    shed_borrowed_depth | shed_borrowed_retry | reject_stale_revision
    (a refused try, wait = 0, leaves a waiter's ticket on another pool or lane where it is)
  Events (events.lua): an admission is an `admitted` event (a probe also a `probe` event) and
    counts admitted|<pool>|<lane>|<reason> in `totals` (and probe|<pool>, moved|<asked>|<pool>);
    a refusal, and a borrow's shed, is counted, not streamed: refusals:<minute> and
    refused|<pool>|<lane>|<reason> in `totals` (a replayed borrow decision counts nothing); each
    seat the sweep finds expired is an `expired` event; a day's budget spent, a `closed` event
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_UNKNOWN_LANE, ADM_UNKNOWN_POOL, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "capline"
--- @include "pool"
--- @include "lanes"
--- @include "events"
--- @include "seats"
--- @include "provider"
--- @include "decide"
--- @include "fence"
--- @include "ceilings"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_name, check_num, check_one_of = Util.check_name, Util.check_num, Util.check_one_of
local clock, fail, fmt, key, run = Util.clock, Util.fail, Util.fmt, Util.key, Util.run
local check_lane, check_pool, lane_of = Config.check_lane, Config.check_pool, Config.lane_of
local load_config, pinned = Config.load_config, Config.pinned
local advance_clock, cap_line_refuses = Capline.advance_clock, Capline.cap_line_refuses
local check_declared, check_tokens = Capline.check_declared, Capline.check_tokens
local load_pool, slots = Pool.load_pool, Pool.slots
local load_lanes = Lanes.load_lanes
local count, count_refusal, event = Events.count, Events.count_refusal, Events.event
local add_seat, add_ticket, drop_ticket = Seats.add_seat, Seats.add_ticket, Seats.drop_ticket
local keep_sweep_before, read_hash, sweep = Seats.keep_sweep_before, Seats.read_hash, Seats.sweep
local sweep_due, wake = Seats.sweep_due, Seats.wake
local budget, close_provider, gate = Provider.budget, Provider.close_provider, Provider.gate
local is_closed, lane_spend, load_provider = Provider.is_closed, Provider.lane_spend, Provider.load_provider
local money = Provider.money
local decide, guarded_at = Decide.decide, Decide.guarded_at
local check_revision, fence, load_plane = Fence.check_revision, Fence.fence, Fence.load_plane
local read_intent, waiting_of, write_intent = Fence.read_intent, Fence.waiting_of, Fence.write_intent
local REASON, cover, debit = Ceilings.REASON, Ceilings.cover, Ceilings.debit
local load_scope, scope_for = Ceilings.load_scope, Ceilings.scope_for
local reservation, seat_fields = Ceilings.reservation, Ceilings.seat_fields

local SWEEP_PER_ADMIT = 4
local MAX_CANDIDATES = 1000

-- The call, every argument validated before the first write (Redis does not roll a script
-- back). The steps below share it as `r`.
local function read_call()
  local id = check_name('round id', ARGV[1])
  local asked = ARGV[3]
  local cfg = load_config(asked)
  local agent = check_name('agent', ARGV[5], true)
  local lane = check_lane(cfg, lane_of(cfg, ARGV[2], agent))
  check_pool(asked, cfg.provider)
  local pod = check_name('pod', ARGV[4])
  local now = clock(ARGV[6])
  local u = check_num('draw', ARGV[7])
  if u < 0 or u >= 1 then fail(ERR.BAD_ARG, 'draw must be in [0, 1), got ' .. ARGV[7]) end
  local want_wait = check_one_of('wait', ARGV[8], {['0'] = true, ['1'] = true}) == '1'
  local parent = check_name('parent', ARGV[9], true)
  local rev = check_revision(ARGV[10])
  local borrow = check_name('borrow', ARGV[11], true)
  if borrow ~= '' then
    check_pool(borrow)
    if borrow == asked then fail(ERR.BAD_ARG, 'a round cannot borrow the pool it asks for') end
  end
  local tokens = check_tokens(ARGV[12])
  local input = check_declared('input tokens', ARGV[13])
  local budget = check_declared('answer budget', ARGV[14])
  if #ARGV - 14 > MAX_CANDIDATES then fail(ERR.BAD_ARG, 'at most ' .. MAX_CANDIDATES .. ' alternatives') end
  local ranked = {}
  for i = 15, #ARGV do ranked[#ranked + 1] = check_name('alternative', ARGV[i]) end
  return {id = id, asked = asked, cfg = cfg, T = cfg.T, agent = agent, lane = lane, pod = pod, now = now, u = u,
    want_wait = want_wait, parent = parent, rev = rev, borrow = borrow, tokens = tokens, input = input,
    budget = budget, ranked = ranked}
end

-- One decision per intent: a live seat answers again with the same decision. A seat and a
-- ticket never exist for one id: the asker's ticket goes (it asked after a lapse, say).
local function same_intent(r, seat, ticket)
  local id, T = r.id, r.T
  if ticket then drop_ticket(id, ticket) end
  local p = load_pool(T, seat.pool)
  return {STATUS.ADMITTED, 'same-intent', seat.pool, id, tonumber(seat.seq), seat.lane,
    fmt(p.est), p.running, slots(p), r.cfg.version, seat.at, seat.pod,
    (seat.movedFrom ~= nil and seat.movedFrom ~= '') and seat.movedFrom or seat.pool, {}}
end

-- 0. Delegated: a round whose parent holds a live seat is part of the parent's work. It runs
-- on the parent's lane at once: refusing it could only stall the parent (a nested-resource
-- deadlock), so nothing in admission bounds the fan-out.
local function delegation(r)
  local id, parent, now, cfg, lane = r.id, r.parent, r.now, r.cfg, r.lane
  local delegated = false
  if parent ~= '' and parent ~= id then
    local ps = read_hash(key('seat', parent))
    local lease = ps and tonumber(redis.call('ZSCORE', key('seats'), parent))
    if lease and lease > now then
      delegated = true
      if cfg.lane[ps.lane] then lane = ps.lane end
    end
  end
  r.delegated, r.lane = delegated, lane
end

-- A borrow's refusal or shed: only the intent's own record is written, so that asking again
-- answers the same while it lives (decision_ttl).
local function refuse_borrow(r, why, b)
  local id, now, rev, intent, borrow, asked = r.id, r.now, r.rev, r.intent, r.borrow, r.asked
  write_intent(id, 'decision', why, 'until', fmt(now + r.T.decision_ttl))
  -- the watermark still moves: the intent has seen this revision
  if rev and why ~= 'reject_stale_revision' and rev > (intent.rev or -1) then write_intent(id, 'rev', fmt(rev)) end
  count_refusal(now, borrow, r.lane, why) -- counted like a refusal, not streamed (events.lua)
  return {STATUS.REFUSED, why, borrow, id, 0, r.lane, fmt(b.est), b.running, slots(b), r.cfg.version, fmt(now),
    r.pod, asked, {}}
end

-- The borrow (docs/design.md §8): decided on the borrowed plane alone, after the fence on both
-- planes. It never waits, and a refusal or a shed writes nothing on the primary. The reply
-- when the borrow is refused here, nil when the borrowed pool decides.
local function the_borrow(r)
  local intent, now, borrow, asked, rev, cfg = r.intent, r.now, r.borrow, r.asked, r.rev, r.cfg
  if intent.decision and intent.until_ > now then -- one decision per intent id
    local b = load_pool(r.T, borrow)
    return {STATUS.REFUSED, intent.decision, borrow, r.id, 0, r.lane, fmt(b.est), b.running, slots(b), cfg.version,
      fmt(now), r.pod, asked, {}}
  end
  local why
  if rev and intent.rev and rev < intent.rev then why = 'reject_stale_revision' end
  if not why then
    why = fence(load_plane(cfg, asked, now), waiting_of(asked), load_plane(cfg, borrow, now), waiting_of(borrow))
  end
  if why then return refuse_borrow(r, why, load_pool(r.T, borrow)) end
  r.want_wait = false
end

-- The candidates: the pool asked for, then (unless hard-pinned) its configured alternatives
-- in the client's ranking. A name that is not (any longer) an alternative of it is skipped.
local function candidates(r)
  local asked, borrow, pin, cfg = r.asked, r.borrow, r.pin, r.cfg
  local cands = {asked}
  if borrow ~= '' then
    cands = {borrow}
  elseif not pin then
    local allowed, seen = cfg.moves.alt_set[asked] or {}, {[asked] = true}
    for _, c in ipairs(r.ranked) do
      if allowed[c] and not seen[c] then
        seen[c] = true
        cands[#cands + 1] = c
      end
    end
  end
  return cands
end

-- 3c. The provider's ceilings (ceilings.lua), once concurrency would admit the round on `pool`:
-- every bucket of the pool's scope must cover it, and all are debited together, or none. The
-- refusal's reason (ceiling-<limit>) or nil; r.res is the reservation to keep on the seat, and
-- r.wait_s the refusal's wait. A delegated round is debited, never refused (its parent runs).
local function ceilings_refuse(r, pool, p, delegated)
  local scope = scope_for(r.cfg, pool, p)
  if not scope then return nil end
  local b = load_scope(r.cfg, scope, r.now)
  if not b then return nil end -- a learned scope without a limit yet
  local res = reservation(b, r.input, r.budget)
  res.inp_text, res.out_text = r.input and ARGV[13], r.budget and ARGV[14]
  local limit, wait = cover(b, res)
  if limit and not delegated then
    r.wait_s = wait
    return REASON[limit]
  end
  debit(b, res)
  r.res, r.res_scope = res, scope
  return nil
end

-- The decision on one candidate: admitted, reason, probe, its pool state.
local function consider(r, pool, provider)
  local cfg, T, now, lane, id = r.cfg, r.T, r.now, r.lane, r.id
  local p = load_pool(T, pool)
  local pv = load_provider(provider)
  local bud = budget(cfg, provider, now, pv)
  -- the day's budget spent closes the provider until midnight
  if bud and bud.spent >= bud.limit and not is_closed(pv, now) then
    close_provider(cfg, provider, now, 'budget_reached')
    pv = load_provider(provider)
  end
  if r.delegated then -- only the closure (closure is not load): it moves a delegated round too
    local g = gate(T, pv, nil, p, now, nil)
    if g == 'paused' then g = nil end -- part of its parent's round, which holds a seat already
    if g and g ~= 'probe' then return false, g, false, p end
    ceilings_refuse(r, pool, p, true)
    if g == 'probe' then return true, 'probe', true, p end
    return true, 'delegated', false, p
  end
  -- After a restart the pods' running rounds are unknown until their heartbeats re-assert them.
  if now < cfg.hold_until then return false, 'recovering', false, p end
  -- 1. and 2. The provider's day (provider.lua gate): a closed provider admits one probe every
  -- probe_every while nothing runs on this pool; the budget, committed spend counted, and the
  -- lane's reserve.
  local m = money(cfg, bud, lane, bud and lane_spend(cfg, provider, lane, bud.day), p.meanCost)
  local g = gate(T, pv, bud, p, now, m)
  if g and g ~= 'probe' then return false, g, false, p end
  -- 3. Oldest first: a newcomer does not pass the older waiters of its own lane.
  local L = load_lanes(cfg, pool)
  if L.wait[lane] > 0 then
    local oldest = redis.call('ZRANGE', key('wait', pool, lane), 0, 0)[1]
    if oldest ~= id then return false, 'behind-older', false, p end
  end
  if g == 'probe' then
    local spent = ceilings_refuse(r, pool, p)
    if spent then return false, spent, false, p end
    return true, 'probe', true, p
  end
  -- 3b. The cap line: the rounds running (and this one, if sized) end before their caps.
  if cap_line_refuses(T, p, r.tokens) then return false, 'cap-line', false, p end
  local ok, why = decide(cfg, T, p, L, lane, r.u, guarded_at(m, 0))
  if ok then
    local spent = ceilings_refuse(r, pool, p)
    if spent then return false, spent, false, p end
  end
  return ok, why, false, p
end

-- Each candidate in turn until one admits the round: the outcome `o` (admitted, reason, probe,
-- p, pool, provider; first_reason and first_p, the refusal of the pool asked for; stats, what
-- the client's next Thompson draw needs of each alternative looked at).
local function decide_on(r, cands)
  local asked, cfg, T, now, lane = r.asked, r.cfg, r.T, r.now, r.lane
  local admitted, reason, probe, p
  local o = {stats = {}}
  local stats = o.stats
  for i, c in ipairs(cands) do
    local provider = c == asked and cfg.provider or check_pool(c)
    -- an alternative is a borrow: the fence on the plane it borrows first
    local shed = i > 1 and cfg.planes[c] and fence(nil, 0, load_plane(cfg, c, now), waiting_of(c))
    r.wait_s = nil
    if shed then admitted, reason, probe, p = false, shed, false, load_pool(T, c)
    else admitted, reason, probe, p = consider(r, c, provider) end
    if i > 1 then
      stats[#stats + 1] = c
      stats[#stats + 1] = p.succ
      stats[#stats + 1] = p.fail
      stats[#stats + 1] = fmt(p.meanCost)
    end
    if admitted then
      o.admitted, o.reason, o.probe, o.p, o.pool, o.provider = true, reason, probe, p, c, provider
      if probe then redis.call('HSET', key('provider', provider), 'lastProbe', fmt(now)) end
      return o
    end
    if i == 1 then o.first_reason, o.first_p, o.first_wait = reason, p, r.wait_s end
    if reason == 'recovering' then break end -- the hold is the mesh's, not one pool's
    -- oldest first across the alternatives: a newcomer does not move past an older waiter of its
    -- lane that could move too (it is woken when an alternative frees a slot); past a pinned
    -- one it may (a pin must not hold the lane's other rounds back)
    if i == 1 and reason == 'behind-older' then
      local oldest = redis.call('ZRANGE', key('wait', asked, lane), 0, 0)[1]
      if not redis.call('ZSCORE', key('pinned', asked), oldest) then break end
    end
  end
  return o
end

-- The seating: the round holds a seat on `o.pool` (the pool asked for or an alternative).
local function seat_round(r, o, ticket, marker)
  local id, asked, borrow, lane, pod, now, T, tokens, intent = r.id, r.asked, r.borrow, r.lane, r.pod, r.now, r.T,
    r.tokens, r.intent
  local pool, reason, probe, p, delegated, parent, rev = o.pool, o.reason, o.probe, o.p, r.delegated, r.parent, r.rev
  local moved = pool ~= asked
  -- a pinned round served (not a probe) ends the pinned wait; a probe does not
  local pinned_since = probe and redis.call('HGET', key('pool', asked), 'pinnedSince')
  if ticket then drop_ticket(id, ticket) end
  if not probe and p.pinnedSince and (r.pin or redis.call('ZCARD', key('pinned', pool)) == 0) then
    redis.call('HDEL', key('pool', pool), 'pinnedSince') -- served, or the pool serves and none is pinned
  elseif pinned_since then redis.call('HSET', key('pool', asked), 'pinnedSince', pinned_since) end
  -- seq and running in one write; while declared rounds run (or this one declares), the cap
  -- line's load clock moves with the rounds that ran until now (capline.lua)
  p.seq = p.seq + 1
  if tokens or p.sized > 0 then
    advance_clock(p, now)
    redis.call('HSET', key('pool', pool), 'seq', fmt(p.seq), 'running', p.running + 1,
      'sized', p.sized + (tokens and 1 or 0), 'clockAt', fmt(p.clockAt), 'area', fmt(p.area), 'virt', fmt(p.virt))
  else
    redis.call('HSET', key('pool', pool), 'seq', fmt(p.seq), 'running', p.running + 1)
  end
  add_seat(r.cfg, pool, lane, id, {pod = pod, agent = r.agent, at = now, seq = p.seq, load = p.running + 1, parent = parent,
    rev = rev and fmt(rev) or '', probe = probe and '1' or '', delegated = delegated and parent or '',
    movedFrom = (moved and borrow == '') and asked or '', borrowedFor = borrow ~= '' and asked or '',
    tokens = tokens, area0 = tokens and p.area, virt0 = tokens and p.virt, counted = true,
    extra = r.res and seat_fields(r.res_scope, r.res)},
    now + T.lease_ttl)
  keep_sweep_before(marker, now + T.lease_ttl)
  if intent then -- the watermark moves up to this revision; an earlier refusal is superseded
    if rev and rev > (intent.rev or -1) then write_intent(id, 'rev', fmt(rev)) end
    if intent.decision then redis.call('HDEL', key('intent', id), 'decision', 'until') end
  end
  if moved and borrow == '' then
    redis.call('HINCRBY', key('pool', pool), 'movedIn', 1)
    redis.call('HINCRBY', key('pool', asked), 'movedOut', 1)
  end
  redis.call('DEL', key('gone', id))
  p.running = p.running + 1
  -- an upward probe counts the rounds that test its level (pool.lua: grow)
  if p.probeFrom > 0 and p.running > p.probeFrom then redis.call('HINCRBY', key('pool', pool), 'probeRuns', 1) end
  -- more waiters and a slot still free: wake them now (every pod), not at the next clock
  local own = ticket and ticket.pool == pool and ticket.lane == lane
  if p.waiting - (own and 1 or 0) > 0 and p.running < slots(p) then wake(pool) end
  event('admitted', 'round', id, 'lane', lane, 'pool', pool, 'pod', pod, 'reason', reason,
    'asked', asked, 'delegatedBy', delegated and parent or '')
  count('admitted', pool, lane, reason)
  if probe then
    count('probe', pool)
    event('probe', 'provider', o.provider, 'pool', pool, 'round', id, 'lane', lane, 'pod', pod)
  end
  if moved and borrow == '' then count('moved', asked, pool) end
  return {STATUS.ADMITTED, reason, pool, id, p.seq, lane, fmt(p.est), p.running, slots(p), r.cfg.version, fmt(now),
    pod, asked, o.stats}
end

-- The queueing: refused everywhere, the round waits on the pool it asked for, with that pool's
-- reason (a try, wait = 0, only counts the refusal).
local function queue_round(r, o, ticket, marker)
  local id, lane, pod, now, T, intent, rev, want_wait, pin = r.id, r.lane, r.pod, r.now, r.T, r.intent, r.rev,
    r.want_wait, r.pin
  if intent and rev and rev > (intent.rev or -1) then write_intent(id, 'rev', fmt(rev)) end
  local pool, reason, p = r.asked, o.first_reason, o.first_p
  -- held back by a ceiling, the round is no demand for concurrency (pool.lua has_demand: its
  -- waiters then do not make the estimate grow either)
  local ceiling = o.first_wait ~= nil
  redis.call('HSET', key('pool', pool), ceiling and 'ceilingAt' or 'lastDemand', fmt(now))
  -- A waiter asking on another pool or lane keeps its place unless it is admitted there, or
  -- asks to wait there (then it moves).
  local elsewhere = ticket and (ticket.pool ~= pool or ticket.lane ~= lane)
  local since = now
  if elsewhere then
    if want_wait then
      drop_ticket(id, ticket)
      since = add_ticket(pool, lane, id, pod, r.agent, now, now + T.lease_ttl)
    end
  elseif ticket then
    since = tonumber(ticket.since)
    if want_wait then redis.call('ZADD', key('tickets'), now + T.lease_ttl, id) end
  elseif want_wait then
    since = add_ticket(pool, lane, id, pod, r.agent, now, now + T.lease_ttl)
  end
  -- a hard-pinned waiter is listed (census: hard-pinned to <pool>; starving past starved_after)
  if want_wait then
    keep_sweep_before(marker, now + T.lease_ttl) -- its ticket's lease, new or renewed
    if pin then
      redis.call('ZADD', key('pinned', pool), since, id)
      redis.call('HSETNX', key('pool', pool), 'pinnedSince', fmt(since))
    elseif ticket and redis.call('ZREM', key('pinned', pool), id) == 1 and redis.call('ZCARD', key('pinned', pool)) == 0 then
      redis.call('HDEL', key('pool', pool), 'pinnedSince')
    end
  end
  count_refusal(now, pool, lane, reason) -- counted per minute, not streamed (events.lua)
  -- paused by the provider's Retry-After: the waiter asks again when the pause ends
  local paused_for = reason == 'paused' and fmt(p.pausedUntil - now) or ''
  return {STATUS.REFUSED, reason, pool, id, 0, lane, fmt(p.est), p.running, slots(p), r.cfg.version, fmt(since), pod,
    r.asked, o.stats, paused_for, ceiling and fmt(o.first_wait) or ''}
end

return function()
  local r = read_call()
  local id, now = r.id, r.now
  -- validated: writes may start

  -- the sweep only once a lease may have run out (its marker: seats.lua sweep_due)
  local marker = r.cfg.sweep_at
  if sweep_due(marker, now) then marker = select(3, sweep(now, SWEEP_PER_ADMIT)) end

  local ticket = read_hash(key('ticket', id))
  local seat = read_hash(key('seat', id))
  if seat then
    return same_intent(r, seat, ticket)
  end
  delegation(r)
  r.pin = pinned(r.cfg, r.lane, r.agent)
  r.intent = (r.borrow ~= '' or r.rev) and read_intent(id) or nil
  if r.borrow ~= '' then
    local refused = the_borrow(r)
    if refused then return refused end
  end

  local o = decide_on(r, candidates(r))
  if o.admitted then return seat_round(r, o, ticket, marker) end
  if r.borrow ~= '' then -- a borrow the borrowed pool refused: shed there, nothing on the primary
    if not o.first_wait then redis.call('HSET', key('pool', r.borrow), 'lastDemand', fmt(now)) end
    return refuse_borrow(r, o.first_reason, o.first_p)
  end
  return queue_round(r, o, ticket, marker)
end
