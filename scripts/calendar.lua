-- calendar.lua: a calendar quota (redlimit.Daily, Weekly, Monthly): at
-- most rate events in each window of a calendar in a time zone. The zone's
-- rules live in Go (calendar.go): the caller sends the window that holds
-- its estimate of now, and the check counts in it only if now (the same
-- clock as every decision's) is inside it.
--
-- Arguments, in an ordinary rule's slots (see common.lua): code 'cw', rate,
-- then start + d and end, in µs: the window [start, end), start a whole
-- second (its last µs digit is free), d the last digit of the window's
-- index, which grows by one from each window to the next.
-- A now outside [start, end) (a boundary passed between the caller's
-- estimate and the call) is an error before any write: the message holds
-- 'redlimit-window-miss ' and now in µs, and the caller sends the window
-- of that now (rare: only within a clock offset or a round trip of a
-- boundary).
--
-- State: as the fixed window's (fixedwindow.lua), a string holding count *
-- 10 + d, expiring at the window's end (PX, rounded up to the ms): the digit
-- tells a key left over from the previous window (it can outlive it by up
-- to 1 ms) from the current one; a key of a window ahead (the clock went
-- back) keeps counting, so a clock step never admits more (see cw_read).
-- Retry after and reset after: until the window ends. Burst is unused.
-- Tag (for a reservation): the window's start.

-- cw_window reads a calendar rule's arguments: the window's start, end and
-- digit; it raises the miss when now is outside the window.
local function cw_window(sd, stop)
  local d = sd % 10
  local start = sd - d
  if now < start or now >= stop then
    error(string.format('redlimit-window-miss %d', now), 0)
  end
  return start, stop, d
end

-- cw_read returns the count of the window whose digit is d, which ends at
-- stop: the key's, or one ahead's (the clock went back), whose digit tells
-- it 1 to 5 windows ahead, and its PTTL 6 to 9 (or 10 more...), as
-- fixedwindow.lua's fw_read tells it.
local function cw_read(key, d, stop)
  local v = rcall('GET', key)
  if v then
    local x = v + 0
    local behind = (d - x) % 10 -- windows the key is behind now
    if behind == 0 or behind >= 5 or rcall('PTTL', key) * 1000 > stop - now + 1000 then
      return (x - x % 10) / 10
    end
  end
  return 0
end

local function check_cw(key, rate, sd, stop)
  local start, stop, d = cw_window(sd, stop)
  local count = cw_read(key, d, stop)
  local left = stop - now
  local avail = rate - count
  if n > avail then
    return false, avail, left, left, left
  end
  if n > 0 then
    if count > 0 then
      write('INCRBY', key, n * 10)
    else
      write('SET', key, n * 10 + d, 'PX', ms(left))
    end
  end
  local reset_now, reset_next = 0, left
  if count > 0 then reset_now = left end
  if count + n == 0 then reset_next = 0 end
  return true, avail, 0, reset_now, reset_next, start
end

-- adjust_cw settles a reservation (settle.lua) by delta events: it gives
-- back only while the reservation's window (tag, its start) is the current
-- one, and charges more into the current window.
local function adjust_cw(key, sd, stop, tag, delta)
  local start, stop, d = cw_window(sd, stop)
  local count = cw_read(key, d, stop)
  if delta < 0 then
    if tag == start and count > 0 then
      rcall('DECRBY', key, math.min(-delta, count) * 10)
    end
  elseif count > 0 then
    rcall('INCRBY', key, delta * 10)
  else
    rcall('SET', key, delta * 10 + d, 'PX', ms(stop - now))
  end
end
