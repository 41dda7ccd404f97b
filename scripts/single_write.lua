-- single_write.lua ends the decision of single_bucket.lua,
-- single_slidingcounter.lua and single_window.lua in a single rule's
-- script (see singleFiles in scripts.go), before single_reply.lua: it
-- makes the write the file left, the command wc, if any, on key with its
-- arguments wa, and wb and wx where wb is not nil, and adds the clock's
-- skew to the code. What the reply says is whole already: the files round
-- their times up as they compute them, and count whole events. A
-- policy's script makes each rule's write instead once every rule has
-- allowed (see policy_head.lua), which is why those files leave it.

if wc then
  if wb then rcall(wc, key, wa, wb, wx) else rcall(wc, key, wa) end
end
if rem < 0 then rem = 0 end
if reset < 0 then reset = 0 end
code = code + (skew or 0)
