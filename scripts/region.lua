-- region.lua follows the rules' checks in every general decision script:
-- with WithRegions (see regions.go), the call's last key is the key's
-- journal, and an admitted call (n > 0, no block, nothing denied) adds
-- itself to it, so that the exchange can tell the other regions what this
-- region admitted. Without a journal key it does nothing.
--
-- The journal's key ends in its life, ':j' and 1e11 + the life in ms as
-- 12 digits (read by position, which costs Redis a seventh of a pattern's
-- match; the leading 1 keeps miniredis's Lua from reading octal): the
-- longest its rules remember an event, or ten exchange intervals if
-- longer. Its value is
-- "e:c:k:t:pe:pc:pk": e, when its epoch began (µs); c and k, the events
-- and calls admitted since; t, the time of the last (µs); and pe, pc, pk
-- the previous epoch's. The counts only grow within an epoch, so a peer
-- that has applied c of them applies only what is past c, however many
-- instances deliver it and however often (see region_apply.lua). An epoch
-- ends at the first admission ten minutes after it began (a peer that
-- never applied it, or lost its record of what it applied, charges at most
-- a rule's capacity of it), and the key lives a life after its last
-- admission, as the rules' state does: a key an attacker chose costs
-- Redis no longer than its state.
if not denied and n0 > 0 and block >= 0 then
  local jk = KEYS[nkeys + (rid ~= '' and nrules or 0) + 1]
  if jk then
    local life = string.sub(jk, -12) - 1e11
    local e, c, k, pe, pc, pk = now, n0, 1, 0, 0, 0
    local v = rcall('GET', jk)
    if v then
      local je, jc, jk2, _, xe, xc, xk = string.match(v, '^(%d+):(%d+):(%d+):(%d+):(%d+):(%d+):(%d+)$')
      if je then
        if now - je < 600000000 then
          e, c, k, pe, pc, pk = je + 0, jc + n0, jk2 + 1, xe, xc, xk
        else
          pe, pc, pk = je, jc, jk2 -- a new epoch
        end
      end
    end
    rcall('SET', jk, string.format('%d:%d:%d:%d:%s:%s:%s', e, c, k, now, pe, pc, pk), 'PX', life)
  end
end
