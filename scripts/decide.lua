-- decide.lua ends every decision script (after the rules' part, rules.lua
-- or its written-in equivalent): it checks every rule, then writes
-- only if all of them allow (a denial writes nothing, in any rule), records
-- a reservation, and replies (see common.lua).

local nkeys = nrules
if block > 0 then
  nkeys = nkeys + 1
  local b = redis.call('GET', KEYS[nkeys])
  if b then
    local left = tonumber(b) - now
    if left > 0 then
      if n == 0 then -- n = 0 only reports: never denied
        return {0, 0, 0, math.ceil(left), 0}
      end
      return {2, 0, math.ceil(left), math.ceil(left), 0}
    end
  end
end

local n0 = n -- the call's n; a per-call rule counts min(n, 1) instead
local HUGE = 2 ^ 53
local denied, code = false, 0
local min_now, min_after, fewest = nil, nil, 1
local delay, reset_ok, reset_denied = 0, 0, 0
local retry, slowest = -1, 1
local tags -- only for a reservation
if rid ~= '' then tags = {} end
for i = 1, nrules do
  local strat, rate, period, burst, per_call = rule(i)
  n = n0
  if per_call and n > 1 then n = 1 end
  local ok, avail, w, reset_now, reset_next, tag, why = S[strat](KEYS[i], rate, period, burst, strat)
  if tags then tags[i] = tag or 0 end
  local after = avail - n
  if per_call and counting then
    -- Remaining counts the call's units (n): a per-call rule limits it
    -- only when it has no call left.
    if avail >= 1 then avail = HUGE end
    if after >= 1 then after = HUGE end
  end
  if min_now == nil or avail < min_now then min_now = avail end
  if min_after == nil or after < min_after then min_after, fewest = after, i end
  if reset_now > reset_denied then reset_denied = reset_now end
  if ok then
    if w > delay then delay = w end
    if reset_next > reset_ok then reset_ok = reset_next end
  else
    denied = true
    if why == 3 then
      if code == 0 then code = 3 end
    else
      code = 1
    end
    if w > retry then retry, slowest = w, i end
  end
end

n = n0
if denied and n > 0 then
  -- n = 0 only reports: it is never denied (a lowered limit can leave a
  -- rule over its allowance) and never writes.
  -- A lease's denial (lease.go: its id starts with 'lease:') is not a
  -- call's: it sets no block.
  if code == 1 and block > 0 and string.sub(rid, 1, 6) ~= 'lease:' then
    redis.call('SET', KEYS[nkeys], now + block, 'PX', ms(block))
    if retry < block then retry = block end
    if reset_denied < block then reset_denied = block end
    min_now = 0
  end
  if min_now < 0 then min_now = 0 end
  return {code, math.floor(min_now), math.ceil(retry), math.ceil(reset_denied), slowest}
end
if n == 0 then
  if min_now < 0 then min_now = 0 end
  return {0, math.floor(min_now), math.ceil(delay), math.ceil(reset_denied), fewest}
end

if writes then
  local i, last = 1, #writes
  while i < last do
    local c = writes[i]
    redis.call(unpack(writes, i + 1, i + c))
    i = i + c + 1
  end
end
if min_after < 0 then min_after = 0 end
local reply = {0, math.floor(min_after), math.ceil(delay), math.ceil(reset_ok), fewest}
if rid ~= '' then
  -- The reservation: a member of a sorted set scored by when it lapses,
  -- so that settle.lua finds it once, and lapsed ones are dropped here.
  local rkey = KEYS[nkeys + 1]
  local life = tonumber(ARGV[7])
  redis.call('ZREMRANGEBYSCORE', rkey, '-inf', now)
  redis.call('ZADD', rkey, now + life * 1000, rid)
  redis.call('PEXPIRE', rkey, life)
  for i = 1, nrules do reply[5 + i] = tags[i] end
end
return reply
