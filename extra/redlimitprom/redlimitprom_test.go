package redlimitprom_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/extra/redlimitprom"
)

// setup returns a Redis client on a miniredis whose clock stands still (no
// refill between calls), and a Collector registered in a pedantic registry.
func setup(t *testing.T) (*miniredis.Miniredis, *redis.Client, *redlimitprom.Collector, *prometheus.Registry) {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	// Timeouts for a loaded machine: a timeout would make a decision
	// degraded.
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), DialTimeout: 2 * time.Second, DialerRetries: 1,
		ReadTimeout: 2 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	c := redlimitprom.NewCollector()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	return mr, rdb, c, reg
}

// histogramCounts returns the sample count of each redlimit_decision_seconds
// series, by its labels written limiter/outcome/degraded.
func histogramCounts(t *testing.T, reg *prometheus.Registry) map[string]uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := make(map[string]uint64)
	for _, mf := range mfs {
		if mf.GetName() != "redlimit_decision_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := labels(m)
			got[l["limiter"]+"/"+l["outcome"]+"/"+l["degraded"]] += m.GetHistogram().GetSampleCount()
			assert.Positive(t, m.GetHistogram().GetSampleSum(), "%v: the time taken", l)
			assert.Len(t, m.GetHistogram().GetBucket(), len(redlimitprom.DurationBuckets))
		}
	}
	return got
}

func labels(m *dto.Metric) map[string]string {
	l := make(map[string]string)
	for _, p := range m.GetLabel() {
		l[p.GetName()] = p.GetValue()
	}
	return l
}

