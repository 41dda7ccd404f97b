-- single_fixedwindow.lua: a fixed window of one rule written in, the usual
-- call only: the decision of the general script (common.lua,
-- fixedwindow.lua, args.lua, decide.lua, check.lua, reply.lua) for one
-- rule with no penalty block and no reservation, a priority share or none,
-- written out in one chunk, as single_bucket.lua is for a bucket (see there
-- why). Same state, same writes, same reply: a reservation on the same key
-- runs the general script (specialisedRunner in runner.go).
-- TestSingleScriptDecidesAsGeneral holds them to the same Results and the
-- same state.
--
-- It finds the window and its count; single_window.lua, which follows it,
-- checks, writes and replies. Before this file, scripts.go writes the rule
-- in, then single_args.lua
-- (which reads n and now, and takes the server's TIME when now is 0):
--   local key, rate, period, burst, leaky, pxs = KEYS[1], <rate>, <µs>, <burst>, false
--   local shift, calendar = <µs>, <bool>
-- (burst, leaky and pxs unused). shift moves the windows' starts: 0, or a
-- calendar's day or week in a zone of one offset, where calendar is true
-- (see bakeCalendar in scripts.go): then a key ahead (the clock went back)
-- counts in now's window, as calendar.lua's cw_read counts it, whose
-- script knows no other window's end.
-- A policy's script runs this file and single_window.lua once per rule, in a
-- block of its own, KEYS[i] its key, and makes the rule's write once
-- every rule has allowed (see policy_head.lua).
--
-- KEYS[1]  the window's state key (see fixedwindow.lua for the state)
-- ARGV     as common.lua's, up to ARGV[3]: n, 1, now in µs or 0 (the
--          server's TIME); trailing defaults left out (ARGV[4], a max
--          delay, is not read: it bounds only a leaky bucket's Delay; the
--          runner sends no block or reservation); a priority share
--          as single_args.lua reads it
-- Reply: common.lua's five integers (code, remaining, delay 0 or retry
--   after, reset after, rule 1), and with a share a sixth, the rule's
--   whole remaining allowance before the call, packed in one string
--   where Redis has its struct library, else an array.


-- The window's count (fw_read): w is the window now is in, or the key's
-- when it is ahead (the clock went back). Windows start at multiples of
-- period since the epoch, less shift.
local at = now + shift
local w = (at - at % period) / period
local count = 0
local v = rcall('GET', key)
if v then
  local x = v + 0
  local d = (w - x) % 10 -- how many windows the key is behind now
  if d == 0 then
    count = (x - x % 10) / 10
  elseif d >= 5 or rcall('PTTL', key) * 1000 > (w + 1) * period - at + 1000 then
    -- ahead: the clock went back (a key 1 to 4 windows behind is left over
    -- from the previous window, by up to 1 ms, or 6 to 9 windows ahead, or
    -- 10 more...: its PTTL tells, as in fw_read)
    count = (x - x % 10) / 10
    if not calendar then w = w + 10 - d end
  end
end

-- The window's end and digit, for the check (single_window.lua).
local left, digit = (w + 1) * period - at, w % 10
