-- leakybucket.lua: a queue that drains one event every T = period / rate.
-- An admitted event takes the next free slot, and the reply's delay says how
-- long to wait before acting so that the output keeps the leak rate. The
-- queue holds at most burst events, counting the one being served: an
-- instant burst gets delays 0, T, ..., (burst-1)T and the next is denied.
-- n events take n consecutive slots; the delay is the wait for the first.
--
-- KEYS[1]  string: the TAT, the time at which the queue is empty (see gcra.lua).
-- ARGV     see common.lua. ARGV[5] (max delay) makes the script refuse a
--          slot it would have to wait for longer than that (reason 3),
--          without taking it, so that a waiter never holds a slot it cannot use.
-- Reply    see common.lua. Reset after: until the queue is empty.
-- Denials write nothing.

return gcra(true)