// TestCollector makes known decisions, an outage included, and compares
// every metric with what they must say.
func TestCollector(t *testing.T) {
	mr, rdb, c, reg := setup(t)
	ctx := context.Background()

	// 3 per second with a 1s block and a deny cache: 5 calls are 3 allowed,
	// 1 denied by the limit (which starts the block), 1 by the deny cache.
	api, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(3),
		append(c.Options("api"), redlimit.WithBlock(time.Second), redlimit.WithDenyCache(100), redlimit.WithPingInterval(20*time.Millisecond))...)
	require.NoError(t, err)
	t.Cleanup(func() { api.Close() })
	for range 5 {
		_, err := api.Allow(ctx, "user:1")
		require.NoError(t, err)
	}
	// Shadow mode: 2 per second, 3 calls, the third shadowed.
	shadow, err := redlimit.NewFixedWindow(rdb, redlimit.PerSecond(2), append(c.Options("candidate"), redlimit.WithShadow())...)
	require.NoError(t, err)
	t.Cleanup(func() { shadow.Close() })
	for range 3 {
		_, err := shadow.Allow(ctx, "user:1")
		require.NoError(t, err)
	}
	// A policy: the "tokens" rule denies AllowN of 50 after one of 80.
	pol, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "requests", Strategy: redlimit.SlidingCounter, Limit: redlimit.PerSecond(10), PerCall: true},
		{Name: "tokens", Strategy: redlimit.TokenBucket, Limit: redlimit.PerMinute(100)},
	}, c.Options("llm")...)
	require.NoError(t, err)
	t.Cleanup(func() { pol.Close() })
	for _, n := range []int{80, 50} {
		_, err := pol.AllowN(ctx, "tenant:1", n)
		require.NoError(t, err)
	}
	// A concurrency cap of 1: one lease, one denial.
	conc, err := redlimit.NewConcurrency(rdb, 1, time.Minute, c.Options("jobs")...)
	require.NoError(t, err)
	t.Cleanup(func() { conc.Close() })
	for range 2 {
		_, _, err := conc.TryAcquire(ctx, "tenant:1")
		require.NoError(t, err)
	}
	// An outage: api decides 2 calls degraded; strict, with FallbackError,
	// returns an error: no decision.
	strict, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(3), append(c.Options("strict"), redlimit.WithFallback(redlimit.FallbackError))...)
	require.NoError(t, err)
	t.Cleanup(func() { strict.Close() })
	mr.Close()
	for range 2 {
		res, err := api.Allow(ctx, "user:2")
		require.NoError(t, err)
		require.True(t, res.Degraded)
	}
	_, err = strict.Allow(ctx, "user:2")
	require.Error(t, err)

	const head = `# HELP redlimit_decisions_total Rate-limit decisions, by outcome (allowed, denied, error, exceeds-limit), strategy, rule, reason of a denial, degraded (decided without Redis) and shadowed (allowed by shadow mode, denied by the limit).
# TYPE redlimit_decisions_total counter
`
	decisions := head + `redlimit_decisions_total{degraded="false",denied_by="",limiter="api",outcome="allowed",rule="",shadowed="false",strategy="token-bucket"} 3
redlimit_decisions_total{degraded="false",denied_by="limit",limiter="api",outcome="denied",rule="",shadowed="false",strategy="token-bucket"} 1
redlimit_decisions_total{degraded="false",denied_by="deny-cache",limiter="api",outcome="denied",rule="",shadowed="false",strategy="token-bucket"} 1
redlimit_decisions_total{degraded="true",denied_by="",limiter="api",outcome="allowed",rule="",shadowed="false",strategy="token-bucket"} 2
redlimit_decisions_total{degraded="false",denied_by="",limiter="candidate",outcome="allowed",rule="",shadowed="false",strategy="fixed-window"} 2
redlimit_decisions_total{degraded="false",denied_by="limit",limiter="candidate",outcome="allowed",rule="",shadowed="true",strategy="fixed-window"} 1
redlimit_decisions_total{degraded="false",denied_by="",limiter="llm",outcome="allowed",rule="tokens",shadowed="false",strategy="token-bucket"} 1
redlimit_decisions_total{degraded="false",denied_by="limit",limiter="llm",outcome="denied",rule="tokens",shadowed="false",strategy="token-bucket"} 1
redlimit_decisions_total{degraded="false",denied_by="",limiter="jobs",outcome="allowed",rule="",shadowed="false",strategy="concurrency"} 1
redlimit_decisions_total{degraded="false",denied_by="limit",limiter="jobs",outcome="denied",rule="",shadowed="false",strategy="concurrency"} 1
redlimit_decisions_total{degraded="false",denied_by="",limiter="strict",outcome="error",rule="",shadowed="false",strategy="token-bucket"} 1
`
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(decisions), "redlimit_decisions_total"))
	assert.Equal(t, map[string]uint64{
		"api/allowed/false": 3, "api/denied/false": 2, "api/allowed/true": 2,
		"candidate/allowed/false": 3, "llm/allowed/false": 1, "llm/denied/false": 1,
		"jobs/allowed/false": 1, "jobs/denied/false": 1, "strict/error/false": 1,
	}, histogramCounts(t, reg))

	const fallback = `# HELP redlimit_fallback_active 1 while a limiter decides a Redis node's keys without Redis (the node marked down), 0 once back.
# TYPE redlimit_fallback_active gauge
redlimit_fallback_active{limiter="api",node=""} 1
redlimit_fallback_active{limiter="candidate",node=""} 1
redlimit_fallback_active{limiter="jobs",node=""} 1
redlimit_fallback_active{limiter="llm",node=""} 1
redlimit_fallback_active{limiter="strict",node=""} 1
# HELP redlimit_fallback_transitions_total Switches of a Redis node's keys to the fallback (to=fallback) and back (to=redis).
# TYPE redlimit_fallback_transitions_total counter
redlimit_fallback_transitions_total{limiter="api",node="",to="fallback"} 1
redlimit_fallback_transitions_total{limiter="candidate",node="",to="fallback"} 1
redlimit_fallback_transitions_total{limiter="jobs",node="",to="fallback"} 1
redlimit_fallback_transitions_total{limiter="llm",node="",to="fallback"} 1
redlimit_fallback_transitions_total{limiter="strict",node="",to="fallback"} 1
`
	// api has a ping interval of its own, so a watch of its own; strict's
	// failed call marked the node down in the watch that candidate, llm
	// and jobs share with it (the same client and options), and each
	// limiter's hook is told, from a goroutine of its own: wait for them.
	compareFallback := func() error {
		return testutil.GatherAndCompare(reg, strings.NewReader(fallback), "redlimit_fallback_active", "redlimit_fallback_transitions_total")
	}
	assert.Eventually(t, func() bool { return compareFallback() == nil }, 5*time.Second, 10*time.Millisecond)
	assert.NoError(t, compareFallback())

	require.NoError(t, mr.Restart())
	require.Eventually(t, func() bool {
		res, err := api.Allow(ctx, "user:3")
		return err == nil && !res.Degraded
	}, 10*time.Second, 10*time.Millisecond, "api not back on Redis")
	back := testutil.ToFloat64(gauge(t, reg, "redlimit_fallback_active", "api"))
	assert.Equal(t, 0.0, back, "redlimit_fallback_active{limiter=api} after the outage")

	// An eviction notice counts keys and is no switch.
	c.OnTransition("api")(redlimit.Transition{Node: "10.0.0.1:6379", Evicted: 7, Err: redlimit.ErrEvictionPolicy})
	const evicted = `# HELP redlimit_evicted_keys_total Keys a Redis node evicted, as redlimit.WithEvictionCheck samples them.
# TYPE redlimit_evicted_keys_total counter
redlimit_evicted_keys_total{limiter="api",node="10.0.0.1:6379"} 7
`
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(evicted), "redlimit_evicted_keys_total"))

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for name, v := range labels(m) {
				assert.NotContains(t, v, "user:", "%s: the limited key in label %s", mf.GetName(), name)
				assert.NotContains(t, v, "tenant:", "%s: the limited key in label %s", mf.GetName(), name)
			}
		}
	}
}

