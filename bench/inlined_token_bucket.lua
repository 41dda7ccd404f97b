-- inlined_token_bucket.lua is not a limiter: it is redlimit's token bucket
-- written out without the engine, for `compare -ceiling` to measure what
-- the engine costs Redis (the row "token bucket inlined (no engine)").
-- It does what the library's script does on its common path, with the same
-- storage and the same arithmetic (scripts/bucket.lua): the integer form of
-- the state (D rounded up to M * 10^E, the write time in µs modulo 10^10)
-- while the key lives at most 83 minutes, else its text form "<D>:<t>",
-- n >= 1, no max delay, block or reservation, the clock never going back.
-- Not covered: the text form after a refund, a leaky bucket's delay, a
-- Policy's other rules.
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
  local elapsed, d0
  local sep = string.find(v, ':', 1, true)
  if sep then -- "<D>:<t>", a key that lives past 83 minutes
    d0 = tonumber(string.sub(v, 1, sep - 1))
    elapsed = now - tonumber(string.sub(v, sep + 1))
  else
    local len = #v
    local me = tonumber(string.sub(v, 1, len - 10)) -- M * 10 + E
    local e = me % 10
    d0 = (me - e) / 10 * 10 ^ e
    elapsed = (now - tonumber(string.sub(v, len - 9))) % 10000000000
  end
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
local value = string.format('%.17g:%d', after, now)
if ttl <= 5000000000 then
  local e, p = 0, 1
  while after > 92233719 * p do e, p = e + 1, p * 10 end
  local m = after
  if e > 0 then m = math.ceil(after / p) end
  if e > 0 and math.ceil(m * p / rate) > ttl then ttl = math.ceil(m * p / rate) end
  value = string.format('%d%010d', m * 10 + e, now % 10000000000)
end
redis.call('SET', key, value, 'PX', math.ceil(ttl / 1000))
return {0, avail - n, 0, life, 1}
