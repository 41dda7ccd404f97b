-- settle.lua ends the settle script (common.lua, the strategies' parts,
-- rules.lua, this): it settles a reservation that reply.lua recorded, once.
--
-- KEYS and ARGV as in common.lua, with n = 0, no block: ARGV[5] is
-- instead the most entries a charge adds to each sliding log (see
-- adjust.sl), ARGV[6] the reservation id and ARGV[7] the events really
-- used; then, after the rules, ARGV[8+4k] the events reserved and
-- ARGV[9+4k ..] each rule's tag from the reservation's reply. What the
-- reply reports (see below) may follow: ARGV[9+5k] m, the number of the
-- key's rules now when they are not the reservation's (WithLimitFunc,
-- WithRulesFunc), then their arguments as a rule's (ARGV[10+5k ..]),
-- with their state keys after the reservations' (KEYS[2k+1 .. 2k+m]);
-- and last in KEYS, the penalty block key of the key's rules now (with
-- WithBlock).
--
-- used < reserved gives back the difference, but never more than was taken
-- and never past what still counts: a window only while it is the current
-- one (the sliding counter's also while it is the previous one, weighted),
-- the sliding log only the reservation's own entries still in the log, a
-- bucket only the reservation's tokens that the refill cannot have paid
-- back yet (see adjust.tb: never refill that already happened, never above
-- full), a warming bucket its stored permits and their cost, as time only
-- from its own time still to come (see adjust_warm). used > reserved
-- charges the difference even past the limit: the key owes it, and later
-- calls are denied until it is paid back: a
-- bucket's debt beyond burst by the refill, a fixed window's count beyond
-- rate by the window's end (it goes with the window), a sliding counter's
-- by the next window as its weight falls, a sliding log's by its entries
-- leaving (it owes at most one full window, and is charged at most
-- ARGV[5] entries, see adjust.sl). reserve.go bounds used where these
-- states need it (checkUsed).
--
-- Reply: {-1} when the reservation is unknown: settled already, lapsed,
-- never recorded, or forgotten by a Reset of every rule's state (nothing
-- changes); else the state after settling, as a decision with n = 0
-- replies (its five integers, and with several rules the deciding rule's
-- own reset) under the key's rules now (the m rules, or else the
-- reservation's) and its block: nothing left while a block lasts.

local used = tonumber(ARGV[7])
local base = 8 + 4 * nrules
local reserved = tonumber(ARGV[base])
-- reported(j) is the key, code, rate, period, burst and per-call mark of
-- rule j of the rules the reply reports, m of them: the key's rules now.
local m = tonumber(ARGV[base + nrules + 1]) or 0
local function reported(j)
  if m == 0 then return KEYS[j], rule(j) end
  local a = base + nrules - 2 + 4 * j
  local code = ARGV[a]
  local per_call = string.byte(code) == STAR
  if per_call then code = string.sub(code, 2) end
  return KEYS[2 * nrules + j], code, ARGV[a + 1] + 0, ARGV[a + 2] + 0, ARGV[a + 3] + 0, per_call
end
-- A calendar rule's window is checked before anything is written (see
-- calendar.lua): a miss is an error, and the caller settles again.
for i = 1, nrules do
  local strat, _, period, burst = rule(i)
  if strat == 'cw' then cw_window(period, burst) end
end
for j = 1, m do
  local _, strat, _, period, burst = reported(j)
  if strat == 'cw' then cw_window(period, burst) end
end
-- KEYS[nrules + i]: rule i's reservations. A rule whose set no longer has
-- the reservation had its state reset since (by any limiter on it): that
-- rule is not settled.
local held, lapses = {}, nil
for i = 1, nrules do
  local s = redis.call('ZSCORE', KEYS[nrules + i], rid)
  if s then
    redis.call('ZREM', KEYS[nrules + i], rid)
    held[i], lapses = true, s
  end
end
if not lapses or tonumber(lapses) <= now then return {-1} end
local delta = used - reserved

