-- slidinglog.lua: at most rate events in any interval of length period.
-- Exact: the log keeps one sorted-set member per admitted event.
--
-- State: a sorted set; score = the event's admission time in µs; member =
-- "<µs>" for the first event admitted in that microsecond and "<µs>:<L><i>"
-- for the i-th after it (i >= 1, L its number of digits), so that two events
-- in the same microsecond are two members. Redis orders equal scores by
-- member, bytewise, and that order is the order of i ("<µs>" first, then
-- L, then i's digits): the newest member, which the check reads anyway,
-- tells the next i, and no ZCOUNT of the microsecond is needed. A
-- reservation's events end in ".<reservation id>" (the first as
-- "<µs>:10.<id>"), so that settle.lua can find them.
-- An event admitted at s counts while now < s + period. Denials write
-- nothing. Expired members are trimmed when an event is admitted, at most
-- 2n + 64 of them, once 64 are behind or when the newest one was in
-- another eighth of a period (cells of period / 8 µs), or there is none in
-- the window: the decisions never depend on the trim. Besides the
-- window's events the set holds fewer than 64 expired ones, or those of
-- less than period / 8 before the window, or a backlog left by events
-- that left the window together, which each admission shrinks by at least
-- n + 64. The key's expiry is set by an admission whose newest event was
-- in another expiry cell (cells of max(period / 64, 1000) µs, sl_cell):
-- one period, one cell and a ms ahead, so that it outlives by a ms every
-- event admitted in the same cell, which leaves it as it is (an expiry a
-- call for a hot log would be a write a call, and one to every replica).
-- The key outlives its newest event's window by at most a cell and two
-- ms; the ms more keeps an event counted where a key expires at exactly
-- its write time plus PX (miniredis; Redis expires it at the end of that
-- ms).
-- Burst is ignored. Tag (for a reservation): the admission time.

-- member returns the member of the event of index i admitted at nowstr.
local function member(nowstr, i)
  if i == 0 and rid == '' then return nowstr end
  local digits = 1
  while i >= 10 ^ digits do digits = digits + 1 end
  if rid == '' then return string.format('%s:%d%d', nowstr, digits, i) end
  return string.format('%s:%d%d.%s', nowstr, digits, i, rid)
end

-- score returns the admission time of member m: the digits it starts with
-- (so that the check reads members without WITHSCORES, whose replies cost
-- Redis a '%.17g' conversion each).
local function score(m)
  local d = string.find(m, '.', 1, true)
  if d == nil then
    local t = tonumber(m)
    if t then return t end
  end
  local c = string.find(m, ':', 1, true)
  if c == nil or (d ~= nil and d < c) then c = d end
  return tonumber(string.sub(m, 1, c - 1))
end

-- sl_cell returns the expiry cell of a log of the given period, in µs (see
-- above; usualPX in scripts.go writes the usual PX with the same cell).
local function sl_cell(period)
  local c = (period - period % 64) / 64
  if c < 1000 then return 1000 end
  return c
end

-- next_index returns the index after that of member m, the newest of its
-- microsecond: 1 after "<µs>" (or a member of another form).
local function next_index(m)
  local c = string.find(m, ':', 1, true)
  if c then
    local digits = tonumber(string.sub(m, c + 1, c + 1))
    local i = digits and tonumber(string.sub(m, c + 2, c + 1 + digits))
    if i then return i + 1 end
  end
  return 1
end

local function check_sl(key, rate, period, burst, code, pxs)
  local from = now - period
  local lower = string.format('(%d', from)
  local count = rcall('ZCOUNT', key, lower, '+inf')
  local newest, newest_member = nil, nil
  if count > 0 then
    -- From the end: a skiplist's tail, where ZRANGE -1 -1 looks the
    -- rank up from the head (O(log N); 0.37 against 0.22 us a call on a
    -- log of 40,000 events).
    newest_member = rcall('ZREVRANGE', key, '0', '0')[1]
    newest = score(newest_member)
  end
  local reset_now = 0
  if newest ~= nil then reset_now = newest + period - now end
  local avail = rate - count
  if n > avail then
    -- The (count+n-rate)-th oldest event in the window must leave first.
    -- The window's events are the newest count in the set, so that event
    -- is the (rate-n)-th newest (from 0), which ZREVRANGE finds by rank,
    -- in O(log N), where ZRANGEBYSCORE ... LIMIT walks the events before
    -- it: after a lowered limit (count far over rate) each denial held
    -- Redis for the walk.
    local retry = reset_now
    if n <= rate then
      local r = rate - n
      local e = rcall('ZREVRANGE', key, r, r)
      retry = score(e[1]) + period - now
    end
    return false, avail, retry, reset_now, reset_now
  end
  if n > 0 then
    -- One string for now, the score and (usually) the member: Redis 7.0
    -- converts a number argument with '%.17g', which costs more.
    local nowstr = string.format('%d', now)
    local i = 0
    if newest ~= nil and newest >= now then
      local m = newest_member
      if newest > now then
        -- The clock went back: find the newest member of this microsecond.
        m = rcall('ZREVRANGEBYSCORE', key, nowstr, nowstr, 'LIMIT', '0', '1')[1]
      end
      if m then i = next_index(m) end
    end
    -- Expired events are the lowest scores (the window's are the newest
    -- count): they go by rank, at most 2n + 64 a call, so that no call
    -- removes a large batch at once (100,000 events leaving the window
    -- together took one trim of them all 24.8 ms), and an admission takes
    -- away more than it adds. They go once 64 are behind, or when the
    -- newest event was in another eighth of a period (cells of period / 8
    -- µs), so that a slow log keeps few.
    local expired = rcall('ZCARD', key) - count
    if expired > 0 then
      local cell = (period - period % 8) / 8
      if expired >= 64 or newest == nil or newest - newest % cell ~= now - now % cell then
        local k = 2 * n + 64
        if expired < k then k = expired end
        write('ZREMRANGEBYRANK', key, '0', k - 1)
      end
    end
    if n == 1 then
      write('ZADD', key, nowstr, member(nowstr, i))
    else
      local args = {'ZADD', key}
      for k = 1, n do
        args[#args + 1] = nowstr
        args[#args + 1] = member(nowstr, i)
        i = i + 1
        if #args >= 1002 or k == n then
          if write_args then write_args(args) else rcall(unpack(args)) end
          args = {'ZADD', key}
        end
      end
    end
    local last = now
    if newest ~= nil and newest > now then last = newest end
    local cell = sl_cell(period)
    if newest == nil or newest > now or newest - newest % cell ~= now - now % cell then
      -- One period and one cell from the newest event, and a ms more (see
      -- above). So at least 2 ms, as it must be: Redis 7.0's PEXPIRE
      -- deletes the key at once when the expiry is not after its clock,
      -- which it reads twice, so PEXPIRE 1 can delete the log when a ms
      -- ticks in between (SET PX has no such check). pxs (see common.lua)
      -- is the usual one, as a string (usualPX in scripts.go).
      local px = pxs
      if not px or last > now then
        px = ms(last + period + cell - now) + 1
      end
      write('PEXPIRE', key, px)
    end
    return true, avail, 0, reset_now, last + period - now, now
  end
  return true, avail, 0, reset_now, reset_now
end
