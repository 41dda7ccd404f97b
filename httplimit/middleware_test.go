package httplimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
)

// fakeLimiter answers every AllowN with res and err, and records the keys.
type fakeLimiter struct {
	res redlimit.Result
	err error

	mu   sync.Mutex
	keys []string
}

func (f *fakeLimiter) Allow(ctx context.Context, key string) (redlimit.Result, error) {
	return f.AllowN(ctx, key, 1)
}

func (f *fakeLimiter) AllowN(_ context.Context, key string, _ int) (redlimit.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.keys = append(f.keys, key)
	return f.res, f.err
}

func (f *fakeLimiter) Wait(ctx context.Context, key string) error { return f.WaitN(ctx, key, 1) }

func (f *fakeLimiter) WaitN(context.Context, string, int) error {
	return errors.New("fakeLimiter: WaitN not implemented")
}

func (f *fakeLimiter) Reset(context.Context, string) error { return nil }
func (f *fakeLimiter) Close() error                        { return nil }

func (f *fakeLimiter) calls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.keys...)
}

// okHandler answers 200 "ok" and counts its calls.
type okHandler struct {
	mu    sync.Mutex
	calls int
	res   redlimit.Result // from the last request's context
	hasR  bool
}

func (h *okHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.calls++
	h.res, h.hasR = httplimit.ResultFromContext(r.Context())
	h.mu.Unlock()
	fmt.Fprint(w, "ok")
}

func (h *okHandler) count() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.calls
}

// serve runs one request through the middleware.
func serve(mw func(http.Handler) http.Handler, next http.Handler, r *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	mw(next).ServeHTTP(rec, r)
	return rec
}

// wantHeaders checks the named header fields; "" means absent.
func wantHeaders(t *testing.T, h http.Header, want map[string]string) {
	t.Helper()
	for name, w := range want {
		assert.Equal(t, w, h.Get(name), "%s = %q, want %q", name, h.Get(name), w)
		if w == "" {
			assert.Empty(t, h.Values(name), "%s present (%q), want absent", name, h.Values(name))
		}
	}
}

var allHeaders = []string{
	httplimit.HeaderRateLimitPolicy, httplimit.HeaderRateLimit, httplimit.HeaderRetryAfter,
	httplimit.HeaderXRateLimitLimit, httplimit.HeaderXRateLimitRemaining, httplimit.HeaderXRateLimitReset,
}

func noHeaders() map[string]string {
	m := make(map[string]string)
	for _, h := range allHeaders {
		m[h] = ""
	}
	return m
}

func TestAllowedHeaders(t *testing.T) {
	t.Parallel()
	res := redlimit.Result{
		Allowed:    true,
		Limit:      redlimit.Limit{Rate: 100, Period: 90*time.Second + time.Millisecond, Burst: 100},
		Remaining:  7,
		ResetAfter: 1200 * time.Millisecond,
	}
	tests := []struct {
		name string
		opts []httplimit.Option
		want map[string]string
	}{
		{"default", nil, map[string]string{
			httplimit.HeaderRateLimitPolicy:     `"default";q=101;w=91`,
			httplimit.HeaderRateLimit:           `"default";r=7;t=2`,
			httplimit.HeaderRetryAfter:          "",
			httplimit.HeaderXRateLimitLimit:     "",
			httplimit.HeaderXRateLimitRemaining: "",
			httplimit.HeaderXRateLimitReset:     "",
		}},
		{"x-ratelimit on", []httplimit.Option{httplimit.WithXRateLimitHeaders(true)}, map[string]string{
			httplimit.HeaderRateLimitPolicy:     `"default";q=101;w=91`,
			httplimit.HeaderRateLimit:           `"default";r=7;t=2`,
			httplimit.HeaderRetryAfter:          "",
			httplimit.HeaderXRateLimitLimit:     "101", // q: 100 per 90.001s is 101 per 91s
			httplimit.HeaderXRateLimitRemaining: "7",
			httplimit.HeaderXRateLimitReset:     "2",
		}},
		{"x-ratelimit on then off", []httplimit.Option{httplimit.WithXRateLimitHeaders(true), httplimit.WithXRateLimitHeaders(false)}, map[string]string{
			httplimit.HeaderRateLimit:       `"default";r=7;t=2`,
			httplimit.HeaderXRateLimitLimit: "",
		}},
		{"policy name", []httplimit.Option{httplimit.WithPolicyName(`per "ip"\x`)}, map[string]string{
			httplimit.HeaderRateLimitPolicy: `"per \"ip\"\\x";q=101;w=91`,
			httplimit.HeaderRateLimit:       `"per \"ip\"\\x";r=7;t=2`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			next := &okHandler{}
			rec := serve(httplimit.Middleware(&fakeLimiter{res: res}, tt.opts...), next, request("192.0.2.1:1"))
			assert.Equal(t, http.StatusOK, rec.Code, "status = %d, want %d", rec.Code, http.StatusOK)
			assert.Equal(t, "ok", rec.Body.String(), "body = %q, want %q", rec.Body.String(), "ok")
			wantHeaders(t, rec.Header(), tt.want)
			assert.True(t, next.hasR, "ResultFromContext = %+v, %v, want %+v, true", next.res, next.hasR, res)
			assert.Equal(t, res, next.res, "ResultFromContext = %+v, %v, want %+v, true", next.res, next.hasR, res)
		})
	}
}

