-- reply.lua ends every decision script, after the rules' checks: a denial
-- replies without writing; else the queued writes are made, a reservation
-- is recorded, and the reply says what the rules found (see common.lua).

-- pack makes the reply's five integers one string (see common.lua); nil
-- where Redis's struct library is missing: a table then. (rawget: reading
-- a missing global is an error in miniredis.)
local pack = rawget(_G, 'struct')
if pack then pack = pack.pack end

-- skew: 64 when a rule found the caller's clock behind (see common.lua),
-- added to the code; else 0 (or false: the server's TIME).
skew = skew or 0

n = n0
if block < 0 then
  -- A block lasts (decide.lua), -block µs more: the call is denied, told
  -- to retry when the block ends or, if later, when its n fits (the
  -- longest retry among the rules that deny it, which then decides: else
  -- rule 0, the block), and ResetAfter when the block ends or the rules
  -- are full, whichever is later. n = 0 only reports (Remaining 0). The
  -- time left follows, for the fallback's copy of the block (see
  -- rescue.block). A table: a block is rare, and costs no struct.pack.
  local left = -block
  left = left + (-left) % 1 -- rounded up, as every time in the reply
  if reset_denied < left then reset_denied = left end
  reset_denied = reset_denied + (-reset_denied) % 1
  if n == 0 then
    return {skew, 0, 0, reset_denied, 0}
  end
  if retry > left then
    retry = retry + (-retry) % 1
  else
    retry, slowest = left, 0
  end
  return {2 + skew, 0, retry, reset_denied, slowest, left}
end
if denied and n > 0 then
  -- n = 0 only reports: it is never denied (a lowered limit can leave a
  -- rule over its allowance) and never writes.
  -- A prefetch's denial (prefetch.go: its id starts with 'prefetch:') is not a
  -- call's: it sets no block.
  -- The block lasts block: its key holds when it ends. This call is told
  -- to retry then, or when its n would be allowed again if that is later,
  -- so that a client that waits its RetryAfter is not denied again by the
  -- limit; each call during the block is told its own (see above).
  if code == 1 and block > 0 and string.sub(rid, 1, 9) ~= 'prefetch:' then
    if retry < block then retry = block end
    rcall('SET', KEYS[nkeys], now + block, 'PX', ms(block))
    if reset_denied < retry then reset_denied = retry end
    if slowest_reset < retry then slowest_reset = retry end
    min_now = 0
  end
  if min_now < 0 then min_now = 0 end
  -- (Rounded by arithmetic, see common.lua.)
  min_now, retry, reset_denied = min_now - min_now % 1, retry + (-retry) % 1, reset_denied + (-reset_denied) % 1
  -- With several rules or a share, each rule's remaining allowance too
  -- (see decide.lua: with one rule, tags is a table only for a
  -- reservation); the layout for more than 3 rules is cut from one for
  -- 16 (string.sub and unpack cost Redis about 500 instructions each).
  if nrules > 1 or share then
    if nrules == 1 then
      if pack then return pack('<Bi8i8i8Bi8', code + skew, min_now, retry, reset_denied, slowest, rid == '' and tags or tags[1]) end
      return {code + skew, min_now, retry, reset_denied, slowest, rid == '' and tags or tags[1]}
    end
    -- Several rules: the deciding rule's own reset first (see decide.lua).
    slowest_reset = slowest_reset + (-slowest_reset) % 1
    if pack then
      if nrules == 2 then return pack('<Bi8i8i8Bi8i8i8', code + skew, min_now, retry, reset_denied, slowest, slowest_reset, tags[1], tags[2]) end
      if nrules == 3 then return pack('<Bi8i8i8Bi8i8i8i8', code + skew, min_now, retry, reset_denied, slowest, slowest_reset, tags[1], tags[2], tags[3]) end
      return pack(string.sub('<Bi8i8i8Bi8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8', 1, 11 + 2 * nrules), code + skew, min_now, retry, reset_denied, slowest, slowest_reset, unpack(tags, 1, nrules))
    end
    return {code + skew, min_now, retry, reset_denied, slowest, slowest_reset, unpack(tags, 1, nrules)}
  end
  if pack then
    return pack('<Bi8i8i8B', code + skew, min_now, retry, reset_denied, slowest)
  end
  return {code + skew, min_now, retry, reset_denied, slowest}
