-- region.lua follows the rules' checks in every general decision script:
-- with WithRegions (see regions.go), the call's last key is the key's
-- journal, and an admitted call (n > 0, no block, nothing denied) adds
-- itself to it, so that the exchange can tell the other regions what this
-- region admitted. Without a journal key it does nothing.
--
-- The journal is a string "e:c:k:t": e, when it began (µs); c and k, the
-- events and the calls admitted since; t, the time of the last (µs). Its
-- counts only grow, so a peer that has applied c of them applies only what
-- is past c, however many instances deliver it and however often (see
-- region_apply.lua). It lives an hour after the last admission: a key idle
-- longer begins a new journal (a new e), which its peers apply whole.
if not denied and n0 > 0 and block >= 0 then
  local jk = KEYS[nkeys + (rid ~= '' and nrules or 0) + 1]
  if jk then
    local e, c, k = now, n0, 1
    local v = rcall('GET', jk)
    if v then
      local je, jc, jn = string.match(v, '^(%d+):(%d+):(%d+):')
      e, c, k = je + 0, jc + n0, jn + 1
    end
    rcall('SET', jk, string.format('%d:%d:%d:%d', e, c, k, now), 'PX', 3600000)
  end
end