func TestHeaderValues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		limit             redlimit.Limit
		remaining         int
		reset             time.Duration
		policy, ratelimit string
	}{
		{redlimit.PerSecond(10), 9, 100 * time.Millisecond, `"default";q=10;w=1`, `"default";r=9;t=1`},
		{redlimit.PerMinute(60), 0, time.Minute, `"default";q=60;w=60`, `"default";r=0;t=60`},
		{redlimit.PerHour(1000), 5, 0, `"default";q=1000;w=3600`, `"default";r=5;t=0`},
		// Periods that are not whole seconds: the steady rate over w, the
		// span rounded up (see Quota).
		{redlimit.Limit{Rate: 3, Period: time.Millisecond}, 3, time.Nanosecond, `"default";q=3000;w=1`, `"default";r=3;t=1`},
		{redlimit.Limit{Rate: 3, Period: 1500 * time.Millisecond}, 1, 2 * time.Second, `"default";q=4;w=2`, `"default";r=1;t=2`},
		{redlimit.Limit{Rate: 3, Period: 1500 * time.Millisecond}, 1, 2*time.Second + time.Microsecond, `"default";q=4;w=2`, `"default";r=1;t=3`},
		// A Limiter that does not report its strategy: q covers the Burst
		// too, whichever it is.
		{redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, 19, 100 * time.Millisecond, `"default";q=20;w=2`, `"default";r=19;t=1`},
		// r never negative, and clamped to 15 digits.
		{redlimit.PerSecond(1), -1, 0, `"default";q=1;w=1`, `"default";r=0;t=0`},
		{redlimit.PerSecond(1), 1 << 60, 1 << 62, `"default";q=1;w=1`, `"default";r=999999999999999;t=4611686019`},
		// q past 15 digits: no policy field.
		{redlimit.Limit{Rate: 1 << 50, Period: time.Millisecond}, 1, time.Second, "", `"default";r=1;t=1`},
		// A result with no Limit (not one of redlimit's): no policy field.
		{redlimit.Limit{}, 2, time.Second, "", `"default";r=2;t=1`},
	}
	for _, tt := range tests {
		res := redlimit.Result{Allowed: true, Limit: tt.limit, Remaining: tt.remaining, ResetAfter: tt.reset}
		rec := serve(httplimit.Middleware(&fakeLimiter{res: res}), &okHandler{}, request("192.0.2.1:1"))
		h := rec.Header()
		assert.Equal(t, tt.policy, h.Get(httplimit.HeaderRateLimitPolicy), "%v reset %v: RateLimit-Policy = %q, want %q", tt.limit, tt.reset, h.Get(httplimit.HeaderRateLimitPolicy), tt.policy)
		assert.Equal(t, tt.ratelimit, h.Get(httplimit.HeaderRateLimit), "%v reset %v: RateLimit = %q, want %q", tt.limit, tt.reset, h.Get(httplimit.HeaderRateLimit), tt.ratelimit)
	}
}

