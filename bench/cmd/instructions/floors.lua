#!lua name=floors
-- floors.lua: the least a decision can cost Redis (issue 40). Each
-- function is a decision written as tight as one reasonably can while
-- keeping the library's promises: the server's time (TIME in the script),
-- fixed windows aligned to multiples of the period since the epoch, a TTL
-- on every key, exact integer arithmetic, and a reply that carries the
-- code, remaining, retry (or delay), reset and deciding rule (packed into
-- one string). The limit is the bench workloads' `one` and `keys`: 10^9
-- events per 10^10 µs (10,000 s), burst 10^9, written in (as redlimit's
-- scripts have their rules written in: no arguments). KEYS[1] is the
-- state key. Measured as Functions and as scripts (each function's body
-- run by EVALSHA), one hot key or a new key every call:
--
--	go run ./cmd/instructions -library cmd/instructions/floors.lua -functions ret,time,tgs,tb,... -keys 1 [-workload keys] [-eval]
--
-- (policy3 and policy3_p with -keys 3; sc_new only as a Function, on
-- -workload keys.) BENCHMARKS.md's section "Floors" has the figures.
--
-- What they leave out, against redlimit's scripts: n (always 1), max
-- delay, blocks, reservations, shares, several rules, the clock going
-- back (the fixed window keeps no window digit; the sliding counter's
-- only tells its windows apart), limits whose period is not a whole
-- number of ms (fw_*) or of the emission interval period / rate (tb, lb),
-- a sub-window grid that the period does not divide (sw), and
-- products past 2^53 (a sliding counter's previous count times the
-- period in µs: exact below about 900,000 events at this period).
-- policy3_p and sw_p put back what their targets' verdicts turn on: the
-- promises of a policy's reply and state, and the sub-window grid.

-- The floor's pieces.
redis.register_function('ret', function(KEYS)
  return 1
end)

redis.register_function('time', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  return 1
end)

redis.register_function('tgs', function(KEYS)
  local t = redis.call('TIME')
  local v = redis.call('GET', KEYS[1])
  redis.call('SET', KEYS[1], '1765000000000000', 'PX', '3600000')
  return 1
end)

redis.register_function('reply', function(KEYS)
  return struct.pack('<Bi8i8i8B', 0, 999999999, 0, 10, 1)
end)

-- Token bucket as its theoretical arrival time (GCRA's state, the same
-- decisions): one integer, the µs at which the bucket is full again; an
-- event takes T = period / rate = 10 µs, the burst tau = burst * T. TIME,
-- GET, the refill, SET … PX, the packed reply.
redis.register_function('tb', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local tat = redis.call('GET', KEYS[1])
  if tat then
    tat = tat + 0
    if tat < now then tat = now end
  else
    tat = now
  end
  local debt = tat + 10 - now
  if debt > 10000000000 then
    return struct.pack('<Bi8i8i8B', 1, 0, debt - 10000000000, tat - now, 1)
  end
  -- The key lives a period after the write, as redlimit's buckets' (a
  -- call finds the bucket it left): debt <= tau = the period here, so the
  -- PX is a constant string, which Redis need not print.
  redis.call('SET', KEYS[1], string.format('%d', tat + 10), 'PX', '10000000')
  local left = 10000000000 - debt
  return struct.pack('<Bi8i8i8B', 0, (left - left % 10) / 10, 0, debt, 1)
end)

-- Leaky bucket (a queue of at most burst events, one every T): the same
-- state; an admitted event's delay is the queue ahead of it.
redis.register_function('lb', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local tat = redis.call('GET', KEYS[1])
  if tat then
    tat = tat + 0
    if tat < now then tat = now end
  else
    tat = now
  end
  local wait = tat - now
  if wait + 10 > 10000000000 then
    return struct.pack('<Bi8i8i8B', 1, 0, wait + 10 - 10000000000, wait, 1)
  end
  redis.call('SET', KEYS[1], string.format('%d', tat + 10), 'PX', '10000000')
  local left = 10000000000 - wait - 10
  return struct.pack('<Bi8i8i8B', 0, (left - left % 10) / 10, wait, wait + 10, 1)
end)

