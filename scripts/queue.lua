-- queue.lua makes the queue of writes where a rule's write may wait in it:
-- in a script whose rules come as arguments (with several rules: see
-- argumentChecks in scripts.go), and in one with several rules written in
-- of which one may write more than once (see writtenChecks and bake in
-- scripts.go: in a Redis Function, in the part that only defines, so that
-- these functions are made once). reply.lua makes the queue's writes only if
-- every rule allows. The queue is one flat table of commands, each its
-- argument count and then its arguments (a table per command cost a
-- policy's decision more than its commands did), and nw its length
-- (cheaper than #writes). queue_args queues a command already in a table.
-- (Elsewhere the functions are not made: Redis makes every function of a
-- script anew on every call, and one costs it about as much as a rule's
-- arithmetic.)
queue = function(cmd, key, a, b, c)
  if not writes then writes, nw = {}, 0 end
  local w = nw
  if b == nil then
    writes[w + 1], writes[w + 2], writes[w + 3], writes[w + 4] = 3, cmd, key, a
    nw = w + 4
  elseif c == nil then
    writes[w + 1], writes[w + 2], writes[w + 3], writes[w + 4], writes[w + 5] = 4, cmd, key, a, b
    nw = w + 5
  else
    writes[w + 1], writes[w + 2], writes[w + 3], writes[w + 4], writes[w + 5], writes[w + 6] = 5, cmd, key, a, b, c
    nw = w + 6
  end
end
queue_args = function(args)
  if not writes then writes, nw = {}, 0 end
  local w = nw
  writes[w + 1] = #args
  for i = 1, #args do writes[w + 1 + i] = args[i] end
  nw = w + 1 + #args
end
