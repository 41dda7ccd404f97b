-- settle.lua ends the settle script (common.lua, the strategies' parts,
-- rules.lua, adjust.lua, this): it settles a reservation that reply.lua recorded, once.
--
-- KEYS and ARGV as in common.lua, with n = 0, no block: ARGV[5] is
-- instead the most entries a charge adds to each sliding log (see
-- adjust.sl), ARGV[6] the reservation id and ARGV[7] the events really
-- used; then, after the rules, ARGV[8+4k] the events reserved and
-- ARGV[9+4k ..] each rule's tag from the reservation's reply; ARGV[9+5k]
-- m, the number of the key's rules now when the reply reports them and
-- they are not the reservation's (WithLimitFunc, WithRulesFunc), else 0;
-- ARGV[10+5k] the reservation lifetime (ms: the reservation was made that
-- long before the time its record lapses); then the m rules' arguments
-- as a rule's (ARGV[11+5k ..]), with their state keys after the
-- reservations' (KEYS[2k+1 .. 2k+m]);
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
  local a = base + nrules - 1 + 4 * j
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
delta = used - reserved
since = lapses - ARGV[base + nrules + 2] * 1000

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