end
if n == 0 then
  if min_now < 0 then min_now = 0 end
  min_now, delay, reset_denied = min_now - min_now % 1, delay + (-delay) % 1, reset_denied + (-reset_denied) % 1
  if nrules > 1 or share then
    if nrules == 1 then
      if pack then return pack('<Bi8i8i8Bi8', skew, min_now, delay, reset_denied, fewest, rid == '' and tags or tags[1]) end
      return {skew, min_now, delay, reset_denied, fewest, rid == '' and tags or tags[1]}
    end
    fewest_reset = fewest_reset + (-fewest_reset) % 1
    if pack then
      if nrules == 2 then return pack('<Bi8i8i8Bi8i8i8', skew, min_now, delay, reset_denied, fewest, fewest_reset, tags[1], tags[2]) end
      if nrules == 3 then return pack('<Bi8i8i8Bi8i8i8i8', skew, min_now, delay, reset_denied, fewest, fewest_reset, tags[1], tags[2], tags[3]) end
      return pack(string.sub('<Bi8i8i8Bi8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8', 1, 11 + 2 * nrules), skew, min_now, delay, reset_denied, fewest, fewest_reset, unpack(tags, 1, nrules))
    end
    return {skew, min_now, delay, reset_denied, fewest, fewest_reset, unpack(tags, 1, nrules)}
  end
  if pack then
    return pack('<Bi8i8i8B', skew, min_now, delay, reset_denied, fewest)
  end
  return {skew, min_now, delay, reset_denied, fewest}
end

if writes then
  local i, last = 1, nw
  while i < last do
    local c = writes[i]
    rcall(unpack(writes, i + 1, i + c))
    i = i + c + 1
  end
end
if min_after < 0 then min_after = 0 end
min_after, delay, reset_ok = min_after - min_after % 1, delay + (-delay) % 1, reset_ok + (-reset_ok) % 1
if rid == '' then
  if nrules > 1 or share then
    if nrules == 1 then
      if pack then return pack('<Bi8i8i8Bi8', skew, min_after, delay, reset_ok, fewest, tags) end
      return {skew, min_after, delay, reset_ok, fewest, tags}
    end
    fewest_reset = fewest_reset + (-fewest_reset) % 1
    if pack then
      if nrules == 2 then return pack('<Bi8i8i8Bi8i8i8', skew, min_after, delay, reset_ok, fewest, fewest_reset, tags[1], tags[2]) end
      if nrules == 3 then return pack('<Bi8i8i8Bi8i8i8i8', skew, min_after, delay, reset_ok, fewest, fewest_reset, tags[1], tags[2], tags[3]) end
      return pack(string.sub('<Bi8i8i8Bi8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8i8', 1, 11 + 2 * nrules), skew, min_after, delay, reset_ok, fewest, fewest_reset, unpack(tags, 1, nrules))
    end
    return {skew, min_after, delay, reset_ok, fewest, fewest_reset, unpack(tags, 1, nrules)}
  end
  if pack then
    return pack('<Bi8i8i8B', skew, min_after, delay, reset_ok, fewest)
  end
  return {skew, min_after, delay, reset_ok, fewest}
end
local reply = {skew, min_after, delay, reset_ok, fewest}
if nrules > 1 then reply[6] = fewest_reset + (-fewest_reset) % 1 end -- the deciding rule's own reset
if rid ~= '' then
  -- The reservation: a member of a sorted set of each rule's state (so
  -- that a Reset of a rule's state, by whichever limiter, forgets it for
  -- that rule), scored by when it lapses, so that settle.lua finds it
  -- once, and lapsed ones are dropped here.
  local life = (ARGV[7] or 0) + 0
  for i = 1, nrules do
    local rkey = KEYS[nkeys + i]
    -- Lapsed ones have the lowest scores; at most 16 go per call (one
    -- comes), so that a call never clears a backlog at once: 360,000
    -- reservations left to lapse took one reserve 102 ms.
    local lapsed = rcall('ZCOUNT', rkey, '-inf', now)
    if lapsed > 0 then
      if lapsed > 16 then lapsed = 16 end
      rcall('ZREMRANGEBYRANK', rkey, 0, lapsed - 1)
    end
    rcall('ZADD', rkey, now + life * 1000, rid)
    -- Limiters that share the state share the set: its life only grows,
    -- so that a shorter one does not end a longer one's.
    if rcall('PTTL', rkey) < life then rcall('PEXPIRE', rkey, life) end
    reply[#reply + 1] = tags[nrules + i]
  end
  if nrules > 1 or share then
    for i = 1, nrules do reply[#reply + 1] = tags[i] end
  end
end
return reply
