-- policy_head.lua: the head of the script specialised for a policy of
-- several rules (policySource in scripts.go), after single_args.lua. The
-- script is the single rule's, once per rule: each rule's strategy file
-- (single_bucket.lua, single_slidingcounter.lua, or single_fixedwindow.lua
-- and single_window.lua) in a block of its own, with the rule written in
-- (its key KEYS[i], i its number), then policy_rule.lua, which gathers
-- what the rule found as check.lua and decide.lua do in the general
-- script. The rules' blocks nest, each in the block of the rule before
-- it, so that each rule's write, which the file leaves for
-- single_write.lua in a single rule's script, stays in its block, made on
-- the way out (policy_write.lua) only if every rule allowed, as in the
-- general script with the rules written in (writtenChecks);
-- policy_reply.lua replies. A block declares no name of this head or of
-- single_args.lua, and uses no name before declaring it but theirs
-- (TestPolicyScriptBlocksKeepTheirNames): it never reads another rule's.
-- Same decisions, writes and reply as the general script
-- (TestPolicyScriptDecidesAsGeneral); it makes one function, not the
-- general script's dozen, and runs no loop or rule table.
-- For the usual call only (no penalty block, priority share, reservation
-- or regions: the general script takes those, see bake), and for two to
-- four rules, each a token bucket, a sliding counter or a fixed window
-- (the strategies whose file writes at most once in a call).

-- policy tells single_bucket.lua that its rule's write may not be made
-- (another rule may deny): a state it must keep alive longer is kept at
-- once.
policy = true
-- What the rules found, as decide.lua gathers it (see there): denied, a
-- rule that n does not fit; min_now, the least remaining before the call
-- (2^63: more than any rule's), fewest, its rule (the one with the least
-- after, too: every rule here counts n), and its reset; reset_ok, the
-- longest reset after the call over the rules that allow; reset_denied,
-- the longest reset now; retry, slowest and slowest_reset, the longest
-- retry over the rules that deny, its rule and its reset.
local denied = false
local min_now, fewest, fewest_reset = 2 ^ 63, 1, 0
local reset_ok, reset_denied = 0, 0
local retry, slowest, slowest_reset = -1, 1, 0