-- Fixed window, windows aligned to multiples of the period: TIME, GET,
-- then INCRBY in an existing window or SET … PXAT at a new one (the key
-- ends with its window: PXAT its last ms, so no key outlives it).
redis.register_function('fw', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local left = 10000000000 - now % 10000000000
  local v = redis.call('GET', KEYS[1])
  local count = 0
  if v then count = v + 0 end
  if count >= 1000000000 then
    return struct.pack('<Bi8i8i8B', 1, 0, left, left, 1)
  end
  if v then
    redis.call('INCRBY', KEYS[1], '1')
  else
    redis.call('SET', KEYS[1], '1', 'PXAT', (now + left) / 1000 - 1)
  end
  return struct.pack('<Bi8i8i8B', 0, 999999999 - count, 0, left, 1)
end)

-- The same with INCRBY first: one command in an existing window, and a
-- PEXPIREAT when INCRBY made the key. A denied call counts too (the count
-- only matters up to the limit: remaining is 0 either way).
redis.register_function('fw_incr', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local left = 10000000000 - now % 10000000000
  local count = redis.call('INCRBY', KEYS[1], '1')
  if count == 1 then
    redis.call('PEXPIREAT', KEYS[1], (now + left) / 1000 - 1)
  end
  if count > 1000000000 then
    return struct.pack('<Bi8i8i8B', 1, 0, left, left, 1)
  end
  return struct.pack('<Bi8i8i8B', 0, 1000000000 - count, 0, left, 1)
end)

-- The same with the expiry printed by string.format, not by Redis (which
-- prints a number argument with '%.17g').
redis.register_function('fw_incr_fmt', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local left = 10000000000 - now % 10000000000
  local count = redis.call('INCRBY', KEYS[1], '1')
  if count == 1 then
    redis.call('PEXPIREAT', KEYS[1], string.format('%d', (now + left) / 1000 - 1))
  end
  if count > 1000000000 then
    return struct.pack('<Bi8i8i8B', 1, 0, left, left, 1)
  end
  return struct.pack('<Bi8i8i8B', 0, 1000000000 - count, 0, left, 1)
end)

-- ulule's way (no TIME, a window starts at a key's first event): INCRBY,
-- then PEXPIRE on a new key or PTTL (for the reset) on an existing one.
redis.register_function('fw_ulule', function(KEYS)
  local count = redis.call('INCRBY', KEYS[1], '1')
  local ttl = 10000000
  if count == 1 then
    redis.call('PEXPIRE', KEYS[1], '10000000')
  else
    ttl = redis.call('PTTL', KEYS[1])
  end
  if count > 1000000000 then
    return struct.pack('<Bi8i8i8B', 1, 0, ttl * 1000, ttl * 1000, 1)
  end
  return struct.pack('<Bi8i8i8B', 0, 1000000000 - count, 0, ttl * 1000, 1)
end)

