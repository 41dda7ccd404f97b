-- common.lua is prepended to every strategy script (see scripts.go); it is not
-- run on its own. It reads the arguments all strategies share, takes the time
-- from the Redis server, applies a penalty block, and builds the reply.
--
-- KEYS[1]  the strategy's state key (one Redis key per limited key)
-- KEYS[2]  the penalty block key; present only when ARGV[6] > 0. It is built
--          from the same hash tag as KEYS[1], so both are in one cluster slot.
-- ARGV[1]  rate: events allowed per period (integer >= 1)
-- ARGV[2]  period in microseconds (integer >= 1000)
-- ARGV[3]  burst: bucket or queue capacity (integer >= 1)
-- ARGV[4]  n: events asked for (integer >= 0; 0 reports without consuming)
-- ARGV[5]  max delay in microseconds the caller can wait (leaky bucket), -1 = any
-- ARGV[6]  block in microseconds: once denied by the limit, deny everything
--          for this long (0 = off)
--
-- Reply: an array of six integers (Redis truncates Lua floats, so every value
-- is rounded here, and times are rounded up):
--   [1] allowed (1 or 0)
--   [2] remaining events that could still be allowed now
--   [3] retry after, µs (0 when allowed)
--   [4] reset after, µs: until the key is back at its full allowance
--   [5] delay, µs: how long to wait before acting (leaky bucket), else 0
--   [6] reason: 0 allowed, 1 denied by the limit, 2 denied by a block,
--       3 denied because the wait would exceed the max delay
--
-- Numbers: Lua numbers are doubles. Times are integer microseconds (below
-- 2^53 until the year 2255). Numbers are never turned into strings with
-- tostring or '..' (that keeps only 14 digits); redis.call converts them
-- exactly, and string.format('%d') is used where a string is needed.

local rate = tonumber(ARGV[1])
local period = tonumber(ARGV[2])
local burst = tonumber(ARGV[3])
local n = tonumber(ARGV[4])
local max_delay = tonumber(ARGV[5])
local block = tonumber(ARGV[6])

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- ttl_ms turns a duration in µs into a TTL in ms: rounded up, never below 1.
local function ttl_ms(us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return ms
end

-- floor_div and ceil_div divide integers exactly (as long as they are below
-- 2^53), correcting the rounding of the floating-point quotient.
local function floor_div(a, b)
  local q = math.floor(a / b)
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function ceil_div(a, b)
  return -floor_div(-a, b)
end

local function allow(remaining, reset, delay)
  return {1, math.floor(remaining), 0, math.ceil(reset), math.ceil(delay), 0}
end

-- deny answers a denial by the limit and starts the penalty block, if any.
local function deny(remaining, retry, reset)
  if block > 0 then
    redis.call('SET', KEYS[2], now + block, 'PX', ttl_ms(block))
    if retry < block then retry = block end
    if reset < block then reset = block end
    remaining = 0
  end
  return {0, math.floor(remaining), math.ceil(retry), math.ceil(reset), 0, 1}
end

if block > 0 then
  local b = redis.call('GET', KEYS[2])
  if b then
    local left = tonumber(b) - now
    if left > 0 then
      return {0, 0, math.ceil(left), math.ceil(left), 0, 2}
    end
  end
end

