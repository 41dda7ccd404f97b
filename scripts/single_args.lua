-- single_args.lua: the head of every script specialised for a single rule
-- (single_<strategy>.lua, after the rule written in; see singleSource in
-- scripts.go): reads the arguments of the usual call, as args.lua does for
-- the general script, and takes the server's TIME unless the call sent its
-- time.
--
-- ARGV[1]  n (absent: 1)
-- ARGV[3]  now in µs, or 0 (absent): the server's TIME
-- ARGV[4]  max delay in µs, or -1 (absent): none; only a leaky bucket's
--          Delay reads it
-- A call with a priority share (WithPriorityShares) sends -(c + 1), c the
-- capacity the share leaves the rule (floor(share × capacity / 1e6),
-- capacity being Burst for a bucket, else Rate), computed in Go: in ARGV[1]
-- for n = 1, or else in ARGV[2], where the general script has the rule
-- count, which these scripts do not read (see trimSingle in runner.go):
-- one argument, not eight, and no share arithmetic here. The script of a
-- share that bakeShares made has it written in instead, after this file
-- (shared, share_c = true, c): its calls send none. Each strategy's
-- file then lowers the rule's capacity to c and keeps what the share
-- leaves out in kept, which single_reply.lua adds back to tell a denial by
-- the share alone (code 5) and in the reply's sixth integer.
-- Sets rcall, policy (false; a policy's script sets it, see
-- policy_head.lua), n, now, max_delay, nargs (#ARGV), skew: false when now
-- is the server's time, else 0 (single_bucket.lua reports a clock behind
-- the state's with it), and shared and share_c: whether the call has a
-- share, and c.

local rcall = redis.call
local policy = false
local n, now, max_delay, skew = 1, 0, -1, 0
local shared, share_c = false, 0
local nargs = #ARGV
if nargs > 0 then -- (the usual call sends none)
  if ARGV[1] ~= '1' then n = ARGV[1] + 0 end
  if nargs > 2 and ARGV[3] ~= '0' then now = ARGV[3] + 0 end
  if nargs > 3 and ARGV[4] ~= '-1' then max_delay = ARGV[4] + 0 end
  if n < 0 then
    shared, share_c, n = true, -n - 1, 1
  elseif nargs > 1 and ARGV[2] ~= '1' then
    shared, share_c = true, -ARGV[2] - 1
  end
end
if now <= 0 then
  local t = rcall('TIME')
  now = t[1] * 1000000 + t[2]
  skew = false
end
