-- common.lua is prepended to every strategy script (see scripts.go); it is not
-- run on its own. It reads the arguments all strategies share, takes the time
-- from the Redis server, applies a penalty block, and defines deny.
--
-- KEYS[1]  the strategy's state key (one Redis key per limited key)
-- KEYS[2]  the penalty block key; present only when ARGV[6] > 0. It is built
--          from the same hash tag as KEYS[1], so both are in one cluster slot.
-- ARGV[1]  rate: events allowed per period (integer >= 1)
-- ARGV[2]  period in microseconds (integer >= 1000)
-- ARGV[3]  burst: bucket or queue capacity (integer >= 1)
-- ARGV[4]  n: events asked for (integer >= 0; 0 reports without consuming)
-- ARGV[5]  optional: max delay in microseconds the caller can wait (leaky
--          bucket); absent or -1 = any
-- ARGV[6]  optional: block in microseconds: once denied by the limit, deny
--          everything for this long; absent or 0 = off
-- (Callers leave out the optional arguments they do not need: every
-- argument costs encoding on both sides of the round trip.)
--
-- Reply: an array of four integers (Redis truncates Lua floats, so every
-- value is rounded here, times up):
--   [1] code: 0 allowed, 1 denied by the limit, 2 denied by a block,
--       3 denied because the wait would exceed the max delay
--   [2] remaining events that could still be allowed now
--   [3] when allowed: the delay, µs, to wait before acting (leaky bucket;
--       else 0); when denied: the retry after, µs
--   [4] reset after, µs: until the key is back at its full allowance
--
-- Numbers: Lua numbers are doubles. Times are integer microseconds (below
-- 2^53 until the year 2255). Numbers are never turned into strings with
-- tostring or '..' (that keeps only 14 digits); redis.call converts them
-- exactly, and string.format('%d') is used where a string is needed.
--
-- Cost: every redis.call and every closure made per call shows in Redis's
-- time per script, so this part makes one call (TIME, plus one GET only
-- with a block) and one closure.

local rate = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local block = tonumber(ARGV[6]) or 0

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- deny answers a denial by the limit and starts the penalty block, if any.
-- n = 0 only reports, so it is never denied and never writes: it can find
-- remaining below 0 after a limit was lowered (limiters that differ only in
-- rate or burst share state), and then reports 0 remaining.
local function deny(remaining, retry, reset)
  if n == 0 then
    if remaining < 0 then remaining = 0 end
    return {0, math.floor(remaining), 0, math.ceil(reset)}
  end
  if block > 0 then
    redis.call('SET', KEYS[2], now + block, 'PX', math.ceil(block / 1000))
    if retry < block then retry = block end
    if reset < block then reset = block end
    remaining = 0
  end
  return {1, math.floor(remaining), math.ceil(retry), math.ceil(reset)}
end

if block > 0 then
  local b = redis.call('GET', KEYS[2])
  if b then
    local left = tonumber(b) - now
    if left > 0 then
      return {2, 0, math.ceil(left), math.ceil(left)}
    end
  end
end

