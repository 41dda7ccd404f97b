-- slots.lua follows the rules' checks of a policy (see scripts.go): a
-- leaky bucket's event leaves at the policy's Delay, the longest of its
-- leaky rules' queues, so each leaky rule takes its slot there, not at its
-- own queue's end: the gap between the two counts as used (it is, by the
-- events ahead in the slower queue), and the next call waits behind it.
-- Without it, one call per 100 ms beside 10 per 10 ms let calls 2-4 out
-- 500, 501 and 502 ms after the first: the slower rule's spacing lost. A
-- rule whose queue cannot hold the gap denies the call (code 1), with a
-- retry when it could. bucket.lua's check_tb queued each slot in writes.lb;
-- every rule allowed before these are written, and the writes of the other
-- rules wait until after (denied set here makes none).
if writes and writes.lb then
  local p = writes.lb
  writes.lb = nil
  if not denied then
    for j = 1, #p do
      local r = p[j] -- key, used, y, w, lag, rate, period, cap, pxs, take, i, counts calls, own delay
      local gap = 0
      if delay > r[13] then gap = (delay - r[5]) * r[6] - r[2] end
      if gap < 0 then gap = 0 end
      local over = r[2] + gap + r[10] - r[8]
      if over > 0 then
        denied, code = true, 1
        local wait = ceil_div(over, r[6])
        if wait > retry then retry, slowest = wait, r[11] end
      end
      r[14] = gap
    end
  end
  if not denied then
    for j = 1, #p do
      local r = p[j]
      local d = r[2] + r[14] + r[10]
      local value, px, life, stored = bucket_write(d, r[6], r[7], r[9], r[5], r[3] + r[14] + r[10], r[4])
      rcall('SET', r[1], value, 'PX', px)
      if life > reset_ok then reset_ok = life end
      local after = floor_div(r[8] - stored, r[7])
      if r[12] and after >= 1 then after = 2 ^ 53 end
      if after < min_after then min_after, fewest = after, r[11] end
      if r[14] > 0 and rid ~= '' then
        local y = r[3] + r[14]
        tags[nrules + r[11]] = now + r[5] + (y - y % r[6]) / r[6]
      end
    end
  end
end
