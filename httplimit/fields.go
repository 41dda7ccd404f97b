package httplimit

import (
	"net/http"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// SetHeaders writes the rate-limit fields for res, a decision of l, into
// h, as the middleware writes them: RateLimit-Policy (every rule of a
// [redlimit.Policy], in order, or the one policy of a single-strategy
// limiter), RateLimit for the policy that decided (Result.Rule), and on a
// denial Retry-After, in whole seconds rounded up and at least 1. It is
// for handlers that decide themselves, with their own Reserve, AllowN or
// a [redlimit.Reservation]'s Result, so that their 429 describes the
// limit that denied it, not the middleware's. Policies are named as the
// middleware names them (see the package documentation); a Policy with
// [redlimit.WithRulesFunc] lists its own rules, not the call's. The fields
// that an earlier decision wrote (a middleware's), X-RateLimit-* included,
// are replaced or removed.
func SetHeaders(h http.Header, l redlimit.Limiter, res redlimit.Result) {
	clearFields(h)
	h.Del(HeaderRetryAfter)
	policies := ratelimitfields.NewSource(l, "", false, DefaultPolicyName)
	list, deciding := policies.Policies(res, nil)
	writeHeaders(h, res, list, deciding, false)
	if !res.Allowed {
		setRetryAfter(h, res.RetryAfter)
	}
}

// clearFields removes the fields that describe a rate limit's decision
// from h: RateLimit, RateLimit-Policy and X-RateLimit-*.
func clearFields(h http.Header) {
	for _, f := range []string{HeaderRateLimit, HeaderRateLimitPolicy, HeaderXRateLimitLimit, HeaderXRateLimitRemaining, HeaderXRateLimitReset} {
		h.Del(f)
	}
}