// gauge returns a collector of the one series of metric name with
// limiter=limiter, for testutil.ToFloat64.
func gauge(t *testing.T, reg *prometheus.Registry, name, limiter string) prometheus.Collector {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if labels(m)["limiter"] == limiter {
				g := prometheus.NewGauge(prometheus.GaugeOpts{Name: "x"})
				g.Set(m.GetGauge().GetValue())
				return g
			}
		}
	}
	t.Fatalf("no %s{limiter=%q}", name, limiter)
	return nil
}

type fakeSource redlimit.PrefetchStats

func (f *fakeSource) PrefetchStats() redlimit.PrefetchStats { return redlimit.PrefetchStats(*f) }

// TestPrefetch checks the redlimit_prefetch_* metrics with known figures,
// and with a hot key's.
func TestPrefetch(t *testing.T) {
	_, rdb, c, reg := setup(t)
	ctx := context.Background()
	c.WatchPrefetch("fake", &fakeSource{Held: 2, Unused: 30, Taken: 5, Served: 400, Returned: 11, Lost: 3})
	const fake = `# HELP redlimit_prefetch_held Prefetches held now, or being taken (redlimit.WithPrefetch).
# TYPE redlimit_prefetch_held gauge
redlimit_prefetch_held{limiter="fake"} 2
# HELP redlimit_prefetch_lost_total Unused prefetched events that could not be settled back: they stand as used.
# TYPE redlimit_prefetch_lost_total counter
redlimit_prefetch_lost_total{limiter="fake"} 3
# HELP redlimit_prefetch_returned_total Unused prefetched events settled back to Redis.
# TYPE redlimit_prefetch_returned_total counter
redlimit_prefetch_returned_total{limiter="fake"} 11
# HELP redlimit_prefetch_served_total Calls served from a prefetch, without a round trip.
# TYPE redlimit_prefetch_served_total counter
redlimit_prefetch_served_total{limiter="fake"} 400
# HELP redlimit_prefetch_taken_total Prefetches taken.
# TYPE redlimit_prefetch_taken_total counter
redlimit_prefetch_taken_total{limiter="fake"} 5
# HELP redlimit_prefetch_unused Events the held prefetches took in Redis and have not served.
# TYPE redlimit_prefetch_unused gauge
redlimit_prefetch_unused{limiter="fake"} 30
`
	names := []string{"redlimit_prefetch_held", "redlimit_prefetch_unused", "redlimit_prefetch_taken_total",
		"redlimit_prefetch_served_total", "redlimit_prefetch_returned_total", "redlimit_prefetch_lost_total"}
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(fake), names...))
	c.UnwatchPrefetch("fake")

	hot, err := redlimit.NewTokenBucket(rdb, redlimit.Limit{Rate: 10, Period: time.Hour, Burst: 1_000_000},
		append(c.Options("hot"), redlimit.WithPrefetch(100, time.Second))...)
	require.NoError(t, err)
	t.Cleanup(func() { hot.Close() })
	c.WatchPrefetch("hot", hot)
	for range 300 {
		res, err := hot.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	// A prefetch may still be being taken in the background: compare
	// with stats that did not change across the gather.
	var st redlimit.PrefetchStats
	got := make(map[string]float64)
	for range 100 {
		st = hot.PrefetchStats()
		mfs, err := reg.Gather()
		require.NoError(t, err)
		clear(got)
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if !strings.HasPrefix(mf.GetName(), "redlimit_prefetch_") {
					continue
				}
				assert.Equal(t, "hot", labels(m)["limiter"], "%s after UnwatchPrefetch(fake)", mf.GetName())
				got[mf.GetName()] = m.GetGauge().GetValue() + m.GetCounter().GetValue()
			}
		}
		if hot.PrefetchStats() == st {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	require.Positive(t, st.Served, "%+v", st)
	assert.Equal(t, map[string]float64{
		"redlimit_prefetch_held": float64(st.Held), "redlimit_prefetch_unused": float64(st.Unused),
		"redlimit_prefetch_taken_total": float64(st.Taken), "redlimit_prefetch_served_total": float64(st.Served),
		"redlimit_prefetch_returned_total": float64(st.Returned), "redlimit_prefetch_lost_total": float64(st.Lost),
	}, got)
}

