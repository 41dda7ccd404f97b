-- single_subwindow.lua: a sub-window counter of one rule written in, the
-- usual call only: the decision of the general script (common.lua,
-- subwindow.lua, args.lua, decide.lua, check.lua, reply.lua) for one
-- rule with no penalty block and no reservation, a priority share or none,
-- written out in one chunk, as single_bucket.lua is for a bucket (see
-- there why). Same state, same writes, same reply: a reservation or a
-- settle on the same key runs the general script (specialisedRunner in
-- runner.go). TestSingleScriptDecidesAsGeneral holds them to the same
-- Results and the same state.
--
-- Before this file, scripts.go writes the rule in, then single_args.lua
-- (which reads n and now, and takes the server's TIME when now is 0):
--   local key, rate, period, burst, leaky, pxs = KEYS[1], <rate>, <µs>, <s>, false
-- (burst: the sub-windows of a period, s; leaky and pxs unused).
--
-- KEYS[1]  the counter's state key (see subwindow.lua for the state and
--          the grid of sub-windows)
-- ARGV     as common.lua's, up to ARGV[3]: n, 1, now in µs or 0 (the
--          server's TIME); trailing defaults left out (ARGV[4], a max
--          delay, is not read: it bounds only a leaky bucket's Delay; the
--          runner sends no block or reservation); a priority share
--          as single_args.lua reads it
-- Reply: common.lua's five integers (code, remaining, delay 0 or retry
--   after, reset after, rule 1), and with a share a sixth, the rule's
--   whole remaining allowance before the call, packed in one string
--   where Redis has its struct library, else an array. Every number here is an integer: the
--   general script's rounding changes none of them.
-- (single_reply.lua, which follows this file, replies.)


-- A priority share (single_args.lua): the rule counts share_c of its rate.
local kept = 0
if shared then kept, rate = rate - share_c, share_c end

