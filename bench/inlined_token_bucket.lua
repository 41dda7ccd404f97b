-- inlined_token_bucket.lua is not a limiter: it is redlimit's token bucket
-- written out without the engine, for `compare -ceiling` to measure what
-- the engine costs Redis (the row "token bucket inlined (no engine)").
-- It does what the library's script does on its common path, with the same
-- storage and the same arithmetic (scripts/bucket.lua): the integer form of
-- the state, n >= 1, no max delay, block or reservation, the clock never
-- going back. Not covered: the text form of the state, a leaky bucket's
-- delay, a Policy's other rules.
--
-- KEYS[1] the state; ARGV: n, rate, period (µs), burst. Reply as the
-- library's: code, remaining, retry after, reset after, rule.
local n = tonumber(ARGV[1])
local rate, period, burst = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local key = KEYS[1]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local used = 0
local v = redis.call('GET', key)
if v then
  local len = #v
  local me = tonumber(string.sub(v, 1, len - 9))
  local e = me % 10
  local d0 = (me - e) / 10 * 10 ^ e
  local d = (math.floor(now / 1000) - tonumber(string.sub(v, len - 8))) % 1000000000
  local elapsed = d * 1000 + now % 1000
  used = d0 - elapsed * rate
  if used < 0 then used = 0 end
end
local cap = burst * period
local avail = math.floor((cap - used) / period)
local reset_now = math.ceil(used / rate)
local over = used + n * period - cap
if over > 0 then
  return {1, avail, math.ceil(over / rate), reset_now, 1}
end
local after = used + n * period
local life = math.ceil(after / rate)
local ttl = life
if ttl < period then ttl = period end
local at_ms = after + (now % 1000) * rate
local e, p = 0, 1
while at_ms > 99999999 * p do e, p = e + 1, p * 10 end
local m = at_ms
if e > 0 then m = math.ceil(at_ms / p) end
redis.call('SET', key, string.format('%d%d%09d', m, e, math.floor(now / 1000) % 1000000000),
  'PX', math.ceil(ttl / 1000))
return {0, avail - n, 0, life, 1}