// A call of more events than a rule can ever hold fails with
// redlimit.ErrExceedsLimit: the caller's error, counted with outcome
// exceeds-limit under the rule that cannot hold it, apart from the
// limiter's errors.
func TestExceedsLimit(t *testing.T) {
	_, rdb, c, reg := setup(t)
	pol, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "requests", Strategy: redlimit.SlidingCounter, Limit: redlimit.PerSecond(10), PerCall: true},
		{Name: "tokens", Strategy: redlimit.TokenBucket, Limit: redlimit.PerMinute(100)},
	}, c.Options("llm")...)
	require.NoError(t, err)
	t.Cleanup(func() { pol.Close() })
	_, err = pol.Reserve(context.Background(), "tenant:1", 101)
	require.ErrorIs(t, err, redlimit.ErrExceedsLimit)
	_, err = pol.AllowN(context.Background(), "tenant:1", 100)
	require.NoError(t, err)
	const decisions = `# HELP redlimit_decisions_total Rate-limit decisions, by outcome (allowed, denied, error, exceeds-limit), strategy, rule, reason of a denial, degraded (decided without Redis) and shadowed (allowed by shadow mode, denied by the limit).
# TYPE redlimit_decisions_total counter
redlimit_decisions_total{degraded="false",denied_by="",limiter="llm",outcome="allowed",rule="tokens",shadowed="false",strategy="token-bucket"} 1
redlimit_decisions_total{degraded="false",denied_by="",limiter="llm",outcome="exceeds-limit",rule="tokens",shadowed="false",strategy="token-bucket"} 1
`
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(decisions), "redlimit_decisions_total"))
}

// A sub-window counter's decisions count under its strategy's name, as
// every strategy's: 2 allowed and 1 denied of 2 a minute.
func TestSubWindowCounterDecisions(t *testing.T) {
	_, rdb, c, reg := setup(t)
	lim, err := redlimit.NewSubWindowCounter(rdb, redlimit.PerMinute(2), c.Options("hour")...)
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close() })
	for range 3 {
		_, err := lim.Allow(context.Background(), "user:1")
		require.NoError(t, err)
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "redlimit_decisions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := labels(m)
			got[l["strategy"]+"/"+l["outcome"]] += m.GetCounter().GetValue()
		}
	}
	assert.Equal(t, map[string]float64{"sub-window-counter/allowed": 2, "sub-window-counter/denied": 1}, got)
}