-- The grid (check_sw): now is r µs into period qn; sub-window j of a
-- period starts ceil(j * period / s) = j * lq + ceil(j * lr / s) into it.
-- (j * lr is below s^2: ceil(a / s) is floor((a + s - 1) / s), exact in
-- doubles, where common.lua's ceil_div corrects a quotient.)
local s = burst
local lq = (period - period % s) / s
local lr = period - lq * s
local r = now % period
local qn = (now - r) / period

-- sw_until is subwindow.lua's: the time from now until sub-window b
-- starts. The one function this script makes, with no upvalues (a
-- closure's upvalues cost Redis an allocation each), for the rare calls
-- that need a sub-window other than cw's successors.
local function sw_until(b, period, s, lq, lr, qn, r)
  local j = b % s
  local a = j * lr + s - 1
  return ((b - j) / s - qn) * period + j * lq - r + (a - a % s) / s
end

-- cw, the sub-window of now (the quotient in doubles is within one of
-- its index j, corrected against the exact bounds), and upto, the time
-- from now until cw + 1 starts: cw + s + 1, when cw stops counting,
-- starts a period later.
local j, upto
if lr == 0 then
  j = (r - r % lq) / lq
  upto = (j + 1) * lq - r
else
  j = r * s / period
  j = j - j % 1
  local a = j * lr + s - 1
  if j * lq + (a - a % s) / s > r then j = j - 1 end -- j starts after now
  a = (j + 1) * lr + s - 1
  upto = (j + 1) * lq + (a - a % s) / s - r
  if upto <= 0 then -- j + 1 has started: now is in it
    j = j + 1
    a = (j + 1) * lr + s - 1
    upto = (j + 1) * lq + (a - a % s) / s - r
  end
end
local cw = qn * s + j
local lo = cw - s -- the oldest sub-window that counts

-- The state, as check_sw reads it: total, nw, and (unless nw is cw) t and
-- o, with the sub-windows before lo dropped. live: a state counts; stale:
-- a key is there all the same.
local total, nw, t, o, live, stale, m = 0, cw, 0, cw, false, false, 0
local x = rcall('HGET', key, 'c')
if x then
  x = x + 0
  m = x % 4096
  total, live = (x - m) / 4096, true
  if (cw - m) % 4096 == 0 then
    t, o = nil, nil -- nw is cw: nothing left the window since it began
  else
    local h = rcall('HMGET', key, 't', 'o')
    if h[1] then t = h[1] + 0 end
    if h[2] then o = h[2] + 0 end
    nw = o + (m - o) % 4096
    if nw < lo then
      total, nw, t, o, live, stale = 0, cw, 0, cw, false, true
    elseif o < lo then
      local dropped = 0
      while o < lo do
        local f = string.format('%d', o)
        local v = rcall('HGET', key, f)
        local g = 1
        if v then
          v = v + 0
          g = v % 4096
          dropped = dropped + (v - g) / 4096
          rcall('HDEL', key, f)
          if g < 1 then g = 1 end
        end
        o = o + g
      end
      total, t = total - dropped, t - dropped
      if o >= nw then o, t = nw, 0 end
      rcall('HSET', key, 'c', string.format('%d', total * 4096 + m), 't', string.format('%d', t),
        'o', string.format('%d', o))
    end
  end
end

-- The check: code, remaining, retry after (when denied), reset after
-- (common.lua): until nw stops counting, and after an admitted call until
-- the sub-window it counted in does.
local avail = rate - total
local reset = 0
if total > 0 then
  if nw == cw then reset = upto + period else reset = sw_until(nw + s + 1, period, s, lq, lr, qn, r) end
end
local code, rem, wait = 0, avail, 0
if n > avail then
  if n > 0 then -- (n = 0 only reports: a lowered limit can leave avail < 0)
    code, wait = 1, reset
    if n <= rate then
      -- The oldest sub-windows that must stop counting for n to fit: the
      -- last of them is b (nw at most).
      if not o then
        o = rcall('HGET', key, 'o')
        if o then o = o + 0 else o = nw end
      end
      local need, b = total + n - rate, o
      while b < nw do
        local v = rcall('HGET', key, string.format('%d', b))
        local g = 1
        if v then
          v = v + 0
          g = v % 4096
          need = need - (v - g) / 4096
          if g < 1 then g = 1 end
        end
        if need <= 0 then break end
        b = b + g
      end
      if b > nw then b = nw end
      wait = sw_until(b + s + 1, period, s, lq, lr, qn, r)
    end
  end
elseif n > 0 then
  -- Count n events: in nw when it is cw (or ahead of it), else in cw.
  -- (The numbers printed by string.format, not by Redis 7.0, which
  -- converts a number argument with '%.17g': the same digits, for less.)
  rem = avail - n
  if live and nw >= cw then
    if n == 1 then
      rcall('HINCRBY', key, 'c', '4096')
    else
      rcall('HINCRBY', key, 'c', string.format('%d', n * 4096))
    end
    if total == 0 then reset = sw_until(nw + s + 1, period, s, lq, lr, qn, r) end
  else
    local v, w = string.format('%d', (total + n) * 4096 + cw % 4096), string.format('%d', cw)
    if stale then rcall('DEL', key) end
    if not live or total == t and o == nw then
      -- Nothing older (nw, if any, has nothing left): cw is the oldest too.
      rcall('HSET', key, 'c', v, 'o', w)
    else
      -- nw's count moves to its field, linked to cw.
      rcall('HSET', key, 'c', v, string.format('%d', nw), string.format('%d', (total - t) * 4096 + cw - nw),
        't', string.format('%d', total), 'o', string.format('%d', o))
    end
    reset = upto + period
    local px = reset / 1000
    px = px + (-px) % 1
    if px < 1 then px = 1 end
    rcall('PEXPIRE', key, string.format('%d', px))
  end
end

if rem < 0 then rem = 0 end
