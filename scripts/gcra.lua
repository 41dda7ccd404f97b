-- gcra.lua is prepended, after common.lua, to the token bucket and leaky
-- bucket scripts, which share this arithmetic (the generic cell rate
-- algorithm): one event is worth T = period / rate µs, and the state is the
-- theoretical arrival time (TAT), the instant at which the bucket is full
-- again (or the queue empty). At time now the bucket holds
--   burst - max(0, tat - now) / T
-- tokens, and n events are admitted if that is at least n.
--
-- KEYS[1]  string: the TAT in quarter microseconds since the epoch, an
--          integer (T need not be a whole number of µs; a double holding
--          today's µs timestamps has a precision of 0.25µs anyway, and an
--          integer value takes about 88 bytes in Redis where a fraction
--          takes 120). A missing key is a full bucket. It expires at the TAT.
--
-- Fractions: token counts are compared with a tolerance of 1e-3 token, so
-- that rounding of T (for example 1 s / 3) never turns an exact refill into
-- a missing token.

local function gcra(with_delay)
  local T = period / rate
  -- used: how far the TAT is ahead of now, in µs. Working with this offset,
  -- not the absolute TAT, keeps fractions of a µs that a double holding a
  -- µs timestamp (precision 0.25µs) would lose.
  local used = 0
  local v = redis.call('GET', KEYS[1])
  if v then
    used = tonumber(v) / 4 - now
    if used < 0 then used = 0 end
  end
  local avail = burst - used / T

  if n > avail + 1e-3 then
    -- Computed in time units, which are exact when T is a whole number of µs.
    local retry = math.ceil(used + (n - burst) * T - 1e-3)
    if (avail + retry / T) + 1e-3 < n then retry = retry + 1 end
    return deny(avail, retry, used)
  end
  local delay = 0
  if with_delay then
    delay = used
    local max_delay = tonumber(ARGV[5]) or -1
    if max_delay >= 0 and delay > max_delay then
      return {3, math.floor(avail + 1e-3), math.ceil(delay - max_delay), math.ceil(used)}
    end
  end
  if n == 0 then
    return {0, math.floor(avail + 1e-3), math.ceil(delay), math.ceil(used)}
  end
  -- The new TAT, rounded up to a quarter µs (the stored unit): an admission
  -- costs at most 0.25µs more than T, never less.
  local ahead = math.ceil((used + n * T) * 4)
  local ttl = math.ceil(ahead / 4000)
  if ttl < 1 then ttl = 1 end
  redis.call('SET', KEYS[1], now * 4 + ahead, 'PX', ttl)
  return {0, math.floor(avail - n + 1e-3), math.ceil(delay), math.ceil(ahead / 4)}
end