func TestDenied(t *testing.T) {
	t.Parallel()
	tests := []struct {
		retry time.Duration
		want  string
	}{
		{1200 * time.Millisecond, "2"},
		{300 * time.Millisecond, "1"},
		{time.Nanosecond, "1"},
		{0, "1"}, // never 0 when denied
		{time.Second, "1"},
		{2 * time.Second, "2"},
		{time.Minute + time.Millisecond, "61"},
	}
	for _, tt := range tests {
		res := redlimit.Result{
			Limit:      redlimit.PerSecond(5),
			RetryAfter: tt.retry,
			ResetAfter: 800 * time.Millisecond,
		}
		next := &okHandler{}
		rec := serve(httplimit.Middleware(&fakeLimiter{res: res}, httplimit.WithXRateLimitHeaders(true)), next, request("192.0.2.1:1"))
		assert.Equal(t, http.StatusTooManyRequests, rec.Code, "RetryAfter %v: status = %d, want %d", tt.retry, rec.Code, http.StatusTooManyRequests)
		assert.Equal(t, "Too Many Requests\n", rec.Body.String(), "RetryAfter %v: body = %q, want %q", tt.retry, rec.Body.String(), "Too Many Requests\n")
		assert.Equal(t, "text/plain; charset=utf-8", rec.Header().Get("Content-Type"), "RetryAfter %v: Content-Type = %q, want %q", tt.retry, rec.Header().Get("Content-Type"), "text/plain; charset=utf-8")
		wantHeaders(t, rec.Header(), map[string]string{
			httplimit.HeaderRetryAfter:          tt.want,
			httplimit.HeaderRateLimitPolicy:     `"default";q=5;w=1`,
			httplimit.HeaderRateLimit:           `"default";r=0;t=1`,
			httplimit.HeaderXRateLimitLimit:     "5",
			httplimit.HeaderXRateLimitRemaining: "0",
			httplimit.HeaderXRateLimitReset:     "1",
		})
		assert.Equal(t, 0, next.count(), "RetryAfter %v: next called %d times, want 0", tt.retry, next.count())
	}
}

func TestDeniedHandler(t *testing.T) {
	t.Parallel()
	res := redlimit.Result{Limit: redlimit.PerSecond(5), RetryAfter: 2500 * time.Millisecond}
	denied := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok := httplimit.ResultFromContext(r.Context())
		assert.True(t, ok, "ResultFromContext = %+v, %v, want %+v, true", got, ok, res)
		assert.Equal(t, res, got, "ResultFromContext = %+v, %v, want %+v, true", got, ok, res)
		assert.Equal(t, "3", w.Header().Get(httplimit.HeaderRetryAfter), "Retry-After in denied handler = %q, want %q", w.Header().Get(httplimit.HeaderRetryAfter), "3")
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		fmt.Fprint(w, `{"error":"slow down"}`)
	})
	rec := serve(httplimit.Middleware(&fakeLimiter{res: res}, httplimit.WithDeniedHandler(denied)), &okHandler{}, request("192.0.2.1:1"))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "status = %d, want %d", rec.Code, http.StatusTooManyRequests)
	assert.Equal(t, `{"error":"slow down"}`, rec.Body.String(), "body = %q, want %q", rec.Body.String(), `{"error":"slow down"}`)
	assert.Equal(t, "3", rec.Header().Get(httplimit.HeaderRetryAfter), "Retry-After = %q, want %q", rec.Header().Get(httplimit.HeaderRetryAfter), "3")
}

// A request without a key is answered by the key error handler, before
// the limiter (or, in ConcurrencyMiddleware, Redis) is asked anything.
func TestKeyError(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("boom")
	tests := []struct {
		name string
		key  httplimit.KeyFunc
		r    *http.Request
		code int
		is   error
	}{
		{"missing header", httplimit.HeaderKey("X-Api-Key"), request("192.0.2.1:1"), http.StatusBadRequest, httplimit.ErrNoKey},
		{"empty key", func(*http.Request) (string, error) { return "", nil }, request("192.0.2.1:1"), http.StatusBadRequest, httplimit.ErrNoKey},
		{"key func error", func(*http.Request) (string, error) { return "", errBoom }, request("192.0.2.1:1"), http.StatusInternalServerError, errBoom},
		{"bad RemoteAddr", httplimit.IPKey(), request("@"), http.StatusInternalServerError, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lim := &fakeLimiter{res: redlimit.Result{Allowed: true, Limit: redlimit.PerSecond(1)}}
			c, rdb := miniConcurrency(t, 1, time.Minute)
			for _, m := range []struct {
				name      string
				mw        func(...httplimit.Option) func(http.Handler) http.Handler
				untouched func(t *testing.T)
			}{
				{"Middleware", func(o ...httplimit.Option) func(http.Handler) http.Handler { return httplimit.Middleware(lim, o...) },
					func(t *testing.T) { assert.Empty(t, lim.calls(), "limiter called with %q, want no call", lim.calls()) }},
				{"ConcurrencyMiddleware", func(o ...httplimit.Option) func(http.Handler) http.Handler {
					return httplimit.ConcurrencyMiddleware(c, o...)
				},
					func(t *testing.T) {
						n, err := rdb.DBSize(context.Background()).Result()
						require.NoError(t, err)
						assert.Zero(t, n, "%d keys in Redis, want none: no lease asked for", n)
					}},
			} {
				t.Run(m.name, func(t *testing.T) {
					next := &okHandler{}
					rec := serve(m.mw(httplimit.WithKeyFunc(tt.key)), next, tt.r)
					assert.Equal(t, tt.code, rec.Code, "status = %d, want %d", rec.Code, tt.code)
					assert.Equal(t, http.StatusText(tt.code)+"\n", rec.Body.String(), "body = %q, want %q", rec.Body.String(), http.StatusText(tt.code)+"\n")
					wantHeaders(t, rec.Header(), noHeaders())
					assert.Equal(t, 0, next.count(), "next called %d times, want 0", next.count())
					m.untouched(t)

					// A custom handler gets the key function's error.
					var gotErr error
					mw := m.mw(httplimit.WithKeyFunc(tt.key),
						httplimit.WithKeyErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
							gotErr = err
							http.Error(w, "who are you", http.StatusUnauthorized)
						}))
					rec = serve(mw, next, tt.r)
					assert.Equal(t, http.StatusUnauthorized, rec.Code, "custom handler: status = %d, want %d", rec.Code, http.StatusUnauthorized)
					assert.Error(t, gotErr, "custom handler: err = %v, want one wrapping %v", gotErr, tt.is)
					if tt.is != nil {
						assert.ErrorIs(t, gotErr, tt.is, "custom handler: err = %v, want one wrapping %v", gotErr, tt.is)
					}
				})
			}
		})
	}
}

