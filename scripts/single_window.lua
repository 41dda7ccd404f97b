-- single_window.lua: the check of a count in a window, its write and the
-- reply, for a single rule's script that counts in windows: the end of
-- single_fixedwindow.lua's and single_calendar.lua's (see singleSource and
-- bakeCalendar in scripts.go), as check_fw and check_cw end the same way
-- in the general script.
--
-- Before it, the script has set n, rate, rcall, shared and share_c (the
-- call's and the rule's: single_args.lua), and
--   key    KEYS[1], the window's state key: count * 10 + a digit
--   count  the window's count
--   left   µs from now until the window ends
--   digit  the last digit of the window's index, written with a new count
-- Reply: common.lua's five integers (code, remaining, delay 0 or retry
--   after, reset after, rule 1), and with a share a sixth, the rule's
--   whole remaining allowance before the call, packed in one string
--   where Redis has its struct library, else an array.
-- (single_reply.lua, which follows this file, replies.)

-- A priority share (single_args.lua): the rule counts share_c of its rate.
local kept = 0
if shared then kept, rate = rate - share_c, share_c end

-- The check (check_fw, check_cw): code, remaining, retry after, reset
-- after (common.lua).
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
    rcall('SET', key, string.format('%d', n * 10 + digit), 'PX', string.format('%d', px))
  end
  rem, reset = avail - n, left
elseif count > 0 then
  reset = left
end

if rem < 0 then rem = 0 end
if reset < 0 then reset = 0 end
rem, wait, reset = rem - rem % 1, wait + (-wait) % 1, reset + (-reset) % 1
