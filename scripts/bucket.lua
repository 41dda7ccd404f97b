-- bucket.lua: the token bucket and the leaky bucket, which share one state.
--
-- The bucket holds burst tokens and refills continuously at rate tokens per
-- period; each event takes a token. The state counts what is used, in exact
-- integers: D = tokens used * period (µs), so that one event adds period and
-- every µs that passes takes away rate. At now, D = max(0, D0 - (now - t0)
-- * rate), and n events fit if D + n * period <= burst * period. Refill is
-- never rounded (no event is free, none is lost) while burst * period stays
-- below 2^53: for example a burst of 9e9 bytes at a Period of 1s.
-- Because D counts tokens, not time, limiters that differ only in rate or
-- burst share the state with its meaning kept: a user who has used 10
-- tokens has used 10 under the new limit too.
--
-- State: a string, one of (MEMORY USAGE: 88 bytes, or 136 for the text form)
--   "<M><E><T>"  an integer (so the key takes 88 bytes): D rounded UP to
--        M * 10^E, M below 10^8 and E one digit, and T the time of the
--        write in ms, modulo 10^9, as 9 digits. Used while the key lives at
--        most 5e8 ms (5.8 days), so that now - t is known from T. D is kept
--        as of the start of the ms (the refill since then is added back, in
--        exact integers), and rounding it up can only charge a hundred-
--        millionth of D more than was used: never an event for free.
--   "<D>:<t>"    otherwise: D exact and t the write time in µs.
-- The key expires when the bucket is full again at the writer's rate, and
-- lives at least one period after the state's time. A call at a lower rate
-- (same key: same period) that finds a state it needs longer than that,
-- and writes none (a look, a denial, or a rule of a policy whose write
-- another rule may undo), makes the key live until the bucket is full at
-- its own rate (check_tb), so that a lowered rate keeps what was used.
--
-- The token bucket replies delay 0. The leaky bucket is a queue draining one
-- event every period / rate: an admitted event waits D / rate µs (the queue
-- ahead of it); the queue holds burst events. With a max delay (ARGV[4]) a
-- slot it would have to wait for longer is refused (code 3) without taking
-- it. Retry after: until n tokens are there. Reset after: until full.
-- Tag (for a reservation): when the refill would have paid back what was
-- used before the reservation (now + D / rate, in µs).

-- T is kept modulo 1e9 ms, written as a number below (no local for it: see
-- bucket_read's note on locals).

-- bucket_read returns D, what is used, at now, 0, and D as stored (as of
-- the state's time, or the start of its ms); or, when now is before the
-- state's time (a client clock behind another instance's, see
-- WithClientClock, or a clock that went back a little), D as of the
-- state's time, with no refill, how far that is ahead of now (µs), and D.
-- The caller then writes as of the state's time too (bucket_write's lag):
-- written as of now, the next call at the later time would be given the
-- refill between the two again, and two instances apart, taking turns,
-- would never drain the bucket. With a client clock (skew not false), the
-- state's time never goes back, however far ahead it is: the refill
-- between two clocks is given once, to the one ahead, and the clock behind
-- gets none until it is measured again (a reply's code has 64 added when
-- it is behind by more than 100 ms) or gets there. With the server's TIME,
-- one clock, a state more than a second ahead is the clock stepped back:
-- it is read with no refill and written as of now, so that the key is not
-- frozen until the clock catches up (the refill of the step is then given
-- once, at most a full bucket). (The numbers are written as numbers: one
-- more local in the script's chunk made miniredis's Lua, gopher-lua 1.1.1,
-- lose another's value in a script with 16 rules written in, as scripts.go
-- says of n0.)
local function bucket_read(key, rate)
  local v = rcall('GET', key)
  if not v then return 0, 0, 0 end
  local d0, elapsed
  local sep = string.find(v, ':', 1, true)
  if sep then
    d0 = string.sub(v, 1, sep - 1) + 0
    elapsed = now - string.sub(v, sep + 1)
  else
    local len = #v
    local me = string.sub(v, 1, len - 9) + 0 -- M * 10 + E, below 1e9
    local e = me % 10
    d0 = (me - e) / 10 * 10 ^ e
    -- tonumber: T is zero-padded, which miniredis's Lua (gopher-lua)
    -- reads as octal in arithmetic on a string.
    local t_ms = tonumber(string.sub(v, len - 8))
    local d = ((now - now % 1000) / 1000 - t_ms) % 1000000000
    if d > 500000000 then d = d - 1000000000 end -- the clock went back
    elapsed = d * 1000 + now % 1000
  end
  if elapsed < 0 then -- the state is ahead: no refill
    if skew then
      if elapsed < -100000 then skew = 64 end
    elseif elapsed <= -1000000 then
      return d0, 0, d0
    end
    return d0, -elapsed, d0
  end
  local used = d0 - elapsed * rate
  if used < 0 then used = 0 end
  return used, 0, d0
