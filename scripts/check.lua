-- check.lua checks one rule: i, its strategy code strat, its check
-- function check, rate, period, burst, per_call and pxs (see common.lua)
-- are locals where it stands (set by the loop over the arguments or
-- written in: argumentChecks and writtenChecks in scripts.go), and what it
-- finds is gathered into decide.lua's locals.
n = n0
if per_call and n > 1 then n = 1 end
local ok, avail, w, reset_now, reset_next, tag, why = check(KEYS[i], rate, period, burst, strat, pxs)
if tags then tags[i] = tag or 0 end
local after = avail - n
if per_call and counting then
  -- Remaining counts the call's units (n): a per-call rule limits it
  -- only when it has no call left.
  if avail >= 1 then avail = HUGE end
  if after >= 1 then after = HUGE end
end
if min_now == nil or avail < min_now then min_now = avail end
if min_after == nil or after < min_after then min_after, fewest = after, i end
if reset_now > reset_denied then reset_denied = reset_now end
if ok then
  if w > delay then delay = w end
  if reset_next > reset_ok then reset_ok = reset_next end
else
  denied = true
  if why == 3 then
    if code == 0 then code = 3 end
  else
    code = 1
  end
  if w > retry then retry, slowest = w, i end
end
