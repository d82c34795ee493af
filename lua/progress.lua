--[[
  progress — a pod says how many tokens each of its running rounds has received so far (a
  streaming worker counts them). Each declared round's stretch since its last report is a point of
  the cap line's fit, and its progress re-anchors what the ceiling counts as received
  (capline.lua): a cold pool has its line within a report or two, not when its first rounds end.

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  pod
  ARGV[2]  now ('' = Redis TIME)
  ARGV[3..] groups of (seat id, seq, tokens received so far: a number in [0, 1e9]); at most 10,000;
           then optionally the marker `~r` (never a seat id) and one rate-limit reading per
           group, in the groups' order ('' = none; as a release's reading, readings.lua): the
           live seat's scope learns from it, as from a release's

  Reply: {status, points (reports that became a point of the fit), lost seat ids (array)}
    status REPORTED; a lost seat is not this pod's live seat at that seq (released, swept, or
    another pod's): nothing of it is written. A round that declared no size, or with no tokens
    or no time since its last report, adds nothing.
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "pool"
--- @include "seats"
--- @include "capline"
--- @include "readings"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_name, clock, fail, key, run = Util.check_name, Util.clock, Util.fail, Util.key, Util.run
local load_config = Config.load_config
local load_pool, save_pool = Pool.load_pool, Pool.save_pool
local check_seq, read_hash = Seats.check_seq, Seats.read_hash
local CLOCK_FIT_FIELDS, advance_clock = Capline.CLOCK_FIT_FIELDS, Capline.advance_clock
local check_token_count, fit_progress = Capline.check_token_count, Capline.fit_progress
local learn, parse_reading = Readings.learn, Readings.parse_reading

local MAX_REPORTS = 10000
local READINGS_MARKER = '~r'

return function()
  local pod = check_name('pod', ARGV[1])
  local now = clock(ARGV[2])
  local last, marker = #ARGV, nil -- the groups end at the readings' marker, if any
  for b = 3, #ARGV, 3 do
    if ARGV[b] == READINGS_MARKER then last, marker = b - 1, b break end
  end
  local n = last - 2
  if n % 3 ~= 0 then fail(ERR.BAD_ARG, 'expected groups of 3 arguments (seat id, seq, tokens), got ' .. n) end
  if n / 3 > MAX_REPORTS then fail(ERR.BAD_ARG, 'at most ' .. MAX_REPORTS .. ' rounds per call') end
  local reports = {}
  for b = 3, last, 3 do
    reports[#reports + 1] = {id = check_name('seat id', ARGV[b]), seq = check_seq(ARGV[b + 1]),
      got = check_token_count('tokens received', ARGV[b + 2], 0)}
  end
  if marker then
    if #ARGV - marker ~= #reports then
      fail(ERR.BAD_ARG, 'expected one reading per round after ' .. READINGS_MARKER .. ', got ' .. (#ARGV - marker))
    end
    for i, r in ipairs(reports) do r.reading = parse_reading(ARGV[marker + i]) end
  end
  local cfg = load_config(nil)
  -- validated: writes may start

  local pools, order, lost, points = {}, {}, {}, 0
  for _, r in ipairs(reports) do
    local s = read_hash(key('seat', r.id))
    local live = s and s.pod == pod and tonumber(s.seq) == r.seq
    if live and r.reading then
      learn(cfg, (s.cScope and s.cScope ~= '') and s.cScope or cfg.scope_of[s.pool] or s.pool, r.reading, now)
    end
    if not live then
      lost[#lost + 1] = r.id
    elseif s.tokens and s.tokens ~= '' then
      local p = pools[s.pool]
      if not p then -- each pool's clock moves once, to now, before its first point
        p = load_pool(cfg.T, s.pool)
        advance_clock(p, now)
        pools[s.pool], order[#order + 1] = p, p
      end
      local fields = fit_progress(p, s, now, r.got)
      if fields then
        redis.call('HSET', key('seat', r.id), unpack(fields))
        points = points + 1
      end
    end
  end
  for _, p in ipairs(order) do save_pool(p, CLOCK_FIT_FIELDS) end
  return {STATUS.REPORTED, points, lost}
end
