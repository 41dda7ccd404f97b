-- policy_rule.lua follows each rule's strategy file in a policy's script
-- (see policy_head.lua), in the rule's block, where i is the rule's
-- number: it gathers what the rule found, as check.lua does (avail, what
-- the rule has left before the call; wait, its retry when it denies (no
-- rule here delays a call it allows: no leaky bucket);
-- reset_now, its reset after before the call; reset, after it if the rule
-- allows). The rule's write (wc, wa, wb, wx, see single_write.lua) stays
-- in the rule's block, which holds the blocks of the rules after it, for
-- policy_write.lua to make once every rule has allowed.
-- The rule allows when n fits (check.lua's ok): a look (n = 0) at a rule
-- over its allowance (a lowered limit) makes no write, as in the general
-- script, though the reply does not deny it.

if avail < min_now then min_now, fewest, fewest_reset = avail, i, reset end
if reset_now > reset_denied then reset_denied = reset_now end
if n > avail then
  denied = true
  if wait > retry then retry, slowest, slowest_reset = wait, i, reset end
elseif reset > reset_ok then
  reset_ok = reset
end
