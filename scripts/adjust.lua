-- adjust.lua: a settle's (settle.lua) and a region's (region_apply.lua)
-- change of a rule's state by delta events, after the strategies' files:
-- adjust[code](key, rate, period, tag, taken, code, burst) for each
-- strategy code, adjust_warm for a warm-up rule. delta > 0 charges the
-- events even past the limit (the key owes them); delta < 0 gives back
-- events of a reservation (its tag and taken) where they still count.

local delta = 0
-- since: when the reservation a settle gives back was made (µs, the
-- time of its call), from which a bucket bounds the refill that can have
-- paid back its events (adjust.tb); nil for a region's change.
local since
local adjust = {}
adjust.fw = function(key, rate, period, tag)
  local cw = math.floor(now / period)
  local count, w = fw_read(key, cw, period)
  if delta < 0 then
    if w == tag and count > 0 then
      redis.call('DECRBY', key, math.min(-delta, count) * 10)
    end
  elseif count > 0 then
    redis.call('INCRBY', key, delta * 10)
  else
    redis.call('SET', key, delta * 10 + w % 10, 'PX', ms((w + 1) * period - now))
  end
end
adjust.sc = function(key, rate, period, tag)
  local cw = math.floor(now / period)
  local cur, prev, w = sc_read(key, cw, period)
  if delta < 0 then
    if tag == w then
      cur = cur - math.min(-delta, cur)
    elseif tag == w - 1 then
      prev = prev - math.min(-delta, prev)
    else
      return
    end
  else
    cur = cur + delta
  end
  if cur == 0 and prev == 0 then
    redis.call('DEL', key)
  else
    redis.call('SET', key, sc_value(cur, prev, w), 'PX', ms((w + 2) * period - now))
  end
