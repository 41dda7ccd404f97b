package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

func miniConcurrency(t *testing.T, maxHolders int, ttl time.Duration) (*redlimit.Concurrency, *redis.Client) {
	t.Helper()
	m := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr(), PoolSize: 80})
	t.Cleanup(func() { rdb.Close() })
	c, err := redlimit.NewConcurrency(rdb, maxHolders, ttl, redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c, rdb
}

// leases is the number of leases Redis holds on key.
func leases(t *testing.T, rdb *redis.Client, key string) int64 {
	t.Helper()
	n, err := rdb.ZCard(context.Background(), "redlimit:{"+key+"}:cc").Result()
	require.NoError(t, err)
	return n
}

// 64 requests at once on a cap of 3: at most 3 handlers run at once, the
// others are denied, and every lease is released at the end.
func TestConcurrencyMiddlewareHoldsAtMostMax(t *testing.T) {
	t.Parallel()
	c, rdb := miniConcurrency(t, 3, 10*time.Second)
	testHoldsAtMostMax(t, c, rdb)
}

// The same on a real redis-server.
func TestConcurrencyMiddlewareRedis(t *testing.T) {
	t.Parallel()
	srv, err := redistest.StartServer()
	redistest.SkipOrFail(t, err)
	t.Cleanup(func() { srv.Close() })
	opts := redistest.TunedOptions(srv.Addr)
	// 64 requests dialling at once on 2 busy cores timed out dials of 1s:
	// 8 connections, which the requests wait for, and generous timeouts
	// (a timeout is an outage, answered 503 under FallbackError).
	opts.DialTimeout, opts.PoolTimeout, opts.ReadTimeout, opts.WriteTimeout = 5*time.Second, 5*time.Second, 5*time.Second, 5*time.Second
	opts.PoolSize = 8
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	c, err := redlimit.NewConcurrency(rdb, 3, 10*time.Second, redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	testHoldsAtMostMax(t, c, rdb)
}

func testHoldsAtMostMax(t *testing.T, c *redlimit.Concurrency, rdb *redis.Client) {
	var inFlight, most, served, denied atomic.Int64
	h := httplimit.ConcurrencyMiddleware(c, httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
		t.Errorf("TryAcquire: %v", err)
		w.WriteHeader(http.StatusServiceUnavailable)
	}))(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for m := most.Load(); n > m; m = most.Load() {
			if most.CompareAndSwap(m, n) {
				break
			}
		}
		_, ok := httplimit.LeaseFromContext(r.Context())
		assert.True(t, ok, "the lease is in the handler's context")
		time.Sleep(20 * time.Millisecond)
		inFlight.Add(-1)
	}))
	var wg sync.WaitGroup
	for range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, request("192.0.2.1:1"))
			switch rec.Code {
			case http.StatusOK:
				served.Add(1)
			case http.StatusTooManyRequests:
				denied.Add(1)
			default:
				t.Errorf("status %d", rec.Code)
			}
		}()
	}
	wg.Wait()
	t.Logf("64 requests: %d served, %d denied, most at once %d", served.Load(), denied.Load(), most.Load())
	assert.LessOrEqual(t, most.Load(), int64(3), "handlers running at once")
	assert.GreaterOrEqual(t, served.Load(), int64(3))
	assert.Equal(t, int64(64), served.Load()+denied.Load())
	assert.Equal(t, int64(0), leases(t, rdb, "192.0.2.1"), "leases left in Redis")
}

// Retry-After is the hint, not the lease ttl: with a ttl of 10s and holds
// of 300ms, 1 second; before any request ended, WithRetryAfterHint's.
func TestConcurrencyMiddlewareRetryAfterHint(t *testing.T) {
	t.Parallel()
	c, rdb := miniConcurrency(t, 3, 10*time.Second)
	// run makes a middleware of its own hint, holding each request for
	// hold, or until release when hold is 0; probe fills the 3 slots with
	// requests held until release and returns the Retry-After and Result of
	// the next request, denied.
	type rig struct {
		h      http.Handler
		denied redlimit.Result
	}
	newRig := func(hold time.Duration, release chan struct{}, opts ...httplimit.Option) *rig {
		r := &rig{}
		opts = append(opts, httplimit.WithDeniedHandler(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			r.denied, _ = httplimit.ResultFromContext(req.Context())
			w.WriteHeader(http.StatusTooManyRequests)
		})))
		r.h = httplimit.ConcurrencyMiddleware(c, opts...)(http.HandlerFunc(func(_ http.ResponseWriter, req *http.Request) {
			if req.Header.Get("X-Hold") == "" {
				<-release
				return
			}
			time.Sleep(hold)
		}))
		return r
	}
	probe := func(r *rig, key string) (*sync.WaitGroup, *httptest.ResponseRecorder) {
		var wg sync.WaitGroup
		for range 3 {
			wg.Add(1)
			go func() { defer wg.Done(); r.h.ServeHTTP(httptest.NewRecorder(), request(key+":1")) }()
		}
		require.Eventually(t, func() bool { return leases(t, rdb, key) == 3 }, 2*time.Second, 5*time.Millisecond)
		rec := httptest.NewRecorder()
		r.h.ServeHTTP(rec, request(key+":1"))
		require.Equal(t, http.StatusTooManyRequests, rec.Code)
		return &wg, rec
	}

	// Before any request ended: the configured default.
	release := make(chan struct{})
	first := newRig(0, release, httplimit.WithRetryAfterHint(3*time.Second))
	wg, rec := probe(first, "192.0.2.1")
	assert.Equal(t, "3", rec.Header().Get(httplimit.HeaderRetryAfter), "before any hold ended")
	close(release)
	wg.Wait()

	// Three holds of 300ms observed: the next denial says 1s, though the
	// oldest lease expires in about 10s.
	release = make(chan struct{})
	second := newRig(300*time.Millisecond, release, httplimit.WithRetryAfterHint(3*time.Second))
	var holds sync.WaitGroup
	for range 3 {
		holds.Add(1)
		go func() {
			defer holds.Done()
			req := request("192.0.2.2:1")
			req.Header.Set("X-Hold", "1")
			second.h.ServeHTTP(httptest.NewRecorder(), req)
		}()
	}
	holds.Wait()
	wg, rec = probe(second, "192.0.2.2")
	assert.Equal(t, "1", rec.Header().Get(httplimit.HeaderRetryAfter), "after holds of 300ms")
	assert.Greater(t, second.denied.RetryAfter, 9*time.Second, "the oldest lease's expiry, which Retry-After was before")
	close(release)
	wg.Wait()
}

