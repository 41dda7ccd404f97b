#!lua name=costs
-- costs.lua: what pieces of Lua and Redis commands called from Lua cost
-- Redis, measured as instructions per FCALL under callgrind:
--
--	go run ./cmd/instructions -library cmd/instructions/costs.lua -functions ret,get,...
--
-- A command's cost is its function's count less ret's (an FCALL that
-- returns at once). The functions named with a 10 run their piece ten
-- times in a loop: a piece's cost is (the count less loop10's) / 10.
-- KEYS are {k}1, {k}2 and {k}3, on an emptied database.

local function id(a) return a end

redis.register_function('ret', function() return 1 end)
-- Commands.
redis.register_function('time', function() redis.call('TIME') return 1 end)
redis.register_function('time_number', function() local t = redis.call('TIME') local now = t[1] * 1000000 + t[2] return 1 end)
redis.register_function('get', function(KEYS) redis.call('GET', KEYS[1]) return 1 end)
redis.register_function('get3', function(KEYS) redis.call('GET', KEYS[1]) redis.call('GET', KEYS[2]) redis.call('GET', KEYS[3]) return 1 end)
redis.register_function('mget3', function(KEYS) redis.call('MGET', KEYS[1], KEYS[2], KEYS[3]) return 1 end)
redis.register_function('incrby', function(KEYS) redis.call('INCRBY', KEYS[2], '10') return 1 end)
redis.register_function('set', function(KEYS) redis.call('SET', KEYS[1], '1234567890123') return 1 end)
redis.register_function('set_px', function(KEYS) redis.call('SET', KEYS[1], '1234567890123', 'PX', '3600000') return 1 end)
redis.register_function('set_px_number', function(KEYS) redis.call('SET', KEYS[1], '1234567890123', 'PX', 3600000) return 1 end)
redis.register_function('set_pxat', function(KEYS) redis.call('SET', KEYS[1], '1234567890123', 'PXAT', '4000000000000') return 1 end)
redis.register_function('pexpire', function(KEYS) redis.call('SET', KEYS[3], '1') redis.call('PEXPIRE', KEYS[3], '3600000') return 1 end)
redis.register_function('set_only', function(KEYS) redis.call('SET', KEYS[3], '1') return 1 end)
-- Replies.
redis.register_function('reply_packed', function() return struct.pack('<Bi8i8i8B', 0, 1, 2, 3, 1) end)
redis.register_function('reply_table', function() return {0, 1, 2, 3, 1} end)
-- Lua, ten times each.
redis.register_function('loop10', function() local x = 0 for i = 1, 10 do x = x + i / 3 end return 1 end)
redis.register_function('floor10', function() local x = 0 for i = 1, 10 do x = x + math.floor(i / 3) end return 1 end)
redis.register_function('mod10', function() local x = 0 for i = 1, 10 do local q = i / 3 x = x + (q - q % 1) end return 1 end)
redis.register_function('call10', function() local x = 0 for i = 1, 10 do x = x + id(i / 3) end return 1 end)
redis.register_function('redis_call10', function(KEYS) for i = 1, 10 do redis.call('GET', KEYS[1]) end return 1 end)
redis.register_function('rcall10', function(KEYS) local rcall = redis.call for i = 1, 10 do rcall('GET', KEYS[1]) end return 1 end)
redis.register_function('find10', function() local v, x = '12345678901234567', 0 for i = 1, 10 do if string.find(v, ':', 1, true) then x = x + i / 3 end end return 1 end)
redis.register_function('sub10', function() local v, x = '12345678901234567', 0 for i = 1, 10 do x = x + #string.sub(v, 1, 8) + i / 3 end return 1 end)
redis.register_function('number10', function() local v, x = '123456789', 0 for i = 1, 10 do x = x + (v + 0) + i / 3 end return 1 end)
redis.register_function('format10', function() local x = 0 for i = 1, 10 do local s = string.format('%d%09d', 1234567891, 123456789) x = x + i / 3 end return 1 end)
redis.register_function('closure10', function() local x, a, b, c, d, e = 0 for i = 1, 10 do local f = function(v) a, b, c, d, e = v, v, v, v, v end x = x + i / 3 end return 1 end)
