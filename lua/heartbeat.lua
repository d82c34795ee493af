--[[
  heartbeat — one pod renews every lease it holds in one call. A seat that Redis lost (a restart
  or failover without its last writes) and that was never released is re-asserted, so the counts
  match what is really running.

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  pod
  ARGV[2]  now ('' = Redis TIME)
  ARGV[3]  number of seats S (a whole number; each seq a whole number >= 1)
  ARGV[4..] S groups of (seat id, seq, lane, pool, admitted at), then the waiter ticket ids

  Reply: {status, est. lease expiry, lost seat ids (array), re-asserted seat ids (array), lost ticket ids (array)}
    a lost seat was released, or belongs to another pod now; a lost ticket must ask again (a
    ticket whose lane or pool left the policy is removed and reported lost)
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "seats"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_name, check_num, check_whole = Util.check_name, Util.check_num, Util.check_whole
local clock, fail, fmt, key, run = Util.clock, Util.fail, Util.fmt, Util.key, Util.run
local load_config = Config.load_config
local MAX_SEQ, add_seat, check_seq = Seats.MAX_SEQ, Seats.add_seat, Seats.check_seq
local drop_ticket, keep_sweep_before, read_gone = Seats.drop_ticket, Seats.keep_sweep_before, Seats.read_gone
local read_hash = Seats.read_hash

return function()
  local pod = check_name('pod', ARGV[1])
  local now = clock(ARGV[2])
  local n = check_whole('seat count', ARGV[3], nil, 0, MAX_SEQ)
  local cfg = load_config(nil)
  if #ARGV < 3 + 5 * n then fail(ERR.BAD_ARG, 'expected ' .. n .. ' seat groups of 5 arguments') end
  -- Seats are checked by name only: a seat whose lane or pool left the policy while its round
  -- runs is still renewed (and counted where it runs) until it ends. A live policy change must
  -- never make a live lease lapse.
  local seats = {}
  for i = 0, n - 1 do
    local b = 4 + 5 * i
    seats[#seats + 1] = {id = check_name('seat id', ARGV[b]), seq = check_seq(ARGV[b + 1]),
      lane = check_name('lane', ARGV[b + 2]), pool = check_name('pool', ARGV[b + 3]),
      at = check_num('admitted at', ARGV[b + 4], nil, 0)}
  end
  local tickets = {}
  for i = 4 + 5 * n, #ARGV do tickets[#tickets + 1] = check_name('ticket id', ARGV[i]) end
  -- validated: writes may start

  local until_ = now + cfg.T.lease_ttl
  local lost, reasserted, lost_tickets = {}, {}, {}
  for _, s in ipairs(seats) do
    local live = read_hash(key('seat', s.id))
    if live then
      if live.pod == pod and tonumber(live.seq) == s.seq then
        redis.call('ZADD', key('seats'), until_, s.id)
      else
        lost[#lost + 1] = s.id
      end
    else
      local gone = read_gone(s.id)
      if gone and gone.state == 'released' then
        lost[#lost + 1] = s.id
      else
        -- expired under a live pod, or lost by the server: the round is still running. A
        -- ticket of the same id (another pod asked after the lapse) goes: one id, one holder.
        local t = read_hash(key('ticket', s.id))
        if t then drop_ticket(s.id, t) end
        add_seat(cfg, s.pool, s.lane, s.id, {pod = pod, at = s.at, seq = s.seq}, until_)
        -- a wiped pool restarts its sequence: keep it past the seats it still has
        if (tonumber(redis.call('HGET', key('pool', s.pool), 'seq')) or 0) < s.seq then
          redis.call('HSET', key('pool', s.pool), 'seq', s.seq)
        end
        redis.call('DEL', key('gone', s.id))
        reasserted[#reasserted + 1] = s.id
      end
    end
  end
  -- A ticket is renewed only while its lane and pool are in the policy: a waiter of a removed
  -- lane or pool must not head a queue (or count as demand) for as long as its pod lives.
  for _, id in ipairs(tickets) do
    local t = read_hash(key('ticket', id))
    if t and t.pod == pod and cfg.lane[t.lane] and redis.call('HEXISTS', KEYS[1], 'pool:' .. t.pool) == 1 then
      redis.call('ZADD', key('tickets'), until_, id)
    else
      if t and t.pod == pod then drop_ticket(id, t) end
      lost_tickets[#lost_tickets + 1] = id
    end
  end
  if #seats + #tickets > 0 then keep_sweep_before(cfg.sweep_at, until_) end -- renewed or re-asserted leases
  return {STATUS.OK, fmt(until_), lost, reasserted, lost_tickets}
end
