-- check.lua checks one rule: i, its strategy code strat, its check
-- function check, rate, period, burst, per_call and pxs (see common.lua)
-- are locals where it stands (set by the loop over the arguments or
-- written in: argumentChecks and writtenChecks in scripts.go), and what it
-- finds is gathered into decide.lua's locals.
n = n0
if per_call and n > 1 then n = 1 end
-- A priority share (see common.lua) lowers the capacity the check sees:
-- kept is what it leaves out, added back below to tell a denial by the
-- share alone (code 5). A warming bucket's rule (its code starts with
-- 'w', see warmup.lua) takes no share: its capacity is time, not events.
local kept = 0
if share and string.byte(strat) ~= 119 then
  local bucket = strat == 'tb' or strat == 'lb'
  local c = rate
  if bucket then c = burst end
  local r = c % 1000000
  kept = c - ((c - r) / 1000000 * share + floor_div(r * share, 1000000))
  if bucket then burst = burst - kept else rate = rate - kept end
end
local ok, avail, w, reset_now, reset_next, tag, why, slot = check(KEYS[i], rate, period, burst, strat, pxs)
if slot then slot[11], slot[12] = i, per_call and counting end -- a policy's leaky rule (slots.lua)
if kept > 0 and not ok and why ~= 3 and n <= avail + kept then why = 5 end
if tags then
  tags[i] = avail + kept
  if rid ~= '' then tags[nrules + i] = tag or 0 end
elseif share then
  tags = avail + kept -- one rule (see decide.lua)
end
local after = avail - n
if per_call and counting then
  -- Remaining counts the call's units (n): a per-call rule limits it
  -- only when it has no call left.
  -- (2 ^ 53 is folded by the compiler: no chunk-level local for it, see
  -- share in common.lua.)
  if avail >= 1 then avail = 2 ^ 53 end
  if after >= 1 then after = 2 ^ 53 end
end
if min_now == nil or avail < min_now then min_now = avail end
if min_after == nil or after < min_after then
  min_after, fewest, fewest_reset = after, i, reset_next
end
if reset_now > reset_denied then reset_denied = reset_now end
if ok then
  if w > delay then delay = w end
  if reset_next > reset_ok then reset_ok = reset_next end
else
  denied = true
  if why == 3 or why == 5 then
    if code == 0 or code == 3 then code = why end
  else
    code = 1
  end
  if w > retry then
    retry, slowest, slowest_reset = w, i, reset_next -- a denial's reset_next is its reset_now
  end
end
