-- rules.lua: where the checks (check.lua, in a loop over the rules) and
-- settle.lua find the rules, here in the arguments (ARGV[8 ..], see
-- common.lua). A limiter whose rules are fixed runs a script with its
-- rules written in instead (see writtenChecks in scripts.go): Redis then
-- converts no rule number per call and the client sends none. This defines
--   rule(i)   rule i's strategy code, rate, period and burst (numbers), and
--             whether it counts each call as one event (a leading '*' in
--             the argument)
--   counting  whether a rule counts n (else Remaining counts calls)

local STAR = 42 -- '*', a per-call rule's mark (compared as a byte: no new string)
local counting = false
for i = 1, nrules do
  if string.byte(ARGV[4 + 4 * i]) ~= STAR then counting = true end
end

local function rule(i)
  local a = 4 + 4 * i
  local code = ARGV[a]
  local per_call = string.byte(code) == STAR
  if per_call then code = string.sub(code, 2) end
  return code, ARGV[a + 1] + 0, ARGV[a + 2] + 0, ARGV[a + 3] + 0, per_call
end
