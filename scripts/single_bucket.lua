-- single_bucket.lua: a token or leaky bucket of one rule written in, the
-- usual call only: the decision of the general script (common.lua,
-- bucket.lua, args.lua, decide.lua, check.lua, reply.lua) for one rule with
-- no penalty block and no reservation, a priority share or none, written
-- out in one chunk. That script re-makes its helper functions on every call
-- (closures with many upvalues: about 10,000 instructions in Redis) and
-- gathers what every rule found for any number of rules; this one makes
-- two functions with no upvalues, and decides and replies directly. Same
-- state, same writes, same reply: a limiter whose rule runs this script
-- runs the general one for a reservation, on the same key
-- (specialisedRunner in runner.go). TestSingleScriptDecidesAsGeneral
-- holds them to the same Results and the same state.
--
-- Before this file, scripts.go writes the rule in, then single_args.lua
-- (which reads n, now and max_delay, and takes the server's TIME when now
-- is 0):
--   local key, rate, period, burst, leaky, pxs = KEYS[1], <rate>, <µs>, <burst>, <leaky>, '<ms>'
-- (pxs: the PX of one period, as a string: see common.lua).
-- A policy's script runs this file once per rule, in a
-- block of its own, KEYS[i] its key, and makes the rule's write once
-- every rule has allowed (see policy_head.lua).
--
-- KEYS[1]  the bucket's state key (see bucket.lua for the state)
-- ARGV     as common.lua's, up to ARGV[4]: n, 1, now in µs or 0 (the
--          server's TIME), max delay in µs or -1; trailing defaults left
--          out (the runner sends no block or reservation); a call with a
--          priority share sends -(c + 1), c the capacity the share leaves
--          the bucket, floor(share × burst / 1e6): in ARGV[1] for n = 1, or
--          else in ARGV[2], where the general script has the rule count,
--          which this script does not read (see trimSingle in runner.go):
--          one argument, not eight, and no arithmetic here
-- Reply: common.lua's five integers (code, remaining, delay or retry
--   after, reset after, rule 1), and with a share a sixth, the bucket's
--   whole remaining allowance before the call, packed in one string
--   where Redis has its struct library, else an array.
-- (single_write.lua, then single_reply.lua, which follow this file,
-- write and reply.)


-- Exact integer division: common.lua's floor_div and ceil_div, written
-- out where they are needed (made and called on every call, the two
-- functions cost Redis about 2,000 instructions more), each as
--   q = a / b  q = q - q % 1 (floor) or q + (-q) % 1 (ceil)
--   then q corrected by one where the double's rounding was off.

