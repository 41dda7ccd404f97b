-- region_apply.lua ends the region script (common.lua, the strategies'
-- files, args.lua, rules.lua, adjust.lua, this): it charges keys' rules
-- with a peer region's usage, once, however many instances deliver it and
-- however often (see regions.go and docs/regions.md). One call takes a
-- batch of keys of the same rules, in one slot.
--
-- KEYS: for each key of the batch, its rules' state keys, then its peer
-- record (a hash, one field per peer region). ARGV: as a decision's with
-- n = 0 (the rules from ARGV[8]), then at b = 8 + 4k the peer's name, the
-- mode, the peer's share of the limit (parts per million), the journal's
-- life (µs, see region.lua) and the staleness bound (µs), then the mode's
-- arguments:
--   'u': for each key, the peer's journal of it, e, c, k, t, pe, pc, pk
--        (see region.lua);
--   'z': (no arguments) the peer has no journal of the keys: it admitted
--        nothing for them lately, and what its share charged while it was
--        silent is given back;
--   'a': since: the peer has not been heard since since (µs): charge it
--        its share of the limit for the time from since (or from where the
--        last such charge ended) to now, on each key, unless it delivered
--        a journal of the key within the staleness bound (it was heard
--        here, whatever the caller's link).
--
-- The record of a peer is "e:c:k:s:ta:tu": the journal (its e, c and k)
-- as far as it is applied; s, the time (µs) for which the peer was charged
-- its share while silent, and ta, when that charge ended; tu, when a
-- journal of the peer was last applied. A journal
-- applied after a silence is charged only past what the share charged
-- for s (the events the share stood for are the peer's real ones), then
-- s is 0 again. A silence charged longer ago than a life is forgotten:
-- its charge has left every rule's state. The record lives three lives
-- after its last change: longer than any epoch it holds can be delivered
-- (an epoch ends a life after it began, and is delivered as the previous
-- one for a life more).
--
-- A journal new to the record, when the record holds none of the peer's (it
-- never had one, or it expired in a partition longer than three lives),
-- charges each rule at most its capacity (a bucket's burst, a window's
-- rate): what its older epochs hold cannot be told apart from what still
-- counts. A journal's events are charged as of t, its last admission: not into a
-- window that has ended since (a fixed or calendar window, a sliding
-- counter's window before the previous one, a sub-window counter's period
-- past), and to an idle bucket (nothing used now) less what the refill
-- since t has given back. Reply: the events charged to the first rule of
-- the batch's keys, in all.

local b = 8 + 4 * nrules
local peer, mode = ARGV[b], ARGV[b + 1]
local share, life, bound = ARGV[b + 2] / 1e6, ARGV[b + 3] + 0, ARGV[b + 4] + 0

-- as_of returns what of d events admitted at t still counts in rule's
-- state at now.
local function as_of(strat, key, rate, period, burst, d, t)
  if t >= now then return d end
  if strat == 'fw' then
    if math.floor(t / period) < math.floor(now / period) then return 0 end
  elseif strat == 'sc' then
    if math.floor(t / period) < math.floor(now / period) - 1 then return 0 end
  elseif strat == 'sw' then
    if t <= now - period then return 0 end
  elseif strat == 'cw' then
    if t < cw_window(period, burst) then return 0 end
  elseif strat == 'tb' or strat == 'lb' then
    if bucket_read(key, rate) == 0 then return d - math.floor((now - t) * rate / period) end
  end
  return d
end

-- refund gives back d events that a silent peer's share charged past
-- what the peer used, where they still count (a bucket's, and the current
-- window's of a fixed, calendar or sliding counter; a sub-window counter
-- keeps them).
local function refund(strat, key, rate, period, burst, d)
  if strat == 'tb' or strat == 'lb' then
    local used, lag, _, y, w = bucket_read(key, rate)
    used, y = used - d * period, y - d * period
    if y <= 0 then
      redis.call('DEL', key)
      return
    end
    if used < 0 then used = 0 end
    local value, px = bucket_write(used, rate, period, nil, lag, y, w)
    redis.call('SET', key, value, 'PX', px)
    return
  end
  local tag
  if strat == 'fw' or strat == 'sc' then
    tag = math.floor(now / period)
  elseif strat == 'cw' then
    tag = cw_window(period, burst)
  else
    return
  end
  delta = -d
  adjust[strat](key, rate, period, tag, d, strat, burst)
end

-- charge charges the rules of the key whose state keys start at KEYS[o + 1]
-- with the events (calls, for a rule per call) that count at now, less
-- what the share stood for over s_was (µs): if the share stood for more,
-- it gives the difference back. It returns the first rule's charge.
local function charge(o, dc, dk, t, s_was, new)
  local first = 0
  for i = 1, nrules do
    local strat, rate, period, burst, per_call = rule(i)
    local key = KEYS[o + i]
    local d = dc
    if per_call then d = dk end
    if new then
      local cap = rate
      if strat == 'tb' or strat == 'lb' then cap = burst end
      if d > cap then d = cap end
    end
    if s_was > 0 then d = d - math.floor(rate * share * s_was / period) end
    if d > 0 and t then d = as_of(strat, key, rate, period, burst, d, t) end
    if d < 0 then refund(strat, key, rate, period, burst, -d) end
    if d > 0 then
      delta = d
      local fn = adjust[strat] or adjust_warm
      fn(key, rate, period, 0, d, strat, burst)
      if i == 1 then first = d end
    end
  end
  return first
end

-- apply applies the peer's journal (its arguments from ARGV[a]), or its
-- share, to the key whose state keys start at KEYS[o + 1], and returns
-- the events charged to its first rule.
local function apply(o, a)
  local rk = KEYS[o + nrules + 1]
  local we, wc, wk, s, ta, tu = 0, 0, 0, 0, 0, 0
  local rec = redis.call('HGET', rk, peer)
  if rec then
    local x1, x2, x3, x4, x5, x6 = string.match(rec, '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')
    if x6 then we, wc, wk, s, ta, tu = x1 + 0, x2 + 0, x3 + 0, x4 + 0, x5 + 0, x6 + 0 end
  end
  if s > 0 and ta < now - life then s = 0 end
  local first = 0
  if mode == 'u' then
    local e, c, k, t = ARGV[a] + 0, ARGV[a + 1] + 0, ARGV[a + 2] + 0, ARGV[a + 3] + 0
    local pe, pc, pk = ARGV[a + 4] + 0, ARGV[a + 5] + 0, ARGV[a + 6] + 0
    local dc, dk
    if e == we then
      dc, dk = c - wc, k - wk
    elseif e < we then
      return 0 -- an older epoch than the one applied
    else
      -- A new epoch: all of it, and what of the previous one was not
      -- applied (all of it if none was).
      dc, dk = c, k
      if pe == we then
        dc, dk = dc + pc - wc, dk + pk - wk
      elseif pe > we then
        dc, dk = dc + pc, dk + pk
      end
    end
    if dc <= 0 and dk <= 0 then return 0 end -- applied already
    first = charge(o, dc, dk, t, s, rec == nil)
    we, wc, wk, s, tu = e, c, k, 0, now
  elseif mode == 'z' then
    if s == 0 then return 0 end
    charge(o, 0, 0, nil, s, false)
    s = 0
  else
    if now - tu <= bound then return 0 end -- heard here
    local from = tonumber(ARGV[a])
    if ta > from then from = ta end
    if from >= now then return 0 end
    -- The share's events over s + (now - from), less those it charged for s.
    for i = 1, nrules do
      local strat, rate, period, burst = rule(i)
      local d = math.floor(rate * share * (s + now - from) / period) - math.floor(rate * share * s / period)
      if d > 0 then
        delta = d
        local fn = adjust[strat] or adjust_warm
        fn(KEYS[o + i], rate, period, 0, d, strat, burst)
        if i == 1 then first = d end
      end
    end
    s, ta = s + now - from, now
  end
  redis.call('HSET', rk, peer, string.format('%d:%d:%d:%d:%d:%d', we, wc, wk, s, ta, tu))
  redis.call('PEXPIRE', rk, math.ceil(3 * life / 1000))
  return first
end

local total, stride = 0, nrules + 1
for j = 0, #KEYS / stride - 1 do
  if mode == 'u' then
    total = total + apply(j * stride, b + 5 + 7 * j)
  else
    total = total + apply(j * stride, b + 5)
  end
end
return total
