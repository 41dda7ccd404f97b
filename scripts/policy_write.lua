-- policy_write.lua ends each rule's block in a policy's script (see
-- policy_head.lua), after the blocks of the rules after it: it makes the
-- write that the rule's strategy file left (wc on key with wa, and wb and
-- wx where wb is not nil, as single_write.lua makes it in a single rule's
-- script), once every rule has allowed.

if wc and not denied then
  if wb then rcall(wc, key, wa, wb, wx) else rcall(wc, key, wa) end
end
