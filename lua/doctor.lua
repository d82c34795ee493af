--[[
  doctor — check that the counts agree with the live records; reads only, never writes.

  An operator tool (and the tests' invariant checker), O(seats + tickets + lanes × pools): it
  reads every seat and ticket record of the mesh in one call, so do not run it in a hot loop.
  It works without a policy (the catalog and the lanes are then empty) and for seats on pools or
  lanes the policy no longer names.

  KEYS[1]  adm:{<mesh>}:config
  ARGV     none: the doctor takes no arguments (any are ignored)

  What it reads, atomically:
    `seats` and every seat:<id>; `tickets` and every ticket:<id>; the records of the ids found in
    the wait queues; for every pool of the catalog or named by a seat or ticket record: `lanes:<p>`
    and pool:<p> running/waiting; the queues wait:<p>:<lane> for those pools × (the policy's
    lanes, the lanes the records name there and the lanes of `lanes:<p>`).
  What it checks:
    every id of `seats`/`tickets` has its record, and every record it reaches has its lease;
    pool running == seats on the pool, waiting == tickets on it, moved == seats that moved there;
    every member of pinned:<p> is a ticket waiting for p; per lane: `<lane>` == seats,
    `<lane>|w` == tickets, `<lane>|d` == delegated seats; every ticket is in its own queue and
    every queue member is a ticket of that pool and lane; no id is both a seat and a ticket; no
    count is negative or not a number; the records name a lane and a pool; the sweep's marker
    (config sweepAt) is not after the earliest lease; sized:<p> holds exactly the seats of p that
    declared a size (the cap line's index), and pool:<p> `sized` counts them; a seat that
    reserved against a rate-ceiling scope holds its reservation as counts (cIn, cOut >= 0), and
    every bucket level of a scope of the policy (ceil:<scope>) is a number, and so are its read
    model's use and accuracy counts (ceiluse:<scope>, ceiluse.lua; the accuracy bins at least 0).

  Reply: JSON {ok, seats, tickets, problems: [{kind, ...}]} (kinds: seat-without-record,
    ticket-without-record, seat-not-leased, ticket-not-leased, bad-record, seat-and-ticket,
    pool-count, lane-count, negative, not-a-number, ticket-not-queued, queue-member-without-ticket,
    queue-member-misplaced, pinned-not-waiting, sweep-marker-late, sized-index, bad-config,
    bad-reservation). An empty problem list may come back as {} (cjson).
  Errors: ADM_BAD_ARG (KEYS[1])
]]
--- @include "util"
--- @include "seats"
--- @include "ceilings"
local key, run = Util.key, Util.run
local LIMITS = Ceilings.LIMITS
-- the read model's counts in a scope's hash (ceiluse.lua), besides acc:<bin> and accN
local USE_FIELDS = {useMin = true, useReq = true, useTok = true, prevReq = true, prevTok = true}
local earliest_lease, read_hash = Seats.earliest_lease, Seats.read_hash

return function()
  local problems = {}
  local function problem(kind, details)
    details.kind = kind
    problems[#problems + 1] = details
  end

  -- the policy, if any: its catalog and its lanes (a missing or unreadable field reads as none)
  local function config_list(field)
    local raw = redis.call('HGET', KEYS[1], field)
    if not raw then return {} end
    local ok, v = pcall(cjson.decode, raw)
    if not ok or type(v) ~= 'table' then
      problem('bad-config', {field = field})
      return {}
    end
    return v
  end
  local catalog_pools = config_list('pools')
  local policy_lanes = {}
  for _, l in ipairs(config_list('lanes')) do
    if type(l) == 'table' and type(l.name) == 'string' then policy_lanes[#policy_lanes + 1] = l.name end
  end

  -- the records: every leased id, and the records of the ids the queues name (reached below)
  local seats, tickets = {}, {}
  local seat_ids = redis.call('ZRANGE', key('seats'), 0, -1)
  local ticket_ids = redis.call('ZRANGE', key('tickets'), 0, -1)
  local leased_seat, leased_ticket = {}, {}
  for _, id in ipairs(seat_ids) do
    leased_seat[id] = true
    local s = read_hash(key('seat', id))
    if s then seats[id] = s else problem('seat-without-record', {id = id}) end
  end
  for _, id in ipairs(ticket_ids) do
    leased_ticket[id] = true
    local t = read_hash(key('ticket', id))
    if t then tickets[id] = t else problem('ticket-without-record', {id = id}) end
  end

  -- the sweep's marker (seats.lua sweep_due) never after a lease: else an admit could skip the
  -- sweep of a lease that ran out
  local marker = redis.call('HGET', KEYS[1], 'sweepAt')
  if marker then
    local first = earliest_lease()
    if first ~= '' and (marker == '' or tonumber(marker) == nil or tonumber(marker) > tonumber(first)) then
      problem('sweep-marker-late', {marker = marker, lease = first})
    end
  end

  -- a record must name its lane and pool to be counted
  local function usable(what, id, r)
    for _, f in ipairs({'lane', 'pool'}) do
      if not r[f] or r[f] == '' then
        problem('bad-record', {what = what, id = id, missing = f})
        return false
      end
    end
    return true
  end

  -- the pools to check, in a stable order: the catalog, then the others the records name
  local pools, pool_seen = {}, {}
  local function add_pool(p)
    if type(p) == 'string' and p ~= '' and not pool_seen[p] then
      pool_seen[p] = true
      pools[#pools + 1] = p
    end
  end
  for _, p in ipairs(catalog_pools) do add_pool(p) end
  local extra = {}
  for _, group in ipairs({seats, tickets}) do
    for _, r in pairs(group) do
      if r.pool and r.pool ~= '' and not pool_seen[r.pool] then extra[r.pool] = true end
    end
  end
  local extra_sorted = {}
  for p in pairs(extra) do extra_sorted[#extra_sorted + 1] = p end
  table.sort(extra_sorted)
  for _, p in ipairs(extra_sorted) do add_pool(p) end

  -- the seats that declared a size, per pool: declared[p][id] = tokens, and their ids in order
  local declared = {}
  for _, id in ipairs(seat_ids) do
    local s = seats[id]
    if s and s.tokens and s.tokens ~= '' and type(s.pool) == 'string' then
      local d = declared[s.pool] or {}
      declared[s.pool] = d
      d[id], d[#d + 1] = tonumber(s.tokens), id
    end
  end

  -- what the records say, per pool and lane
  local want = {}  -- pool -> {running, waiting, lanes = {lane -> {run, wait, deleg}}}
  for _, p in ipairs(pools) do want[p] = {running = 0, waiting = 0, moved = 0, sized = 0, lanes = {}} end
  local function want_of(p, lane)
    local w = want[p].lanes[lane]
    if not w then
      w = {run = 0, wait = 0, deleg = 0}
      want[p].lanes[lane] = w
    end
    return w
  end
  for _, id in ipairs(seat_ids) do
    local s = seats[id]
    if s and usable('seat', id, s) then
      want[s.pool].running = want[s.pool].running + 1
      if s.movedFrom and s.movedFrom ~= '' then want[s.pool].moved = want[s.pool].moved + 1 end
      if s.tokens and s.tokens ~= '' then want[s.pool].sized = want[s.pool].sized + 1 end
      local w = want_of(s.pool, s.lane)
      w.run = w.run + 1
      if s.delegated and s.delegated ~= '' then w.deleg = w.deleg + 1 end
    end
  end
  for _, id in ipairs(ticket_ids) do
    local t = tickets[id]
    if t and usable('ticket', id, t) then
      want[t.pool].waiting = want[t.pool].waiting + 1
      local w = want_of(t.pool, t.lane)
      w.wait = w.wait + 1
    end
  end

  -- a stored count: a number >= 0 (a missing field is 0)
  local function count(k, h, field)
    local v = h[field]
    if v == nil then return 0 end
    local n = tonumber(v)
    if n == nil then
      problem('not-a-number', {key = k, field = field, value = v})
      return nil
    end
    return n
  end

  for _, p in ipairs(pools) do
    local w = want[p]
    local lk, pk = 'lanes:' .. p, 'pool:' .. p
    local lanes = read_hash(key('lanes', p)) or {}
    local pool_h = read_hash(key('pool', p)) or {}
    local fields = {}
    for f in pairs(lanes) do fields[#fields + 1] = f end
    table.sort(fields)
    for _, f in ipairs(fields) do
      local n = tonumber(lanes[f])
      if n and n < 0 then problem('negative', {key = lk, field = f, value = n}) end
    end
    for _, id in ipairs(redis.call('ZRANGE', key('pinned', p), 0, -1)) do
      local t = tickets[id] or read_hash(key('ticket', id))
      if not t or t.pool ~= p then problem('pinned-not-waiting', {pool = p, id = id}) end
    end
    -- the cap line's index (capline.lua): exactly the seats of p that declared a size, by size
    local sized, in_index, mine = redis.call('ZRANGE', key('sized', p), 0, -1, 'WITHSCORES'), {}, declared[p] or {}
    for i = 1, #sized, 2 do
      in_index[sized[i]] = true
      if mine[sized[i]] ~= tonumber(sized[i + 1]) then problem('sized-index', {pool = p, id = sized[i]}) end
    end
    for _, id in ipairs(mine) do
      if not in_index[id] then problem('sized-index', {pool = p, id = id}) end
    end
    for _, f in ipairs({'running', 'waiting', 'moved', 'sized'}) do
      local n = count(pk, pool_h, f)
      if n and n < 0 then problem('negative', {key = pk, field = f, value = n}) end
      if n and n ~= w[f] then problem('pool-count', {pool = p, field = f, stored = n, records = w[f]}) end
    end
    -- the lanes to check here: the policy's, those the records name and those the hash holds
    local lane_names, lane_seen = {}, {}
    local function add_lane(l)
      if l ~= '' and not lane_seen[l] then
        lane_seen[l] = true
        lane_names[#lane_names + 1] = l
      end
    end
    for _, l in ipairs(policy_lanes) do add_lane(l) end
    for l in pairs(w.lanes) do add_lane(l) end
    for _, f in ipairs(fields) do add_lane((string.gsub(f, '|[wd]$', ''))) end
    table.sort(lane_names)
    for _, l in ipairs(lane_names) do
      local r = w.lanes[l] or {run = 0, wait = 0, deleg = 0}
      for _, c in ipairs({{l, r.run}, {l .. '|w', r.wait}, {l .. '|d', r.deleg}}) do
        local n = count(lk, lanes, c[1])
        if n and n ~= c[2] then
          problem('lane-count', {pool = p, lane = l, field = c[1], stored = n, records = c[2]})
        end
      end
      -- the queue: each member a ticket of this pool and lane
      for _, id in ipairs(redis.call('ZRANGE', key('wait', p, l), 0, -1)) do
        local t = tickets[id]
        if not t and not leased_ticket[id] then
          t = read_hash(key('ticket', id))
          if t then
            tickets[id] = t
            problem('ticket-not-leased', {id = id, pool = t.pool or '', lane = t.lane or ''})
          end
        end
        if not t then
          problem('queue-member-without-ticket', {pool = p, lane = l, id = id})
        elseif t.pool ~= p or t.lane ~= l then
          problem('queue-member-misplaced', {pool = p, lane = l, id = id,
            ticketPool = t.pool or '', ticketLane = t.lane or ''})
        end
      end
    end
  end

  -- every leased ticket waits in its own queue
  for _, id in ipairs(ticket_ids) do
    local t = tickets[id]
    if t and t.pool and t.pool ~= '' and t.lane and t.lane ~= '' then
      if not redis.call('ZSCORE', key('wait', t.pool, t.lane), id) then
        problem('ticket-not-queued', {id = id, pool = t.pool, lane = t.lane})
      end
    end
  end

  -- one id is a seat or a ticket, never both; a reached seat record must be leased
  local ids, id_seen = {}, {}
  for _, group in ipairs({ticket_ids, seat_ids}) do
    for _, id in ipairs(group) do
      if not id_seen[id] then id_seen[id] = true; ids[#ids + 1] = id end
    end
  end
  for id in pairs(tickets) do
    if not id_seen[id] then id_seen[id] = true; ids[#ids + 1] = id end
  end
  table.sort(ids)
  for _, id in ipairs(ids) do
    local is_seat = leased_seat[id] or redis.call('EXISTS', key('seat', id)) == 1
    local is_ticket = leased_ticket[id] or tickets[id] ~= nil
    if is_seat and not leased_seat[id] then problem('seat-not-leased', {id = id}) end
    if is_seat and is_ticket then problem('seat-and-ticket', {id = id}) end
  end

  -- the rate ceilings (ceilings.lua): a seat's reservation is counts of tokens, a scope's
  -- levels are numbers (a level may be below 0: a debt that refills)
  for _, id in ipairs(seat_ids) do
    local s = seats[id]
    if s and s.cScope and s.cScope ~= '' then
      for _, f in ipairs({'cIn', 'cOut'}) do
        local v = tonumber(s[f] or '')
        if not v or v ~= v or v < 0 then problem('bad-reservation', {id = id, field = f, value = s[f] or ''}) end
      end
    end
  end
  local ceil = config_list('ceilings')
  local scopes = type(ceil.scopes) == 'table' and ceil.scopes or {}
  local scope_names = {}
  for name in pairs(scopes) do scope_names[#scope_names + 1] = name end
  table.sort(scope_names)
  for _, name in ipairs(scope_names) do
    local h = read_hash(key('ceil', name)) or {}
    for _, l in ipairs(LIMITS) do
      local v = h[l] and tonumber(h[l])
      if h[l] and (not v or v ~= v) then problem('not-a-number', {key = 'ceil:' .. name, field = l, value = h[l]}) end
    end
    local use, counts = read_hash(key('ceiluse', name)) or {}, {}
    for f in pairs(use) do
      if USE_FIELDS[f] or string.match(f, '^acc') then counts[#counts + 1] = f end
    end
    table.sort(counts)
    for _, f in ipairs(counts) do
      local v = tonumber(use[f])
      if not v or v ~= v or (string.match(f, '^acc') and v < 0) then
        problem('not-a-number', {key = 'ceiluse:' .. name, field = f, value = use[f]})
      end
    end
  end

  return cjson.encode({ok = #problems == 0, seats = #seat_ids, tickets = #ticket_ids, problems = problems})
end