// A handler that panics releases its lease, and the panic goes on; so
// does one whose request is cancelled.
func TestConcurrencyMiddlewareReleasesOnPanicAndCancel(t *testing.T) {
	t.Parallel()
	c, rdb := miniConcurrency(t, 1, time.Minute)
	var held int64
	h := httplimit.ConcurrencyMiddleware(c)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		held = leases(t, rdb, "192.0.2.1")
		panic("handler bug")
	}))
	require.PanicsWithValue(t, "handler bug", func() { h.ServeHTTP(httptest.NewRecorder(), request("192.0.2.1:1")) })
	assert.Equal(t, int64(1), held, "lease held while the handler ran")
	assert.Equal(t, int64(0), leases(t, rdb, "192.0.2.1"), "lease released after the panic")

	ctx, cancel := context.WithCancel(context.Background())
	h = httplimit.ConcurrencyMiddleware(c)(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		cancel()
		<-r.Context().Done()
	}))
	h.ServeHTTP(httptest.NewRecorder(), request("192.0.2.1:1").WithContext(ctx))
	assert.Equal(t, int64(0), leases(t, rdb, "192.0.2.1"), "lease released after the request was cancelled")

	rec := httptest.NewRecorder()
	httplimit.ConcurrencyMiddleware(c)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec, request("192.0.2.1:1"))
	assert.Equal(t, http.StatusOK, rec.Code, "the slot is free again")
}

// ConcurrencyMiddleware panics on the invalid options that Middleware
// panics on (TestKeyPanics), and on a Retry-After hint that is not
// positive.
func TestConcurrencyMiddlewarePanics(t *testing.T) {
	t.Parallel()
	c, _ := miniConcurrency(t, 1, time.Minute)
	tests := []struct {
		name string
		opt  httplimit.Option
		want string
	}{
		{"nil key func", httplimit.WithKeyFunc(nil), "httplimit: nil key function"},
		{"nil denied", httplimit.WithDeniedHandler(nil), "httplimit: nil denied handler"},
		{"nil key error", httplimit.WithKeyErrorHandler(nil), "httplimit: nil key error handler"},
		{"nil error handler", httplimit.WithErrorHandler(nil), "httplimit: nil error handler"},
		{"zero hint", httplimit.WithRetryAfterHint(0), "httplimit: Retry-After hint 0s is not positive"},
		{"policy newline", httplimit.WithPolicyName("a\nb"), `httplimit: policy name "a\nb" is not printable ASCII`},
	}
	for _, tt := range tests {
		assert.PanicsWithValue(t, tt.want, func() { httplimit.ConcurrencyMiddleware(c, tt.opt) }, "%s", tt.name)
	}
	assert.PanicsWithValue(t, "httplimit: nil Concurrency", func() { httplimit.ConcurrencyMiddleware(nil) }, "nil Concurrency")
}

// Behind a rate-limit middleware (10 per second on "global"), a request
// that ConcurrencyMiddleware denies gets a 429 without the outer
// limiter's fields, which describe a limit that admitted it ("global";r=9
// on a concurrency denial); the request it let through keeps them.
func TestConcurrencyMiddlewareDenialDropsOuterFields(t *testing.T) {
	t.Parallel()
	c, rdb := miniConcurrency(t, 1, time.Minute)
	global, err := redlimit.NewPolicy(rdb, []redlimit.Rule{{Name: "global", Strategy: redlimit.FixedWindow, Limit: redlimit.PerSecond(10)}})
	require.NoError(t, err)
	t.Cleanup(func() { global.Close() })
	release := make(chan struct{})
	h := httplimit.Middleware(global, httplimit.WithXRateLimitHeaders(true))(
		httplimit.ConcurrencyMiddleware(c)(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { <-release })))
	held := httptest.NewRecorder()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); h.ServeHTTP(held, request("192.0.2.1:1")) }()
	require.Eventually(t, func() bool { return leases(t, rdb, "192.0.2.1") == 1 }, 2*time.Second, 5*time.Millisecond)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, request("192.0.2.1:1"))
	close(release)
	wg.Wait()
	assert.Equal(t, http.StatusOK, held.Code)
	assert.Equal(t, `"global";r=9;t=1`, held.Header().Get(httplimit.HeaderRateLimit), "the request let through")
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, "1", rec.Header().Get(httplimit.HeaderRetryAfter))
	for _, f := range []string{httplimit.HeaderRateLimit, httplimit.HeaderRateLimitPolicy, httplimit.HeaderXRateLimitLimit, httplimit.HeaderXRateLimitRemaining, httplimit.HeaderXRateLimitReset} {
		assert.Empty(t, rec.Header().Values(f), "%s on the concurrency denial", f)
	}
}