end

-- bucket_write returns the value that stores D = used (> 0) at now + lag
-- (see bucket_read), its lifetime in ms (for PX) and the time until the
-- bucket is full again, from now.
-- pxs, where the rule is written in, is the PX of one period as a string:
-- the usual lifetime, passed without Redis converting a number (a
-- '%.17g' in Redis 7.0).
local function bucket_write(used, rate, period, pxs, lag)
  local t = now + lag
  local life = ceil_div(used, rate) + lag
  local ttl = life
  if ttl < period + lag then ttl = period + lag end -- a period after t
  local value
  local at_ms = used + (t % 1000) * rate -- D at the start of the ms
  if ttl <= 500000000000 and at_ms < 1e17 then
    -- M = ceil(at_ms / 10^e) for the least e that makes M < 1e8, that
    -- is at_ms <= 99999999 * 10^e.
    local e, p = 0, 1
    while at_ms > 99999999 * p do
      e, p = e + 1, p * 10
    end
    local m = at_ms
    if e > 0 then
      m = ceil_div(at_ms, p)
      -- The key lives until the bucket is full as stored (D rounded up):
      -- a later call at this rate then finds it alive as long as it needs
      -- it, and does not extend it (check_tb).
      local full = ceil_div(m * p, rate) - t % 1000 + lag
      if full > ttl then ttl = full end
    end
    -- m * 10 + e printed is m's digits then e's (one conversion fewer).
    value = string.format('%d%09d', m * 10 + e, (t - t % 1000) / 1000 % 1000000000)
  else
    value = string.format('%.17g:%d', used, t) -- exact for a double; %d would wrap past 2^63
  end
  if pxs and ttl == period then return value, pxs, life end
  return value, ms(ttl), life
end

-- check_tb is the check function of both (see common.lua): code 'lb' is
-- the leaky bucket.
local function check_tb(key, rate, period, burst, code, pxs)
  local leaky = code == 'lb'
  local used, lag, d0 = bucket_read(key, rate)
  local cap = burst * period
  local avail, reset_now = burst, 0 -- a full bucket (a key at rest): no division
  if used > 0 then
    avail = floor_div(cap - used, period)
    reset_now = ceil_div(used, rate) + lag
  end
  local over = used + n * period - cap
  -- The key lives at least a period after the state's time (bucket_write),
  -- by which this rate refills rate * period of D: a state holding more
  -- (a ms more, as the state's time may be the start of its ms) may have
  -- been written at a higher rate, with a shorter life than this rule
  -- needs. Then, unless this call writes it (a single rule that allows
  -- n > 0), the key is made to live until full at this rate. Never with
  -- Burst <= Rate, the usual case: D is at most burst * period.
  if d0 > rate * (period + 1000) and (nrules > 1 or n == 0 or over > 0 or
      (leaky and max_delay >= 0 and reset_now > max_delay)) then
    -- Slack: PTTL is rounded down (a ms), and Redis 7.0's TIME in a
    -- script can be a few ms behind the clock PTTL reads under load (2 ms
    -- seen): a key is kept unless it would expire within a ms and a
    -- 1024th of its refill time of being full at this rate, so that at
    -- most that refill is forgotten. (-1: no expiry, set by hand.)
    local left = rcall('PTTL', key)
    if left >= 0 and left * 1000 + 1000 + reset_now / 1024 < reset_now then rcall('PEXPIRE', key, ms(reset_now)) end
  end
  if over > 0 then
    return false, avail, ceil_div(over, rate) + lag, reset_now, reset_now
  end
  local delay = 0
  if leaky then
    delay = reset_now
    if max_delay >= 0 and delay > max_delay then
      return false, avail, delay - max_delay, reset_now, reset_now, 0, 3
    end
  end
  if n == 0 then
    return true, avail, delay, reset_now, reset_now
  end
  local value, px, life = bucket_write(used + n * period, rate, period, pxs, lag)
  write('SET', key, value, 'PX', px)
  if rid == '' then return true, avail, delay, reset_now, life, 0 end
  -- A reservation's tag: when the refill would have paid back what was
  -- used before these n events (µs, rounded down), from which settle.lua
  -- bounds a refund.
  return true, avail, delay, reset_now, life, now + lag + (used - used % rate) / rate
end

local check_lb = check_tb
