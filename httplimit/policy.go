package httplimit

import (
	"strconv"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/ratelimitfields"
)

// Quota returns the quota policy that the RateLimit-Policy field
// advertises for a limit l of strategy s: q events (quota units) in a
// window of w seconds.
//
// The policy is the most that r, the RateLimit field's remaining quota, can
// show, at the limit's steady rate:
//
//   - FixedWindow, SlidingLog, SlidingCounter, SubWindowCounter: Rate
//     events per Period.
//   - TokenBucket, LeakyBucket: Burst events per Burst × Period / Rate, the
//     time an empty bucket takes to fill. A client can spend the whole
//     burst, wait w, and spend it again; and q is at least Burst, which r
//     shows when the bucket is full. Quoting Rate instead (q=10 for Rate
//     10, Burst 20) would let r exceed q.
//   - Any other s (0, for a Limiter that does not report its strategy):
//     as a bucket of max(Rate, Burst), which r cannot exceed either way.
//
// The draft (draft-ietf-httpapi-ratelimit-headers) has w in whole seconds,
// at least 1, so the policy's span is rounded up to w seconds and q is the
// steady rate over w, rounded down: q = floor(Rate × w / Period). That is
// exact when the span is whole seconds (q is Rate, or Burst). Otherwise q/w
// is the true rate less at most one event per window, never more, and q
// is still at least Rate (or Burst): 10 per 100ms gives q=100;w=1 rather
// than q=10;w=1, a tenth of the rate; 3 per 1.5s gives q=4;w=2. Scaling
// only periods under a second to one second would leave periods such as
// 1.5s understated; rounding the span up and scaling q to it covers both.
//
// ok is false when l has no positive Rate and Period, or q does not fit a
// Structured Field Integer (15 digits).
func Quota(s redlimit.Strategy, l redlimit.Limit) (q, w int64, ok bool) {
	return ratelimitfields.Quota(s, l)
}

// formatRateLimit returns the value of the RateLimit field: the policy
// named name, which decided res, with its remaining quota r and the
// seconds t until that policy is back at its full allowance.
func formatRateLimit(name string, res redlimit.Result) string {
	return ratelimitfields.String(name) + ";r=" + strconv.FormatInt(remaining(res), 10) +
		";t=" + strconv.FormatInt(resetSeconds(res), 10)
}

// remaining is res.Remaining as a Structured Field Integer: not negative,
// at most 15 digits.
func remaining(res redlimit.Result) int64 {
	return min(int64(max(res.Remaining, 0)), ratelimitfields.MaxInteger)
}

// resetSeconds is ratelimitfields.ResetAfter in whole seconds, rounded up (at
// most 10 digits, so always a Structured Field Integer): the reset of the
// policy that decided, which the RateLimit field names, not the latest of
// a redlimit.Policy's rules (a per-second rule's t=3600 beside an hourly
// one).
func resetSeconds(res redlimit.Result) int64 {
	return ceilSeconds(ratelimitfields.ResetAfter(res))
}
