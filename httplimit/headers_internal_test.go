package httplimit

import (
	"net/http"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// quotaPolicy is a quota policy as the tests of this package write it.
type quotaPolicy ratelimitfields.Policy

// setHeaders is writeHeaders for a list of quotaPolicy.
func setHeaders(h http.Header, res redlimit.Result, list []quotaPolicy, deciding string, xRateLimit bool) {
	ps := make([]ratelimitfields.Policy, len(list))
	for i, p := range list {
		ps[i] = ratelimitfields.Policy(p)
	}
	writeHeaders(h, res, ps, deciding, xRateLimit)
}