func TestLimiterError(t *testing.T) {
	t.Parallel()
	errDown := fmt.Errorf("redis is gone: %w", redlimit.ErrUnavailable)
	lim := &fakeLimiter{err: errDown}
	next := &okHandler{}
	rec := serve(httplimit.Middleware(lim), next, request("192.0.2.1:1"))
	assert.Equal(t, http.StatusServiceUnavailable, rec.Code, "status = %d, want %d", rec.Code, http.StatusServiceUnavailable)
	assert.Equal(t, "Service Unavailable\n", rec.Body.String(), "body = %q, want %q", rec.Body.String(), "Service Unavailable\n")
	wantHeaders(t, rec.Header(), noHeaders())
	assert.Equal(t, 0, next.count(), "next called %d times, want 0", next.count())

	var gotErr error
	mw := httplimit.Middleware(lim, httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
		gotErr = err
		w.WriteHeader(http.StatusTeapot)
	}))
	rec = serve(mw, next, request("192.0.2.1:1"))
	assert.Equal(t, http.StatusTeapot, rec.Code, "custom handler: status = %d, want %d", rec.Code, http.StatusTeapot)
	assert.ErrorIs(t, gotErr, redlimit.ErrUnavailable, "custom handler: err = %v, want one wrapping ErrUnavailable", gotErr)
}

func TestDegradedAndShadowedServed(t *testing.T) {
	t.Parallel()
	for _, res := range []redlimit.Result{
		{Allowed: true, Degraded: true, Limit: redlimit.PerSecond(4), Remaining: 3, ResetAfter: 250 * time.Millisecond},
		{Allowed: true, Shadowed: true, Limit: redlimit.PerSecond(4), Remaining: 0, ResetAfter: time.Second},
	} {
		next := &okHandler{}
		rec := serve(httplimit.Middleware(&fakeLimiter{res: res}), next, request("192.0.2.1:1"))
		assert.Equal(t, http.StatusOK, rec.Code, "%+v: status = %d, want %d", res, rec.Code, http.StatusOK)
		assert.Equal(t, 1, next.count(), "%+v: next called %d times, want %d", res, next.count(), 1)
		want := fmt.Sprintf(`"default";r=%d;t=1`, res.Remaining)
		assert.Equal(t, want, rec.Header().Get(httplimit.HeaderRateLimit), "%+v: RateLimit = %q, want %q", res, rec.Header().Get(httplimit.HeaderRateLimit), want)
	}
}

func TestKeysPassed(t *testing.T) {
	t.Parallel()
	trusted := httplimit.WithTrustedProxies(netip.MustParsePrefix("10.0.0.0/8"))
	lim := &fakeLimiter{res: redlimit.Result{Allowed: true, Limit: redlimit.PerSecond(1)}}
	mw := httplimit.Middleware(lim, httplimit.WithKeyFunc(httplimit.IPKey(trusted, httplimit.WithXForwardedFor(1))))
	for _, r := range []*http.Request{
		request("192.0.2.1:1", "X-Forwarded-For", "203.0.113.9"), // spoofed
		request("10.0.0.1:1", "X-Forwarded-For", "203.0.113.9"),  // from the proxy
		request("10.0.0.1:1", "X-Real-IP", "203.0.113.5"),        // not the configured header
		request("[2001:db8::1]:1"),
	} {
		serve(mw, &okHandler{}, r)
	}
	got, want := strings.Join(lim.calls(), " "), "192.0.2.1 203.0.113.9 10.0.0.1 2001:db8::/64"
	assert.Equal(t, want, got, "keys = %q, want %q", got, want)
}

