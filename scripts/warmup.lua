-- warmup.lua: a token or leaky bucket with a warm-up (Limit.WarmUp): Guava's
-- SmoothWarmingUp with cold factor 3, per key, on the decision's clock.
--
-- Guava's limiter keeps stored permits (capacity saved while the key is
-- under-used) and the time the next call is free. With s = period / rate,
-- the stable interval, and W the warm-up: the threshold is T = W / (2s)
-- permits, the most stored M = 2T (= rate * W / period); a stored permit
-- above T costs time along a line from s at T to 3s at M, one below T costs
-- s, and a fresh one (none stored) s. Stored permits come back at one per s
-- while the next call is free (M / W per unit of time), up to M; a new key
-- (or one whose key expired: back at M) is cold. A call is admitted when
-- the next free time has come (the token bucket: Guava's tryAcquire(n, 0)),
-- and moves it on by the cost of its n permits ("pay forward"); the leaky
-- bucket's Delay is the wait until it (Guava's reserve(n)), and, as the
-- plain leaky bucket's, it is admitted when its Delay and n stable
-- intervals fit in burst stable intervals.
--
-- Exact integers: time and permits are counted in one unit, 1 / (2 rate)
-- µs, so that a fresh or below-threshold permit costs 2 * period units
-- (s) and every µs brings back 2 * rate units of stored permits. Then
--   X   stored permits, times 2 * period (the threshold is W * rate, M
--       twice that; W in µs)
--   F   how far the next free time is ahead of the state's time, in units
-- are integers below 2^53 (newRule bounds W * rate and burst * period), and
-- only a permit taken above the threshold costs a fraction, rounded up to
-- the unit: steady use at the stable rate is exact (no drift, ever).
--
-- The rule's code is 'wt' or 'wl' followed by W in µs (its own argument
-- slot: the rule keeps four arguments). The check functions are found by
-- that code through check_by_code's fallback (see strategyTable in
-- scripts.go) or, with the rules written in, by name.
--
-- State: a string "<X>:<F>:<t>:<rate>", t the state's time in µs and rate
-- the writer's (F is in its units: a call at another rate converts it,
-- rounding up, and scales X by its rate over the writer's, see
-- warm_read). The key expires when the bucket is cold again (F paid and
-- X back at M): absent means cold.
--
-- Retry after: until the next free time (the leaky bucket: until the call
-- fits its queue). Reset after: until cold again. Tag (for a reservation):
-- when the time its events cost ends, in µs (see settle.lua's adjust_warm).

-- warm_read returns X at now (capped at mx), F from now (units of this
-- rate) and the state's lag: how far its time is ahead of now (see
-- bucket_read: a client clock behind another's), folded into F.
local function warm_read(key, rate, mx)
  local v = rcall('GET', key)
  if not v then return mx, 0 end
  local a = string.find(v, ':', 1, true)
  local b = string.find(v, ':', a + 1, true)
  local c = string.find(v, ':', b + 1, true)
  local x = string.sub(v, 1, a - 1) + 0
  local f = string.sub(v, a + 1, b - 1) + 0
  local elapsed = now - string.sub(v, b + 1, c - 1)
  local wrate = string.sub(v, c + 1) + 0
  if wrate ~= rate then
    -- Another rate wrote it (WithLimitFunc): F is converted to this
    -- rate's units, and X scaled by the new most over the old (this rate
    -- over the writer's, the warm-up being the same), as Guava's setRate
    -- does, so that the key is as cold as it was: kept as it is, a cold
    -- key's X is below the threshold of a raised rate, and counted warm.
    -- Both rounded up: no time, no warmth given.
    f = ceil_div(f * rate, wrate)
    x = ceil_div(x * rate, wrate)
  end
  if x > mx then x = mx end
  if elapsed < 0 then -- the state is ahead: no refill
    if skew then
      if elapsed < -100000 then skew = 64 end
    elseif elapsed <= -1000000 then
      return x, f -- the server's clock stepped back: written as of now
    end
    return x, f - elapsed * 2 * rate
  end
  local d = elapsed * 2 * rate
  if d <= f then return x, f - d end
  x = x + (d - f)
  if x > mx then x = mx end
  return x, 0
end

-- warm_cost returns the cost, in units, of taking k (in X's units) from x
-- stored, with threshold tx: fresh permits and those below the threshold
-- one unit each, those above it the area under the line (rounded up).
local function warm_cost(x, k, tx)
  local sp = k
  if sp > x then sp = x end
  local cost = k
  if x > tx then
    local lo = x - sp
    if lo < tx then lo = tx end
    local a = x - lo
    -- a * (s + the mean interval's excess over s): the mean is at
    -- (x + lo) / 2, whose interval is s * (x + lo - tx) / tx.
    local v = a * (x + lo - tx) / tx
    cost = cost - a + v + (-v) % 1
  end
  return cost
end

-- check_wt is the check function of both (see common.lua): a code whose
-- second letter is 'l' is the leaky bucket.
local function check_wt(key, rate, period, burst, code)
  local tx = string.sub(code, 3) * rate -- W µs * rate: the threshold
  local mx, p2, r2 = 2 * tx, 2 * period, 2 * rate
  local x, f = warm_read(key, rate, mx)
  local reset_now = ceil_div(f + mx - x, r2)
  local wait = 0
  if f > 0 then wait = ceil_div(f, r2) end
  local avail
  if string.byte(code, 2) == 108 then -- 'l'
    local room = burst * p2 - f
    avail = floor_div(room, p2)
    local over = n * p2 - room
    if over > 0 then
      return false, avail, ceil_div(over, r2), reset_now, reset_now
    end
    if max_delay >= 0 and wait > max_delay then
      return false, avail, wait - max_delay, reset_now, reset_now, 0, 3
    end
  else
    if f > 0 then
      if n == 0 then return true, 0, 0, reset_now, reset_now end
      return false, 0, wait, reset_now, reset_now
    end
    avail, wait = burst, 0
    if n > 0 then avail = n end -- the next call waits for what this one costs
  end
  if n == 0 then
    return true, avail, wait, reset_now, reset_now
  end
  local k = n * p2
  f = f + warm_cost(x, k, tx)
  if k > x then x = 0 else x = x - k end
  local life = ceil_div(f + mx - x, r2)
  write('SET', key, string.format('%d:%d:%d:%d', x, f, now, rate), 'PX', ms(life))
  if rid == '' then return true, avail, wait, reset_now, life end
  -- A reservation's tag: when the time its events cost ends (µs, rounded
  -- up), until which settle.lua can give that time back.
  return true, avail, wait, reset_now, life, now + ceil_div(f, r2)
end

local check_wl = check_wt
