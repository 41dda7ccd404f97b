-- policy_reply.lua ends a policy's script (see policy_head.lua), after
-- the rules' held writes: it replies as reply.lua does for several rules
-- with no block or reservation (see common.lua): code, remaining, retry
-- after or delay, reset after, the deciding rule and its own reset, then
-- each rule's remaining before the call. policySource writes in format,
-- the reply's struct layout for its rules, and each rule's remaining
-- (its locals a1, a2, ...) in place of the last name of each return.
-- The rules' figures are whole numbers already (a bucket's times are
-- rounded up by its file; a window's are differences of whole µs).

local pack = rawget(_G, 'struct') -- (rawget: miniredis has none)
local code, rem, wait, reset, rule, rule_reset = 0, min_now - n, 0, reset_ok, fewest, fewest_reset
if n == 0 then
  reset = reset_denied
elseif denied then
  code, rem, wait, reset, rule, rule_reset = 1, min_now, retry, reset_denied, slowest, slowest_reset
end
if skew then code = code + skew end
if rem < 0 then rem = 0 end
if pack then return pack.pack(format, code, rem, wait, reset, rule, rule_reset, TAGS) end
return {code, rem, wait, reset, rule, rule_reset, TAGS}