// miniLimiter returns a limiter of strategy s on a fresh miniredis whose
// clock stands still.
func miniLimiter(t *testing.T, s redlimit.Strategy, l redlimit.Limit) redlimit.Limiter {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.New(rdb, s, l, redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { lim.(*redlimit.RateLimiter).Close() })
	return lim
}

func TestIPv6GroupingRealLimiter(t *testing.T) {
	t.Parallel()
	lim := miniLimiter(t, redlimit.TokenBucket, redlimit.Limit{Rate: 1, Period: time.Minute})
	mw := httplimit.Middleware(lim)
	for _, step := range []struct {
		remote string
		code   int
	}{
		{"[2001:db8:1:2::1]:1000", http.StatusOK},
		{"[2001:db8:1:2:ffff::9]:1001", http.StatusTooManyRequests}, // same /64
		{"[2001:db8:1:3::1]:1000", http.StatusOK},                   // another /64
		{"192.0.2.1:1", http.StatusOK},
		{"192.0.2.2:1", http.StatusOK}, // IPv4: one key per address
		{"192.0.2.1:2", http.StatusTooManyRequests},
	} {
		rec := serve(mw, &okHandler{}, request(step.remote))
		assert.Equal(t, step.code, rec.Code, "%s: status = %d, want %d", step.remote, rec.Code, step.code)
		if step.code == http.StatusTooManyRequests {
			wantHeaders(t, rec.Header(), map[string]string{
				httplimit.HeaderRetryAfter:      "60",
				httplimit.HeaderRateLimitPolicy: `"token-bucket";q=1;w=60`,
				httplimit.HeaderRateLimit:       `"token-bucket";r=0;t=60`,
			})
		}
	}
}

// A leaky bucket's request is delayed up to WithMaxDelay; one that would
// wait longer is denied without taking a slot, with a RetryAfter after which
// it would wait no longer than that: a client that waits it is served.
func TestLeakyBucketDelay(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetTime(now)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewLeakyBucket(rdb, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 4}, redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	var denied redlimit.Result // what the denied handler got
	mw := httplimit.Middleware(lim, httplimit.WithMaxDelay(150*time.Millisecond),
		httplimit.WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			denied, _ = httplimit.ResultFromContext(r.Context())
			w.WriteHeader(http.StatusTooManyRequests)
		})))
	for i, step := range []struct {
		after time.Duration // the limiter's clock moves on this much first
		code  int
		delay time.Duration // served: the Delay the limiter gave; denied: its RetryAfter
		retry string
	}{
		{0, http.StatusOK, 0, ""},
		{0, http.StatusOK, 100 * time.Millisecond, ""},
		{0, http.StatusTooManyRequests, 50 * time.Millisecond, "1"}, // it would wait 200ms: refused, no slot taken
		{50 * time.Millisecond, http.StatusOK, 150 * time.Millisecond, ""},
		{0, http.StatusTooManyRequests, 100 * time.Millisecond, "1"},
		{time.Second, http.StatusOK, 0, ""},
	} {
		now = now.Add(step.after)
		m.SetTime(now)
		next := &okHandler{}
		start := time.Now()
		rec := serve(mw, next, request("192.0.2.1:1"))
		elapsed := time.Since(start)
		assert.Equal(t, step.code, rec.Code, "request %d: status = %d, want %d", i+1, rec.Code, step.code)
		assert.Equal(t, step.retry, rec.Header().Get(httplimit.HeaderRetryAfter), "request %d: Retry-After = %q, want %q", i+1, rec.Header().Get(httplimit.HeaderRetryAfter), step.retry)
		if step.code == http.StatusOK {
			assert.Equal(t, step.delay, next.res.Delay, "request %d: Delay = %v, want %v", i+1, next.res.Delay, step.delay)
			// A timer never fires early; the upper bound only catches a
			// middleware that sleeps far too long.
			assert.True(t, elapsed >= step.delay && elapsed <= step.delay+time.Second,
				"request %d: served after %v, want about %v", i+1, elapsed, step.delay)
		} else {
			assert.Equal(t, step.delay, denied.RetryAfter, "request %d: RetryAfter = %v, want %v", i+1, denied.RetryAfter, step.delay)
		}
	}
}