-- Sliding counter: the counts of window w and w-1 and w's last digit in
-- one integer, (p * 2^24 + c) * 10 + w % 10 (counts below 2^24), the key
-- ending with window w+1. INCRBY 10 in the same window, else SET … PX.
redis.register_function('sc', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local elapsed = now % 10000000000
  local w = (now - elapsed) / 10000000000
  local cur, prev, same = 0, 0, false
  local v = redis.call('GET', KEYS[1])
  if v then
    local x = v + 0
    local d = (w - x) % 10
    local pc = (x - x % 10) / 10
    if d == 0 then
      cur = pc % 16777216
      prev = (pc - cur) / 16777216
      same = true
    elseif d == 1 then
      prev = pc % 16777216
    end
  end
  -- ceil(prev * (period - elapsed) / period), exact while the product stays below 2^53.
  local q = prev * (10000000000 - elapsed)
  local r = q % 10000000000
  local weighted = (q - r) / 10000000000
  if r > 0 then weighted = weighted + 1 end
  local avail = 1000000000 - cur - weighted
  if avail < 1 then
    return struct.pack('<Bi8i8i8B', 1, avail, 10000000000 - elapsed, 20000000000 - elapsed, 1)
  end
  if same then
    redis.call('INCRBY', KEYS[1], '10')
  else
    local ms = (20000000000 - elapsed) / 1000
    ms = ms + (-ms) % 1
    redis.call('SET', KEYS[1], string.format('%d', (prev * 16777216 + cur + 1) * 10 + w % 10), 'PX', ms)
  end
  return struct.pack('<Bi8i8i8B', 0, avail - 1, 0, 20000000000 - elapsed, 1)
end)

-- The same with the key living two periods after each write, a constant
-- PX that Redis need not print (at most a period longer than needed: a
-- key two windows behind reads as empty).
redis.register_function('sc_px', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local elapsed = now % 10000000000
  local w = (now - elapsed) / 10000000000
  local cur, prev, same = 0, 0, false
  local v = redis.call('GET', KEYS[1])
  if v then
    local x = v + 0
    local d = (w - x) % 10
    local pc = (x - x % 10) / 10
    if d == 0 then
      cur = pc % 16777216
      prev = (pc - cur) / 16777216
      same = true
    elseif d == 1 then
      prev = pc % 16777216
    end
  end
  local q = prev * (10000000000 - elapsed)
  local r = q % 10000000000
  local weighted = (q - r) / 10000000000
  if r > 0 then weighted = weighted + 1 end
  local avail = 1000000000 - cur - weighted
  if avail < 1 then
    return struct.pack('<Bi8i8i8B', 1, avail, 10000000000 - elapsed, 20000000000 - elapsed, 1)
  end
  if same then
    redis.call('INCRBY', KEYS[1], '10')
  else
    redis.call('SET', KEYS[1], string.format('%d', (prev * 16777216 + cur + 1) * 10 + w % 10), 'PX', '20000000')
  end
  return struct.pack('<Bi8i8i8B', 0, avail - 1, 0, 20000000000 - elapsed, 1)
end)

-- Sliding log: a sorted set of the admitted events' times (µs, each its
-- own member), trimmed of the events older than the period, counted, and
-- the key kept until its newest event leaves: TIME, ZREMRANGEBYSCORE,
-- ZCARD, ZADD, PEXPIRE (and, only on a denial, the oldest event for the
-- retry).
redis.register_function('sl', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', string.format('%d', now - 10000000000))
  local count = redis.call('ZCARD', KEYS[1])
  if count >= 1000000000 then
    local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
    local retry = oldest[2] + 10000000000 - now
    return struct.pack('<Bi8i8i8B', 1, 0, retry, 10000000000, 1)
  end
  local s = string.format('%d', now)
  redis.call('ZADD', KEYS[1], s, s)
  redis.call('PEXPIRE', KEYS[1], '10000000')
  return struct.pack('<Bi8i8i8B', 0, 999999999 - count, 0, 10000000000, 1)
end)

