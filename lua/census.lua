--[[
  census — rebuild the read model now and return it (operators, CLI, HTTP page).

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  now ('' = Redis TIME)

  Reply: the census JSON (also stored in adm:{<mesh>}:census)
  Errors: ADM_BAD_ARG, ADM_NO_CONFIG
]]
--- @include "util"
--- @include "config"
--- @include "census"
local clock, run = Util.clock, Util.run
local load_config = Config.load_config
local build_census = Census.build_census

return function()
  local now = clock(ARGV[1])
  local cfg = load_config(nil)
  return build_census(cfg, now)
end