func TestMaxDelayZeroDenies(t *testing.T) {
	t.Parallel()
	res := redlimit.Result{Allowed: true, Limit: redlimit.PerSecond(10), Remaining: 1, Delay: 1100 * time.Millisecond}
	next := &okHandler{}
	rec := serve(httplimit.Middleware(&fakeLimiter{res: res}, httplimit.WithMaxDelay(0)), next, request("192.0.2.1:1"))
	assert.Equal(t, http.StatusTooManyRequests, rec.Code, "status = %d, want %d", rec.Code, http.StatusTooManyRequests)
	assert.Equal(t, "2", rec.Header().Get(httplimit.HeaderRetryAfter), "Retry-After = %q, want %q", rec.Header().Get(httplimit.HeaderRetryAfter), "2")
	assert.Equal(t, 0, next.count(), "next called %d times, want 0", next.count())
}

// writeRecorder records whether anything was written.
type writeRecorder struct {
	http.ResponseWriter
	wrote bool
}

func (w *writeRecorder) WriteHeader(code int) { w.wrote = true; w.ResponseWriter.WriteHeader(code) }
func (w *writeRecorder) Write(b []byte) (int, error) {
	w.wrote = true
	return w.ResponseWriter.Write(b)
}

func TestDelayContextEnds(t *testing.T) {
	t.Parallel()
	res := redlimit.Result{Allowed: true, Limit: redlimit.PerSecond(10), Delay: time.Hour}
	next := &okHandler{}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	r := request("192.0.2.1:1").WithContext(ctx)
	w := &writeRecorder{ResponseWriter: httptest.NewRecorder()}
	start := time.Now()
	httplimit.Middleware(&fakeLimiter{res: res}, httplimit.WithMaxDelay(-1))(next).ServeHTTP(w, r)
	elapsed := time.Since(start)
	assert.LessOrEqual(t, elapsed, 10*time.Second, "returned after %v, want at once", elapsed)
	assert.False(t, w.wrote, "response written, want nothing (client gone)")
	assert.Equal(t, 0, next.count(), "next called %d times, want 0", next.count())
}

// TestRateLimitPolicyPerStrategy checks the quota policy of each strategy
// on a real limiter: q quota units per window of w whole seconds, at the
// limit's steady rate, with q at least the most that r can show (Rate for
// the windows, Burst for the buckets), including periods under a second
// and periods that are not whole seconds. Each request is the first of its
// key, so r is one less than that capacity.
func TestRateLimitPolicyPerStrategy(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	type step struct {
		limit             redlimit.Limit
		policy, ratelimit string
		xLimit            string
	}
	for _, tt := range []struct {
		strategy redlimit.Strategy
		steps    []step
	}{
		{redlimit.FixedWindow, []step{
			{redlimit.PerSecond(10), `"fixed-window";q=10;w=1`, `"fixed-window";r=9;t=1`, "10"},
			{redlimit.Limit{Rate: 10, Period: 100 * ms}, `"fixed-window";q=100;w=1`, `"fixed-window";r=9;t=1`, "100"},
			{redlimit.Limit{Rate: 3, Period: 1500 * ms}, `"fixed-window";q=4;w=2`, `"fixed-window";r=2;t=2`, "4"},
			{redlimit.Limit{Rate: 60, Period: time.Minute, Burst: 20}, `"fixed-window";q=60;w=60`, `"fixed-window";r=59;t=60`, "60"},
		}},
		{redlimit.SlidingLog, []step{
			{redlimit.PerSecond(10), `"sliding-log";q=10;w=1`, `"sliding-log";r=9;t=1`, "10"},
			{redlimit.Limit{Rate: 10, Period: 100 * ms}, `"sliding-log";q=100;w=1`, `"sliding-log";r=9;t=1`, "100"},
			{redlimit.Limit{Rate: 3, Period: 1500 * ms}, `"sliding-log";q=4;w=2`, `"sliding-log";r=2;t=2`, "4"},
		}},
		{redlimit.SlidingCounter, []step{
			{redlimit.PerSecond(10), `"sliding-counter";q=10;w=1`, `"sliding-counter";r=9;t=2`, "10"},
			{redlimit.Limit{Rate: 10, Period: 100 * ms}, `"sliding-counter";q=100;w=1`, `"sliding-counter";r=9;t=1`, "100"},
			{redlimit.Limit{Rate: 3, Period: 1500 * ms}, `"sliding-counter";q=4;w=2`, `"sliding-counter";r=2;t=3`, "4"},
		}},
		{redlimit.SubWindowCounter, []step{
			// An event counts a Period after its sub-window ends: t is
			// rounded up past the Period.
			{redlimit.PerSecond(10), `"sub-window-counter";q=10;w=1`, `"sub-window-counter";r=9;t=2`, "10"},
			{redlimit.Limit{Rate: 3, Period: 1500 * ms, SubWindows: 3}, `"sub-window-counter";q=4;w=2`, `"sub-window-counter";r=2;t=2`, "4"},
			{redlimit.Limit{Rate: 60, Period: time.Minute, SubWindows: 6}, `"sub-window-counter";q=60;w=60`, `"sub-window-counter";r=59;t=70`, "60"},
		}},
		{redlimit.TokenBucket, []step{
			{redlimit.PerSecond(10), `"token-bucket";q=10;w=1`, `"token-bucket";r=9;t=1`, "10"},
			{redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, `"token-bucket";q=20;w=2`, `"token-bucket";r=19;t=1`, "20"},
			{redlimit.Limit{Rate: 10, Period: 100 * ms, Burst: 20}, `"token-bucket";q=100;w=1`, `"token-bucket";r=19;t=1`, "100"},
			{redlimit.Limit{Rate: 2, Period: time.Second, Burst: 3}, `"token-bucket";q=4;w=2`, `"token-bucket";r=2;t=1`, "4"},
			{redlimit.Limit{Rate: 10, Period: time.Second, Burst: 1}, `"token-bucket";q=10;w=1`, `"token-bucket";r=0;t=1`, "10"},
		}},
		{redlimit.LeakyBucket, []step{
			{redlimit.Limit{Rate: 10, Period: time.Second, Burst: 3}, `"leaky-bucket";q=10;w=1`, `"leaky-bucket";r=2;t=1`, "10"},
			{redlimit.Limit{Rate: 1, Period: time.Minute, Burst: 5}, `"leaky-bucket";q=5;w=300`, `"leaky-bucket";r=4;t=60`, "5"},
			{redlimit.Limit{Rate: 20, Period: time.Second, Burst: 40}, `"leaky-bucket";q=40;w=2`, `"leaky-bucket";r=39;t=1`, "40"},
		}},
	} {
		t.Run(tt.strategy.String(), func(t *testing.T) {
			t.Parallel()
			for _, st := range tt.steps {
				lim := miniLimiter(t, tt.strategy, st.limit)
				rec := serve(httplimit.Middleware(lim, httplimit.WithXRateLimitHeaders(true)), &okHandler{}, request("192.0.2.1:1"))
				require.Equal(t, http.StatusOK, rec.Code, "%v: status", st.limit)
				wantHeaders(t, rec.Header(), map[string]string{
					httplimit.HeaderRateLimitPolicy: st.policy,
					httplimit.HeaderRateLimit:       st.ratelimit,
					httplimit.HeaderXRateLimitLimit: st.xLimit,
				})
				capacity := st.limit.Rate
				if (tt.strategy == redlimit.TokenBucket || tt.strategy == redlimit.LeakyBucket) && st.limit.Burst > 0 {
					capacity = st.limit.Burst
				}
				q := sfParam(t, rec.Header().Get(httplimit.HeaderRateLimitPolicy), "q")
				r := sfParam(t, rec.Header().Get(httplimit.HeaderRateLimit), "r")
				assert.GreaterOrEqual(t, q, capacity, "%v: q below the capacity that r can show", st.limit)
				assert.Less(t, r, q, "%v: r after a request not below q", st.limit)
			}
		})
	}
}