-- The state (bucket_read): used, D at now; lag, how far the state's time
-- is ahead of now; d0, D as stored; y, Y at now; w, W.
local used, lag, d0, y, w = 0, 0, 0, 0, nil
local v = rcall('GET', key)
if v then
  local y0, elapsed
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
    local me = string.sub(v, 1, len - 10) + 0 -- M * 10 + E
    local e = me % 10
    d0 = (me - e) / 10 * 10 ^ e
    -- tonumber: T is zero-padded (octal in gopher-lua's arithmetic).
    elapsed = (now - tonumber(string.sub(v, len - 9))) % 10000000000
    if elapsed > 5000000000 then elapsed = elapsed - 10000000000 end -- the clock went back
  end
  y0 = y0 or d0
  if elapsed < 0 then -- the state is ahead: no refill (see bucket_read)
    used, y = d0, y0
    lag = -elapsed
    if skew then
      if elapsed < -100000 then skew = 64 end
    elseif elapsed <= -1000000 then
      lag = 0
    end
  else
    local refill = elapsed * rate
    used = d0 - refill
    if used < 0 then used = 0 end
    if y0 == d0 then
      y, w = used, nil
    else
      y = y0 - refill
      if y < 0 then y = 0 end
    end
  end
end

-- A priority share (single_args.lua): the bucket counts share_c of its
-- burst.
local kept = 0
if shared then kept, burst = burst - share_c, share_c end

-- The check (check_tb).
local cap = burst * period
local avail, reset_now = burst, 0
if used > 0 then
  local a = cap - used
  local q = a / period
  q = q - q % 1
  if q * period > a then q = q - 1 elseif (q + 1) * period <= a then q = q + 1 end
  avail = q
  q = used / rate
  q = q + (-q) % 1
  if q * rate < used then q = q + 1 elseif (q - 1) * rate >= used then q = q - 1 end
  reset_now = q + lag
end
local over = used + n * period - cap
-- The value to write, if any: D, Y, and the PX of one period (pxs) where
-- it is the key's life; wd nil: no write. nd, ny: a state to write at
-- once, before it (below).
local wd, wy, wpxs, nd, ny
local wc, wa, wb, wx
if d0 > rate * (period + 1000) and (policy or n == 0 or over > 0 or
    (leaky and max_delay >= 0 and reset_now > max_delay)) then
  -- A state written at a higher rate (see check_tb): kept until full at
  -- this rate, at once. This call writes nothing else (n = 0, or a
  -- denial), or, in a policy's script, may not (another rule may deny).
  local left = rcall('PTTL', key)
  if left >= 0 and left * 1000 + 1000 + reset_now / 1024 < reset_now then
    if reset_now <= 5000000000 then
      local px = reset_now / 1000
      px = px + (-px) % 1
      if px < 1 then px = 1 end
      rcall('PEXPIRE', key, px)
    else
      nd, ny = used, y -- as text, exact, as of now (see below)
    end
  end
end
-- code, remaining, delay or retry after, reset after (common.lua).
local code, rem, wait, reset = 0, avail, 0, reset_now
if over > 0 then
  local q = over / rate
  q = q + (-q) % 1
  if q * rate < over then q = q + 1 elseif (q - 1) * rate >= over then q = q - 1 end
  code, wait = 1, q + lag
elseif leaky and max_delay >= 0 and reset_now > max_delay then
  code, wait = 3, reset_now - max_delay
elseif leaky then
  wait = reset_now
end
local admit = n > 0 and code == 0
if admit then
  wd, wy, wpxs = used + n * period, y + n * period, pxs
  rem = avail - n
elseif n == 0 and code ~= 0 then
  code, wait = 0, 0 -- a look is never denied, and has no delay then
end

-- The writes: nd, at once, then wd, left in wc, wa, wb, wx (command and
-- arguments after the key) for single_write.lua, or a policy's script, to
-- make; each by the code of bucket_write: the value that stores D = wd,
-- Y = wy and W = w at now + lag, and its PX.
-- (Not swapped in one assignment: miniredis's Lua assigns a, b = b, a in
-- turn.)
local direct = nd ~= nil
if direct then
  local ad, ay = wd, wy
  wd, wy, wpxs = nd, ny, nil
  nd, ny = ad, ay
end
while wd do
  local t = now + lag
  local q = wd / rate
  q = q + (-q) % 1
  if q * rate < wd then q = q + 1 elseif (q - 1) * rate >= wd then q = q - 1 end
  local life = q + lag
  local ttl = life
  if ttl < period + lag then ttl = period + lag end -- a period after t
  local value, stored = nil, wd
  if wy and wy > wd then
    q = wy / rate
    q = q + (-q) % 1
    if q * rate < wy then q = q + 1 elseif (q - 1) * rate >= wy then q = q - 1 end
    local full = q + lag -- the key keeps Y until refilled
    if full > ttl then ttl = full end
    value = string.format('%.17g:%d:%.17g:%d', wd, t, wy, w or 0)
  elseif wd >= 1e17 then
    value = string.format('%.17g:%d', wd, t) -- exact for a double
  elseif ttl <= 5000000000 then
    -- The compact form: M = ceil(wd / 10^e) for the least e that makes
    -- M <= 92233719.
    local e, p = 0, 1
    while wd > 92233719 * p do
      e, p = e + 1, p * 10
    end
    local m = wd
    if e > 0 then
      m = wd / p
      m = m + (-m) % 1
      if m * p < wd then m = m + 1 elseif (m - 1) * p >= wd then m = m - 1 end
      stored = m * p
      q = stored / rate
      q = q + (-q) % 1
      if q * rate < stored then q = q + 1 elseif (q - 1) * rate >= stored then q = q - 1 end
      local full = q + lag
      if full > ttl then ttl = full end
    end
    value = string.format('%d%010d', m * 10 + e, t % 10000000000)
  else
    value = string.format('%d:%d', wd, t)
  end
  local px = wpxs
  if not px or ttl ~= period then
    px = ttl / 1000
    px = px + (-px) % 1
    if px < 1 then px = 1 end
  end
  if direct then
    rcall('SET', key, value, 'PX', px)
    -- Then the rule's own write, if it allows.
    direct, wd, wy, wpxs = false, nd, ny, pxs
  else
    wc, wa, wb, wx = 'SET', value, 'PX', px
    if admit then
      -- Remaining is what a call at once finds: D as stored, rounded up;
      -- and so is the rule's remaining before the call, which a policy's
      -- script and a share's reply give (bucket.lua's check_tb).
      if stored ~= wd then
        local a = cap - stored
        local q = a / period
        q = q - q % 1
        if q * period > a then q = q - 1 elseif (q + 1) * period <= a then q = q + 1 end
        rem, avail = q, q + n
      end
      reset = life
    end
    wd = nil
  end
end
