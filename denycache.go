package redlimit

import "github.com/redlimit/redlimit/internal/denycache"

// denyCache is the cache of WithDenyCache: Redis's denials by first state
// key, each for the n and the limits (ruleSet.sig, with the call's share)
// it denied, until its RetryAfter (see internal/denycache).
type denyCache = denycache.Cache[Result]

func newDenyCache(size int) *denyCache { return denycache.New[Result](size) }

// lookupDenial returns Redis's denial of n events for key under the limits
// sig, if c knows it still holds, with its times counted down, so that the
// deciding rule, its limit and the reset it gave stay what Redis said.
func lookupDenial(c *denyCache, key string, n int, sig uint64) (Result, bool) {
	res, age, ok := c.Lookup(key, n, sig)
	if !ok {
		return Result{}, false
	}
	res.ResetAfter = max(res.ResetAfter, res.RetryAfter) - age
	res.RuleResetAfter = max(res.RuleResetAfter, res.RetryAfter) - age
	res.RetryAfter -= age
	return res, true
}
