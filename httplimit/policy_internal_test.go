package httplimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/redlimit/redlimit"
)

// TestSeveralPolicies checks the fields for a limiter of several rules on
// one key, as the header code will get them once redlimit has one: every
// policy in RateLimit-Policy, in order, and RateLimit and X-RateLimit-Limit
// for the one that decided.
func TestSeveralPolicies(t *testing.T) {
	t.Parallel()
	list := []quotaPolicy{
		{Name: "burst", Strategy: redlimit.TokenBucket, Limit: redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}},
		{Name: "no limit", Strategy: redlimit.FixedWindow},
		{Name: "hourly", Strategy: redlimit.SlidingCounter, Limit: redlimit.PerHour(1000)},
	}
	res := redlimit.Result{Allowed: true, Limit: redlimit.PerHour(1000), Remaining: 12, ResetAfter: 30 * time.Minute}
	h := http.Header{}
	setHeaders(h, res, list, "hourly", true)
	assert.Equal(t, `"burst";q=20;w=2, "hourly";q=1000;w=3600`, h.Get(HeaderRateLimitPolicy))
	assert.Equal(t, `"hourly";r=12;t=1800`, h.Get(HeaderRateLimit))
	assert.Equal(t, "1000", h.Get(HeaderXRateLimitLimit))
	assert.Equal(t, "12", h.Get(HeaderXRateLimitRemaining))
	assert.Equal(t, "1800", h.Get(HeaderXRateLimitReset))

	h = http.Header{}
	setHeaders(h, res, list[1:2], "no limit", true)
	assert.Empty(t, h.Values(HeaderRateLimitPolicy), "no usable limit")
	assert.Empty(t, h.Values(HeaderXRateLimitLimit), "no usable limit")
	assert.Equal(t, `"no limit";r=12;t=1800`, h.Get(HeaderRateLimit))
}
