package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/callrules"
)

// miniPolicy returns a redlimit.Policy of rules on a new miniredis whose
// clock stands at the start of an hour.
func miniPolicy(t *testing.T, rules []redlimit.Rule, opts ...redlimit.Option) *redlimit.Policy {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	p, err := redlimit.NewPolicy(rdb, rules, append([]redlimit.Option{redlimit.WithFallback(redlimit.FallbackError)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	return p
}

// A redlimit.Policy: RateLimit-Policy lists every rule, and RateLimit
// reports the deciding one, with the Result's remaining (the least over the
// rules) and the deciding rule's own reset (until the bucket is full again,
// not the hour).
func TestPolicyHeaders(t *testing.T) {
	t.Parallel()
	p := miniPolicy(t, []redlimit.Rule{
		{Name: "burst", Strategy: redlimit.TokenBucket, Limit: redlimit.Limit{Rate: 10, Period: time.Second, Burst: 3}},
		{Name: "hourly", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(100)},
	})
	h := httplimit.Middleware(p)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	do := func() *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = "192.0.2.1:1234"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	rec := do()
	assert.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, `"burst";q=10;w=1, "hourly";q=100;w=3600`, rec.Header().Get(httplimit.HeaderRateLimitPolicy))
	assert.Equal(t, `"burst";r=2;t=1`, rec.Header().Get(httplimit.HeaderRateLimit))
	do()
	do()
	rec = do()
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, `"burst";r=0;t=1`, rec.Header().Get(httplimit.HeaderRateLimit))
}

// A 429 of a Policy of a per-second and a per-hour rule, denied by the
// per-second rule: RateLimit names it with its own reset, t=1, not the
// hour's (it said "rps";r=0;t=3600, and a client honouring it waited an
// hour; issue 36 item 12); so does X-RateLimit-Reset.
func TestPolicyRateLimitDecidingReset(t *testing.T) {
	t.Parallel()
	p := miniPolicy(t, []redlimit.Rule{
		{Name: "rps", Strategy: redlimit.FixedWindow, Limit: redlimit.PerSecond(2)},
		{Name: "rph", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(3)},
	})
	h := httplimit.Middleware(p, httplimit.WithXRateLimitHeaders(true))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	do := func(ip string) *httptest.ResponseRecorder {
		req := httptest.NewRequest("GET", "/", nil)
		req.RemoteAddr = ip + ":1234"
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}
	do("192.0.2.1")
	do("192.0.2.1")
	rec := do("192.0.2.1")
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, `"rps";r=0;t=1`, rec.Header().Get(httplimit.HeaderRateLimit), "denied by the second")
	assert.Equal(t, "1", rec.Header().Get(httplimit.HeaderXRateLimitReset))
	assert.Equal(t, "2", rec.Header().Get(httplimit.HeaderXRateLimitLimit))
}

