--[[
  census — rebuild the read model now and return it (operators, CLI, HTTP page).

  KEYS[1]  adm:{<mesh>}:config
  ARGV[1]  now ('' = Redis TIME)

  Reply: the census JSON (also stored in adm:{<mesh>}:census)
  Errors: ADM_BAD_ARG, ADM_NO_CONFIG
]]
--@include "codes"
--@include "util"
--@include "config"
--@include "pool"
--@include "lanes"
--@include "events"
--@include "seats"
--@include "provider"
--@include "capline"
--@include "decide"
--@include "fence"
--@include "census"

return run(function()
  local now = clock(ARGV[1])
  local cfg = load_config(nil)
  return build_census(cfg, now)
end)
