--[[
  plan — how many of `wanted` new rounds of a lane would start now on each pool; nothing is
  seated and nothing written. Allowance(lane) is the sum over the lane's pools. O(lanes) per
  pool, whatever `wanted` and the estimate (decide.lua in_a_row). Pins, alternatives and
  closures are honoured as admit honours them: what a pool asked for would not start moves on
  to its alternatives in the policy's order (never for a hard-pinned lane or agent), each pool
  counted once, and only to those the caller can call (ARGV[5]; none named: no move, as a round
  whose caller did not say where it can call stays on the pool it asked for).

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  lane ('' = the agent's lane)
  ARGV[2]  wanted (>= 0, whole)
  ARGV[3]  now ('' = Redis TIME)
  ARGV[4]  agent (may be empty: its pin and its lane count)
  ARGV[5]  the pools the caller can move to, separated by spaces ('' = none)
  ARGV[6..] pools ('*' alone = the lane's pools: its `pools` list in the policy, else the catalog)

  Reply: {status, pool, n, pool, n, ...}: the pools asked for, then the alternatives that
    would take some of the rest (the total is the sum)
  Errors: ADM_BAD_ARG, ADM_BAD_NAME, ADM_UNKNOWN_LANE, ADM_UNKNOWN_POOL, ADM_NO_CONFIG
]]
--- @include "codes"
--- @include "util"
--- @include "config"
--- @include "pool"
--- @include "lanes"
--- @include "provider"
--- @include "decide"
local ERR, STATUS = Codes.ERR, Codes.STATUS
local check_name, check_num, clock, fail = Util.check_name, Util.check_num, Util.clock, Util.fail
local run = Util.run
local catalog, check_lane, check_pool = Config.catalog, Config.check_lane, Config.check_pool
local lane_of, load_config, pinned = Config.lane_of, Config.load_config, Config.pinned
local load_pool = Pool.load_pool
local load_lanes = Lanes.load_lanes
local budget, gate, lane_spend = Provider.budget, Provider.gate, Provider.lane_spend
local load_provider, money = Provider.load_provider, Provider.money
local plan = Decide.plan

-- The provider's day first (a closed provider starts only its probe), then the lane rules with
-- the money context: what admit would do to `wanted` newcomers asking one after another.
local function plan_here(cfg, pool, lane, wanted, now)
  if now < cfg.hold_until then return 0 end -- the recovery hold admits nothing
  local T, provider = cfg.T, check_pool(pool)
  local p, L = load_pool(T, pool), load_lanes(cfg, pool)
  local pv = load_provider(provider)
  local bud = budget(cfg, provider, now, pv)
  local m = money(cfg, bud, lane, bud and lane_spend(cfg, provider, lane, bud.day), p.meanCost)
  local g = gate(T, pv, bud, p, now, m)
  if g == 'probe' then return (wanted > 0 and L.wait[lane] == 0) and 1 or 0 end
  if g then return 0 end
  return plan(cfg, T, p, L, lane, wanted, m)
end

return function()
  local cfg = load_config(nil)
  local agent = check_name('agent', ARGV[4], true)
  local lane = check_lane(cfg, lane_of(cfg, ARGV[1], agent))
  local wanted = check_num('wanted', ARGV[2], nil, 0)
  if wanted ~= math.floor(wanted) or wanted > 100000 then fail(ERR.BAD_ARG, 'wanted must be a whole number <= 100000') end
  local now = clock(ARGV[3])
  local pools = {}
  local callable = {}
  for name in string.gmatch(ARGV[5] or '', '%S+') do callable[name] = true end
  if ARGV[6] == '*' then
    pools = cfg.lane[lane].pools or catalog()
  else
    for i = 6, #ARGV do pools[#pools + 1] = ARGV[i] end
  end
  for _, pool in ipairs(pools) do check_pool(pool) end
  local out, counted, n = {STATUS.OK}, {}, {}
  for _, pool in ipairs(pools) do
    if not counted[pool] then
      counted[pool] = true
      n[pool] = plan_here(cfg, pool, lane, wanted, now)
      out[#out + 1] = pool
      out[#out + 1] = n[pool]
    end
  end
  -- what a pool would not start moves on to its alternatives the caller can call (each pool
  -- counted once)
  if not pinned(cfg, lane, agent) then
    for _, pool in ipairs(pools) do
      local rest = wanted - n[pool]
      for _, alt in ipairs(cfg.moves.alts[pool] or {}) do
        if rest <= 0 then break end
        if callable[alt] and not counted[alt] then
          counted[alt] = true
          local k = plan_here(cfg, alt, lane, rest, now)
          rest = rest - k
          out[#out + 1] = alt
          out[#out + 1] = k
        end
      end
    end
  end
  return out
end
