-- slidinglog.lua: at most rate events in any interval of length period.
-- Exact: the log keeps one sorted-set member per admitted event.
--
-- State: a sorted set; score = the event's admission time in µs; member =
-- "<µs>.<i>", i counting the events admitted in that microsecond, so two
-- events in the same microsecond are two members (a reservation's events
-- end in ".<reservation id>", so that settle.lua can find them).
-- An event admitted at s counts while now < s + period. Denials write
-- nothing: expired members are trimmed only when an event is admitted. The
-- key expires when its newest event leaves the window. Burst is ignored.
-- Tag (for a reservation): the admission time.

S.sl = function(key, rate, period, burst)
  local from = now - period
  local lower = string.format('(%d', from)
  local count = redis.call('ZCOUNT', key, lower, '+inf')
  local newest = nil
  if count > 0 then
    local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    newest = tonumber(last[2])
  end
  local reset_now = 0
  if newest ~= nil then reset_now = newest + period - now end
  local avail = rate - count
  if n > avail then
    -- The (count+n-rate)-th oldest event in the window must leave first.
    local retry = reset_now
    if n <= rate then
      local e = redis.call('ZRANGEBYSCORE', key, lower, '+inf', 'WITHSCORES', 'LIMIT', count + n - rate - 1, 1)
      retry = tonumber(e[2]) + period - now
    end
    return false, avail, retry, reset_now, reset_now
  end
  if n > 0 then
    write('ZREMRANGEBYSCORE', key, '-inf', from)
    local i = redis.call('ZCOUNT', key, now, now)
    local suffix = ''
    if rid ~= '' then suffix = string.format('.%s', rid) end
    local args = {'ZADD', key}
    for k = 1, n do
      args[#args + 1] = now
      args[#args + 1] = string.format('%d.%d%s', now, i, suffix)
      i = i + 1
      if #args >= 1002 or k == n then
        write_args(args)
        args = {'ZADD', key}
      end
    end
    local last = now
    if newest ~= nil and newest > now then last = newest end
    write('PEXPIRE', key, ms(last + period - now))
    return true, avail, 0, reset_now, last + period - now, now
  end
  return true, avail, 0, reset_now, reset_now
end
