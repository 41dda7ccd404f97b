-- common.lua is the head of every decision script (see scripts.go): it
-- declares the call's numbers and defines the helpers the strategies share.
-- The strategies' files follow it, then args.lua (which reads the
-- arguments and takes the time), decide.lua, the rules'
-- checks (rules.lua and check.lua in a loop, or check.lua once per rule
-- with the rules written in) and reply.lua, which writes only if every rule
-- allows.
-- A single-strategy limiter is a policy of one rule; its usual calls (no
-- block, reservation or regions; a priority share or none) run a script
-- specialised for it instead, single_<strategy>.lua, which decides and
-- writes as this one does (see singleSource in scripts.go).
--
-- KEYS[1..k]  the rules' state keys, one per rule, all with the same hash
--             tag (one cluster slot)
-- KEYS[k+1]   the penalty block key; present only when ARGV[5] > 0
-- KEYS[k+1 .. 2k, or k+2 .. 2k+1]  each rule's reservations (a sorted
--             set beside its state key); present only when ARGV[6] is not
--             empty
-- ARGV[1]  n: events asked for (integer >= 0; 0 reports without consuming)
-- ARGV[2]  k: the number of rules (1 to 16); not read by a script with
--          several rules written in, which knows it (writtenCount in
--          scripts.go)
-- ARGV[3]  now in µs on the caller's clock, or 0: use the server's TIME
-- ARGV[4]  max delay in µs the caller can wait (leaky bucket), -1 = any
-- ARGV[5]  block in µs: once denied by a limit, deny everything for this
--          long (each call told a RetryAfter until the limit would allow
--          its n again, if that is later); 0 = off. decide.lua makes the
--          local block minus the block's time left while one lasts.
-- ARGV[6]  reservation id, or '': record an admitted call as a reservation
--          that settle.lua can settle once (see reserve.go)
-- ARGV[7]  how long a reservation can be settled, in ms (with ARGV[6]);
--          settle.lua: the events used
-- (With the rules written in, trailing arguments equal to their defaults,
-- 1, k, 0, -1, 0, '' and 0, are left out.)
-- ARGV[8], with the rules written in, or ARGV[8 + 4k], after the rules:
--          the call's priority share (WithPriorityShares) in parts per
--          million, 1 to 999,999; absent for a call that may use all. A
--          rule then counts its capacity (Rate; Burst for a bucket) as
--          floor(share × capacity / 1e6).
-- ARGV[8 + 4(i-1) ..]  rule i: strategy code ('fw', 'sl', 'sc', 'tb',
--          'lb'; with a leading '*' the rule counts each call as one event,
--          whatever n), rate (events per period, >= 1), period (µs, >= 1000),
--          burst (bucket or queue capacity, >= 1); absent when the rules
--          are written into the script (see writtenChecks in scripts.go)
--
-- Reply: an array of five integers, six for a call a block denied (Redis
-- truncates Lua floats, so every value is rounded here, times up):
--   [1] code: 0 allowed, 1 denied by a limit, 2 denied by a block,
--       3 denied because the wait would exceed the max delay, 5 denied
--       by the call's share only (every rule would admit it at its full
--       capacity; no block is set); plus 64
--       when now (ARGV[3]) is behind a rule's state by more than 100 ms
--       (see skew)
--   [2] remaining events that could still be allowed now (the least over
--       the rules)
--   [3] when allowed: the delay, µs, to wait before acting (leaky bucket;
--       else 0); when denied: the retry after, µs (the longest among the
--       denying rules: after it every rule allows the same n; by a block,
--       the block's time left if longer)
--   [4] reset after, µs: until every rule is back at its full allowance
--       (and a block that lasts has ended)
--   [5] the deciding rule, 1..k: when denied, the denying rule with the
--       longest retry; when allowed, the rule with the fewest remaining;
--       0 for a block (code 2) that lasts longer than the rules' retry,
--       and for a look (n = 0) during a block
--   [6..5+k] a reservation only: each rule's tag, what settling needs
--       (the window, or the time of the events)
--   [6] a call denied by a block (code 2) only, in place of the tags: the
--       block's time left, µs (RetryAfter [3] may be longer: when the
--       rules allow this n)
--   then, with several rules (not for a block): the deciding rule's own
--       reset after, µs, until that rule alone is full again (and a block
--       this call set has ended);
--   then, with several rules or a share (not for a block): each rule's
--       remaining allowance before the call, the whole limit's (what the
--       share keeps out included), for the fallback's memory of Redis's
--       answers (answers.go)
-- Except for an admitted reservation or a block (a call denied by one, or
-- a look during one), where Redis has its
-- struct library (miniredis has not), reply.lua sends the five as one
-- string, struct.pack('<Bi8i8i8B', ...): 26 bytes, code and rule one byte
-- each, the others signed 64-bit little-endian; the deciding rule's reset
-- and each rule's remaining allowance follow as 8 more bytes each. A table reply costs Redis
-- about 5,000 instructions more (it probes the table for err, ok, double,
-- map and more before reading it as an array), and go-redis allocations
-- for the array and its numbers.
--
-- Numbers: Lua numbers are doubles, exact for integers below 2^53. Times are
-- integer µs. Numbers are never turned into strings with tostring or '..'
-- (that keeps only 14 digits); redis.call converts them exactly, and
-- string.format('%d') is used where a string is needed.
--
-- Redis 6.0 compatibility: no PXAT, no PEXPIRETIME. Every expiry is
-- relative (PX), computed from the same clock as now, so a client clock
-- (ARGV[3]) that is offset from the server's still gives the right lifetime.

