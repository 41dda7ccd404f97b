-- subwindow.lua: the sub-window counter. At most rate events in any
-- interval of length period, in memory bounded by the sub-windows.
--
-- The period is cut into s sub-windows (s comes in the rule's burst
-- argument), a grid aligned to the Unix epoch on the clock of now:
-- sub-window b covers [start(b), start(b + 1)), start(b) = b * period / s
-- rounded up to the µs. An event counts until its whole sub-window has
-- left the interval (now - period, now], as if it happened at the
-- sub-window's end: sub-window b counts while now < start(b + 1) + period
-- = start(b + s + 1), so at now, in sub-window cw, the sub-windows cw - s
-- .. cw count. n events are admitted if their counts plus n are at most
-- rate. (Counted from the sub-window's start instead, up to twice the rate
-- could pass in one period.)
--
-- State: a hash of
--   c    the events that count, total, * 4096 + nw % 4096, nw the newest
--        sub-window with events (an integer: HINCRBY c 4096 counts an
--        event in nw)
--   o    the oldest sub-window with events (nw when there is none older)
--   t    the events of the older sub-windows, o .. nw - 1 (absent: 0); nw
--        holds total - t
--   <b>  an older sub-window b with events: its count * 4096 + how far
--        after b the next one with events is (1 to s), so that the fields
--        link the sub-windows oldest to newest
-- A call in nw, the usual one, reads c only: nw is cw when their 12 bits
-- agree (else o tells nw: nw - o is at most s, MaxSubWindows, 1000). A
-- call in a new sub-window moves nw's count into its field; a call that
-- finds the oldest sub-window no longer counting drops it, and the next,
-- until one counts (whatever it decides: that changes no count that
-- counts). Each field is dropped once, so a decision is amortised O(1)
-- whatever s, and the hash holds at most s + 1 sub-windows and 3 fields
-- more. The key expires when nw stops counting. When the clock went back
-- (nw ahead of now's sub-window), events count in nw: a clock step never
-- admits more.
-- Exact integers: an index is below now / 1000 (a sub-window lasts 1 ms at
-- least), below 2^53; period * s, which is not for periods of years, is
-- never made, nor an absolute time past now: with b = q * s + j, start(b)
-- = q * period + j * lq + ceil(j * lr / s), lq = floor(period / s) and lr
-- = period % s (j * lr < s^2), and the time from now until it is taken
-- from now's own q and offset (at most 2 periods, 6.3e15 µs). total is at
-- most 2^40 (rate, or MaxRate after a settle's charge: more denies
-- nothing more), so c is below 2^52.
-- Retry after: until enough of the oldest counted sub-windows have stopped
-- counting (read from o on, along the links). Reset after: until nw stops
-- counting. Tag (for a reservation): the sub-window the events counted in.
-- Settling (settle.lua calls check_sw with the tag and the difference): a
-- refund goes back to the tag's sub-window while it counts, at most what
-- it holds; a charge counts now, even past the limit.

-- (4096: c and the fields keep an index, or a gap, in 12 bits. Written
-- as a number, not a local: see share in common.lua. Two functions, two
-- locals of the chunk: each function of a script is made anew on every
-- call, which costs Redis; and in a script with 16 rules written in, some
-- layouts of them made miniredis's Lua, gopher-lua 1.1.1, lose a value,
-- see n0 in scripts.go and TestBakedScriptMaxRules.)
-- sw_until returns the time from now (µs) until sub-window b starts,
-- from now's period qn and its offset r in it (no absolute time is
-- made: for a period of 100 years, now + 2 periods is past 2^53 in
-- 2055).
local function sw_until(b, period, s, lq, lr, qn, r)
  local j = b % s
  local t = ((b - j) / s - qn) * period + j * lq - r
  if lr > 0 then t = t + ceil_div(j * lr, s) end
  return t
end

