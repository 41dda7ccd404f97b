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
--        M * 10^E, M at most 92233719 and E one digit, and T the time of
--        the write in µs, modulo 10^10, as 10 digits (19 digits in all,
--        below 2^63, so that Redis keeps it as an integer). Used while the
--        key lives at most 5e9 µs (83 minutes), so that now - t is known
--        from T. Rounding D up can only charge about a ten-millionth of D
--        more than was used: never an event for free. The time is kept to
--        the µs, not the ms: D kept as of the start of its ms, with the
--        refill since added back at the writer's Rate, gave a reader at a
--        higher Rate that refill again at its own (a plan's Rate raised
--        within the ms: up to a token per unit of Rate raised, at a 1 ms
--        Period).
--   "<D>:<t>"    otherwise: D exact and t the write time in µs.
--   "<D>:<t>:<Y>:<W>"  after a refund that did not come off the end of
--        the queue (see below): Y > D.
-- The raw queue: the events taken, in order, each at the time the refill
-- would reach it if nothing were given back (a reservation's tag is its
-- events' place, from which settle.lua bounds a refund). Y is what the
-- raw queue holds that the refill has not passed; it refills as D does
-- (Y >= D always) and the key lives until Y is refilled. A refund of the
-- events at the end of the queue (no whole event taken after them) takes
-- them off Y too: the usual Cancel keeps Y = D, the compact form. One
-- from the middle leaves a gap of Y - D that moves every event behind it
-- forward once the refill reaches it; W is the earliest gap's place (µs).
-- Before W the refill is exactly where time says; after it, it is taken
-- as past every gap, Y - D ahead: a later refund then never gives back
-- refill that happened, however many refunds came before it (see
-- settle.lua adjust.tb).
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
-- taken before the reservation (now + Y / rate, in µs).

-- bucket_read returns D, what is used, at now, 0, D as stored (as of the
-- state's time) and Y (see above) at now; or, when now is before the
-- state's time (a client clock behind another instance's, see
-- WithClientClock, or a clock that went back a little), D as of the
-- state's time, with no refill, how far that is ahead of now (µs), D and
-- Y. The caller then writes as of the state's time too (bucket_write's lag):
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
  if not v then return 0, 0, 0, 0 end
  local d0, y0, w, elapsed
  local sep = string.find(v, ':', 1, true)
  if sep then
    d0 = string.sub(v, 1, sep - 1) + 0
    local rest = string.sub(v, sep + 1)
    local sep2 = string.find(rest, ':', 1, true)
    if sep2 then -- "<D>:<t>:<Y>:<W>"
      local sep3 = string.find(rest, ':', sep2 + 1, true)
      y0 = string.sub(rest, sep2 + 1, sep3 - 1) + 0
      w = string.sub(rest, sep3 + 1) + 0
      rest = string.sub(rest, 1, sep2 - 1)
    end
    elapsed = now - rest
  else
    local len = #v
    local me = string.sub(v, 1, len - 10) + 0 -- M * 10 + E, below 1e9
    local e = me % 10
    d0 = (me - e) / 10 * 10 ^ e
    -- tonumber: T is zero-padded, which miniredis's Lua (gopher-lua)
    -- reads as octal in arithmetic on a string.
    elapsed = (now - tonumber(string.sub(v, len - 9))) % 10000000000
    if elapsed > 5000000000 then elapsed = elapsed - 10000000000 end -- the clock went back
  end
  y0 = y0 or d0
  if elapsed < 0 then -- the state is ahead: no refill
    if skew then
      if elapsed < -100000 then skew = 64 end
    elseif elapsed <= -1000000 then
      return d0, 0, d0, y0, w
    end
    return d0, -elapsed, d0, y0, w
  end
  local refill = elapsed * rate
  local used = d0 - refill
  if used < 0 then used = 0 end
  if y0 == d0 then return used, 0, d0, used end
  local y = y0 - refill
  if y < 0 then y = 0 end
  return used, 0, d0, y, w
end

