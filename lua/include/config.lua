-- The validated policy, as apply_config.lua stored it in the `config` hash:
--   version   integer, +1 per apply
--   lanes     JSON array of {name, floor, weight, priority, reserve, pools} sorted by priority desc
--   tunables  JSON object: every tunable of DESIGN §4 with its value
--   pools     JSON array of pool names (the catalog)
--   pool:<p>  the provider of pool p (membership of the catalog in O(1))
--   policy    the whole policy as JSON, for clients and the census
local function load_config(pool)
  local v = redis.call('HMGET', KEYS[1], 'version', 'lanes', 'tunables',
    pool and ('pool:' .. pool) or 'version')
  if not v[1] then fail(ERR.NO_CONFIG, 'no policy applied to this mesh; run `admission config apply FILE`') end
  local cfg = {version = tonumber(v[1]), lanes = cjson.decode(v[2]), T = cjson.decode(v[3]),
    provider = v[4], lane = {}, max_weight = 0}
  for _, l in ipairs(cfg.lanes) do
    cfg.lane[l.name] = l
    if l.weight > cfg.max_weight then cfg.max_weight = l.weight end
  end
  return cfg
end

local function check_lane(cfg, lane)
  check_name('lane', lane)
  if not cfg.lane[lane] then fail(ERR.UNKNOWN_LANE, 'lane ' .. lane .. ' is not in the policy') end
  return lane
end

local function check_pool(cfg, pool)
  check_name('pool', pool)
  if not cfg.provider then fail(ERR.UNKNOWN_POOL, 'pool ' .. pool .. ' is not in the catalog') end
  return pool
end

local function catalog()
  return cjson.decode(redis.call('HGET', KEYS[1], 'pools') or '[]')
end