end
adjust.sl = function(key, rate, period, tag)
  local suffix = string.format('.%s', rid)
  if delta < 0 then
    local del = {'ZREM', key}
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, tag, tag)) do
      if #del - 2 >= -delta then break end
      if string.sub(m, -string.len(suffix)) == suffix then del[#del + 1] = m end
    end
    if #del > 2 then redis.call(unpack(del)) end
    return
  end
  -- Entries past the limit: more than rate would add nothing (they all
  -- leave the log together). At most ARGV[5] (MaxSlidingLogN, shared by
  -- the logs that count n: reserve.go's settleLogEntries), as a call
  -- writes at most, so that a settle holds Redis no longer: the rest of
  -- the charge is not the log's (reserve.go's Settle says so).
  local add = math.min(delta, rate, tonumber(ARGV[5]))
  local in_window = redis.call('ZCOUNT', key, string.format('(%d', now - period), '+inf')
  local i = redis.call('ZCOUNT', key, now, now)
  local args = {'ZADD', key}
  for k = 1, add do
    args[#args + 1] = now
    args[#args + 1] = string.format('%d.%d%s', now, i, suffix)
    i = i + 1
    if #args >= 1002 or k == add then
      redis.call(unpack(args))
      args = {'ZADD', key}
    end
  end
  -- The log keeps only its newest rate entries, or as many as the window
  -- held before this charge if more (a limiter with a larger Rate on the
  -- same state, after a plan upgrade, counts them: trimmed to this rate,
  -- 90 of its 100 were lost; it may still see up to this charge's add
  -- fewer, never more, than were used): a decision at this rate reads no further
  -- back (it is allowed only with fewer than rate in the window, and a
  -- denial's retry is the (rate-n)-th newest), and settles charging past
  -- the limit again and again grew the log to rate x 1000 entries (143 MB
  -- at 1,000 an hour, and a 389 ms trim once they left the window). The
  -- key owes at most one full window; a refund finds only its entries
  -- still kept.
  redis.call('ZREMRANGEBYRANK', key, 0, -(math.max(rate, in_window) + 1))
  -- A period, a cell and a ms, as slidinglog.lua's expiry: an event
  -- admitted later in this expiry cell leaves it as it is.
  local px = ms(period + sl_cell(period))
  local ttl = redis.call('PTTL', key)
  if ttl <= px then redis.call('PEXPIRE', key, px + 1) end
end
adjust.tb = function(key, rate, period, tag, taken)
  local d, lag, _, y, w = bucket_read(key, rate)
  if delta < 0 then
    -- The reservation's events are, in the raw queue (see bucket.lua),
    -- the taken events from its tag on: left is what the refill has still
    -- to pass to their end, rounded down with the tag. Past the earliest
    -- gap (W) the refill may be up to Y - D further on. What it has not
    -- passed of them is theirs to give back, never refill that happened.
    -- Taking every gap as passed once the earliest is (W) leaves out
    -- gaps the refill has not reached yet, behind the reservation: alone,
    -- that bound kept events no refill had paid back (130 of 64
    -- goroutines' settles at a Rate of 1 an hour, TestReserveConcurrentRedis).
    -- So a reservation also gets back what it took less the refill since
    -- its call: whatever else the bucket held, the refill cannot have
    -- paid back more of its own events than that (nor, without a tag).
    local t = now + lag
    local left = (tag - t) * rate + taken * period
    if w and t >= w then left = left - (y - d) end
    if since then
      local own = taken * period - (t - since) * rate
      if own > left then left = own end
    end
    local back = math.min(-delta * period, left, d)
    if back <= 0 then return end
    d = d - back
    local behind = y - ((tag - t) * rate + taken * period) -- taken after them, or more
    if behind < period then
      -- No whole event behind them (none taken after this reservation):
      -- the events given back come off the end of the raw queue.
      y = y - back
    else
      -- A gap where they were (rounded down: earlier is safe).
      local g = tag + floor_div(taken * period - back, rate)
      if not w or g < w then w = g end
    end
  else
    d = d + delta * period
    y = y + delta * period
  end
  if y <= 0 then
    redis.call('DEL', key)
  else
    if d < 0 then d = 0 end
    local value, px = bucket_write(d, rate, period, nil, lag, y, w)
    redis.call('SET', key, value, 'PX', px)
  end
end
adjust.lb = adjust.tb
-- A warming bucket (warmup.lua, its code 'wt' or 'wl' and its warm-up): a
-- charge pays forward the cost of the events at what is stored now. A
-- refund of k (in X's units) undoes a take of k at what is stored now:
-- the stored permits come back, and their cost, c = warm_cost(x + k, k)
-- (exactly what the reservation paid for them when nothing came between),
-- comes back as time owed, but only from the reservation's own time still
-- to come (until its tag: never time already passed, nor time other calls
-- owe after it); the rest of c, time that has passed, comes back as the
-- stored permits an idle key would have kept meanwhile (one per stable
-- interval, as warm_read refills). So a Cancel at once leaves the key as
-- it was, one after the reservation's time as an idle key would be, and
-- stored permits only make later calls slower: no capacity is given twice.
-- (A tag of 0, from before tags were kept, gives back no time.)
local function adjust_warm(key, rate, period, tag, _, code)
  local tx = string.sub(code, 3) * rate
  local mx, p2, r2 = 2 * tx, 2 * period, 2 * rate
  local x, f = warm_read(key, rate, mx)
  if delta < 0 then
    local k = -delta * p2
    local top = x + k
    if top > mx then top = mx end
    local c = warm_cost(top, k, tx)
    local back = (tag - now) * r2
    if back > c then back = c end
    if back > f then back = f end
    if back < 0 then back = 0 end
    f = f - back
    x = x + k + (c - back)
    if x > mx then x = mx end
  else
    local k = delta * p2
    f = f + warm_cost(x, k, tx)
    if k > x then x = 0 else x = x - k end
  end
  if f == 0 and x >= mx then
    redis.call('DEL', key)
    return
  end
  redis.call('SET', key, string.format('%d:%d:%d:%d', x, f, now, rate), 'PX', ms(ceil_div(f + mx - x, r2)))
end
-- A sub-window counter (subwindow.lua; its sub-windows in burst's place).
adjust.sw = function(key, rate, period, tag, taken, _, burst)
  check_sw(key, rate, period, burst, tag, delta)
end
adjust.cw = function(key, rate, period, tag, taken, _, burst)
  adjust_cw(key, period, burst, tag, delta)
end
