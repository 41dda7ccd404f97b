-- gcra.lua is prepended, after common.lua, to the token bucket and leaky
-- bucket scripts, which share this arithmetic (the generic cell rate
-- algorithm): one event is worth T = period / rate µs, and the state is the
-- theoretical arrival time (TAT), the instant at which the bucket is full
-- again (or the queue empty). At time now the bucket holds
--   burst - max(0, tat - now) / T
-- tokens, and n events are admitted if that is at least n.
--
-- KEYS[1]  string: the TAT in quarter microseconds since 2025-01-01 (an
--          integer: T need not be a whole number of µs, and an integer value
--          takes about 88 bytes in Redis where a fraction takes 120; counting
--          from 2025 keeps it exact below 2^53 until 2096). A missing key is
--          a full bucket. It expires at the TAT.
--
-- Rounding: each admission moves the TAT by n*T rounded up to a quarter µs
-- (never less than T: at most 2.5% fewer admissions at the finest interval
-- allowed, T = 10µs, 0.025% at 1ms). When T is not a whole number of
-- quarter µs, comparisons allow a tolerance of
-- min(T/1000, burst/4 + 1) µs, enough to absorb that rounding over a burst
-- (so that, for example, 3 events at T = 1s/3 fit in a bucket of 3) and
-- never more than a thousandth of an event. RetryAfter is computed with the
-- same tolerance, so a call at RetryAfter is allowed and one a µs earlier is
-- not.

local EPOCH = 1735689600000000 -- 2025-01-01T00:00:00Z in µs

local function gcra(with_delay)
  local T = period / rate
  local tol = 0
  if (T * 4) % 1 ~= 0 then tol = math.min(T / 1000, burst / 4 + 1) end
  -- used: how far the TAT is ahead of now, in µs. Working with this offset,
  -- not the absolute TAT, keeps fractions of a µs.
  local now4 = (now - EPOCH) * 4
  local used = 0
  local v = redis.call('GET', KEYS[1])
  if v then
    used = (tonumber(v) - now4) / 4
    if used < 0 then used = 0 end
  end
  -- over: how much later than now the n events could start, in µs.
  local over = used + (n - burst) * T
  local avail = math.floor((burst * T - used + tol) / T)

  if over > tol then
    return deny(avail, math.ceil(over - tol), used)
  end
  if avail < 0 then avail = 0 end
  local delay = 0
  if with_delay then
    delay = used
    local max_delay = tonumber(ARGV[5]) or -1
    if max_delay >= 0 and delay > max_delay then
      return {3, avail, math.ceil(delay - max_delay), math.ceil(used)}
    end
  end
  if n == 0 then
    return {0, avail, math.ceil(delay), math.ceil(used)}
  end
  local ahead = math.ceil((used + n * T) * 4)
  local ttl = math.ceil(ahead / 4000)
  if ttl < 1 then ttl = 1 end
  redis.call('SET', KEYS[1], now4 + ahead, 'PX', ttl)
  return {0, math.max(avail - n, 0), math.ceil(delay), math.ceil(ahead / 4)}
end
