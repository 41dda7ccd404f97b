-- slidingcounter.lua: the counter approximation of the sliding log. The
-- estimate for the interval (now - period, now] is the previous aligned
-- window's count weighted by the part of it still inside that interval, plus
-- the current window's count; n events are admitted if estimate + n <= rate.
--
-- KEYS[1]  string: two counts, c (events admitted in window w) and p (in
--          window w-1), packed into one integer p * 2^26 + c when both are
--          below 2^26 (so Redis stores it as an integer: about 88 bytes a
--          key), else the text "c:p". Window w = floor(µs / period) is not
--          stored: the key expires at the end of window w+1 (PXAT, rounded
--          up to the millisecond), so w = floor(expiry µs / period) - 2,
--          exact because period >= 1ms.
-- ARGV     see common.lua; burst and max delay are ignored.
-- Reply    see common.lua.
--
-- Arithmetic is scaled by period so that it stays in integers:
--   estimate * period = p * (period - elapsed) + c * period
-- and the remaining allowance is rate - c - ceil(p * (period - elapsed) / period).
-- Denials write nothing. If the server clock went backwards (w ahead of the
-- current window), the stored counts are kept as they are, so a clock step
-- never admits more.

local PACK = 67108864 -- 2^26

-- floor_div and ceil_div divide integers exactly (as long as they are below
-- 2^53), correcting the rounding of the floating-point quotient.
local function floor_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function ceil_div(a, b)
  return -floor_div(-a, b)
end

local cw = math.floor(now / period)
local cur, prev, w = 0, 0, cw
local v = redis.call('GET', KEYS[1])
if v then
  local c, p
  local sep = string.find(v, ':', 1, true)
  if sep then
    c, p = tonumber(string.sub(v, 1, sep - 1)), tonumber(string.sub(v, sep + 1))
  else
    local x = tonumber(v)
    c, p = x % PACK, math.floor(x / PACK)
  end
  local sw = cw
  local exp = redis.call('PEXPIRETIME', KEYS[1])
  if exp > 0 then sw = math.floor(exp * 1000 / period) - 2 end
  if sw == cw then
    cur, prev = c, p
  elseif sw == cw - 1 then
    prev = c
  elseif sw > cw then
    cur, prev, w = c, p, sw
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
  local c = cur + n
  local value
  if c < PACK and prev < PACK then
    value = prev * PACK + c
  else
    value = string.format('%d:%d', c, prev)
  end
  redis.call('SET', KEYS[1], value, 'PXAT', math.ceil((w + 2) * period / 1000))
end
return {0, remaining - n, 0, reset_after(cur + n)}