-- The call's numbers, set by args.lua on every call (which comes after the
-- strategies' files: they read these as upvalues). skew says where now
-- came from: false, the server's TIME; 0, the caller (a client clock, see
-- WithClientClock); 64, the caller, whose clock a rule found behind its
-- state's time by more than 100 ms (instances agree to about a round
-- trip): reply.lua adds it to the reply's code, and the caller measures
-- its clock again. (No local more in this chunk for the 100 ms: see n0 in
-- scripts.go.)
-- share: nil, or the call's priority share (WithPriorityShares), parts
-- per million, which check.lua applies to each rule's capacity. (It took
-- the place of decide.lua's HUGE, now a constant: one more local in the
-- chunk made miniredis's Lua lose a value with 16 rules written in,
-- TestBakedScriptMaxRules.)
local n, nrules, now, max_delay, block, rid, skew, share

-- Rounding: a decision rounds by arithmetic, not with math.floor and
-- math.ceil (settle.lua, off the hot path, still calls them). For every
-- finite double x, x - x % 1 equals math.floor(x) and
-- x + (-x) % 1 equals math.ceil(x) (up to the sign of a zero), in Redis's
-- Lua and in miniredis's (checked on 200,000 random doubles and edge
-- values). For integers a and b > 0 below 2^53, (a - a % b) / b is
-- floor(a / b) exactly. A call to math.floor costs Redis about 540
-- instructions (the lookups of math and floor, and a C call), the
-- arithmetic about 150 (bench/cmd/instructions/costs.lua).

-- floor_div and ceil_div divide integers exactly (as long as they are below
-- 2^53, and b > 0), correcting the rounding of the floating-point
-- quotient. (ceil_div does not call floor_div: a call costs Redis more
-- than the two lines.)
local function floor_div(a, b)
  local q = a / b
  q = q - q % 1
  if q * b > a then q = q - 1 elseif (q + 1) * b <= a then q = q + 1 end
  return q
end
local function ceil_div(a, b)
  local q = a / b
  q = q + (-q) % 1
  if q * b < a then q = q + 1 elseif (q - 1) * b >= a then q = q - 1 end
  return q
end

-- ms returns a PX lifetime for d µs: rounded up, never 0.
local function ms(d)
  local v = d / 1000
  v = v + (-v) % 1
  if v < 1 then v = 1 end
  return v
end

-- rcall is redis.call, which args.lua sets on every call (a Redis Function
-- cannot read it when its library loads): reading the global redis and
-- its field call costs Redis about 260 instructions on every use.
local rcall

-- write(cmd, key, a[, b[, c]]) is how a rule that allows writes: with one
-- rule, at once (no other rule can deny, so the call is allowed): write is
-- redis.call itself (args.lua sets it on every call); with several, queued
-- (queue.lua) or held (written.lua), and made only if every rule allows.
-- write_args queues a command already in a table (queue.lua); it is nil
-- where nothing queues, and with one rule the caller makes the command
-- itself.
local write
local write_args, queue, queue_args
local writes, nw -- the queue, made on the first queued write

-- Each strategy's file defines its check function, check_<code> (check_fw,
-- check_sl, check_sc, check_tb and check_lb). A check function is called
-- with the rule's key, rate, period, burst and code (the strategy's, so
-- that two strategies can share a function), and pxs, which only a script
-- with its rules written in passes to a bucket or a sliding log: its PX
-- for one period, as a string (Redis 7.0 converts a number argument with
-- '%.17g', which costs it about 2,700 instructions more). It reads the
-- rule's state and returns
--   ok, avail, wait, reset_now, reset_next
-- ok: the n events fit; avail: events that fit now (may be < 0 after a
-- lowered limit); wait: when ok, the delay (leaky bucket); else the retry
-- after; reset_now: until full with no more traffic; reset_next: the same
-- after the n events; tag: what a reservation must remember to settle
-- (see settle.lua). When ok and n > 0 it writes with write().
-- Where the rules come from the arguments, the table check_by_code maps a code to its
-- check function (strategyTable in scripts.go writes it after the
-- strategies' files); with the rules written in, each rule's check calls
-- its function by name, and no table is made.