// Both limiters that take redlimit.WithRegions are region sources.
var (
	_ redlimitprom.RegionSource = (*redlimit.RateLimiter)(nil)
	_ redlimitprom.RegionSource = (*redlimit.Policy)(nil)
)

type fakeRegions map[string]time.Duration

func (f fakeRegions) PeerAges() map[string]time.Duration { return f }

// TestRegions checks redlimit_region_peer_age_seconds with known ages, its
// end at UnwatchRegions, and redlimit_region_stale_decisions_total, which
// counts the decisions whose Stale is set.
func TestRegions(t *testing.T) {
	_, _, c, reg := setup(t)
	c.WatchRegions("eu", fakeRegions{"us": 1500 * time.Millisecond, "ap": 2 * time.Second})
	c.WatchRegions("us", fakeRegions{"eu": 250 * time.Millisecond})
	const ages = `# HELP redlimit_region_peer_age_seconds Seconds since this instance's exchange last reached the peer region (redlimit.WithRegions).
# TYPE redlimit_region_peer_age_seconds gauge
redlimit_region_peer_age_seconds{limiter="eu",peer="ap"} 2
redlimit_region_peer_age_seconds{limiter="eu",peer="us"} 1.5
redlimit_region_peer_age_seconds{limiter="us",peer="eu"} 0.25
`
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(ages), "redlimit_region_peer_age_seconds"))

	eu, us := c.Observer("eu"), c.Observer("us")
	for _, stale := range []bool{true, false, true} {
		eu(redlimit.Decision{Strategy: redlimit.TokenBucket, Allowed: true, Stale: stale, Latency: time.Millisecond})
	}
	eu(redlimit.Decision{Strategy: redlimit.TokenBucket, DeniedBy: redlimit.DeniedByLimit, Stale: true, Latency: time.Millisecond})
	us(redlimit.Decision{Strategy: redlimit.TokenBucket, Allowed: true, Latency: time.Millisecond})
	const stale = `# HELP redlimit_region_stale_decisions_total Decisions made while a peer region was silent past the staleness bound (redlimit.WithRegions, Result.Stale).
# TYPE redlimit_region_stale_decisions_total counter
redlimit_region_stale_decisions_total{limiter="eu"} 3
`
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(stale), "redlimit_region_stale_decisions_total"))
	const decisions = `# HELP redlimit_decisions_total Rate-limit decisions, by outcome (allowed, denied, error, exceeds-limit), strategy, rule, reason of a denial, degraded (decided without Redis) and shadowed (allowed by shadow mode, denied by the limit).
# TYPE redlimit_decisions_total counter
redlimit_decisions_total{degraded="false",denied_by="",limiter="eu",outcome="allowed",rule="",shadowed="false",strategy="token-bucket"} 3
redlimit_decisions_total{degraded="false",denied_by="limit",limiter="eu",outcome="denied",rule="",shadowed="false",strategy="token-bucket"} 1
redlimit_decisions_total{degraded="false",denied_by="",limiter="us",outcome="allowed",rule="",shadowed="false",strategy="token-bucket"} 1
`
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(decisions), "redlimit_decisions_total"), "the decisions' series unchanged by Stale")

	c.UnwatchRegions("eu")
	const left = `# HELP redlimit_region_peer_age_seconds Seconds since this instance's exchange last reached the peer region (redlimit.WithRegions).
# TYPE redlimit_region_peer_age_seconds gauge
redlimit_region_peer_age_seconds{limiter="us",peer="eu"} 0.25
`
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(left), "redlimit_region_peer_age_seconds"), "after UnwatchRegions(eu)")
	c.UnwatchRegions("us")
	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(""), "redlimit_region_peer_age_seconds"), "after UnwatchRegions(us)")

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
}