local adjust = {}
adjust.fw = function(key, rate, period, tag)
  local cw = math.floor(now / period)
  local count, w = fw_read(key, cw)
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
  local cur, prev, w = sc_read(key, cw)
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
  -- A period and a ms, as slidinglog.lua's expiry: an event admitted
  -- later in this ms leaves it as it is.
  local ttl = redis.call('PTTL', key)
  if ttl <= ms(period) then redis.call('PEXPIRE', key, ms(period) + 1) end
end
adjust.tb = function(key, rate, period, tag, taken)
  local d, lag, _, y, w = bucket_read(key, rate)
  if delta < 0 then
    -- The reservation's events are, in the raw queue (see bucket.lua),
    -- the taken events from its tag on: left is what the refill has still
    -- to pass to their end, rounded down with the tag. Past the earliest
    -- gap (W) the refill may be up to Y - D further on. What it has not
    -- passed of them is theirs to give back, never refill that happened
    -- (a reservation recorded without its tag, 0, gives back nothing).
    local t = now + lag
    local left = (tag - t) * rate + taken * period
    if w and t >= w then left = left - (y - d) end
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

local d0 = delta
for i = 1, nrules do
  local strat, rate, period, burst, per_call = rule(i)
  delta = d0
  local taken = reserved
  if per_call then
    -- A per-call rule took one event: it keeps it if anything was used.
    delta, taken = 0, 1
    if used == 0 then delta = -1 end
  end
  if delta ~= 0 and held[i] then
    local fn = adjust[strat] or adjust_warm
    fn(KEYS[i], rate, period, tonumber(ARGV[base + i]), taken, strat, burst)
  end
end

-- The state after settling, as n = 0 reports it (check.lua, reply.lua):
-- under the reported rules; during a block, nothing left, the reset not
-- before the block's end, and no rule deciding.
local nr = m
if nr == 0 then nr = nrules end
local counts = m == 0 and counting
for j = 1, m do
  local _, _, _, _, _, per_call = reported(j)
  if not per_call then counts = true end
end
local min_now, reset, fewest, delay, own = nil, 0, 1, 0, 0
local nexts = {}
for j = 1, nr do
  local key, strat, rate, period, burst, per_call = reported(j)
  local ok, avail, w, reset_now, reset_next, _, _, slot = check_by_code[strat](key, rate, period, burst, strat)
  if slot then slot[11], slot[12] = j, per_call and counts end
  nexts[j] = reset_next
  if ok and w > delay then delay = w end -- a leaky bucket's queue ahead
  if per_call and counts and avail >= 1 then avail = 2 ^ 53 end -- see check.lua
  if min_now == nil or avail < min_now then min_now, fewest, own = avail, j, reset_next end
  if reset_now > reset then reset = reset_now end
end
if #KEYS > 2 * nrules + m then
  local b = redis.call('GET', KEYS[#KEYS])
  if b and b - now > 0 then
    if reset < b - now then reset = b - now end
    return {0, 0, 0, math.ceil(reset), 0}
  end
end
-- A policy's leaky rules: each holds only what fits behind the longest
-- queue (see slots.lua).
if writes and writes.lb then
  local p = writes.lb
  local q = 0
  local r = p
  while r do
    if r[13] > q then q = r[13] end
    r = r[15]
  end
  r = p
  while r do
    if q > r[13] then
      local d = (q - r[5]) * r[6]
      if d < r[2] then d = r[2] end
      local room = floor_div(r[8] - d, r[7])
      if r[12] and room >= 1 then room = 2 ^ 53 end
      if room < min_now then min_now, fewest, own = room, r[11], nexts[r[11]] end
    end
    r = r[15]
  end
end
if min_now < 0 then min_now = 0 end
if nr > 1 then -- the deciding rule's own reset, as reply.lua adds it
  return {0, math.floor(min_now), math.ceil(delay), math.ceil(reset), fewest, math.ceil(own)}
end
return {0, math.floor(min_now), math.ceil(delay), math.ceil(reset), fewest}
