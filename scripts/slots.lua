-- slots.lua follows the rules' checks of a policy (see scripts.go): a
-- leaky bucket's event leaves at the policy's Delay, the longest of its
-- leaky rules' queues, so each leaky rule takes its slot there, not at its
-- own queue's end: the gap between the two counts as used (it is, by the
-- events ahead in the slower queue), and the next call waits behind it.
-- Without it, one call per 100 ms beside 10 per 10 ms let calls 2-4 out
-- 500, 501 and 502 ms after the first: the slower rule's spacing lost.
-- So a rule holds only the events that fit behind the longest queue: its
-- Remaining counts from there, a rule whose queue cannot hold the gap
-- denies the call (code 1), and a denial's RetryAfter is when every
-- leaky rule can hold it (the queues and the gaps drain together).
-- bucket.lua's check_tb put each leaky rule's numbers in writes.lb, a
-- list: slot[1 ..] key, used (D), Y, W, lag, rate, period, capacity,
-- pxs, n * period, the rule's index, whether it counts calls (check.lua),
-- its own queue's wait, the gap (set here), the next slot. The other rules' writes wait until
-- after (denied set here makes none).
local p = writes and writes.lb
if p and not p[15] and (n0 == 0 or denied or delay <= p[13]) then
  -- One leaky rule and no longer wait: its own queue, as a single
  -- rule's (the usual policy: a leaky bucket beside windows).
  writes.lb = nil
  if n0 > 0 and not denied then
    local r = p
    local d = r[2] + r[10]
    local value, px, _, stored = bucket_write(d, r[6], r[7], r[9], r[5], r[3] + r[10], r[4])
    rcall('SET', r[1], value, 'PX', px)
    if stored ~= d then
      local after = floor_div(r[8] - stored, r[7])
      if r[12] and after >= 1 then after = 2 ^ 53 end
      if after < min_after then min_after, fewest = after, r[11] end
    end
  end
elseif p then
  writes.lb = nil
  local q = 0 -- the longest queue: the Delay of a call now
  local r = p
  while r do
    if r[13] > q then q = r[13] end
    r = r[15]
  end
  local writing = n0 > 0 and not denied
  if writing and delay > q then q = delay end -- a warming leaky rule's
  r = p
  while r do
    local d = r[2]
    if q > r[13] then
      local g = (q - r[5]) * r[6]
      if g > d then d = g end
    end
    r[14] = d - r[2] -- the gap
    local over = d + r[10] - r[8]
    if n0 > 0 and over > 0 then
      denied, code = true, 1
      local wait = ceil_div(over, r[6]) + r[5]
      if wait > retry then retry, slowest = wait, r[11] end
    end
    r = r[15]
  end
  if not writing or denied then
    -- A look, or a denial: Remaining counts behind the longest queue.
    r = p
    while r do
      local room = floor_div(r[8] - r[2] - r[14], r[7])
      if r[12] and room >= 1 then room = 2 ^ 53 end
      if room < min_now then min_now = room end
      if n0 == 0 and room < min_after then min_after, fewest = room, r[11] end
      r = r[15]
    end
  else -- writing, allowed
    local q2 = 0 -- the longest queue after this call
    r = p
    while r do
      local d = r[2] + r[14] + r[10]
      local value, px, life, stored = bucket_write(d, r[6], r[7], r[9], r[5], r[3] + r[14] + r[10], r[4])
      rcall('SET', r[1], value, 'PX', px)
      if life > reset_ok then reset_ok = life end
      if stored ~= d then life = ceil_div(stored, r[6]) + r[5] end
      r[2], r[13] = stored, life
      if life > q2 then q2 = life end
      if r[14] > 0 and rid ~= '' then
        local y = r[3] + r[14]
        tags[nrules + r[11]] = now + r[5] + (y - y % r[6]) / r[6]
      end
      r = r[15]
    end
    -- Remaining: what a call at once could take, behind the new longest
    -- queue.
    r = p
    while r do
      local d = r[2]
      if q2 > r[13] then
        local g = (q2 - r[5]) * r[6]
        if g > d then d = g end
      end
      local after = floor_div(r[8] - d, r[7])
      if r[12] and after >= 1 then after = 2 ^ 53 end
      if after < min_after then min_after, fewest = after, r[11] end
      r = r[15]
    end
  end
end
