-- single_fixedwindow.lua: a fixed window of one rule written in, the usual
-- call only: the decision of the general script (common.lua,
-- fixedwindow.lua, args.lua, decide.lua, check.lua, reply.lua) for one
-- rule with no penalty block, no priority share and no reservation,
-- written out in one chunk, as single_bucket.lua is for a bucket (see there
-- why). Same state, same writes, same reply: a reservation on the same key
-- runs the general script (singleRunner in runner.go).
-- TestSingleScriptDecidesAsGeneral holds them to the same Results and the
-- same state.
--
-- Before this file, scripts.go writes the rule in, then single_args.lua
-- (which reads n and now, and takes the server's TIME when now is 0):
--   local rate, period, burst, leaky, pxs = <rate>, <µs>, <burst>, false
-- (burst, leaky and pxs unused).
--
-- KEYS[1]  the window's state key (see fixedwindow.lua for the state)
-- ARGV     as common.lua's, up to ARGV[3]: n, 1, now in µs or 0 (the
--          server's TIME); trailing defaults left out (ARGV[4], a max
--          delay, is not read: it bounds only a leaky bucket's Delay; the
--          runner sends no block, reservation or share)
-- Reply: common.lua's five integers (code, remaining, delay 0 or retry
--   after, reset after, rule 1), packed in one string where Redis has its
--   struct library, else an array.


-- The window's count (fw_read): w is the window now is in, or the key's
-- when it is ahead (the clock went back).
local key = KEYS[1]
local w = (now - now % period) / period
local count = 0
local v = rcall('GET', key)
if v then
  local x = v + 0
  local d = (w - x) % 10 -- how many windows the key is behind now
  if d == 0 then
    count = (x - x % 10) / 10
  elseif d >= 5 then -- ahead: the clock went back
    count, w = (x - x % 10) / 10, w + 10 - d
  end
end

-- The check (check_fw): code, remaining, retry after, reset after
-- (common.lua).
local left = (w + 1) * period - now
local avail = rate - count
local code, rem, wait, reset = 0, avail, 0, 0
if n > avail then
  reset = left
  if n > 0 then code, wait = 1, left end
elseif n > 0 then
  -- (The numbers printed by string.format, not by Redis 7.0, which
  -- converts a number argument with '%.17g': the same digits, for less.)
  if count > 0 then
    if n == 1 then
      rcall('INCRBY', key, '10')
    else
      rcall('INCRBY', key, string.format('%d', n * 10))
    end
  else
    local px = left / 1000
    px = px + (-px) % 1
    if px < 1 then px = 1 end
    rcall('SET', key, string.format('%d', n * 10 + w % 10), 'PX', string.format('%d', px))
  end
  rem, reset = avail - n, left
elseif count > 0 then
  reset = left
end

if rem < 0 then rem = 0 end
if reset < 0 then reset = 0 end
rem, wait, reset = rem - rem % 1, wait + (-wait) % 1, reset + (-reset) % 1
local pack = rawget(_G, 'struct') -- (rawget: miniredis has none)
if pack then return pack.pack('<Bi8i8i8B', code, rem, wait, reset, 1) end
return {code, rem, wait, reset, 1}
