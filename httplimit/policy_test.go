package httplimit_test

import (
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
)

// A redlimit.Policy: RateLimit-Policy lists every rule, and RateLimit
// reports the deciding one, with the Result's remaining (the least over the
// rules) and reset (until every rule is full again: here the hour).
func TestPolicyHeaders(t *testing.T) {
	m := miniredis.RunT(t)
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	p, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "burst", Strategy: redlimit.TokenBucket, Limit: redlimit.Limit{Rate: 10, Period: time.Second, Burst: 3}},
		{Name: "hourly", Strategy: redlimit.FixedWindow, Limit: redlimit.PerHour(100)},
	})
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	h := httplimit.Middleware(p)(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
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
	assert.Equal(t, `"burst";r=2;t=3600`, rec.Header().Get(httplimit.HeaderRateLimit))
	do()
	do()
	rec = do()
	assert.Equal(t, http.StatusTooManyRequests, rec.Code)
	assert.Equal(t, `"burst";r=0;t=3600`, rec.Header().Get(httplimit.HeaderRateLimit))
}
