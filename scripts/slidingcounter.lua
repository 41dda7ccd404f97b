-- slidingcounter.lua: the counter approximation of the sliding log. The
-- estimate for the interval (now - period, now] is the previous aligned
-- window's count weighted by the part of it still inside that interval, plus
-- the current window's count; n events are admitted if estimate + n <= rate.
--
-- KEYS[1]  hash: w = index of the window that c counts (floor(µs / period)),
--          c = events admitted in window w, p = events admitted in window w-1.
-- ARGV     see common.lua; burst and max delay are ignored.
-- Reply    see common.lua.
--
-- Arithmetic is scaled by period so that it stays in integers:
--   estimate * period = p * (period - elapsed) + c * period
-- and the remaining allowance is rate - c - ceil(p * (period - elapsed) / period).
-- Denials write nothing. The key expires at the end of window w+1, after
-- which its counts no longer matter. If the server clock went backwards
-- (stored w ahead of the current window), the stored counts are kept as they
-- are, so a clock step never admits more.

local cw = math.floor(now / period)
local cur, prev, w = 0, 0, cw
local st = redis.call('HMGET', KEYS[1], 'w', 'c', 'p')
if st[1] then
  local sw = tonumber(st[1])
  if sw == cw then
    cur, prev = tonumber(st[2]), tonumber(st[3])
  elseif sw == cw - 1 then
    prev = tonumber(st[2])
  elseif sw > cw then
    cur, prev, w = tonumber(st[2]), tonumber(st[3]), sw
  end
end

local elapsed = now - w * period
if elapsed < 0 then elapsed = 0 end
local weighted = prev * (period - elapsed)
local remaining = rate - cur - ceil_div(weighted, period)

local function reset_after(c)
  if c > 0 then return (w + 2) * period - now end
  if prev > 0 then return (w + 1) * period - now end
  return 0
end

if n > remaining then
  local retry
  if cur + n <= rate then
    -- The previous window's weight falls far enough within this window.
    retry = period - floor_div((rate - cur - n) * period, prev) - elapsed
  else
    -- Wait for the next window, where this window's count is the weighted one.
    retry = (period - elapsed) + period - floor_div((rate - n) * period, cur)
  end
  if remaining < 0 then remaining = 0 end
  return deny(remaining, retry, reset_after(cur))
end

if n > 0 then
  redis.call('HSET', KEYS[1], 'w', w, 'c', cur + n, 'p', prev)
  redis.call('PEXPIRE', KEYS[1], ttl_ms((w + 2) * period - now))
end
return allow(remaining - n, reset_after(cur + n), 0)
