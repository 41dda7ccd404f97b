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
-- (single_write.lua, then single_reply.lua, which follow this file,
-- write and reply.)

-- A priority share (single_args.lua): the rule counts share_c of its rate.
local kept = 0
if shared then kept, rate = rate - share_c, share_c end

-- The write, if any, for single_write.lua or a policy's script to make:
-- command and arguments after the key.
local wc, wa, wb, wx

-- The check (check_fw, check_cw): code, remaining, retry after, reset
-- after (common.lua).
local avail = rate - count
local reset_now = 0
if count > 0 or n > avail then reset_now = left end
local code, rem, wait, reset = 0, avail, 0, reset_now
if n > avail then
  if n > 0 then code, wait = 1, left end
elseif n > 0 then
  -- (The numbers printed by string.format, not by Redis 7.0, which
  -- converts a number argument with '%.17g': the same digits, for less.)
  if count > 0 then
    if n == 1 then
      wc, wa = 'INCRBY', '10'
    else
      wc, wa = 'INCRBY', string.format('%d', n * 10)
    end
  else
    local px = left / 1000
    px = px + (-px) % 1
    if px < 1 then px = 1 end
    wc, wa, wb, wx = 'SET', string.format('%d', n * 10 + digit), 'PX', string.format('%d', px)
  end
  rem, reset = avail - n, left
end