// With redlimit.WithRulesFunc, RateLimit-Policy lists the rules the
// request was decided by (its caller's plan), each with that plan's limit,
// not the policy's own; RateLimit and X-RateLimit-Limit report the deciding
// rule of that plan.
func TestRulesFuncHeaders(t *testing.T) {
	t.Parallel()
	// The policy's own rules are the free plan; the rules function gives
	// the others by API key (nil: the policy's own).
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
			{Name: "hour", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(3)},
		},
		// Other rules, one of them named by default, in another order.
		"enterprise": {
			{Name: "minute", Strategy: redlimit.SlidingLog, Limit: redlimit.PerMinute(600)},
			{Strategy: redlimit.TokenBucket, Limit: redlimit.Limit{Rate: 50, Period: time.Second, Burst: 100}},
		},
		// The free plan given explicitly.
		"free": free,
	}
	rulesFunc := func(_ context.Context, key string) ([]redlimit.Rule, error) {
		return plans[key], nil
	}
	type step struct {
		key               string
		code              int
		policy, rateLimit string
		xLimit, retry     string
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{"free caller, the policy's own rules", []step{
			{"anon", http.StatusOK, `"second";q=2;w=1, "hour";q=20;w=3600`, `"second";r=1;t=1`, "2", ""},
			{"anon", http.StatusOK, `"second";q=2;w=1, "hour";q=20;w=3600`, `"second";r=0;t=1`, "2", ""},
			{"anon", http.StatusTooManyRequests, `"second";q=2;w=1, "hour";q=20;w=3600`, `"second";r=0;t=1`, "2", "1"},
		}},
		{"free plan from the rules function", []step{
			{"free", http.StatusOK, `"second";q=2;w=1, "hour";q=20;w=3600`, `"second";r=1;t=1`, "2", ""},
		}},
		{"paid caller", []step{
			{"paid", http.StatusOK, `"second";q=10;w=1, "hour";q=1000;w=3600`, `"second";r=9;t=1`, "10", ""},
			{"paid", http.StatusOK, `"second";q=10;w=1, "hour";q=1000;w=3600`, `"second";r=8;t=1`, "10", ""},
		}},
		{"trial caller, decided by the hour", []step{
			{"trial", http.StatusOK, `"second";q=10;w=1, "hour";q=3;w=3600`, `"hour";r=2;t=3600`, "3", ""},
			{"trial", http.StatusOK, `"second";q=10;w=1, "hour";q=3;w=3600`, `"hour";r=1;t=3600`, "3", ""},
			{"trial", http.StatusOK, `"second";q=10;w=1, "hour";q=3;w=3600`, `"hour";r=0;t=3600`, "3", ""},
			{"trial", http.StatusTooManyRequests, `"second";q=10;w=1, "hour";q=3;w=3600`, `"hour";r=0;t=3600`, "3", "3600"},
		}},
		{"enterprise caller, other rules", []step{
			{"enterprise", http.StatusOK, `"minute";q=600;w=60, "token-bucket-1s";q=100;w=2`, `"token-bucket-1s";r=99;t=1`, "100", ""},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := miniPolicy(t, free, redlimit.WithRulesFunc(rulesFunc))
			mw := httplimit.Middleware(p, httplimit.WithKeyFunc(httplimit.HeaderKey("X-API-Key")), httplimit.WithXRateLimitHeaders(true))
			for i, st := range tt.steps {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest(http.MethodGet, "/", nil)
				req.Header.Set("X-API-Key", st.key)
				mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec, req)
				h := rec.Header()
				assert.Equal(t, st.code, rec.Code, "request %d (%s): status", i, st.key)
				assert.Equal(t, st.policy, h.Get(httplimit.HeaderRateLimitPolicy), "request %d (%s): RateLimit-Policy", i, st.key)
				assert.Equal(t, st.rateLimit, h.Get(httplimit.HeaderRateLimit), "request %d (%s): RateLimit", i, st.key)
				assert.Equal(t, st.xLimit, h.Get(httplimit.HeaderXRateLimitLimit), "request %d (%s): X-RateLimit-Limit", i, st.key)
				assert.Equal(t, st.retry, h.Get(httplimit.HeaderRetryAfter), "request %d (%s): Retry-After", i, st.key)
			}
		})
	}
}

// The context the rules function gets is the request's, and the next
// handler's context carries the Result but not the middleware's own values.
func TestRulesFuncContext(t *testing.T) {
	t.Parallel()
	type ctxKey struct{}
	var got any
	p := miniPolicy(t, []redlimit.Rule{{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(2)}},
		redlimit.WithRulesFunc(func(ctx context.Context, _ string) ([]redlimit.Rule, error) {
			got = ctx.Value(ctxKey{})
			return []redlimit.Rule{{Name: "second", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(5)}}, nil
		}))
	var res redlimit.Result
	var ok, sink bool
	next := http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		res, ok = httplimit.ResultFromContext(r.Context())
		sink = callrules.From[redlimit.Rule](r.Context()) != nil
	})
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req = req.WithContext(context.WithValue(req.Context(), ctxKey{}, "v"))
	httplimit.Middleware(p)(next).ServeHTTP(rec, req)
	assert.Equal(t, "v", got, "the rules function gets the request's context")
	require.True(t, ok, "ResultFromContext")
	assert.Equal(t, redlimit.PerSecond(5).Rate, res.Limit.Rate, "the Result of the plan")
	assert.False(t, sink, "the next handler's context carries the middleware's sink")
	assert.Equal(t, `"second";q=5;w=1`, rec.Header().Get(httplimit.HeaderRateLimitPolicy))
}
