package main

import (
	"context"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSelfTest runs the selftest's decisions in-process and checks every
// counter against what the callers were told.
func TestSelfTest(t *testing.T) {
	mr := miniredis.RunT(t)
	// Redis's clock stands still: the counts below assume no refill
	// between the calls, which a loaded machine could otherwise allow.
	mr.SetTime(time.Now())
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), DialTimeout: 100 * time.Millisecond, DialerRetries: 1, ReadTimeout: 100 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	reg := prometheus.NewRegistry()
	m := newMetrics(reg)
	srv := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(srv.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)

	made, err := traffic(ctx, rdb, mr, m)
	require.NoError(t, err)
	want := tally{decisions: 21, allowed: 13, denied: 6, shadowed: 2, degraded: 2}
	assert.Equal(t, want, made, "decisions made: got %+v, want %+v", made, want)
	_, samples, err := scrape(ctx, srv.URL)
	require.NoError(t, err)
	for _, c := range []struct {
		series string
		want   float64
	}{
		{`redlimit_decisions_total{result="allowed",strategy="token-bucket"}`, 12},
		{`redlimit_decisions_total{result="allowed",strategy="leaky-bucket"}`, 1},
		{`redlimit_decisions_total{result="denied",strategy="token-bucket"}`, 5},
		{`redlimit_decisions_total{result="denied",strategy="leaky-bucket"}`, 1},
		{`redlimit_decisions_total{result="shadowed",strategy="token-bucket"}`, 2},
		{`redlimit_denied_total{denied_by="limit",strategy="token-bucket"}`, 3}, // 1 denied + 2 shadowed
		{`redlimit_denied_total{denied_by="deny-cache",strategy="token-bucket"}`, 2},
		{`redlimit_denied_total{denied_by="block",strategy="token-bucket"}`, 2},
		{`redlimit_denied_total{denied_by="deadline",strategy="leaky-bucket"}`, 1},
		{`redlimit_degraded_decisions_total{strategy="token-bucket"}`, 2},
		{`redlimit_decision_seconds_count{strategy="token-bucket"}`, 19},
		{`redlimit_decision_seconds_count{strategy="leaky-bucket"}`, 2},
		{`redlimit_fallback_active{strategy="token-bucket"}`, 0},
		{`redlimit_fallback_transitions_total{strategy="token-bucket",to="fallback"}`, 1},
		{`redlimit_fallback_transitions_total{strategy="token-bucket",to="redis"}`, 1},
	} {
		got, ok := samples[c.series]
		assert.True(t, ok, "%s: got %v (present %v), want %v", c.series, got, ok, c.want)
		assert.Equal(t, c.want, got, "%s: got %v (present %v), want %v", c.series, got, ok, c.want)
	}
	allowed := sum(samples, "redlimit_decisions_total", `result="allowed"`)
	denied := sum(samples, "redlimit_decisions_total", `result="denied"`)
	shadowed := sum(samples, "redlimit_decisions_total", `result="shadowed"`)
	got, wantSum := allowed+denied+shadowed, float64(made.decisions)
	assert.Equal(t, wantSum, got, "allowed + denied + shadowed = %v, want %v decisions", got, wantSum)
	assert.NoError(t, check(samples, made, true))
}

// TestSelfTestFails checks that check notices metrics that do not match.
func TestSelfTestFails(t *testing.T) {
	samples := map[string]float64{`redlimit_decisions_total{result="allowed",strategy="token-bucket"}`: 3}
	assert.Error(t, check(samples, tally{decisions: 4, allowed: 4}, false), "check: got nil, want an error for 3 allowed in the metrics and 4 made")
}
