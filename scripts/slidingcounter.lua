-- slidingcounter.lua: the counter approximation of the sliding log. The
-- estimate for the interval (now - period, now] is the previous aligned
-- window's count weighted by the part of it still inside that interval, plus
-- the current window's count; n events are admitted if estimate + n <= rate.
--
-- State: a string. Two counts, c (events admitted in window w) and p (in
-- window w-1), and the window's last digit, packed into one integer
-- (p * 2^24 + c) * 10 + w % 10 when both counts are below 2^24 (so Redis
-- stores it as an integer: 88 bytes a key), else the text "c:p:w". The key
-- expires at the end of window w+1 (PX, set by the window's first write;
-- later admissions in the window add n * 10 with INCRBY, which keeps it). The digit tells how far the key's
-- window is behind now (or ahead, when the clock went back: then the counts
-- are kept as they are, so a clock step never admits more).
-- Burst is ignored. Tag (for a reservation): the window index.
--
-- Arithmetic is scaled by period so that it stays in integers:
--   estimate * period = p * (period - elapsed) + c * period
-- and the remaining allowance is rate - c - ceil(p * (period - elapsed) / period).

local PACK = 16777216 -- 2^24

S.sc = function(key, rate, period, burst)
  local cw = math.floor(now / period)
  local cur, prev, w = 0, 0, cw
  local packed = false -- the key holds window w's counts, packed
  local v = redis.call('GET', key)
  if v then
    local c, p, d
    local sep = string.find(v, ':', 1, true)
    if sep then
      local sep2 = string.find(v, ':', sep + 1, true)
      c = tonumber(string.sub(v, 1, sep - 1))
      p = tonumber(string.sub(v, sep + 1, sep2 - 1))
      d = cw - tonumber(string.sub(v, sep2 + 1))
      if d < -4 then d = -4 elseif d > 5 then d = 5 end
      d = d % 10
    else
      local x = tonumber(v)
      local pc = math.floor(x / 10)
      c, p, d = pc % PACK, math.floor(pc / PACK), (cw - x) % 10
    end
    if d == 0 then
      cur, prev = c, p
      packed = not sep
    elseif d == 1 then
      prev = c
    elseif d >= 6 then -- ahead: the clock went back
      cur, prev, w = c, p, cw + 10 - d
      packed = not sep
    end
  end

  local elapsed = now - w * period
  if elapsed < 0 then elapsed = 0 end
  local avail = rate - cur - ceil_div(prev * (period - elapsed), period)

  local function reset_after(c)
    if c > 0 then return (w + 2) * period - now end
    if prev > 0 then return (w + 1) * period - now end
    return 0
  end

  if n > avail then
    local retry
    if n > rate then
      retry = reset_after(cur)
    elseif cur + n <= rate then
      -- The previous window's weight falls far enough within this window.
      retry = period - floor_div((rate - cur - n) * period, prev) - elapsed
    else
      -- Wait for the next window, where this window's count is the weighted one.
      retry = (period - elapsed) + period - floor_div((rate - n) * period, cur)
    end
    return false, avail, retry, reset_after(cur), reset_after(cur)
  end
  if n > 0 then
    local c = cur + n
    local value
    if packed and c < PACK then
      -- The key is window w's already, with its expiry (the end of window
      -- w+1): adding n to the packed count is adding n * 10 to the integer,
      -- which INCRBY does for less than a SET with PX (and no number to
      -- format for n = 1).
      if n == 1 then
        write('INCRBY', key, '10')
      else
        write('INCRBY', key, n * 10)
      end
      return true, avail, 0, reset_after(cur), reset_after(c), w
    end
    if c < PACK and prev < PACK then
      -- string.format: cheaper for Redis 7.0 than a number argument ('%.17g').
      value = string.format('%d', (prev * PACK + c) * 10 + w % 10)
    else
      value = string.format('%d:%d:%d', c, prev, w)
    end
    write('SET', key, value, 'PX', ms((w + 2) * period - now))
  end
  return true, avail, 0, reset_after(cur), reset_after(cur + n), w
end