-- Sub-window counter (60 sub-windows of the period): a hash whose field
-- 'h' packs the window's total, the current sub-window's count and that
-- sub-window's last three digits, (total * 2^24 + cur) * 1000 + s % 1000,
-- and one field per earlier sub-window with its count. In the current
-- sub-window: HGET, HINCRBY. A new key: HSET and PEXPIRE (until the end of
-- the sub-window plus the period). When the sub-window moves on (not in
-- these workloads' runs but rarely): the old one's count gets its own
-- field, and the sub-windows that left the window would be taken off the
-- total (HMGET and HDEL, left out here: the floor is the usual path).
redis.register_function('sw', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local into = now % 166666666
  local sw = (now - into) / 166666666
  local h = redis.call('HGET', KEYS[1], 'h')
  local total, cur, same = 0, 0, false
  if h then
    local x = h + 0
    local pc = (x - x % 1000) / 1000
    cur = pc % 16777216
    total = (pc - cur) / 16777216
    same = (sw - x) % 1000 == 0
  end
  if total >= 1000000000 then
    return struct.pack('<Bi8i8i8B', 1, 0, 166666666 - into, 10000000000, 1)
  end
  if same then
    redis.call('HINCRBY', KEYS[1], 'h', '16777217000')
  else
    local v = string.format('%d', ((total + 1) * 16777216 + 1) * 1000 + sw % 1000)
    if h then
      redis.call('HSET', KEYS[1], 'h', v, string.format('%d', sw - 1), cur)
    else
      redis.call('HSET', KEYS[1], 'h', v)
    end
    local ms = (10166666666 - into) / 1000
    ms = ms + (-ms) % 1
    redis.call('PEXPIRE', KEYS[1], ms)
  end
  return struct.pack('<Bi8i8i8B', 0, 999999999 - total, 0, 10166666666 - into, 1)
end)

-- sw on redlimit's grid, which keeps "at most rate in any interval of a
-- period" exact where s does not divide the period (here 10^10 µs in 60
-- sub-windows: 166,666,666 µs and 2/3): sub-window b starts at
-- b * period / s rounded up to the µs, found from now's period and its
-- offset in it (no absolute time past now is made), with period / s and
-- period % s written in. A new key writes 'h' only (no 'o': a state could
-- find the sub-window 'h' counts in from the key's PTTL instead).
redis.register_function('sw_p', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local r = now % 10000000000
  local qn = (now - r) / 10000000000
  local j = r * 60 / 10000000000
  j = j - j % 1
  local a = j * 40 + 59
  if j * 166666666 + (a - a % 60) / 60 > r then j = j - 1 end
  a = (j + 1) * 40 + 59
  local upto = (j + 1) * 166666666 + (a - a % 60) / 60 - r
  if upto <= 0 then
    j = j + 1
    a = (j + 1) * 40 + 59
    upto = (j + 1) * 166666666 + (a - a % 60) / 60 - r
  end
  local sw = qn * 60 + j
  local h = redis.call('HGET', KEYS[1], 'h')
  local total, cur, same = 0, 0, false
  if h then
    local x = h + 0
    local pc = (x - x % 1000) / 1000
    cur = pc % 16777216
    total = (pc - cur) / 16777216
    same = (sw - x) % 1000 == 0
  end
  if total >= 1000000000 then
    return struct.pack('<Bi8i8i8B', 1, 0, upto, upto + 10000000000, 1)
  end
  if same then
    redis.call('HINCRBY', KEYS[1], 'h', '16777217000')
  else
    local v = string.format('%d', ((total + 1) * 16777216 + 1) * 1000 + sw % 1000)
    if h then
      redis.call('HSET', KEYS[1], 'h', v, string.format('%d', sw - 1), cur)
    else
      redis.call('HSET', KEYS[1], 'h', v)
    end
    local ms = (upto + 10000000000) / 1000
    ms = ms + (-ms) % 1
    redis.call('PEXPIRE', KEYS[1], ms)
  end
  return struct.pack('<Bi8i8i8B', 0, 999999999 - total, 0, upto + 10000000000, 1)
end)

-- A policy of 3 rules, as bench's: the token bucket above (KEYS[1]), a
-- sliding counter per minute (KEYS[2]) and a fixed window per hour
-- (KEYS[3]), 10^9 events each: one TIME, one MGET, and the three writes
-- only when every rule allows; the reply tells the rule with the fewest
-- left (the token bucket's on a tie). Call it with -keys 3.
redis.register_function('policy3', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local v = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3])
  -- Token bucket.
  local tat = now
  if v[1] then
    tat = v[1] + 0
    if tat < now then tat = now end
  end
  local debt = tat + 10 - now
  local tb_left = 10000000000 - debt
  tb_left = (tb_left - tb_left % 10) / 10
  -- Sliding counter, period 6 * 10^7 µs.
  local elapsed = now % 60000000
  local w = (now - elapsed) / 60000000
  local cur, prev, same = 0, 0, false
  if v[2] then
    local x = v[2] + 0
    local d = (w - x) % 10
    local pc = (x - x % 10) / 10
    if d == 0 then
      cur = pc % 16777216
      prev = (pc - cur) / 16777216
      same = true
    elseif d == 1 then
      prev = pc % 16777216
    end
  end
  local q = prev * (60000000 - elapsed)
  local r = q % 60000000
  local weighted = (q - r) / 60000000
  if r > 0 then weighted = weighted + 1 end
  local sc_avail = 1000000000 - cur - weighted
  -- Fixed window, period 3.6 * 10^9 µs.
  local fw_end = now - now % 3600000000 + 3600000000
  local count = 0
  if v[3] then count = v[3] + 0 end
  local fw_avail = 1000000000 - count
  -- The decision: the rule with the fewest left decides.
  local rule, avail, reset = 1, tb_left + 1, debt
  if sc_avail < avail then rule, avail, reset = 2, sc_avail, 120000000 - elapsed end
  if fw_avail < avail then rule, avail, reset = 3, fw_avail, fw_end - now end
  if debt > 10000000000 or sc_avail < 1 or fw_avail < 1 then
    return struct.pack('<Bi8i8i8B', 1, 0, fw_end - now, reset, rule)
  end
  -- The key lives a period after the write, as redlimit's buckets' (a
  -- call finds the bucket it left): debt <= tau = the period here, so the
  -- PX is a constant string, which Redis need not print.
  redis.call('SET', KEYS[1], string.format('%d', tat + 10), 'PX', '10000000')
  if same then
    redis.call('INCRBY', KEYS[2], '10')
  else
    local ms = (120000000 - elapsed) / 1000
    ms = ms + (-ms) % 1
    redis.call('SET', KEYS[2], string.format('%d', (prev * 16777216 + cur + 1) * 10 + w % 10), 'PX', ms)
  end
  if v[3] then
    redis.call('INCRBY', KEYS[3], '1')
  else
    redis.call('SET', KEYS[3], '1', 'PXAT', fw_end / 1000 - 1)
  end
  return struct.pack('<Bi8i8i8B', 0, avail - 1, 0, reset, rule)
end)