-- bucket_write returns the value that stores D = used (>= 0), Y = y
-- (>= used; nil: used) and W = w (with y > used) at now + lag (see bucket_read), its lifetime in ms
-- (for PX), the time until the bucket is full again, from now, and D as
-- stored (rounded up: a reply's Remaining is what a call at once finds).
-- pxs, where the rule is written in, is the PX of one period as a string:
-- the usual lifetime, passed without Redis converting a number (a
-- '%.17g' in Redis 7.0).
local function bucket_write(used, rate, period, pxs, lag, y, w)
  local t = now + lag
  local life = ceil_div(used, rate) + lag
  local ttl = life
  if ttl < period + lag then ttl = period + lag end -- a period after t
  local value, stored = nil, used
  if y and y > used then
    local full = ceil_div(y, rate) + lag -- the key keeps Y until refilled
    if full > ttl then ttl = full end
    value = string.format('%.17g:%d:%.17g:%d', used, t, y, w or 0)
  elseif used >= 1e17 then
    value = string.format('%.17g:%d', used, t) -- exact for a double; %d would wrap past 2^63
  elseif ttl <= 5000000000 then
    -- M = ceil(used / 10^e) for the least e that makes M <= 92233719.
    local e, p = 0, 1
    while used > 92233719 * p do
      e, p = e + 1, p * 10
    end
    local m = used
    if e > 0 then
      m = ceil_div(used, p)
      stored = m * p
      -- The key lives until the bucket is full as stored (D rounded up):
      -- a later call at this rate then finds it alive as long as it needs
      -- it, and does not extend it (check_tb).
      local full = ceil_div(stored, rate) + lag
      if full > ttl then ttl = full end
    end
    -- m * 10 + e printed is m's digits then e's (one conversion fewer).
    value = string.format('%d%010d', m * 10 + e, t % 10000000000)
  else
    -- Below 1e17, %d prints the digits %.17g would (D is an integer),
    -- without printing a double: about 2,500 instructions less in Redis.
    value = string.format('%d:%d', used, t)
  end
  if pxs and ttl == period then return value, pxs, life, stored end
  return value, ms(ttl), life, stored
end

-- check_tb is the check function of both (see common.lua): code 'lb' is
-- the leaky bucket.
local function check_tb(key, rate, period, burst, code, pxs)
  local leaky = code == 'lb'
  local used, lag, d0, y, w = bucket_read(key, rate)
  local cap = burst * period
  local avail, reset_now = burst, 0 -- a full bucket (a key at rest): no division
  if used > 0 then
    avail = floor_div(cap - used, period)
    reset_now = ceil_div(used, rate) + lag
  end
  local over = used + n * period - cap
  -- The key lives at least a period after the state's time (bucket_write),
  -- by which this rate refills rate * period of D: a state holding more
  -- (a ms more: the compact state rounds D up, and PX is in ms) may have
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
    if left >= 0 and left * 1000 + 1000 + reset_now / 1024 < reset_now then
      if reset_now <= 5000000000 then
        rcall('PEXPIRE', key, ms(reset_now))
      else
        -- Longer than the compact state tells its time (a key read
        -- 83 minutes after its write was taken as written in the future,
        -- with no refill): the same state as text, exact, as of now.
        local value, px = bucket_write(used, rate, period, nil, lag, y, w)
        rcall('SET', key, value, 'PX', px)
      end
    end
  end
  local take = n * period
  -- A policy's leaky bucket takes its slot at the policy's Delay, known
  -- once every rule is checked (slots.lua): its write, and what the
  -- other leaky rules' queues make of its Remaining and RetryAfter, wait
  -- in writes.lb (no local more in the chunk, see bucket_read's note),
  -- returned last, for check.lua to add the rule's index and whether it
  -- counts calls.
  local slot
  if leaky and nrules > 1 then
    if not writes then writes, nw = {}, 0 end
    -- A list: slot[15] is the leaky rule checked before (no table more).
    slot = {key, used, y, w, lag, rate, period, cap, pxs, take, 0, false, reset_now, 0, writes.lb}
    writes.lb = slot
  end
  if over > 0 then
    return false, avail, ceil_div(over, rate) + lag, reset_now, reset_now, nil, nil, slot
  end
  local delay = 0
  if leaky then
    delay = reset_now
    if max_delay >= 0 and delay > max_delay then
      return false, avail, delay - max_delay, reset_now, reset_now, 0, 3, slot
    end
  end
  if n == 0 then
    return true, avail, delay, reset_now, reset_now, nil, nil, slot
  end
  if slot then
    local tag = 0
    if rid ~= '' then tag = now + lag + (y - y % rate) / rate end
    return true, avail, delay, reset_now, ceil_div(used + take, rate) + lag, tag, nil, slot
  end
  local value, px, life, stored = bucket_write(used + take, rate, period, pxs, lag, y + take, w)
  write('SET', key, value, 'PX', px)
  -- Remaining (avail - n) is what a call at once finds: D as stored,
  -- rounded up (a fresh key's n * period rounded up left one event fewer).
  if stored ~= used + take then avail = floor_div(cap - stored, period) + n end
  if rid == '' then return true, avail, delay, reset_now, life, 0 end
  -- A reservation's tag: when the refill would have paid back what was
  -- taken before these n events, Y (µs, rounded down), from which
  -- settle.lua bounds a refund.
  return true, avail, delay, reset_now, life, now + lag + (y - y % rate) / rate
end

local check_lb = check_tb
