package httplimit_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/httplimit"
)

// costRig is a Policy of "requests" (100 per minute, a token bucket taking
// one per call) and "tokens" (1000 per hour, a fixed window), on a
// miniredis standing at the start of an hour, and a RateLimiter that shares the tokens rule's state: it reads
// what Redis holds for the tokens.
type costRig struct {
	p      *redlimit.Policy
	tokens redlimit.Limiter
}

func newCostRig(t *testing.T) *costRig {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	p, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "requests", Strategy: redlimit.TokenBucket, Limit: redlimit.PerMinute(100), PerCall: true},
		{Name: "tokens", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(1000)},
	}, redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	tokens, err := redlimit.New(rdb, redlimit.FixedWindow, redlimit.PerHour(1000), redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { tokens.Close() })
	return &costRig{p: p, tokens: tokens}
}

// tokensUsed is what Redis holds for the tokens rule of key.
func (c *costRig) tokensUsed(t *testing.T, key string) int {
	t.Helper()
	res, err := c.tokens.AllowN(context.Background(), key, 0)
	require.NoError(t, err)
	return 1000 - res.Remaining
}

// maxTokens is a cost function: the request's X-Max-Tokens.
func maxTokens(r *http.Request) int {
	n, _ := strconv.Atoi(r.Header.Get("X-Max-Tokens"))
	return n
}

func costRequest(maxTok int) *http.Request {
	r := httptest.NewRequest("POST", "/v1/chat", nil)
	r.RemoteAddr = "192.0.2.1:1234"
	r.Header.Set("X-Max-Tokens", strconv.Itoa(maxTok))
	return r
}

// The reservation is settled when the handler returns: with the cost it
// reported, or with the reserved cost when it reported none. Redis then
// holds the reported cost, not the reserved one.
func TestCostSettled(t *testing.T) {
	t.Parallel()
	rig := newCostRig(t)
	mw := httplimit.Middleware(rig.p, httplimit.WithCost(maxTokens), httplimit.WithKeyFunc(httplimit.HeaderKey("X-Tenant")))
	var seen int
	h := mw(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		seen = rig.tokensUsed(t, "reported")
		httplimit.Report(r, 80)
		httplimit.Report(r, 120) // the last report counts
	}))
	r := costRequest(500)
	r.Header.Set("X-Tenant", "reported")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	require.Equal(t, http.StatusOK, rec.Code)
	assert.Equal(t, 500, seen, "tokens held while the handler runs")
	assert.Equal(t, 120, rig.tokensUsed(t, "reported"), "tokens held once settled")

	quiet := mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r = costRequest(300)
	r.Header.Set("X-Tenant", "quiet")
	quiet.ServeHTTP(httptest.NewRecorder(), r)
	assert.Equal(t, 300, rig.tokensUsed(t, "quiet"), "nothing reported: the reserved cost")

	// Report outside the middleware does nothing.
	httplimit.Report(costRequest(1), 5)
}

// A handler that panics is settled with what it reported before, and the
// panic goes on; one whose request is cancelled is settled too.
func TestCostSettledPanicAndCancel(t *testing.T) {
	t.Parallel()
	rig := newCostRig(t)
	var settleErrs []error
	mw := httplimit.Middleware(rig.p, httplimit.WithCost(maxTokens), httplimit.WithKeyFunc(httplimit.HeaderKey("X-Tenant")),
		httplimit.WithOnSettleError(func(_ *http.Request, err error) { settleErrs = append(settleErrs, err) }))

	panicky := mw(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		httplimit.Report(r, 50)
		panic("handler bug")
	}))
	r := costRequest(400)
	r.Header.Set("X-Tenant", "panic")
	require.PanicsWithValue(t, "handler bug", func() { panicky.ServeHTTP(httptest.NewRecorder(), r) })
	assert.Equal(t, 50, rig.tokensUsed(t, "panic"), "settled with the report made before the panic")

	ctx, cancel := context.WithCancel(context.Background())
	cancelled := mw(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		cancel() // the client goes away mid-stream
		<-r.Context().Done()
		httplimit.Report(r, 10)
	}))
	r = costRequest(400).WithContext(ctx)
	r.Header.Set("X-Tenant", "cancel")
	cancelled.ServeHTTP(httptest.NewRecorder(), r)
	assert.Equal(t, 10, rig.tokensUsed(t, "cancel"), "a cancelled request is settled")
	assert.Empty(t, settleErrs)
}

// A request denied by the tokens rule of a Policy gets a 429 whose fields
// are the tokens rule's, not the requests rule's.
func TestCostDeniedFieldsOfDenyingRule(t *testing.T) {
	t.Parallel()
	rig := newCostRig(t)
	h := httplimit.Middleware(rig.p, httplimit.WithCost(maxTokens))(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, costRequest(600))
	require.Equal(t, http.StatusOK, rec.Code)
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, costRequest(600))
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	wantHeaders(t, rec.Header(), map[string]string{
		httplimit.HeaderRateLimitPolicy: `"requests";q=100;w=60, "tokens";q=1000;w=3600`,
		httplimit.HeaderRateLimit:       `"tokens";r=400;t=3600`,
		httplimit.HeaderRetryAfter:      "3600",
	})
	assert.Equal(t, 600, rig.tokensUsed(t, "192.0.2.1"), "the denied request took nothing")
}

