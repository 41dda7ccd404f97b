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
-- bucket.lua's check_tb put each leaky rule's numbers in writes.lb:
-- slot[1 ..] key, used (D), Y, W, lag, rate, period, capacity, pxs,
-- n * period, the rule's index, whether it counts calls (check.lua), its
-- own queue's wait; this adds the gap. The other rules' writes wait until
-- after (denied set here makes none).
if writes and writes.lb then
  local p = writes.lb
  writes.lb = nil
  local q = 0 -- the longest queue: the Delay of a call now
  for j = 1, #p do
    if p[j][13] > q then q = p[j][13] end
  end
  if n0 > 0 and not denied and delay > q then q = delay end -- a warming leaky rule's
  for j = 1, #p do
    local r = p[j]
    local gap = 0
    if q > r[13] then
      gap = (q - r[5]) * r[6] - r[2]
      if gap < 0 then gap = 0 end
    end
    r[14] = gap
    local d = r[2] + gap
    local room = floor_div(r[8] - d, r[7])
    if r[12] and room >= 1 then room = 2 ^ 53 end
    if room < min_now then min_now = room end
    if n0 == 0 and room < min_after then min_after, fewest = room, r[11] end
    local over = d + r[10] - r[8]
    if n0 > 0 and over > 0 then
      denied, code = true, 1
      local wait = ceil_div(over, r[6]) + r[5]
      if wait > retry then retry, slowest = wait, r[11] end
    end
  end
  if n0 > 0 and not denied then
    local q2 = 0 -- the longest queue after this call
    for j = 1, #p do
      local r = p[j]
      local value, px, life, stored = bucket_write(r[2] + r[14] + r[10], r[6], r[7], r[9], r[5], r[3] + r[14] + r[10], r[4])
      rcall('SET', r[1], value, 'PX', px)
      if life > reset_ok then reset_ok = life end
      r[2], r[13] = stored, ceil_div(stored, r[6]) + r[5]
      if r[13] > q2 then q2 = r[13] end
      if r[14] > 0 and rid ~= '' then
        local y = r[3] + r[14]
        tags[nrules + r[11]] = now + r[5] + (y - y % r[6]) / r[6]
      end
    end
    -- Remaining: what a call at once could take, behind the new longest
    -- queue.
    for j = 1, #p do
      local r = p[j]
      local d = r[2]
      if q2 > r[13] then
        local g = (q2 - r[5]) * r[6]
        if g > d then d = g end
      end
      local after = floor_div(r[8] - d, r[7])
      if r[12] and after >= 1 then after = 2 ^ 53 end
      if after < min_after then min_after, fewest = after, r[11] end
    end
  end
end
