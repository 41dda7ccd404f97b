-- single_warmup.lua: a token or leaky bucket with a warm-up (Limit.WarmUp)
-- of one rule written in, the usual call only: the decision of the general
-- script (common.lua, warmup.lua, args.lua, decide.lua, check.lua,
-- reply.lua) for one rule with no penalty block and no reservation, a
-- priority share or none, written out in one chunk, as single_bucket.lua
-- is for a plain bucket (see there why): no function is made or called
-- here but the string library's. Same state, same writes, same reply: a
-- reservation on the same key runs the general script (specialisedRunner in
-- runner.go). TestSingleScriptDecidesAsGeneral holds them to the same
-- Results and the same state.
--
-- Before this file, scripts.go writes the rule in (singleWarmSource in
-- warmup.go), then single_args.lua (which reads n, now and max_delay, and
-- takes the server's TIME when now is 0):
--   local rate, period, burst, leaky = <rate>, <µs>, <burst>, <leaky>
--   local tx, mx, p2, r2, cap2 = <W·rate>, <2·tx>, <2·period>, <2·rate>, <burst·p2>
--   local mpat, wfmt, zfmt = '^(%d+):(%d+):(%d+):<rate>$', '%d:%d:%d:<rate>', '0:%d:%d:<rate>'
--   local cfmt, cpx, clife = '<X>:<F>:%d:<rate>', '<ms>', <µs>
-- W the warm-up in µs, tx the threshold and mx the most stored (in
-- warmup.lua's units; every product exact: below 2^53, see newRule and
-- warmAlgorithm); mpat the pattern of a state this rate wrote, wfmt the
-- state's format (zfmt with X = 0), all with the rate written in; cfmt,
-- cpx and clife what a call of 1 on a cold bucket writes (its state's
-- format, with X and F written in, its PX) and its life, or cfmt false
-- where they are not exact integers (see coldWrite in warmup.go).
--
-- KEYS[1]  the bucket's state key (see warmup.lua for the state)
-- ARGV     as common.lua's, up to ARGV[4]: n, 1, now in µs or 0 (the
--          server's TIME), max delay in µs or -1; trailing defaults left
--          out (the runner sends no block or reservation); a call with a
--          priority share as single_args.lua reads it, and a warming
--          bucket takes no share (check.lua: its capacity is time): only
--          whether the call has one (shared) matters here
-- Reply: common.lua's five integers (code, remaining, delay or retry
--   after, reset after, rule 1), and with a share a sixth, the remaining
--   allowance before the call, packed in one string where Redis has its
--   struct library, else an array.
--
-- Exact integer division is written out as in single_bucket.lua:
--   q = a / b  q = q - q % 1 (floor) or q + (-q) % 1 (ceil)
--   then q corrected by one where the double's rounding was off.


