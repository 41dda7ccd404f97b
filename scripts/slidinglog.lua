-- slidinglog.lua: at most rate events in any interval of length period.
-- Exact: the log keeps one sorted-set member per admitted event.
--
-- KEYS[1]  sorted set: score = the event's admission time in µs; member =
--          "<µs>.<i>", i counting the events admitted in that microsecond,
--          so two events in the same microsecond are two members.
-- ARGV     see common.lua; burst and max delay are ignored.
-- Reply    see common.lua.
--
-- An event admitted at s counts while now < s + period. Denials write
-- nothing: expired members are trimmed only when an event is admitted. The
-- key expires when its newest event leaves the window.

local from = now - period
local lower = string.format('(%d', from)
local count = redis.call('ZCOUNT', KEYS[1], lower, '+inf')

local newest = nil
if count > 0 then
  local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
  newest = tonumber(last[2])
end

if count + n > rate then
  -- The (count+n-rate)-th oldest event in the window must leave first.
  local e = redis.call('ZRANGEBYSCORE', KEYS[1], lower, '+inf', 'WITHSCORES', 'LIMIT', count + n - rate - 1, 1)
  local retry = tonumber(e[2]) + period - now
  return deny(rate - count, retry, newest + period - now)
end

if n > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', from)
  local i = redis.call('ZCOUNT', KEYS[1], now, now)
  local args = {}
  for k = 1, n do
    args[#args + 1] = now
    args[#args + 1] = string.format('%d.%d', now, i)
    i = i + 1
    if #args >= 1000 or k == n then
      redis.call('ZADD', KEYS[1], unpack(args))
      args = {}
    end
  end
  if newest == nil or newest < now then newest = now end
  redis.call('PEXPIRE', KEYS[1], math.ceil((newest + period - now) / 1000))
end

local reset = 0
if newest ~= nil then reset = newest + period - now end
return {0, rate - count - n, 0, reset}
