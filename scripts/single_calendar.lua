-- single_calendar.lua: a calendar quota of one rule (redlimit.Daily,
-- Weekly, Monthly; a day or a week in a zone of one offset runs
-- single_fixedwindow.lua instead, see bakeCalendar), the usual call only:
-- the decision of the general
-- script (common.lua, calendar.lua, args.lua, decide.lua, check.lua,
-- reply.lua) for one calendar rule with no penalty block, no priority
-- share and no reservation, written out in one chunk, as
-- single_fixedwindow.lua is for a fixed window (see single_bucket.lua
-- why). Same state, same writes, same reply, and the same miss when now
-- is outside the window the call sent: a reservation on the same key runs
-- the general script (calendarSingleRunner in runner.go).
-- TestSingleScriptDecidesAsGeneral holds them to the same Results and the
-- same state.
--
-- It reads the window and finds its count; single_window.lua, which
-- follows it, checks, writes and replies. Before this file, scripts.go
-- writes the rule's rate in:
--   local rate = <rate>
--
-- KEYS[1]  the window's state key (see calendar.lua for the state)
-- ARGV[1]  the window: (its start in seconds times 10, plus d) times
--          2^16, plus its length in minutes (calendar.lua: d the last
--          digit of the window's index; a window's start and end are
--          whole seconds; see singleWindowArgs in calendar.go); or, for a
--          window that is not a whole number of minutes long, -(its
--          start in seconds times 10, plus d) - 1, and then
-- ARGV[2]  its end, in seconds
-- then     n (absent: 1), and now in µs (absent, or 0: the server's TIME)
-- (The usual call sends the window only: one argument.)
-- Reply: common.lua's five integers (code, remaining, 0 or retry after,
--   reset after, rule 1), packed in one string where Redis has its struct
--   library, else an array; or the error 'redlimit-window-miss <now>'
--   before any write (calendar.lua's cw_window).

local rcall = redis.call
local shared, share_c = false, 0 -- no priority share (bakeCalendar)
local skew = 0 -- (single_write.lua adds it to the code)
local sd, minutes, a, n, now = ARGV[1] + 0, nil, 1, 1, 0
if sd >= 0 then
  minutes = sd % 65536 -- the window's length
  sd = (sd - minutes) / 65536
else -- (a window that is not a whole number of minutes long: its end follows)
  sd, a = -sd - 1, 2
end
local nargs = #ARGV
if nargs > a and ARGV[a + 1] ~= '1' then n = ARGV[a + 1] + 0 end
if nargs > a + 1 and ARGV[a + 2] ~= '0' then now = ARGV[a + 2] + 0 end
if now <= 0 then
  local t = rcall('TIME')
  now = t[1] * 1000000 + t[2]
end

-- The window (cw_window) and its count (cw_read).
local d = sd % 10
local start = (sd - d) * 100000
local stop = minutes and start + minutes * 60000000 or ARGV[2] * 1000000
if now < start or now >= stop then
  error(string.format('redlimit-window-miss %d', now), 0)
end
local key = KEYS[1]
local count = 0
local v = rcall('GET', key)
if v then
  local x = v + 0
  local behind = (d - x) % 10 -- windows the key is behind now
  if behind == 0 or behind >= 5 or rcall('PTTL', key) * 1000 > stop - now + 1000 then
    -- the current one, or ahead (see calendar.lua's cw_read)
    count = (x - x % 10) / 10
  end
end

-- The window's end and digit, for the check (single_window.lua).
local left, digit = stop - now, d
