-- tokenbucket.lua: a bucket of burst tokens, refilled continuously at rate
-- tokens per period (fractional tokens, µs precision), full when first used.
-- Each event takes one token; n events are admitted if n tokens are there.
--
-- KEYS[1]  string: the bucket's TAT (see gcra.lua).
-- ARGV     see common.lua; max delay is ignored.
-- Reply    see common.lua. Delay is always 0. Retry after: until n tokens
--          are there. Reset after: until the bucket is full.
-- Denials write nothing.

return gcra(false)
