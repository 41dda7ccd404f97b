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
	// Timeouts for a loaded machine: a command that timed out would make
	// its decision degraded and the counts below wrong.
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), DialTimeout: 2 * time.Second, DialerRetries: 1, ReadTimeout: 2 * time.Second, MaxRetries: -1})
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
	l := func(limiter, strategy, outcome, deniedBy, degraded, shadowed string) string {
		return `redlimit_decisions_total{degraded="` + degraded + `",denied_by="` + deniedBy + `",limiter="` + limiter +
			`",outcome="` + outcome + `",rule="",shadowed="` + shadowed + `",strategy="` + strategy + `"}`
	}
	for _, c := range []struct {
		series string
		want   float64
	}{
		{l("api", "token-bucket", "allowed", "", "false", "false"), 8},     // 5 user:1, 3 user:2
		{l("api", "token-bucket", "denied", "limit", "false", "false"), 1}, // starts the block
		{l("api", "token-bucket", "denied", "deny-cache", "false", "false"), 2},
		{l("api", "token-bucket", "allowed", "", "true", "false"), 2}, // the outage
		{l("api-b", "token-bucket", "denied", "block", "false", "false"), 2},
		{l("candidate", "token-bucket", "allowed", "", "false", "false"), 2},
		{l("candidate", "token-bucket", "allowed", "limit", "false", "true"), 2},
		{l("queue", "leaky-bucket", "allowed", "", "false", "false"), 1},
		{l("queue", "leaky-bucket", "denied", "deadline", "false", "false"), 1},
		{`redlimit_fallback_active{limiter="api",node=""}`, 0},
		{`redlimit_fallback_transitions_total{limiter="api",node="",to="fallback"}`, 1},
		{`redlimit_fallback_transitions_total{limiter="api",node="",to="redis"}`, 1},
	} {
		got, ok := samples[c.series]
		assert.True(t, ok, "%s: got %v (present %v), want %v", c.series, got, ok, c.want)
		assert.Equal(t, c.want, got, "%s: got %v (present %v), want %v", c.series, got, ok, c.want)
	}
	assert.Equal(t, 19.0, sum(samples, "redlimit_decision_seconds_count", `strategy="token-bucket"`))
	assert.Equal(t, 2.0, sum(samples, "redlimit_decision_seconds_count", `strategy="leaky-bucket"`))
	allowed := sum(samples, "redlimit_decisions_total", `outcome="allowed"`)
	denied := sum(samples, "redlimit_decisions_total", `outcome="denied"`)
	got, wantSum := allowed+denied, float64(made.decisions)
	assert.Equal(t, wantSum, got, "allowed + denied = %v, want %v decisions", got, wantSum)
	assert.NoError(t, check(samples, made, true))
}

// TestSelfTestFails checks that check notices metrics that do not match.
func TestSelfTestFails(t *testing.T) {
	samples := map[string]float64{`redlimit_decisions_total{limiter="api",outcome="allowed",strategy="token-bucket"}`: 3}
	assert.Error(t, check(samples, tally{decisions: 4, allowed: 4}, false), "check: got nil, want an error for 3 allowed in the metrics and 4 made")
}
