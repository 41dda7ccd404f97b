-- single_reply.lua: the reply of a single rule's script, the last file of
-- every single_<strategy>.lua's script (see singleFiles and bakeCalendar
-- in scripts.go; not the warm-up's, which has no share to add back).
--
-- Before it, the script has set code, rem, wait and reset (rounded, times
-- up) and, for a call with a priority share (shared, see
-- single_args.lua), avail and kept: what the rule had left before the
-- call under its share, and what the share keeps out.
-- Reply: common.lua's five integers (code, remaining, delay or retry
--   after, reset after, rule 1), and with a share a sixth, the rule's
--   whole remaining allowance before the call (avail + kept), packed in
--   one string where Redis has its struct library, else an array.

local pack = rawget(_G, 'struct') -- (rawget: miniredis has none)
if shared then
  if pack then return pack.pack('<Bi8i8i8Bi8', code, rem, wait, reset, 1, avail + kept) end
  return {code, rem, wait, reset, 1, avail + kept}
end
if pack then return pack.pack('<Bi8i8i8B', code, rem, wait, reset, 1) end
return {code, rem, wait, reset, 1}