-- policy3 with what redlimit's policy promises beyond it: n (a local
-- here, 1, as a policy's script has it for Allow); a bucket state that a
-- change of the rule's rate reads right, its debt D (an event adds the
-- period in µs, a µs takes away the rate) and D's time, as text "D:t"
-- (GCRA's theoretical arrival time is of one rate); the fixed window's
-- last window digit, which tells a key left from another window (the clock
-- went back, or a key that outlived its window by a ms); the divisions
-- exact for any rate (a correction after each); and a reply that also
-- carries the deciding rule's own reset and each rule's remaining before
-- the call (the fallback's memory of every rule), with the reset the
-- longest over the rules. Call it with -keys 3.
redis.register_function('policy3_p', function(KEYS)
  local n = 1
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local v = redis.call('MGET', KEYS[1], KEYS[2], KEYS[3])
  -- Token bucket: rate 10^9, period 10^10 µs, burst 10^9.
  local used = 0
  if v[1] then
    local sep = string.find(v[1], ':', 1, true)
    used = string.sub(v[1], 1, sep - 1) - (now - string.sub(v[1], sep + 1)) * 1000000000
    if used < 0 then used = 0 end
  end
  local a = 10000000000000000000 - used
  local q = a / 10000000000
  q = q - q % 1
  if q * 10000000000 > a then q = q - 1 elseif (q + 1) * 10000000000 <= a then q = q + 1 end
  local a1 = q
  local d = used + n * 10000000000
  q = d / 1000000000
  q = q + (-q) % 1
  if q * 1000000000 < d then q = q + 1 elseif (q - 1) * 1000000000 >= d then q = q - 1 end
  local tb_reset = q
  -- Sliding counter, period 6 * 10^7 µs.
  local elapsed = now % 60000000
  local w = (now - elapsed) / 60000000
  local cur, prev, same = 0, 0, false
  if v[2] then
    local x = v[2] + 0
    local dw = (w - x) % 10
    local pc = (x - x % 10) / 10
    if dw == 0 then
      cur = pc % 16777216
      prev = (pc - cur) / 16777216
      same = true
    elseif dw == 1 then
      prev = pc % 16777216
    end
  end
  q = prev * (60000000 - elapsed)
  local r = q % 60000000
  local weighted = (q - r) / 60000000
  if r > 0 then weighted = weighted + 1 end
  local a2 = 1000000000 - cur - weighted
  -- Fixed window, period 3.6 * 10^9 µs, its window's last digit kept.
  local into = now % 3600000000
  local fw = (now - into) / 3600000000
  local left = 3600000000 - into
  local count = 0
  if v[3] then
    local x = v[3] + 0
    if (fw - x) % 10 == 0 then count = (x - x % 10) / 10 end
  end
  local a3 = 1000000000 - count
  -- The decision: the rule with the fewest left decides.
  local rule, avail, reset = 1, a1, tb_reset
  if a2 < avail then rule, avail, reset = 2, a2, 120000000 - elapsed end
  if a3 < avail then rule, avail, reset = 3, a3, left end
  if n > a1 or n > a2 or n > a3 then
    return struct.pack('<Bi8i8i8Bi8i8i8i8', 1, 0, left, left, rule, reset, a1, a2, a3)
  end
  local longest = tb_reset
  if 120000000 - elapsed > longest then longest = 120000000 - elapsed end
  if left > longest then longest = left end
  redis.call('SET', KEYS[1], string.format('%d:%d', d, now), 'PX', '10000000')
  if same then
    redis.call('INCRBY', KEYS[2], '10')
  else
    local ms = (120000000 - elapsed) / 1000
    ms = ms + (-ms) % 1
    redis.call('SET', KEYS[2], string.format('%d', (prev * 16777216 + cur + n) * 10 + w % 10), 'PX', ms)
  end
  if count > 0 then
    redis.call('INCRBY', KEYS[3], '10')
  else
    redis.call('SET', KEYS[3], string.format('%d', n * 10 + fw % 10), 'PXAT', (now + left) / 1000 - 1)
  end
  return struct.pack('<Bi8i8i8Bi8i8i8i8', 0, avail - n, 0, longest, rule, reset, a1, a2, a3)
end)

-- The same with a new key's value taken from a table of strings (no
-- number printed for it): what printing the value costs a new key. Only
-- as a Function (the table is made when the library loads), and only
-- on new keys (workload keys): an existing key returns at once.
local SC_NEW = {[0] = '10', '11', '12', '13', '14', '15', '16', '17', '18', '19'}
redis.register_function('sc_new', function(KEYS)
  local t = redis.call('TIME')
  local now = t[1] * 1000000 + t[2]
  local elapsed = now % 10000000000
  local w = (now - elapsed) / 10000000000
  local v = redis.call('GET', KEYS[1])
  if v then
    return 1
  end
  local ms = (20000000000 - elapsed) / 1000
  ms = ms + (-ms) % 1
  redis.call('SET', KEYS[1], SC_NEW[w % 10], 'PX', ms)
  return struct.pack('<Bi8i8i8B', 0, 999999999, 0, 20000000000 - elapsed, 1)
end)
