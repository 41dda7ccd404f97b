-- concurrency.lua: leases of a concurrency limit (see concurrency.go). It is
-- a script of its own, not a part of the decision scripts (common.lua).
--
-- State: one sorted set per limited key; member = a lease id (random, from
-- the client), score = the lease's expiry in µs on the script's clock. A
-- lease is live while now < score. Live leases are counted by score
-- (ZCOUNT), so a holder that crashed gives its slot back when its lease's
-- ttl ends, with nobody cleaning up; expired ones, the lowest scores, are
-- removed at most 16 a call (clearing 100,000 that expired together took
-- one acquire 24.5 ms), and until then they are skipped by rank and never
-- extended.
-- Every acquire and extend sets the key's PEXPIRE to the latest expiry in
-- the set (not only on the first acquire: a key that expired while a later
-- lease was live would forget that lease and over-admit).
--
-- The key's time: scores are on the clock of the call that wrote them, and
-- with a client clock (ARGV[3] > 0) instances may disagree, by seconds
-- after a step of the server's clock between their measurements; the one
-- ahead would then count the other's live leases as expired. But the
-- key's expiry runs on the server's own clock, set to the latest expiry
-- less the writer's now: the latest score less PTTL is the writer's now,
-- as of this moment (to a ms or two). A call whose now disagrees with that
-- by more than 100 ms decides on it instead, so that every instance counts
-- the leases on the one clock their scores are on, and the reply's code
-- has 64 added (concurrency.go then measures its clock again). Releasing
-- the latest lease keeps that time (the expiry follows the new latest).
-- With the server's TIME, one clock, none of this is needed. A step of
-- the server's clock moves the key's expiry and so its time: the leases
-- then end as much earlier (stepped forward) or later, as every key's
-- expiry does.
--
-- KEYS[1]  the lease set: <prefix>:{<key>}:cc
-- ARGV[1]  op: 1 acquire, 2 extend, 3 release
-- ARGV[2]  lease id (the member)
-- ARGV[3]  now in µs on the caller's clock, or 0: use the server's TIME
--          (a release takes no time: 1 with the caller's clock, else 0)
-- ARGV[4]  max: live leases allowed at once (1 to 100,000)
-- ARGV[5]  ttl in µs (>= 1000): a lease lives this long after its acquire
--          or its last extend
-- ARGV[6]  an acquire of a priority with a share (WithPriorityShares): the
--          slots it may fill, floor(share × max); absent: max
--
-- Reply: an array of four integers, times in µs, rounded up:
--   [1] code: 0 done (acquired, extended, released), 1 denied: no free slot
--       (acquire), 4 no such lease: expired or released (extend, release),
--       5 denied by the share (ARGV[6]) only: a slot of max is free;
--       plus 64 when now (ARGV[3]) disagreed with the key's time
--   [2] free slots after the call (>= 0)
--   [3] when denied: the retry after, until enough leases expire for one
--       slot to be free; else 0
--   [4] reset after: until the latest live lease expires (every slot free
--       with no more traffic); 0 when none is live
--
-- Numbers: scores are integer µs, exact in a Lua double (below 2^53); they
-- reach redis.call as numbers, which Redis formats exactly (%.17g), and are
-- never turned into strings here.

local key = KEYS[1]
local op = tonumber(ARGV[1])
local id = ARGV[2]
local now = tonumber(ARGV[3])
local limit = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])

-- ms returns a PX lifetime for d µs: rounded up, never 0.
local function ms(d)
  local v = math.ceil(d / 1000)
  if v < 1 then v = 1 end
  return v
end

-- latest returns the latest expiry in the set, or nil when it is empty,
-- and its member.
local function latest()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if #last == 0 then return nil end
  return tonumber(last[2]), last[1]
end

if op == 3 then
  -- Release needs no clock: removing a lease that already expired is
  -- harmless. With the server's TIME the key's expiry stays at or past
  -- its latest lease's. With a client clock, removing the latest lease
  -- sets the expiry to the new latest as of the key's time (see above),
  -- which it keeps; when none is live at that time the key goes (an
  -- expiry left at the released lease's would put the key's time early,
  -- and bring expired leases back); others leave it.
  local l, last
  if now > 0 then l, last = latest() end
  local left = -1
  if last == id then left = redis.call('PTTL', key) end -- -1: no expiry (set by hand)
  if left < 0 then
    if redis.call('ZREM', key, id) == 0 then return {4, 0, 0, 0} end
    return {0, 0, 0, 0}
  end
  local at = l - left * 1000
  redis.call('ZREM', key, id)
  l = latest()
  if l ~= nil and at < l then
    redis.call('PEXPIRE', key, ms(l - at))
  else
    redis.call('DEL', key)
  end
  return {0, 0, 0, 0}
end

local skew = 0
if now <= 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
else
  local l = latest()
  if l ~= nil then
    local left = redis.call('PTTL', key) -- -1: no expiry (set by hand)
    local at = l - left * 1000
    if left >= 0 and (now - at > 100000 or at - now > 100000) then now, skew = at, 64 end
  end
end

local count = redis.call('ZCOUNT', key, string.format('(%d', now), '+inf')
local expired = redis.call('ZCARD', key) - count
if expired > 0 then
  local k = math.min(expired, 16)
  redis.call('ZREMRANGEBYRANK', key, 0, k - 1)
  expired = expired - k
end

if op == 2 then
  local s = redis.call('ZSCORE', key, id)
  if s == false or tonumber(s) <= now then
    if s then redis.call('ZREM', key, id) end -- expired: never brought back
    local reset = 0
    local l = latest()
    if l ~= nil and l > now then reset = l - now end
    return {4 + skew, math.max(limit - count, 0), 0, reset}
  end
  redis.call('ZADD', key, 'XX', now + ttl, id)
  local l = latest()
  redis.call('PEXPIRE', key, ms(l - now))
  return {skew, math.max(limit - count, 0), 0, l - now}
end

local code = 1
if ARGV[6] then -- the call's share: its slots are the limit it sees
  if count < limit then code = 5 end
  limit = tonumber(ARGV[6])
end
if count >= limit then
  -- count - limit + 1 leases must expire for a slot to be free: the one at
  -- rank count - limit among the live ones (0-based, by expiry, after the
  -- expired still kept) is the last of them. count > limit happens only
  -- after max was lowered (a rolling deploy), or with a share.
  local r = expired + count - limit
  local e = redis.call('ZRANGE', key, r, r, 'WITHSCORES')
  local retry = tonumber(e[2]) - now
  return {code + skew, 0, retry, latest() - now}
end

redis.call('ZADD', key, now + ttl, id)
local l = latest()
redis.call('PEXPIRE', key, ms(l - now))
return {skew, limit - count - 1, 0, l - now}
