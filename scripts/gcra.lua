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
-- Fractions: token counts are compared with a tolerance of 1e-6 token, so
-- that rounding of T (for example 1 s / 3) never turns an exact refill into
-- a missing token.

local function gcra(with_delay)
  local T = period / rate
  local tat = tonumber(redis.call('GET', KEYS[1]) or '0') / 4
  local base = tat
  if base < now then base = now end
  local avail = burst - (base - now) / T
  local delay = 0
  if with_delay then delay = base - now end

  if n > avail + 1e-6 then
    -- Computed in time units, which are exact when T is a whole number of µs.
    local retry = math.ceil((base - now) + (n - burst) * T - 1e-3)
    if (avail + retry / T) + 1e-6 < n then retry = retry + 1 end
    return deny(avail, retry, base - now)
  end
  if with_delay and max_delay >= 0 and delay > max_delay then
    return {0, math.floor(avail + 1e-6), math.ceil(delay - max_delay), math.ceil(base - now), 0, 3}
  end
  if n == 0 then
    return allow(avail + 1e-6, base - now, delay)
  end
  local new_tat = base + n * T
  redis.call('SET', KEYS[1], math.ceil(new_tat * 4), 'PX', ttl_ms(new_tat - now))
  return allow(avail - n + 1e-6, new_tat - now, delay)
end

