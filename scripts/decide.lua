-- decide.lua follows the strategies in every decision script: it applies
-- a penalty block and sets up what the rules' checks gather. Then come the
-- checks (check.lua once per rule: in a loop over the rules passed as
-- arguments, after rules.lua, or written out once per rule with the rules
-- written in, see scripts.go) and reply.lua, which writes only if every
-- rule allowed (a denial writes nothing, in any rule), records a
-- reservation and replies (see common.lua).

local nkeys = nrules
local n0 = n -- the call's n; a per-call rule counts min(n, 1) instead
local denied, code = false, 0
local min_now, min_after, fewest = nil, nil, 1
local delay, reset_ok, reset_denied = 0, 0, 0
local retry, slowest = -1, 1
-- The reset after the call (µs) of the rule with the fewest left and of
-- the slowest denying rule: with several rules, the reply's deciding
-- rule's own reset. (Two locals, not two fields of tags: a hash part cost
-- Redis about 500 instructions more; a script of 16 rules written in
-- still passes TestBakedScriptMaxRules with them, see share in
-- common.lua.)
local fewest_reset, slowest_reset = 0, 0
-- tags: where Remaining cannot tell it (with several rules, or a share),
-- each rule's remaining allowance before the call, the whole limit's (a
-- share's kept part added back), tags[i] for rule i, which the reply
-- carries for the fallback's memory of Redis's answers (answers.go); and
-- a reservation's tags, tags[k + i]. With one rule and a share, and no
-- reservation, tags is that rule's number itself (a table costs Redis
-- about 1,500 instructions). (One variable for all: one more local in the
-- chunk made miniredis's Lua lose a value with 16 rules written in, see
-- share in common.lua. The table is made with room for 4, so that it
-- does not grow, which costs Redis about 1,000 instructions a time.)
local tags
if nrules > 1 or rid ~= '' then tags = {0, 0, 0, 0} end

-- The penalty block's key holds when the block ends (µs). While it lasts,
-- the call is denied (n = 0 only reports), but the rules are checked all
-- the same, writing nothing, so that the reply can tell this call's own
-- RetryAfter and ResetAfter (reply.lua): the block's time left, or when
-- the rules would allow this n (or be full) if later. block becomes minus
-- the time left, which marks the call blocked; denied is set at once, so
-- that no queued or held write is made (see queue.lua, written.lua), and a
-- rule that writes at once (a single rule: write is redis.call) writes
-- into nothing.
if block > 0 then
  nkeys = nkeys + 1
  local b = rcall('GET', KEYS[nkeys])
  if b then
    local left = b - now
    if left > 0 then
      block, denied = -left, true
      write = function() end
      write_args = write
    end
  end
end
