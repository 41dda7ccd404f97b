-- fixedwindow.lua: at most rate events in each window of period, windows
-- aligned to multiples of period since the Unix epoch (Redis server time).
--
-- KEYS[1]  string: the number of events admitted in the current window. It
--          expires at the end of that window (PXAT, rounded up to the
--          millisecond), so an existing key whose expiry is the current
--          window's end holds the current count.
-- ARGV     see common.lua; burst and max delay are ignored.
-- Reply    see common.lua. Retry after and reset after: until the window ends.
--
-- Denials write nothing. A key left over from the previous window (it can
-- live up to 2 ms past its window's end, since expiry is in whole ms) is
-- recognised by its expiry time and counted as 0. If the server clock went
-- backwards, the key expires later than the current window: its count is
-- kept until then, so a clock step never admits more.

local window_end = now - (now % period) + period
local end_ms = math.ceil(window_end / 1000)

local count = 0
local v = redis.call('GET', KEYS[1])
if v then
  local exp = redis.call('PEXPIRETIME', KEYS[1])
  if exp >= end_ms then
    count = tonumber(v)
    if exp > end_ms then -- the clock went back: the count lasts until its expiry
      end_ms = exp
      window_end = exp * 1000
    end
  end
end

local remaining = rate - count
if n > remaining then
  return deny(remaining, window_end - now, window_end - now)
end

if n > 0 then
  if count > 0 then
    redis.call('INCRBY', KEYS[1], n) -- keeps the expiry
  else
    redis.call('SET', KEYS[1], n, 'PXAT', end_ms)
  end
end

local reset = 0
if count + n > 0 then reset = math.ceil(window_end - now) end
return {0, remaining - n, 0, reset}
