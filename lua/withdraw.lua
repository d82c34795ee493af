--[[
  withdraw — a waiter gives up (its wait timed out, or its work went away): remove its ticket.

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  ticket id (the round id)
  ARGV[2]  pod

  Reply: {status, removed (0/1)}
  Errors: ADM_BAD_NAME, ADM_NOT_YOUR_SEAT (the ticket belongs to another pod)
]]
--- @include "codes"
--- @include "util"
--- @include "seats"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_name, fail, key, run = Util.check_name, Util.fail, Util.key, Util.run
local drop_ticket, read_hash = Seats.drop_ticket, Seats.read_hash

return function()
  local id = check_name('ticket id', ARGV[1])
  local pod = check_name('pod', ARGV[2])
  local t = read_hash(key('ticket', id))
  if not t then return {STATUS.OK, 0} end
  if t.pod ~= pod then fail(ERR.NOT_YOUR_SEAT, 'ticket ' .. id .. ' belongs to pod ' .. t.pod) end
  drop_ticket(id, t)
  return {STATUS.OK, 1}
end
