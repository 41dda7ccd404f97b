package grpclimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/grpclimit"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// hourStart is the start of an hour, so that a fixed window of an hour
// resets 3600s later.
var hourStart = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// miniPolicy returns a redlimit.Policy of rules on a fresh miniredis whose
// clock stands still at now.
func miniPolicy(t *testing.T, now time.Time, rules []redlimit.Rule, opts ...redlimit.Option) *redlimit.Policy {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(now)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	p, err := redlimit.NewPolicy(rdb, rules, append([]redlimit.Option{redlimit.WithFallback(redlimit.FallbackError)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// wantHeaders checks the rate-limit metadata of a call; "" means absent.
func wantHeaders(t *testing.T, what string, header metadata.MD, policy, limit, remaining, reset, retry string) {
	t.Helper()
	for _, f := range []struct{ name, want string }{
		{grpclimit.HeaderPolicy, policy},
		{grpclimit.HeaderLimit, limit},
		{grpclimit.HeaderRemaining, remaining},
		{grpclimit.HeaderReset, reset},
		{grpclimit.HeaderRetryAfter, retry},
	} {
		want := []string{f.want}
		if f.want == "" {
			want = nil
		}
		assert.Equal(t, want, header.Get(f.name), "%s: %s", what, f.name)
	}
}

// A redlimit.Policy: ratelimit-policy lists every rule, in order and named
// as the rules, as httplimit's RateLimit-Policy field does; the other
// entries describe the deciding rule (the fewest remaining), with its own
// reset (until the bucket is full again, not the hour).
func TestPolicyHeaders(t *testing.T) {
	t.Parallel()
	p := miniPolicy(t, hourStart, []redlimit.Rule{
		{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(10)},
		{Name: "hour", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(1000)},
	})
	s := newServer(t, p)
	const policy = `"second";q=10;w=1, "hour";q=1000;w=3600`
	for i, remaining := range []string{"9", "8"} {
		header, err := s.check(t)
		require.NoError(t, err, "call %d", i+1)
		wantHeaders(t, "call", header, policy, "10", remaining, "1", "")
	}
}

// A Policy of a per-second and a per-hour rule, denied by the per-second
// rule: ratelimit-limit is its quota and ratelimit-reset its own reset, 1s,
// not the hour's (it said 3600 beside the per-second quota, and a client
// honouring it waited an hour; issue 36 item 12).
func TestPolicyDeniedBySecond(t *testing.T) {
	t.Parallel()
	p := miniPolicy(t, hourStart.Add(10*time.Minute), []redlimit.Rule{
		{Name: "rps", Strategy: redlimit.FixedWindow, Limit: redlimit.PerSecond(2)},
		{Name: "rph", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(3)},
	})
	s := newServer(t, p)
	const policy = `"rps";q=2;w=1, "rph";q=3;w=3600`
	for i, remaining := range []string{"1", "0"} {
		header, err := s.check(t)
		require.NoError(t, err, "call %d", i+1)
		wantHeaders(t, "call", header, policy, "2", remaining, "1", "")
	}
	header, err := s.check(t)
	wantCode(t, "call 3", err, codes.ResourceExhausted)
	wantHeaders(t, "call 3", header, policy, "2", "0", "1", "1")
}

// A Policy denied by its hour rule: ratelimit-limit is the hour's q, and
// retry-after (and the RetryInfo detail) the time until the hour's window
// ends.
func TestPolicyDeniedByHour(t *testing.T) {
	t.Parallel()
	p := miniPolicy(t, hourStart.Add(10*time.Minute), []redlimit.Rule{
		{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(10)},
		{Name: "hour", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(2)},
	})
	s := newServer(t, p)
	const policy = `"second";q=10;w=1, "hour";q=2;w=3600`
	for i, remaining := range []string{"1", "0"} {
		header, err := s.check(t)
		require.NoError(t, err, "call %d", i+1)
		wantHeaders(t, "call", header, policy, "2", remaining, "3000", "")
	}
	header, err := s.check(t)
	wantCode(t, "call 3", err, codes.ResourceExhausted)
	var delays []time.Duration
	for _, d := range status.Convert(err).Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			delays = append(delays, ri.GetRetryDelay().AsDuration())
		}
	}
	assert.Equal(t, []time.Duration{50 * time.Minute}, delays, "call 3: RetryInfo")
	wantHeaders(t, "call 3", header, policy, "2", "0", "3000", "3000")
	assert.Equal(t, int64(2), s.calls.Load(), "calls to the handler")
}

// With redlimit.WithRulesFunc, ratelimit-policy lists the rules the call
// was decided by (its caller's plan), not the policy's own, and the other
// entries describe the deciding rule of that plan.
func TestPolicyRulesFunc(t *testing.T) {
	t.Parallel()
	free := []redlimit.Rule{
		{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(2)},
		{Name: "hour", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(20)},
	}
	plans := map[string][]redlimit.Rule{
		"paid": {
			{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(10)},
			{Name: "hour", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(1000)},
		},
		// The hour decides: the fewest remaining.
		"trial": {
			{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(10)},
			{Name: "hour", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(1)},
		},
		// Other rules, one of them named by default, in another order.
		"enterprise": {
			{Name: "minute", Strategy: redlimit.SlidingLog, Limit: redlimit.PerMinute(600)},
			{Strategy: redlimit.TokenBucket, Limit: redlimit.Limit{Rate: 50, Period: time.Second, Burst: 100}},
		},
	}
	p := miniPolicy(t, hourStart, free, redlimit.WithRulesFunc(func(_ context.Context, key string) ([]redlimit.Rule, error) {
		return plans[key], nil
	}))
	s := newServer(t, p, grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-api-key")))
	for _, tt := range []struct {
		key                                    string
		policy, limit, remaining, reset, retry string
	}{
		{"anon", `"second";q=2;w=1, "hour";q=20;w=3600`, "2", "1", "1", ""},
		{"paid", `"second";q=10;w=1, "hour";q=1000;w=3600`, "10", "9", "1", ""},
		{"trial", `"second";q=10;w=1, "hour";q=1;w=3600`, "1", "0", "3600", ""},
		{"trial", `"second";q=10;w=1, "hour";q=1;w=3600`, "1", "0", "3600", "3600"},
		{"enterprise", `"minute";q=600;w=60, "token-bucket-1s";q=100;w=2`, "100", "99", "1", ""},
	} {
		header, err := s.check(t, "x-api-key", tt.key)
		if tt.retry == "" {
			require.NoError(t, err, tt.key)
		} else {
			wantCode(t, tt.key, err, codes.ResourceExhausted)
		}
		wantHeaders(t, tt.key, header, tt.policy, tt.limit, tt.remaining, tt.reset, tt.retry)
	}
}

// With redlimit.WithLimitFunc, a single-strategy limiter's one policy is
// the limit the call's key was given.
func TestLimitFuncHeaders(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	m.SetTime(windowStart)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(2), redlimit.WithFallback(redlimit.FallbackError),
		redlimit.WithLimitFunc(func(_ context.Context, key string) (redlimit.Limit, error) {
			if key == "paid" {
				return redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, nil
			}
			return redlimit.PerSecond(2), nil
		}))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	s := newServer(t, lim, grpclimit.WithKeyFunc(grpclimit.MetadataKey("x-api-key")))
	header, err := s.check(t, "x-api-key", "paid")
	require.NoError(t, err)
	wantHeaders(t, "paid", header, `"token-bucket";q=20;w=2`, "20", "19", "1", "")
	header, err = s.check(t, "x-api-key", "free")
	require.NoError(t, err)
	wantHeaders(t, "free", header, `"token-bucket";q=2;w=1`, "2", "1", "1", "")
}
