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

// WithPriority puts each request's priority on the limiter's call: with
// shares 0.5 and 0.8 of 10, /export (Sheddable) gets 5 requests, /login
// (Critical) the other 5.
func TestWithPriority(t *testing.T) {
	m := miniredis.RunT(t)
	m.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewFixedWindow(rdb, redlimit.PerMinute(10), redlimit.WithPriorityShares(0.5, 0.8))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	mw := httplimit.Middleware(lim,
		httplimit.WithKeyFunc(func(*http.Request) (string, error) { return "k", nil }),
		httplimit.WithPriority(func(r *http.Request) redlimit.Priority {
			if r.URL.Path == "/export" {
				return redlimit.Sheddable
			}
			return redlimit.Critical
		}))
	ok := &okHandler{}
	passed := func(path string) int {
		n := 0
		for range 20 {
			if rec := serve(mw, ok, httptest.NewRequest(http.MethodGet, path, nil)); rec.Code == http.StatusOK {
				n++
			} else {
				require.Equal(t, http.StatusTooManyRequests, rec.Code)
			}
		}
		return n
	}
	assert.Equal(t, 5, passed("/export"), "Sheddable: half of 10")
	assert.Equal(t, 5, passed("/login"), "Critical: the rest")
}
