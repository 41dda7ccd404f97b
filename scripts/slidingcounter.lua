-- slidingcounter.lua: the counter approximation of the sliding log. The
-- estimate for the interval (now - period, now] is the previous aligned
-- window's count weighted by the part of it still inside that interval, plus
-- the current window's count; n events are admitted if estimate + n <= rate.
--
-- State: a string. Two counts, c (events admitted in window w) and p (in
-- window w-1), and the window's last digit, packed into one integer
-- (p * 2^24 + c) * 10 + w % 10 when both counts are below 2^24 (so Redis
-- stores it as an integer: 88 bytes a key), else the text "c:p:w". The key
-- expires at the end of window w+1 (PX). The digit tells how far the key's
-- window is behind now (or ahead, when the clock went back: then the counts
-- are kept as they are, so a clock step never admits more, but 9 windows
-- back (or 19...) when packed: see sc_read and docs/clock.md).
-- Burst is ignored. Tag (for a reservation): the window index.
--
-- Arithmetic is scaled by period so that it stays in integers:
--   estimate * period = p * (period - elapsed) + c * period
-- and the remaining allowance is rate - c - ceil(p * (period - elapsed) / period).

local PACK = 16777216 -- 2^24

-- sc_read returns the current window cw's counts: cur, prev, the window w
-- they belong to (w > cw when the clock went back), and whether the stored
-- value is window cw's, packed (so that INCRBY n * 10 adds n to cur).
local function sc_read(key, cw, period)
  local cur, prev, w, inplace = 0, 0, cw, false
  local v = rcall('GET', key)
  if v then
    local c, p, d
    local sep = string.find(v, ':', 1, true)
    if sep then
      local sep2 = string.find(v, ':', sep + 1, true)
      c = string.sub(v, 1, sep - 1) + 0
      p = string.sub(v, sep + 1, sep2 - 1) + 0
      d = cw - string.sub(v, sep2 + 1)
      if d < -4 then d = -4 elseif d > 5 then d = 5 end
      d = d % 10
    else
      local x = v + 0
      local pc = (x - x % 10) / 10
      c = pc % PACK
      p, d = (pc - c) / PACK, (cw - x) % 10
      inplace = d == 0
    end
    if d == 0 then
      cur, prev = c, p
    elseif d == 1 then
      prev = c
    elseif d >= 6 or rcall('PTTL', key) * 1000 > (cw + 1) * period - now + 1000 then
      -- ahead: the clock went back (2 to 5 windows behind is a key left
      -- over, by up to 1 ms, or one 5 to 8 windows ahead, or 10 more...:
      -- its PTTL tells them apart; asked only then, which is rare)
      cur, prev, w = c, p, cw + 10 - d
    end
  end
  return cur, prev, w, inplace
end

-- sc_value encodes the counts of window w (string.format: cheaper for
-- Redis 7.0 than a number argument, which it converts with '%.17g').
local function sc_value(cur, prev, w)
  if cur < PACK and prev < PACK then
    return string.format('%d', (prev * PACK + cur) * 10 + w % 10)
  end
  return string.format('%d:%d:%d', cur, prev, w)
end

-- sc_reset_after returns the time until the counts of window w, c in it
-- and prev in the one before, have left the sliding interval. (Not a
-- closure in check_sc: making one per call costs Redis more than passing these.)
local function sc_reset_after(c, prev, w, period)
  if c > 0 then return (w + 2) * period - now end
  if prev > 0 then return (w + 1) * period - now end
  return 0
end

local function check_sc(key, rate, period, burst)
  local cw = (now - now % period) / period
  local cur, prev, w, inplace = sc_read(key, cw, period)

  local elapsed = now - w * period
  if elapsed < 0 then elapsed = 0 end
  local avail = rate - cur - ceil_div(prev * (period - elapsed), period)

  if n > avail then
    local retry
    if n > rate then
      retry = sc_reset_after(cur, prev, w, period)
    elseif cur + n <= rate then
      -- The previous window's weight falls far enough within this window.
      retry = period - floor_div((rate - cur - n) * period, prev) - elapsed
    else
      -- Wait for the next window, where this window's count is the weighted one.
      retry = (period - elapsed) + period - floor_div((rate - n) * period, cur)
    end
    local reset = sc_reset_after(cur, prev, w, period)
    return false, avail, retry, reset, reset
  end
  if n > 0 then
    if inplace and cur + n < PACK then
      -- The key is window w's already, with its expiry (the end of window
      -- w+1): adding n to the packed count is adding n * 10 to the
      -- integer, which INCRBY does for less than a SET with PX.
      if n == 1 then
        write('INCRBY', key, '10')
      else
        write('INCRBY', key, n * 10)
      end
    else
      write('SET', key, sc_value(cur + n, prev, w), 'PX', ms((w + 2) * period - now))
    end
  end
  return true, avail, 0, sc_reset_after(cur, prev, w, period), sc_reset_after(cur + n, prev, w, period), w
end
