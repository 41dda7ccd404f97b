-- written.lua: in a script with several rules written in (see
-- writtenChecks in scripts.go), a rule's first write waits in locals of
-- its own, not in the queue: the rules' checks are nested blocks, each
-- taking its rule's write from wc, wk, wa, wb, wx into its locals (and
-- clearing wc) and, on the way out, making it if every rule allowed.
-- Further writes of a rule (the sliding log's) queue behind it
-- (queue.lua), and reply.lua makes them after the held ones. This costs
-- Redis less than queueing every write and reading the queue back (and
-- the taking and making are written out, not functions: a call costs
-- more).
-- In a Redis Function it follows the strategies' files, in the part that
-- only defines, so that held and held_args are made once, when the library
-- loads, not on every call (a function with five upvalues costs Redis
-- about 900 instructions to make); in a script it comes before the
-- checks (see bake in scripts.go). The checks set write to held and clear
-- wc on every call.

local wc, wk, wa, wb, wx -- the checked rule's first write; wc false: it queued
local function held(cmd, key, a, b, c)
  if wc == nil then
    wc, wk, wa, wb, wx = cmd, key, a, b, c
  else
    queue(cmd, key, a, b, c)
  end
end
-- held_args is write_args where a rule may write more than once: made only
-- where queue.lua came before (a sliding log among the rules). (It calls
-- queue_args, queue.lua's upvalue: in an earlier layout a local copy of it
-- was nil inside this function in miniredis's Lua, with 16 rules.)
local held_args
if queue_args then
  held_args = function(args)
    if wc == nil then wc = false end -- the rule's later writes queue behind it
    queue_args(args)
  end
end