local function check_sw(key, rate, period, s, tag, delta)
  -- cw, the sub-window of now.
  local lq = (period - period % s) / s
  local lr = period - lq * s
  local r = now % period
  local j
  if lr == 0 then
    j = (r - r % lq) / lq
  else
    -- The quotient in doubles is within one of j: corrected against
    -- the exact bounds.
    j = r * s / period
    j = j - j % 1
    if j * lq + ceil_div(j * lr, s) > r then
      j = j - 1
    elseif (j + 1) * lq + ceil_div((j + 1) * lr, s) <= r then
      j = j + 1
    end
  end
  local qn = (now - r) / period
  local cw = qn * s + j
  local lo = cw - s -- the oldest sub-window that counts

  -- The state: total, nw, and (unless nw is cw) t and o, with the
  -- sub-windows before lo dropped. live: a state counts; stale: a key
  -- is there all the same.
  local total, nw, t, o, live, stale, m = 0, cw, 0, cw, false, false, 0
  local x = rcall('HGET', key, 'c')
  if x then
    x = x + 0
    m = x % 4096
    total, live = (x - m) / 4096, true
    if (cw - m) % 4096 == 0 and not delta then
      t, o = nil, nil -- nw is cw: nothing left the window since it began
    else
      local h = rcall('HMGET', key, 't', 'o')
      if h[1] then t = h[1] + 0 end
      if h[2] then o = h[2] + 0 end
      nw = o + (m - o) % 4096
      if nw < lo then
        total, nw, t, o, live, stale = 0, cw, 0, cw, false, true
      elseif o < lo then
        local dropped = 0
        while o < lo do
          local f = string.format('%d', o)
          local v = rcall('HGET', key, f)
          local g = 1
          if v then
            v = v + 0
            g = v % 4096
            dropped = dropped + (v - g) / 4096
            rcall('HDEL', key, f)
            if g < 1 then g = 1 end
          end
          o = o + g
        end
        total, t = total - dropped, t - dropped
        if o >= nw then o, t = nw, 0 end
        rcall('HSET', key, 'c', string.format('%d', total * 4096 + m), 't', string.format('%d', t),
          'o', string.format('%d', o))
      end
    end
  end

  local k, avail, reset_now = n, 0, 0
  if delta then
    if delta < 0 then
      if not live or tag < lo or tag > nw or tag < o then return end
      k = -delta
      if tag == nw then
        if k > total - t then k = total - t end
        if k > 0 then rcall('HINCRBY', key, 'c', -k * 4096) end
        return
      end
      local f = string.format('%d', tag)
      local v = rcall('HGET', key, f)
      if not v then return end
      v = v + 0
      v = (v - v % 4096) / 4096
      if k > v then k = v end
      if k > 0 then
        rcall('HINCRBY', key, f, -k * 4096)
        rcall('HINCRBY', key, 't', -k)
        rcall('HINCRBY', key, 'c', -k * 4096)
      end
      return
    end
    k = delta
    if total + k > 1099511627776 then k = 1099511627776 - total end
    if k <= 0 then return end
  else
    avail = rate - total
    if total > 0 then reset_now = sw_until(nw + s + 1, period, s, lq, lr, qn, r) end
    if n > avail then
      local retry = reset_now
      if n <= rate then
        -- The oldest sub-windows that must stop counting for n to fit:
        -- the last of them is b (nw at most).
        if not o then
          o = rcall('HGET', key, 'o')
          if o then o = o + 0 else o = nw end
        end
        local need, b = total + n - rate, o
        while b < nw do
          local v = rcall('HGET', key, string.format('%d', b))
          local g = 1
          if v then
            v = v + 0
            g = v % 4096
            need = need - (v - g) / 4096
            if g < 1 then g = 1 end
          end
          if need <= 0 then break end
          b = b + g
        end
        if b > nw then b = nw end
        retry = sw_until(b + s + 1, period, s, lq, lr, qn, r)
      end
      return false, avail, retry, reset_now, reset_now
    end
    if n == 0 then return true, avail, 0, reset_now, reset_now end
  end

  -- Count k events: in nw when it is cw (or ahead of it), else in cw.
  if live and nw >= cw then
    if k == 1 then write('HINCRBY', key, 'c', '4096') else write('HINCRBY', key, 'c', k * 4096) end
    local left = reset_now -- (until nw stops counting, when something counts)
    if total == 0 then left = sw_until(nw + s + 1, period, s, lq, lr, qn, r) end
    return true, avail, 0, reset_now, left, nw
  end
  local v, w = string.format('%d', (total + k) * 4096 + cw % 4096), string.format('%d', cw)
  if stale then write('DEL', key) end
  if not live or total == t and o == nw then
    -- Nothing older (nw, if any, has nothing left): cw is the oldest too.
    if write_args then write_args({'HSET', key, 'c', v, 'o', w}) else rcall('HSET', key, 'c', v, 'o', w) end
  else
    -- nw's count moves to its field, linked to cw.
    local args = {'HSET', key, 'c', v, string.format('%d', nw), string.format('%d', (total - t) * 4096 + cw - nw),
      't', string.format('%d', total), 'o', string.format('%d', o)}
    if write_args then write_args(args) else rcall(unpack(args)) end
  end
  local left = sw_until(cw + s + 1, period, s, lq, lr, qn, r)
  write('PEXPIRE', key, string.format('%d', ms(left)))
  return true, avail, 0, reset_now, left, cw
end
