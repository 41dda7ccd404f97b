-- fixedwindow.lua: at most rate events in each window of period, windows
-- aligned to multiples of period since the Unix epoch (on the clock of now).
--
-- State: a string holding the integer count * 10 + (w % 10), w the window
-- index floor(now / period); it expires at the end of window w (PX, rounded
-- up to the ms). The last digit tells the key's window from a key left over
-- from the previous one (a key can outlive its window by up to 1 ms), and
-- from a window ahead of now (the clock went back: the count is kept until
-- its window ends, so a clock step never admits more: see fw_read).
-- INCRBY n * 10 adds to the count and keeps the digit and the expiry. An
-- integer value keeps the key at 88 bytes.
-- Retry after and reset after: until the window ends. Burst is ignored.
-- Tag (for a reservation): the window index.

-- fw_read returns the count of the current window cw, and the window it
-- belongs to (ahead of cw when the clock went back). The digit tells a key
-- 1 to 5 windows ahead; one 1 to 4 windows behind is a key left over from
-- the previous window (by up to 1 ms), or a key 6 to 9 windows ahead (or
-- 10 more, 20 more...), whose expiry is past now's window's end by more
-- than a ms: its PTTL tells them apart (asked only then, which is rare).
local function fw_read(key, cw, period)
  local v = rcall('GET', key)
  if v then
    local x = v + 0
    local d = (cw - x) % 10 -- how many windows the key is behind now
    if d == 0 then
      return (x - x % 10) / 10, cw
    elseif d >= 5 or rcall('PTTL', key) * 1000 > (cw + 1) * period - now + 1000 then -- ahead
      return (x - x % 10) / 10, cw + 10 - d
    end
  end
  return 0, cw
end

local function check_fw(key, rate, period, burst)
  local cw = (now - now % period) / period
  local count, w = fw_read(key, cw, period)
  local left = (w + 1) * period - now
  local avail = rate - count
  if n > avail then
    return false, avail, left, left, left
  end
  if n > 0 then
    -- A number argument costs Redis 7.0 a '%.17g' conversion; n = 1, the
    -- usual call, passes the string.
    if count > 0 then
      if n == 1 then
        write('INCRBY', key, '10')
      else
        write('INCRBY', key, n * 10)
      end
    else
      write('SET', key, n * 10 + w % 10, 'PX', ms(left))
    end
  end
  local reset_now, reset_next = 0, left
  if count > 0 then reset_now = left end
  if count + n == 0 then reset_next = 0 end
  return true, avail, 0, reset_now, reset_next, w
end