-- The state (warm_read): x, X at now (capped at mx), and f, F from now
-- (the state's lag folded in).
local key = KEYS[1]
local x, f = mx, 0
local v = rcall('GET', key)
if v then
  -- One match for the usual state, of this rate (mpat: its rate written
  -- in, so that it is neither captured nor converted): these scripts
  -- write its fields with '%d', from integers >= 0. Anything else (another
  -- rate's state) is parsed as warm_read does.
  local sx, sf, st = string.match(v, mpat)
  local sr
  if not sx then
    local a = string.find(v, ':', 1, true)
    local b = string.find(v, ':', a + 1, true)
    local c = string.find(v, ':', b + 1, true)
    sx, sf = string.sub(v, 1, a - 1), string.sub(v, a + 1, b - 1)
    st, sr = string.sub(v, b + 1, c - 1), string.sub(v, c + 1)
  end
  x, f = sx + 0, sf + 0
  local elapsed = now - st
  if sr then
    local wrate = sr + 0
    if wrate ~= rate then
      -- Another rate wrote it: F and X converted, rounded up (warm_read).
      local a = f * rate
      local q = a / wrate
      q = q + (-q) % 1
      if q * wrate < a then q = q + 1 elseif (q - 1) * wrate >= a then q = q - 1 end
      f = q
      a = x * rate
      q = a / wrate
      q = q + (-q) % 1
      if q * wrate < a then q = q + 1 elseif (q - 1) * wrate >= a then q = q - 1 end
      x = q
    end
  end
  if x > mx then x = mx end
  if elapsed < 0 then -- the state is ahead: no refill
    if skew then
      if elapsed < -100000 then skew = 64 end
      f = f - elapsed * r2
    elseif elapsed > -1000000 then
      f = f - elapsed * r2
    end -- else the server's clock stepped back: as of now
  else
    local d = elapsed * r2
    if d <= f then
      f = f - d
    else
      x = x + (d - f)
      if x > mx then x = mx end
      f = 0
    end
  end
end

-- The check (check_wt): ok, avail, wait (the delay, or the retry after)
-- and reset_now; a denial's code (1, or 3: past the max delay).
local a = f + mx - x
local q = a / r2
q = q + (-q) % 1
if q * r2 < a then q = q + 1 elseif (q - 1) * r2 >= a then q = q - 1 end
local reset_now = q
local wait = 0
if f > 0 then
  q = f / r2
  q = q + (-q) % 1
  if q * r2 < f then q = q + 1 elseif (q - 1) * r2 >= f then q = q - 1 end
  wait = q
end
local code, avail = 0, 0 -- code: 0 ok, 1 denied, 3 denied past the max delay
if leaky then
  local room = cap2 - f
  q = room / p2
  q = q - q % 1
  if q * p2 > room then q = q - 1 elseif (q + 1) * p2 <= room then q = q + 1 end
  avail = q
  local over = n * p2 - room
  if over > 0 then
    q = over / r2
    q = q + (-q) % 1
    if q * r2 < over then q = q + 1 elseif (q - 1) * r2 >= over then q = q - 1 end
    code, wait = 1, q
  elseif max_delay >= 0 and wait > max_delay then
    code, wait = 3, wait - max_delay
  end
elseif f > 0 then
  if n == 0 then wait = 0 else code = 1 end -- a look: allowed, none left
else
  avail = burst
  if n > 0 then avail = n end -- the next call waits for what this one costs
end

-- The reply (reply.lua for one rule): a look (n = 0) is never denied, and
-- has no delay where the check denied; a denial writes nothing; an
-- admission takes n * p2 (warm_cost: a permit above the threshold costs
-- the area under the line, rounded up) and writes the state, which lives
-- until the bucket is cold again.
local rem, reset = avail, reset_now
if n == 0 then
  if code ~= 0 then code, wait = 0, 0 end
elseif code == 0 and n == 1 and f == 0 and x == mx and cfmt then
  -- A call of 1 on a cold bucket (absent, or back at M): its state and
  -- life are the same every time but for its time (coldWrite in
  -- warmup.go), made once.
  rcall('SET', key, string.format(cfmt, now), 'PX', cpx)
  rem, reset = avail - 1, clife
elseif code == 0 then
  local k = n * p2
  local cost = k
  if x > tx then
    local sp = k
    if sp > x then sp = x end
    local lo = x - sp
    if lo < tx then lo = tx end
    local ax = x - lo
    local c = ax * (x + lo - tx) / tx
    cost = cost - ax + c + (-c) % 1
  end
  f = f + cost
  if k > x then x = 0 else x = x - k end
  a = f + mx - x
  q = a / r2
  q = q + (-q) % 1
  if q * r2 < a then q = q + 1 elseif (q - 1) * r2 >= a then q = q - 1 end
  reset = q -- the key's life
  local px = q / 1000
  px = px + (-px) % 1
  if px < 1 then px = 1 end
  -- (Numbers as strings, printed here: see single_fixedwindow.lua. No
  -- permits stored, as at the stable rate: X written in, one number
  -- fewer to print, about 1,200 instructions.)
  local format = string.format
  if x == 0 then
    v = format(zfmt, f, now)
  else
    v = format(wfmt, x, f, now)
  end
  rcall('SET', key, v, 'PX', format('%d', px))
  rem = avail - n
end

if rem < 0 then rem = 0 end
if reset < 0 then reset = 0 end
if wait < 0 then wait = 0 end
code = code + (skew or 0)
local pack = rawget(_G, 'struct') -- (rawget: miniredis has none)
if shared then
  if pack then return pack.pack('<Bi8i8i8Bi8', code, rem, wait, reset, 1, avail) end
  return {code, rem, wait, reset, 1, avail}
end
if pack then return pack.pack('<Bi8i8i8B', code, rem, wait, reset, 1) end
return {code, rem, wait, reset, 1}