// sfParam returns the integer parameter name of the one item in field.
func sfParam(t *testing.T, field, name string) int {
	t.Helper()
	for p := range strings.SplitSeq(field, ";") {
		if v, ok := strings.CutPrefix(p, name+"="); ok {
			n, err := strconv.Atoi(v)
			require.NoError(t, err, "%s in %q", name, field)
			return n
		}
	}
	require.Fail(t, "no parameter", "%s in %q", name, field)
	return 0
}

func TestQuota(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond
	tests := []struct {
		strategy redlimit.Strategy
		limit    redlimit.Limit
		q, w     int64
		ok       bool
	}{
		{redlimit.FixedWindow, redlimit.PerSecond(10), 10, 1, true},
		{redlimit.SlidingLog, redlimit.PerMinute(50), 50, 60, true},
		{redlimit.SlidingCounter, redlimit.PerHour(1000), 1000, 3600, true},
		{redlimit.SubWindowCounter, redlimit.Limit{Rate: 10_000, Period: time.Hour, SubWindows: 60}, 10_000, 3600, true},
		{redlimit.FixedWindow, redlimit.Limit{Rate: 10, Period: 100 * ms}, 100, 1, true},
		{redlimit.FixedWindow, redlimit.Limit{Rate: 10, Period: 300 * ms}, 33, 1, true}, // rounded down
		{redlimit.FixedWindow, redlimit.Limit{Rate: 3, Period: 1500 * ms}, 4, 2, true},
		{redlimit.FixedWindow, redlimit.Limit{Rate: 1, Period: ms}, 1000, 1, true},
		{redlimit.FixedWindow, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 50}, 10, 1, true}, // Burst ignored
		{redlimit.FixedWindow, redlimit.Limit{Rate: 1, Period: redlimit.MaxPeriod}, 1, int64(redlimit.MaxPeriod / time.Second), true},
		{redlimit.TokenBucket, redlimit.PerSecond(10), 10, 1, true}, // Burst 0 means Rate
		{redlimit.TokenBucket, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, 20, 2, true},
		{redlimit.TokenBucket, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 25}, 30, 3, true},
		{redlimit.TokenBucket, redlimit.Limit{Rate: 10, Period: time.Minute, Burst: 5}, 5, 30, true},
		{redlimit.TokenBucket, redlimit.Limit{Rate: 10, Period: 100 * ms, Burst: 20}, 100, 1, true},
		{redlimit.LeakyBucket, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 1}, 10, 1, true},
		{redlimit.LeakyBucket, redlimit.Limit{Rate: 1, Period: time.Minute, Burst: 5}, 5, 300, true},
		{0, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, 20, 2, true}, // unknown: as a bucket
		{0, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 5}, 10, 1, true},
		{redlimit.Strategy(99), redlimit.PerSecond(3), 3, 1, true},
		{redlimit.FixedWindow, redlimit.Limit{}, 0, 0, false},
		{redlimit.FixedWindow, redlimit.Limit{Rate: -1, Period: time.Second}, 0, 0, false},
		{redlimit.FixedWindow, redlimit.Limit{Rate: 1, Period: -time.Second}, 0, 0, false},
		{redlimit.FixedWindow, redlimit.Limit{Rate: redlimit.MaxRate, Period: ms}, 0, 0, false}, // q has 16 digits
		{0, redlimit.Limit{Rate: 1, Period: redlimit.MaxPeriod, Burst: redlimit.MaxRate}, 0, 0, false},
	}
	for _, tt := range tests {
		q, w, ok := httplimit.Quota(tt.strategy, tt.limit)
		assert.Equal(t, []any{tt.q, tt.w, tt.ok}, []any{q, w, ok}, "Quota(%v, %v)", tt.strategy, tt.limit)
	}
}

