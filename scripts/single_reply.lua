-- single_reply.lua: the reply of a single rule's script, the last file of
-- every single_<strategy>.lua's script (see singleFiles and bakeCalendar
-- in scripts.go; not the warm-up's, which has no share to add back).
--
-- Before it, the script has set code (with a clock's skew added: 64),
-- rem, wait and reset (whole numbers, times rounded up), avail, what the
-- rule had left before the call (under its share), and kept, what the
-- call's priority share keeps out of the rule's capacity (0 without one,
-- see single_args.lua).
-- Reply: common.lua's five integers (code, remaining, delay or retry
--   after, reset after, rule 1), and with a share a sixth, the rule's
--   whole remaining allowance before the call (avail + kept), packed in
--   one string where Redis has its struct library, else an array.

-- A denial the rule's whole capacity would have admitted is the share's
-- alone: code 5 (with the skew kept).
if kept > 0 and code % 64 == 1 and n <= avail + kept then code = code + 4 end
local pack = rawget(_G, 'struct') -- (rawget: miniredis has none)
if shared then
  if pack then return pack.pack('<Bi8i8i8Bi8', code, rem, wait, reset, 1, avail + kept) end
  return {code, rem, wait, reset, 1, avail + kept}
end
if pack then return pack.pack('<Bi8i8i8B', code, rem, wait, reset, 1) end
return {code, rem, wait, reset, 1}