// SetHeaders: a handler behind an IP limiter that reserves on its own
// Policy and is denied answers with the Policy's fields, replacing the IP
// limiter's.
func TestSetHeaders(t *testing.T) {
	t.Parallel()
	rig := newCostRig(t)
	ip := miniLimiter(t, redlimit.TokenBucket, redlimit.PerSecond(100))
	h := httplimit.Middleware(ip, httplimit.WithXRateLimitHeaders(true))(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		resv, err := rig.p.Reserve(r.Context(), "tenant", 900)
		require.NoError(t, err)
		httplimit.SetHeaders(w.Header(), rig.p, resv.Result())
		if !resv.Result().Allowed {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, costRequest(0))
	require.Equal(t, http.StatusOK, rec.Code)
	wantHeaders(t, rec.Header(), map[string]string{
		httplimit.HeaderRateLimitPolicy: `"requests";q=100;w=60, "tokens";q=1000;w=3600`,
		httplimit.HeaderRateLimit:       `"tokens";r=100;t=3600`,
		httplimit.HeaderRetryAfter:      "",
	})
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, costRequest(0))
	require.Equal(t, http.StatusTooManyRequests, rec.Code)
	wantHeaders(t, rec.Header(), map[string]string{
		httplimit.HeaderRateLimitPolicy:     `"requests";q=100;w=60, "tokens";q=1000;w=3600`,
		httplimit.HeaderRateLimit:           `"tokens";r=100;t=3600`,
		httplimit.HeaderRetryAfter:          "3600",
		httplimit.HeaderXRateLimitLimit:     "",
		httplimit.HeaderXRateLimitRemaining: "",
	})

	single := miniLimiter(t, redlimit.FixedWindow, redlimit.PerMinute(10))
	res, err := single.AllowN(context.Background(), "k", 10)
	require.NoError(t, err)
	hd := http.Header{}
	httplimit.SetHeaders(hd, single, res)
	wantHeaders(t, hd, map[string]string{
		httplimit.HeaderRateLimitPolicy: `"fixed-window";q=10;w=60`,
		httplimit.HeaderRateLimit:       `"fixed-window";r=0;t=60`,
	})
}

func TestCostNeedsReserve(t *testing.T) {
	t.Parallel()
	require.PanicsWithValue(t, "httplimit: WithCost needs a limiter with Reserve, such as a redlimit.RateLimiter or redlimit.Policy",
		func() { httplimit.Middleware(&fakeLimiter{}, httplimit.WithCost(maxTokens)) })
}

// A cost above what a rule can ever hold (5,000 tokens against 1,000 an
// hour) is the client's error: 413 with a body that says so, not the 503
// of a broken limiter; nothing is taken and the handler does not run. The
// error handler set with WithErrorHandler still gets the error, which
// wraps redlimit.ErrExceedsLimit.
func TestCostAboveCapacity(t *testing.T) {
	t.Parallel()
	rig := newCostRig(t)
	ran := false
	next := http.HandlerFunc(func(http.ResponseWriter, *http.Request) { ran = true })
	rec := httptest.NewRecorder()
	httplimit.Middleware(rig.p, httplimit.WithCost(maxTokens))(next).ServeHTTP(rec, costRequest(5000))
	assert.Equal(t, http.StatusRequestEntityTooLarge, rec.Code)
	assert.Equal(t, "Request Entity Too Large: the request costs more than the rate limit allows at once\n", rec.Body.String())
	assert.False(t, ran, "the handler ran")
	assert.Equal(t, 0, rig.tokensUsed(t, "192.0.2.1"), "tokens taken")

	var got error
	custom := httplimit.Middleware(rig.p, httplimit.WithCost(maxTokens), httplimit.WithErrorHandler(func(w http.ResponseWriter, _ *http.Request, err error) {
		got = err
		w.WriteHeader(http.StatusTeapot)
	}))(next)
	rec = httptest.NewRecorder()
	custom.ServeHTTP(rec, costRequest(5000))
	assert.Equal(t, http.StatusTeapot, rec.Code)
	assert.ErrorIs(t, got, redlimit.ErrExceedsLimit)
}

// A reported overspend on a sliding log is charged as far as the log takes
// it in one settle (min(used-n, Rate) entries, at most
// redlimit.MaxSlidingLogN), and the settle succeeds: a request reserving 10
// that reported 1,200 at 5,000 an hour was charged 10 (its settle refused,
// seen only by WithOnSettleError), one reporting 1,000 was charged 1,000.
func TestCostSlidingLogOverspend(t *testing.T) {
	t.Parallel()
	m := miniredis.RunT(t)
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewSlidingLog(rdb, redlimit.PerHour(5000), redlimit.WithFallback(redlimit.FallbackError))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	var settleErrs []error
	mw := httplimit.Middleware(lim, httplimit.WithCost(maxTokens), httplimit.WithKeyFunc(httplimit.HeaderKey("X-Tenant")),
		httplimit.WithOnSettleError(func(_ *http.Request, err error) { settleErrs = append(settleErrs, err) }))
	for _, tc := range []struct {
		reported, charged int
	}{{1000, 1000}, {1200, 1010}} {
		tenant := strconv.Itoa(tc.reported)
		h := mw(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { httplimit.Report(r, tc.reported) }))
		r := costRequest(10)
		r.Header.Set("X-Tenant", tenant)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		require.Equal(t, http.StatusOK, rec.Code)
		res, err := lim.AllowN(context.Background(), tenant, 0)
		require.NoError(t, err)
		assert.Equal(t, tc.charged, 5000-res.Remaining, "reserved 10, reported %d: charged", tc.reported)
	}
	assert.Empty(t, settleErrs)
}
