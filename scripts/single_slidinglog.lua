-- single_slidinglog.lua: a sliding log of one rule written in, the usual
-- call only: the decision of the general script (common.lua,
-- slidinglog.lua, args.lua, decide.lua, check.lua, reply.lua) for one rule
-- with no penalty block and no reservation, a priority share or none, written out
-- in one chunk, as single_bucket.lua is for a bucket (see there why).
-- Same state, same writes, same reply: a reservation on the same key runs
-- the general script (specialisedRunner in runner.go).
-- TestSingleScriptDecidesAsGeneral holds them to the same Results and the
-- same state.
--
-- Before this file, scripts.go writes the rule in, then single_args.lua
-- (which reads n and now, and takes the server's TIME when now is 0):
--   local key, rate, period, burst, leaky, pxs = KEYS[1], <rate>, <µs>, <burst>, false, '<ms>'
-- (burst and leaky unused; pxs: the usual PX, one period and a ms, as a
-- string: see slidinglog.lua).
--
-- KEYS[1]  the log's state key (see slidinglog.lua for the state)
-- ARGV     as common.lua's, up to ARGV[3]: n, 1, now in µs or 0 (the
--          server's TIME); trailing defaults left out (ARGV[4], a max
--          delay, is not read: it bounds only a leaky bucket's Delay; the
--          runner sends no block or reservation); a priority share
--          as single_args.lua reads it
-- Reply: common.lua's five integers (code, remaining, delay 0 or retry
--   after, reset after, rule 1), and with a share a sixth, the rule's
--   whole remaining allowance before the call, packed in one string
--   where Redis has its struct library, else an array.
-- (single_reply.lua, which follows this file, replies.)


-- score returns the admission time of member m (slidinglog.lua's score).
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

-- A priority share (single_args.lua): the rule counts share_c of its rate.
local kept = 0
if shared then kept, rate = rate - share_c, share_c end

-- The check (check_sl).
local count = rcall('ZCOUNT', key, string.format('(%d', now - period), '+inf')
local newest, newest_member = nil, nil
if count > 0 then
  newest_member = rcall('ZREVRANGE', key, '0', '0')[1]
  newest = score(newest_member)
end
local reset_now = 0
if newest ~= nil then reset_now = newest + period - now end
local avail = rate - count
-- code, remaining, retry after, reset after (common.lua).
local code, rem, wait, reset = 0, avail, 0, reset_now
if n > avail then
  if n > 0 then
    -- The (count+n-rate)-th oldest event in the window must leave first:
    -- the (rate-n)-th newest (see check_sl).
    code, wait = 1, reset_now
    if n <= rate then
      local r = rate - n
      wait = score(rcall('ZREVRANGE', key, r, r)[1]) + period - now
    end
    if wait < -1 then wait = -1 end -- (reply.lua's retry starts at -1)
  end
elseif n > 0 then
  local nowstr = string.format('%d', now)
  local i = 0
  if newest ~= nil and newest >= now then
    local m = newest_member
    if newest > now then
      -- The clock went back: find the newest member of this microsecond.
      m = rcall('ZREVRANGEBYSCORE', key, nowstr, nowstr, 'LIMIT', '0', '1')[1]
    end
    if m then
      -- The index after m's (slidinglog.lua's next_index).
      i = 1
      local c = string.find(m, ':', 1, true)
      if c then
        local digits = tonumber(string.sub(m, c + 1, c + 1))
        local j = digits and tonumber(string.sub(m, c + 2, c + 1 + digits))
        if j then i = j + 1 end
      end
    end
  end
  -- Expired events go by rank, at most 2n + 64 a call (see check_sl).
  local expired = rcall('ZCARD', key) - count
  if expired > 0 then
    local cell = (period - period % 8) / 8
    if expired >= 64 or newest == nil or newest - newest % cell ~= now - now % cell then
      local k = 2 * n + 64
      if expired < k then k = expired end
      rcall('ZREMRANGEBYRANK', key, '0', k - 1)
    end
  end
  if n == 1 and i == 0 then
    rcall('ZADD', key, nowstr, nowstr)
  else
    -- Members of index i and on (slidinglog.lua's member), in ZADDs of
    -- at most 500.
    local args = {'ZADD', key}
    for k = 1, n do
      local mb = nowstr
      if i > 0 then
        local digits = 1
        while i >= 10 ^ digits do digits = digits + 1 end
        mb = string.format('%s:%d%d', nowstr, digits, i)
      end
      args[#args + 1] = nowstr
      args[#args + 1] = mb
      i = i + 1
      if #args >= 1002 or k == n then
        rcall(unpack(args))
        args = {'ZADD', key}
      end
    end
  end
  local last = now
  if newest ~= nil and newest > now then last = newest end
  -- The expiry cell (slidinglog.lua's sl_cell).
  local cell = (period - period % 64) / 64
  if cell < 1000 then cell = 1000 end
  if newest == nil or newest > now or newest - newest % cell ~= now - now % cell then
    -- A period, a cell and a ms from the newest event (see check_sl).
    local px = pxs
    if last > now then
      px = (last + period + cell - now) / 1000
      px = px + (-px) % 1
      if px < 1 then px = 1 end
      px = px + 1
    end
    rcall('PEXPIRE', key, px)
  end
  rem, reset = avail - n, last + period - now
end

if rem < 0 then rem = 0 end
if reset < 0 then reset = 0 end
rem, wait, reset = rem - rem % 1, wait + (-wait) % 1, reset + (-reset) % 1
