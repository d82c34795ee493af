--[[
  bind — revision binding (docs/design.md §8): a result binds only to the revision it observed.
  Each intent keeps a watermark, the newest revision it has seen (admit with a revision, or
  advance); a late result for an older revision is rejected and never replayed onto the
  primary's budget (the caller compensates inside the plane that ran it, if that plane had
  accepted the attempt).

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  action: bind | advance
  ARGV[2]  intent id (the round id)
  ARGV[3]  revision: a whole number >= 0
  ARGV[4]  now ('' = Redis TIME)

  Reply: {status, decision, watermark}
    bind:    bound (the revision is the watermark or newer; it becomes the watermark),
             reject_stale_revision (older than the watermark; nothing changed) or
             reject_not_admitted (the intent's last borrow was refused or shed: no attempt of it
             ran, so no result binds; nothing changed)
    advance: advanced (the watermark is now at least the revision)
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "fence"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_name, check_one_of, clock, fail = Util.check_name, Util.check_one_of, Util.clock, Util.fail
local fmt, run = Util.fmt, Util.run
local load_config = Config.load_config
local check_revision, read_intent, write_intent = Fence.check_revision, Fence.read_intent, Fence.write_intent

return function()
  local action = check_one_of('action', ARGV[1], {bind = true, advance = true})
  local id = check_name('intent id', ARGV[2])
  local rev = check_revision(ARGV[3])
  if rev == nil then fail(ERR.BAD_ARG, 'revision is required') end
  clock(ARGV[4])
  load_config(nil)
  -- validated: writes may start
  local intent = read_intent(id)
  local mark = intent.rev
  if action == 'bind' and mark and rev < mark then return {STATUS.OK, 'reject_stale_revision', fmt(mark)} end
  if action == 'bind' and intent.decision then return {STATUS.OK, 'reject_not_admitted', fmt(mark or rev)} end
  if not mark or rev > mark then
    write_intent(id, 'rev', fmt(rev))
    mark = rev
  end
  return {STATUS.OK, action == 'bind' and 'bound' or 'advanced', fmt(mark)}
end
