-- args.lua reads a call's arguments (see common.lua for their layout) into
-- common.lua's locals and takes the time. It follows the strategies'
-- files, so that it is the first of what a call runs: in a Redis Function
-- (see functions.go) everything before it runs once, when the library is
-- loaded, and everything from it on runs on every call, which is why it
-- also sets rcall and write (redis.call itself; with several rules the
-- checks then set it, and write_args, to queue.lua's or written.lua's
-- functions) and clears write_args (a block's call set both to write
-- nothing, see decide.lua) and the queue of writes.

-- Numbers: the usual values are compared as strings (Lua interns them: a
-- pointer comparison) before any conversion, whose strtod is a good part
-- of a decision's time in Redis. A string known to hold a number (an
-- argument, a reply, a value these scripts wrote) is converted by
-- arithmetic (x + 0: one strtod), not by tonumber, which in Lua 5.1 runs
-- strtod twice (to check, then to convert); tonumber is kept where a
-- string may not be a number, or may start with a 0 (which miniredis's Lua
-- reads as octal in arithmetic).
-- A script with its rules written in gets the arguments only up to the
-- last that is not its default (every argument Redis puts in ARGV costs it
-- a string and a table slot): an absent one is its default. With several
-- rules written in, the script sets nrules itself after this (see
-- writtenCount in scripts.go), whether ARGV[2] came or not.
n, nrules, now, max_delay, block, rid, skew = 1, 1, 0, -1, 0, '', 0
rcall = redis.call
write, write_args, writes = rcall, nil, nil
local nargs = #ARGV
if nargs > 0 and ARGV[1] ~= '1' then n = ARGV[1] + 0 end
if nargs > 1 and ARGV[2] ~= '1' then nrules = ARGV[2] + 0 end
if nargs > 2 and ARGV[3] ~= '0' then now = ARGV[3] + 0 end
if nargs > 3 and ARGV[4] ~= '-1' then max_delay = ARGV[4] + 0 end
if nargs > 4 and ARGV[5] ~= '0' then block = ARGV[5] + 0 end
if nargs > 5 then rid = ARGV[6] end
-- The share follows the rules (or ARGV[7], with the rules written in):
-- there are 7 + 4k arguments without it. (settle.lua's arguments after
-- the rules are read as one too, and not used: it runs no check.lua.)
share = nil
if nargs == 8 or nargs > 7 + 4 * nrules then share = ARGV[nargs] + 0 end

if now <= 0 then
  local t = rcall('TIME')
  now = t[1] * 1000000 + t[2]
  skew = false
end