// TestPolicyNameRealLimiter checks the names in RateLimit-Policy and
// RateLimit for redlimit's limiters, with and without WithPolicyName: it
// names a single-strategy limiter's one policy, and a Policy's policies are
// always named after its rules.
func TestPolicyNameRealLimiter(t *testing.T) {
	t.Parallel()
	bucket := redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}
	rules := []redlimit.Rule{
		{Name: "burst", Strategy: redlimit.TokenBucket, Limit: bucket},
		{Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(100)}, // named "fixed-window-1h"
		{Name: "h\u00e9", Strategy: redlimit.SlidingLog, Limit: redlimit.PerMinute(50)},
	}
	policy := `"burst";q=20;w=2, "fixed-window-1h";q=100;w=3600, "h__";q=50;w=60`
	tests := []struct {
		name              string
		strategy          redlimit.Strategy // a single-strategy limiter of limit,
		limit             redlimit.Limit
		rules             []redlimit.Rule // or a Policy of rules
		opts              []httplimit.Option
		policy, rateLimit string
	}{
		{"strategy", redlimit.TokenBucket, bucket, nil,
			nil, `"token-bucket";q=20;w=2`, `"token-bucket";r=19;t=1`},
		{"strategy named", redlimit.TokenBucket, bucket, nil,
			[]httplimit.Option{httplimit.WithPolicyName("per-ip")}, `"per-ip";q=20;w=2`, `"per-ip";r=19;t=1`},
		{"strategy named as default", redlimit.SlidingLog, redlimit.PerMinute(50), nil,
			[]httplimit.Option{httplimit.WithPolicyName(httplimit.DefaultPolicyName)}, `"default";q=50;w=60`, `"default";r=49;t=60`},
		{"policy", 0, redlimit.Limit{}, rules,
			nil, policy, `"burst";r=19;t=1`},
		{"policy named: the rules' names", 0, redlimit.Limit{}, rules,
			[]httplimit.Option{httplimit.WithPolicyName("per-ip")}, policy, `"burst";r=19;t=1`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var lim redlimit.Limiter
			if tt.rules != nil {
				lim = miniPolicy(t, tt.rules)
			} else {
				lim = miniLimiter(t, tt.strategy, tt.limit)
			}
			rec := serve(httplimit.Middleware(lim, tt.opts...), &okHandler{}, request("192.0.2.1:1"))
			require.Equal(t, http.StatusOK, rec.Code, "status")
			wantHeaders(t, rec.Header(), map[string]string{
				httplimit.HeaderRateLimitPolicy: tt.policy,
				httplimit.HeaderRateLimit:       tt.rateLimit,
			})
		})
	}
}
