-- single_slidingcounter.lua: a sliding counter of one rule written in, the
-- usual call only: the decision of the general script (common.lua,
-- slidingcounter.lua, args.lua, decide.lua, check.lua, reply.lua) for one
-- rule with no penalty block and no reservation, a priority share or none,
-- written out in one chunk, as single_bucket.lua is for a bucket (see
-- there why). Same state, same writes, same reply: a reservation on the
-- same key runs the general script (specialisedRunner in runner.go).
-- TestSingleScriptDecidesAsGeneral holds them to the same Results and the
-- same state.
--
-- Before this file, scripts.go writes the rule in, then single_args.lua
-- (which reads n and now, and takes the server's TIME when now is 0):
--   local key, rate, period, burst, leaky, pxs = KEYS[1], <rate>, <µs>, <burst>, false
-- (burst, leaky and pxs unused).
-- A policy's script runs this file once per rule, in a
-- block of its own, KEYS[i] its key, and makes the rule's write once
-- every rule has allowed (see policy_head.lua).
--
-- KEYS[1]  the counter's state key (see slidingcounter.lua for the state)
-- ARGV     as common.lua's, up to ARGV[3]: n, 1, now in µs or 0 (the
--          server's TIME); trailing defaults left out (ARGV[4], a max
--          delay, is not read: it bounds only a leaky bucket's Delay; the
--          runner sends no block or reservation); a priority share
--          as single_args.lua reads it
-- Reply: common.lua's five integers (code, remaining, delay 0 or retry
--   after, reset after, rule 1), and with a share a sixth, the rule's
--   whole remaining allowance before the call, packed in one string
--   where Redis has its struct library, else an array.
-- Exact integer division is written out as in single_bucket.lua.
-- (single_write.lua, then single_reply.lua, which follow this file,
-- write and reply.)


-- A priority share (single_args.lua): the rule counts share_c of its rate.
local kept = 0
if shared then kept, rate = rate - share_c, share_c end

-- The counts (sc_read): cur and prev of window w (the window now is in,
-- or the key's when it is ahead: the clock went back), and whether the
-- stored value is window w's, packed.
local w = (now - now % period) / period
local cur, prev, inplace = 0, 0, false
local v = rcall('GET', key)
if v then
  local c, p, d
  local sep = string.find(v, ':', 1, true)
  if sep then -- "c:p:w"
    local sep2 = string.find(v, ':', sep + 1, true)
    c = string.sub(v, 1, sep - 1) + 0
    p = string.sub(v, sep + 1, sep2 - 1) + 0
    d = w - string.sub(v, sep2 + 1)
    if d < -4 then d = -4 elseif d > 5 then d = 5 end
    d = d % 10
  else
    local x = v + 0
    local pc = (x - x % 10) / 10
    c = pc % 16777216
    p, d = (pc - c) / 16777216, (w - x) % 10
    inplace = d == 0
  end
  if d == 0 then
    cur, prev = c, p
  elseif d == 1 then
    prev = c
  elseif d >= 6 or rcall('PTTL', key) * 1000 > (w + 1) * period - now + 1000 then
    -- ahead: the clock went back (see slidingcounter.lua's sc_read)
    cur, prev, w = c, p, w + 10 - d
  end
end

-- The write, if any, for single_write.lua or a policy's script to make:
-- command and arguments after the key.
local wc, wa, wb, wx

-- The check (check_sc): code, remaining, retry after, reset after
-- (common.lua). reset is sc_reset_after's: until the counts have left the
-- sliding interval.
local elapsed = now - w * period
if elapsed < 0 then elapsed = 0 end
local a = prev * (period - elapsed)
local q = a / period -- ceil(a / period)
q = q + (-q) % 1
if q * period < a then q = q + 1 elseif (q - 1) * period >= a then q = q - 1 end
local avail = rate - cur - q
local reset_now = 0
if cur > 0 then
  reset_now = (w + 2) * period - now
elseif prev > 0 then
  reset_now = (w + 1) * period - now
end
local code, rem, wait, reset = 0, avail, 0, reset_now
if n > avail then
  if n > 0 then
    code, wait = 1, reset
    if n <= rate then
      -- The previous window's weight falls far enough within this window,
      -- or (cur + n > rate) wait for the next, where this window's count
      -- is the weighted one: period - floor(a / b), and the rest.
      local b, rest = prev, period - elapsed
      a = (rate - cur - n) * period
      if cur + n > rate then b, rest, a = cur, 2 * period - elapsed, (rate - n) * period end
      q = a / b -- floor(a / b)
      q = q - q % 1
      if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
      wait = rest - q
    end
    if wait < -1 then wait = -1 end -- (reply.lua's retry starts at -1)
  end
elseif n > 0 then
  if inplace and cur + n < 16777216 then
    -- The key is window w's already, with its expiry: INCRBY n * 10.
    if n == 1 then
      wc, wa = 'INCRBY', '10'
    else
      wc, wa = 'INCRBY', string.format('%d', n * 10)
    end
  else
    -- (The numbers printed by string.format, not by Redis 7.0, which
    -- converts a number argument with '%.17g': the same digits, for less.)
    local value
    if cur + n < 16777216 and prev < 16777216 then
      value = string.format('%d', (prev * 16777216 + cur + n) * 10 + w % 10)
    else
      value = string.format('%d:%d:%d', cur + n, prev, w)
    end
    local px = ((w + 2) * period - now) / 1000
    px = px + (-px) % 1
    if px < 1 then px = 1 end
    wc, wa, wb, wx = 'SET', value, 'PX', string.format('%d', px)
  end
  rem, reset = avail - n, (w + 2) * period - now
end
