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

// A calendar quota's reset and Retry-After run to the next local midnight:
// 22 h at 01:00 on the day New York springs forward.
func TestCalendarHeaders(t *testing.T) {
	ny, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	m := miniredis.RunT(t)
	m.SetTime(time.Date(2030, 3, 10, 1, 0, 0, 0, ny))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewFixedWindow(rdb, redlimit.Daily(1, ny))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	h := httplimit.Middleware(lim, httplimit.WithKeyFunc(func(*http.Request) (string, error) { return "k", nil }))(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for _, want := range []struct {
		code  int
		field string
		retry string
	}{
		{http.StatusOK, `"fixed-window";r=0;t=79200`, ""},
		{http.StatusTooManyRequests, `"fixed-window";r=0;t=79200`, "79200"},
	} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
		assert.Equal(t, want.code, w.Code)
		assert.Equal(t, want.field, w.Header().Get(httplimit.HeaderRateLimit))
		assert.Equal(t, want.retry, w.Header().Get(httplimit.HeaderRetryAfter))
	}
}

// In the hour before a midnight that daylight saving skips (Havana's clocks
// go from 00:00 to 01:00 on 2025-03-09), a request is decided: its day ends
// in 30 minutes (it was a 503: the calendar window missed the server's
// time).
func TestCalendarSkippedMidnight(t *testing.T) {
	havana, err := time.LoadLocation("America/Havana")
	require.NoError(t, err)
	m := miniredis.RunT(t)
	m.SetTime(time.Date(2025, 3, 8, 23, 30, 0, 0, havana))
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	lim, err := redlimit.NewFixedWindow(rdb, redlimit.Daily(5, havana))
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	h := httplimit.Middleware(lim, httplimit.WithKeyFunc(func(*http.Request) (string, error) { return "k", nil }))(
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/", nil))
	assert.Equal(t, http.StatusOK, w.Code, w.Body.String())
	assert.Equal(t, `"fixed-window";r=4;t=1800`, w.Header().Get(httplimit.HeaderRateLimit))
}
