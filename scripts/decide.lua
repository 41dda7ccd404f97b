-- decide.lua follows the strategies in every decision script: it applies
-- a penalty block and sets up what the rules' checks gather. Then come the
-- checks (check.lua once per rule: in a loop over the rules passed as
-- arguments, after rules.lua, or written out once per rule with the rules
-- written in, see scripts.go) and reply.lua, which writes only if every
-- rule allowed (a denial writes nothing, in any rule), records a
-- reservation and replies (see common.lua).

local nkeys = nrules
if block > 0 then
  nkeys = nkeys + 1
  local b = rcall('GET', KEYS[nkeys])
  if b then
    local left = b - now
    if left > 0 then
      if n == 0 then -- n = 0 only reports: never denied
        return {0, 0, 0, math.ceil(left), 0}
      end
      return {2, 0, math.ceil(left), math.ceil(left), 0}
    end
  end
end

local n0 = n -- the call's n; a per-call rule counts min(n, 1) instead
local denied, code = false, 0
local min_now, min_after, fewest = nil, nil, 1
local delay, reset_ok, reset_denied = 0, 0, 0
local retry, slowest = -1, 1
local tags -- only for a reservation
if rid ~= '' then tags = {} end
