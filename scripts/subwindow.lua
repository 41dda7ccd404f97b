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
--   c    the newest sub-window nw's count * 4096 + nw % 4096 (an integer:
--        HINCRBY c 4096 counts an event in it)
--   o    the oldest sub-window with events o (nw when there is none
--        older); nw is o plus (nw - o) % 4096, as nw - o is at most s
--        (MaxSubWindows, 1000): then nw is known whatever the clock says
--   t    the counts of the older sub-windows (absent: 0)
--   <b>  an older sub-window b with events: its count * 4096 + how far
--        after b the next one with events is (1 to s), so that the fields
--        link the sub-windows oldest to newest
-- The events that count are t plus c's count. A call in a new sub-window
-- moves the newest's count into its field; a call that finds the oldest
-- sub-window no longer counting drops it, and the next, until one counts
-- (whatever it decides: that changes no count that counts). Each field is
-- dropped once, so a decision is amortised O(1) whatever s, and the hash
-- holds at most s + 1 sub-windows and 3 fields more. The key expires when
-- nw stops counting. When the clock went back (nw ahead of now's
-- sub-window), events count in nw: a clock step never admits more.
-- Exact integers: an index is below now / 1000 (a sub-window lasts 1 ms at
-- least), below 2^53; period * s, which is not for periods of years, is
-- never made, nor an absolute time past now: with b = q * s + j, start(b)
-- = q * period + j * lq + ceil(j * lr / s), lq = floor(period / s) and lr
-- = period % s (j * lr < s^2), and the time from now until it is taken
-- from now's own q and offset (at most 2 periods, 6.3e15 µs). A count is
-- at most 2^40 (rate, or MaxRate after a settle's charge), so c is below
-- 2^52.
-- Retry after: until enough of the oldest counted sub-windows have stopped
-- counting (read from o on, along the links). Reset after: until nw stops
-- counting. Tag (for a reservation): the sub-window the events counted in.

-- (4096: c and the fields keep an index, or a gap, in 12 bits. Written
-- as a number, not a local: see share in common.lua.)
-- The helpers are locals of a block, so that the chunk has two locals
-- more only: one more in a script with 16 rules written in made
-- miniredis's Lua (gopher-lua 1.1.1) lose another's value (see n0 in
-- scripts.go).
local check_sw, sw_settle
do

  -- sw_until returns the time from now (µs) until sub-window b starts, from
  -- now's period qn and its offset r in it (no absolute time is made: for a
  -- period of 100 years, now + 2 periods is past 2^53 in 2055).
  local function sw_until(b, period, s, lq, lr, qn, r)
    local j = b % s
    local t = ((b - j) / s - qn) * period + j * lq - r
    if lr > 0 then t = t + ceil_div(j * lr, s) end
    return t
  end

  -- sw_now returns cw, the sub-window of now, lq and lr (see above), and
  -- now's period qn and its offset r in it.
  local function sw_now(period, s)
    local lq = (period - period % s) / s
    local lr = period - lq * s
    local r = now % period
    local j
    if lr == 0 then
      j = (r - r % lq) / lq
    else
      -- The quotient in doubles is within one of j: corrected against the
      -- exact bounds.
      j = r * s / period
      j = j - j % 1
      if j * lq + ceil_div(j * lr, s) > r then
        j = j - 1
      elseif (j + 1) * lq + ceil_div((j + 1) * lr, s) <= r then
        j = j + 1
      end
    end
    local qn = (now - r) / period
    return qn * s + j, lq, lr, qn, r
  end

  -- sw_read returns the state at cw: the newest sub-window's count cnt, nw,
  -- the older count t, the oldest sub-window with events o, and whether a
  -- state counts (live; when false, stale says a key is there all the
  -- same). Sub-windows before lo, which no longer count, are dropped.
  local function sw_read(key, cw, lo)
    local h = rcall('HMGET', key, 'c', 't', 'o')
    if not h[1] or not h[3] then return 0, cw, 0, cw, false, h[1] or h[2] or h[3] end
    local x, o = h[1] + 0, h[3] + 0
    local m = x % 4096
    local nw = o + (m - o) % 4096
    if nw < lo then return 0, cw, 0, cw, false, true end
    local t = 0
    if h[2] then t = h[2] + 0 end
    if o < lo then
      while o < lo do
        local f = string.format('%d', o)
        local v = rcall('HGET', key, f)
        local g = 1
        if v then
          v = v + 0
          g = v % 4096
          t = t - (v - g) / 4096
          rcall('HDEL', key, f)
          if g < 1 then g = 1 end
        end
        o = o + g
      end
      if o >= nw then t, o = 0, nw end
      rcall('HSET', key, 't', string.format('%d', t), 'o', string.format('%d', o))
    end
    return (x - m) / 4096, nw, t, o, true, false
  end

  -- sw_add counts k events at cw (in nw, when the state's newest sub-window
  -- is cw or ahead of it) with write, and returns the sub-window they count
  -- in and the time until it stops counting.
  local function sw_add(key, k, period, s, lq, lr, qn, r, cw, cnt, nw, t, o, live, stale)
    if live and nw >= cw then
      if k == 1 then write('HINCRBY', key, 'c', '4096') else write('HINCRBY', key, 'c', k * 4096) end
      return nw, sw_until(nw + s + 1, period, s, lq, lr, qn, r)
    end
    local v, w = string.format('%d', k * 4096 + cw % 4096), string.format('%d', cw)
    if stale then write('DEL', key) end
    if not live or cnt == 0 and o == nw then
      -- Nothing older (nw, if any, had nothing left): cw is the oldest too.
      if write_args then write_args({'HSET', key, 'c', v, 'o', w}) else rcall('HSET', key, 'c', v, 'o', w) end
    else
      -- The newest moves to its field, linked to cw.
      local args = {'HSET', key, 'c', v, string.format('%d', nw), string.format('%d', cnt * 4096 + cw - nw),
        't', string.format('%d', t + cnt), 'o', string.format('%d', o)}
      if write_args then write_args(args) else rcall(unpack(args)) end
    end
    local left = sw_until(cw + s + 1, period, s, lq, lr, qn, r)
    write('PEXPIRE', key, ms(left))
    return cw, left
  end

  check_sw = function(key, rate, period, s)
    local cw, lq, lr, qn, r = sw_now(period, s)
    local cnt, nw, t, o, live, stale = sw_read(key, cw, cw - s)
    local total = t + cnt
    local avail = rate - total
    local reset_now = 0
    if total > 0 then reset_now = sw_until(nw + s + 1, period, s, lq, lr, qn, r) end
    if n > avail then
      local retry = reset_now
      if n <= rate then
        -- The oldest sub-windows that must stop counting for n to fit: the
        -- last of them is b.
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
    if n > 0 then
      local tag, left = sw_add(key, n, period, s, lq, lr, qn, r, cw, cnt, nw, t, o, live, stale)
      return true, avail, 0, reset_now, left, tag
    end
    return true, avail, 0, reset_now, reset_now
  end

  -- sw_settle settles delta events of a reservation counted in sub-window
  -- tag (see settle.lua): a refund gives back to tag, while it counts, at
  -- most what it holds; a charge counts now, even past the limit (a
  -- sub-window holds at most MaxRate, 2^40: more denies nothing more).
  sw_settle = function(key, period, s, tag, delta)
    local cw, lq, lr, qn, r = sw_now(period, s)
    local cnt, nw, t, o, live, stale = sw_read(key, cw, cw - s)
    if delta > 0 then
      if live and nw >= cw then
        if cnt + delta > 1099511627776 then delta = 1099511627776 - cnt end
        if delta <= 0 then return end
      end
      sw_add(key, delta, period, s, lq, lr, qn, r, cw, cnt, nw, t, o, live, stale)
      return
    end
    if not live or tag < cw - s or tag > nw or tag < o then return end
    if tag == nw then
      local k = math.min(-delta, cnt)
      if k > 0 then rcall('HINCRBY', key, 'c', -k * 4096) end
      return
    end
    local f = string.format('%d', tag)
    local v = rcall('HGET', key, f)
    if not v then return end
    v = v + 0
    local k = math.min(-delta, (v - v % 4096) / 4096)
    if k > 0 then
      rcall('HINCRBY', key, f, -k * 4096)
      rcall('HINCRBY', key, 't', -k)
    end
  end
end
