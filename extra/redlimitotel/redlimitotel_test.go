package redlimitotel_test

import (
	"context"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/extra/redlimitotel"
)

// setup returns a Redis client on a miniredis whose clock stands still (no
// refill between calls), and Metrics read by a ManualReader.
func setup(t *testing.T, opts ...redlimitotel.Option) (*miniredis.Miniredis, *redis.Client, *redlimitotel.Metrics, *sdkmetric.ManualReader) {
	t.Helper()
	mr := miniredis.RunT(t)
	mr.SetTime(time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC))
	// Timeouts for a loaded machine: a timeout would make a decision
	// degraded.
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), DialTimeout: 2 * time.Second, DialerRetries: 1,
		ReadTimeout: 2 * time.Second, MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
	m, err := redlimitotel.New(append([]redlimitotel.Option{redlimitotel.WithMeterProvider(mp)}, opts...)...)
	require.NoError(t, err)
	return mr, rdb, m, reader
}

func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]metricdata.Aggregation {
	t.Helper()
	var rm metricdata.ResourceMetrics
	require.NoError(t, r.Collect(context.Background(), &rm))
	got := make(map[string]metricdata.Aggregation)
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, redlimitotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			got[m.Name] = m.Data
		}
	}
	return got
}

// match tells whether set has every one of want.
func match(set attribute.Set, want []attribute.KeyValue) bool {
	for _, kv := range want {
		if v, ok := set.Value(kv.Key); !ok || v != kv.Value {
			return false
		}
	}
	return true
}

// sum adds the values of the data points of metric name (a counter or a
// gauge) whose attributes include want; ok is false when none has them.
func sum(t *testing.T, got map[string]metricdata.Aggregation, name string, want ...attribute.KeyValue) (total int64, ok bool) {
	t.Helper()
	switch d := got[name].(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes, want) {
				total, ok = total+p.Value, true
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if match(p.Attributes, want) {
				total, ok = total+p.Value, true
			}
		}
	case nil:
		t.Fatalf("no metric %s", name)
	default:
		t.Fatalf("metric %s is a %T", name, d)
	}
	return total, ok
}

// count returns the number of observations of histogram name whose
// attributes include want.
func count(t *testing.T, got map[string]metricdata.Aggregation, name string, want ...attribute.KeyValue) uint64 {
	t.Helper()
	h, ok := got[name].(metricdata.Histogram[float64])
	require.True(t, ok, "metric %s: %T, want a histogram", name, got[name])
	var n uint64
	for _, p := range h.DataPoints {
		if match(p.Attributes, want) {
			n += p.Count
		}
	}
	return n
}

func want(t *testing.T, got map[string]metricdata.Aggregation, name string, v int64, attrs ...attribute.KeyValue) {
	t.Helper()
	total, ok := sum(t, got, name, attrs...)
	assert.True(t, ok, "%s%v: no data point", name, attrs)
	assert.Equal(t, v, total, "%s%v: got %d, want %d", name, attrs, total, v)
}

var (
	lim     = redlimitotel.LimiterKey.String
	outcome = redlimitotel.OutcomeKey.String
)

// TestDecisions makes known decisions and checks redlimit.decisions and
// redlimit.decision.duration for each attribute.
func TestDecisions(t *testing.T) {
	mr, rdb, m, reader := setup(t)
	ctx := context.Background()

	// 3 per second with a 1s block and a deny cache: 5 calls are 3 allowed,
	// 1 denied by the limit (which starts the block), 1 by the deny cache.
	api, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(3),
		append(m.Options("api"), redlimit.WithBlock(time.Second), redlimit.WithDenyCache(100))...)
	require.NoError(t, err)
	t.Cleanup(func() { api.Close() })
	for range 5 {
		_, err := api.Allow(ctx, "user:1")
		require.NoError(t, err)
	}
	// Shadow mode: 2 per second, 3 calls, the third shadowed.
	shadow, err := redlimit.NewFixedWindow(rdb, redlimit.PerSecond(2), append(m.Options("candidate"), redlimit.WithShadow())...)
	require.NoError(t, err)
	t.Cleanup(func() { shadow.Close() })
	for range 3 {
		res, err := shadow.Allow(ctx, "user:1")
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	// A policy: the "tokens" rule denies AllowN of 50 after one of 80.
	pol, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "requests", Strategy: redlimit.SlidingCounter, Limit: redlimit.PerSecond(10), PerCall: true},
		{Name: "tokens", Strategy: redlimit.TokenBucket, Limit: redlimit.PerMinute(100)},
	}, m.Options("llm")...)
	require.NoError(t, err)
	t.Cleanup(func() { pol.Close() })
	for _, n := range []int{80, 50} {
		_, err := pol.AllowN(ctx, "tenant:1", n)
		require.NoError(t, err)
	}
	// A concurrency cap of 1: one lease, one denial.
	conc, err := redlimit.NewConcurrency(rdb, 1, time.Minute, m.Options("jobs")...)
	require.NoError(t, err)
	t.Cleanup(func() { conc.Close() })
	for range 2 {
		_, _, err := conc.TryAcquire(ctx, "tenant:1")
		require.NoError(t, err)
	}
	// An outage: the fallback decides, degraded; a limiter with
	// FallbackError returns an error, no decision.
	strict, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(3), append(m.Options("strict"), redlimit.WithFallback(redlimit.FallbackError))...)
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

	got := collect(t, reader)
	tb := redlimitotel.StrategyKey.String("token-bucket")
	deg := redlimitotel.DegradedKey.Bool
	by := redlimitotel.DeniedByKey.String
	rule := redlimitotel.RuleKey.String
	shadowed := redlimitotel.ShadowedKey.Bool
	want(t, got, "redlimit.decisions", 7, lim("api"))
	want(t, got, "redlimit.decisions", 3, lim("api"), tb, outcome("allowed"), deg(false), shadowed(false), by(""), rule(""))
	want(t, got, "redlimit.decisions", 1, lim("api"), outcome("denied"), by("limit"))
	want(t, got, "redlimit.decisions", 1, lim("api"), outcome("denied"), by("deny-cache"))
	want(t, got, "redlimit.decisions", 1, lim("strict"), outcome("error"))
	want(t, got, "redlimit.decisions", 2, lim("api"), outcome("allowed"), deg(true))
	want(t, got, "redlimit.decisions", 3, lim("candidate"), redlimitotel.StrategyKey.String("fixed-window"), outcome("allowed"))
	want(t, got, "redlimit.decisions", 1, lim("candidate"), outcome("allowed"), shadowed(true), by("limit"))
	want(t, got, "redlimit.decisions", 1, lim("llm"), outcome("allowed"))
	want(t, got, "redlimit.decisions", 1, lim("llm"), outcome("denied"), rule("tokens"), tb, by("limit"))
	want(t, got, "redlimit.decisions", 1, lim("jobs"), redlimitotel.StrategyKey.String("concurrency"), outcome("allowed"))
	want(t, got, "redlimit.decisions", 1, lim("jobs"), redlimitotel.StrategyKey.String("concurrency"), outcome("denied"), by("limit"))
	want(t, got, "redlimit.decisions", 15)

	assert.Equal(t, uint64(15), count(t, got, "redlimit.decision.duration"))
	assert.Equal(t, uint64(2), count(t, got, "redlimit.decision.duration", lim("api"), deg(true)))
	assert.Equal(t, uint64(1), count(t, got, "redlimit.decision.duration", lim("llm"), rule("tokens"), outcome("denied")))
	h := got["redlimit.decision.duration"].(metricdata.Histogram[float64])
	for _, p := range h.DataPoints {
		assert.Positive(t, p.Sum, "%v: the time taken", p.Attributes)
		assert.Equal(t, redlimitotel.DurationBuckets, p.Bounds)
	}
	for _, name := range []string{"redlimit.decisions", "redlimit.decision.duration"} {
		for _, key := range allPoints(got[name]) {
			_, has := key.Value("key")
			assert.False(t, has, "%s: a key attribute", name)
			for _, kv := range key.ToSlice() {
				assert.NotContains(t, kv.Value.String(), "user:", "%s: the limited key in %v", name, kv)
				assert.NotContains(t, kv.Value.String(), "tenant:", "%s: the limited key in %v", name, kv)
			}
		}
	}
}

func allPoints(a metricdata.Aggregation) []attribute.Set {
	var sets []attribute.Set
	switch d := a.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			sets = append(sets, p.Attributes)
		}
	}
	return sets
}

// TestFallback checks the fallback state per node, the transitions and
// the degraded decisions across an outage.
func TestFallback(t *testing.T) {
	mr, rdb, m, reader := setup(t)
	ctx := context.Background()
	up := make(chan struct{}, 1)
	hook := m.OnTransition("api")
	api, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(100),
		redlimit.WithObserver(m.Observer("api")), redlimit.WithPingInterval(20*time.Millisecond),
		redlimit.WithOnTransition(func(tr redlimit.Transition) {
			hook(tr)
			if !tr.Down {
				up <- struct{}{}
			}
		}))
	require.NoError(t, err)
	t.Cleanup(func() { api.Close() })
	node := redlimitotel.NodeKey.String("")
	_, err = api.Allow(ctx, "k")
	require.NoError(t, err)
	got := collect(t, reader)
	_, ok := got["redlimit.fallback.active"]
	assert.False(t, ok, "redlimit.fallback.active before any transition")

	mr.Close()
	for range 3 {
		res, err := api.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Degraded)
	}
	got = collect(t, reader)
	want(t, got, "redlimit.fallback.active", 1, lim("api"), node)
	want(t, got, "redlimit.fallback.transitions", 1, lim("api"), node, redlimitotel.ToKey.String("fallback"))
	want(t, got, "redlimit.decisions", 3, lim("api"), redlimitotel.DegradedKey.Bool(true))
	want(t, got, "redlimit.decisions", 1, lim("api"), redlimitotel.DegradedKey.Bool(false))

	require.NoError(t, mr.Restart())
	select {
	case <-up:
	case <-time.After(10 * time.Second):
		t.Fatal("not back on Redis 10s after the restart")
	}
	got = collect(t, reader)
	want(t, got, "redlimit.fallback.active", 0, lim("api"), node)
	want(t, got, "redlimit.fallback.transitions", 1, lim("api"), node, redlimitotel.ToKey.String("redis"))

	// An eviction notice counts keys and is no switch.
	m.OnTransition("api")(redlimit.Transition{Node: "10.0.0.1:6379", Evicted: 7, Err: redlimit.ErrEvictionPolicy})
	got = collect(t, reader)
	want(t, got, "redlimit.evicted_keys", 7, lim("api"), redlimitotel.NodeKey.String("10.0.0.1:6379"))
	want(t, got, "redlimit.fallback.transitions", 2, lim("api"))
}

type fakeSource redlimit.PrefetchStats

func (f *fakeSource) PrefetchStats() redlimit.PrefetchStats { return redlimit.PrefetchStats(*f) }

// TestPrefetch checks the redlimit.prefetch.* instruments, with known
// figures and with a limiter's.
func TestPrefetch(t *testing.T) {
	_, rdb, m, reader := setup(t)
	ctx := context.Background()
	fake := &fakeSource{Held: 2, Unused: 30, Taken: 5, Served: 400, Returned: 11, Lost: 3}
	m.WatchPrefetch("fake", fake)
	hot, err := redlimit.NewTokenBucket(rdb, redlimit.Limit{Rate: 10, Period: time.Hour, Burst: 1_000_000},
		append(m.Options("hot"), redlimit.WithPrefetch(100, time.Second))...)
	require.NoError(t, err)
	t.Cleanup(func() { hot.Close() })
	m.WatchPrefetch("hot", hot)
	for range 300 {
		res, err := hot.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	// A prefetch may still be being taken in the background: compare
	// with stats that did not change across the collection.
	st := hot.PrefetchStats()
	got := collect(t, reader)
	for i := 0; i < 100 && hot.PrefetchStats() != st; i++ {
		time.Sleep(10 * time.Millisecond)
		st = hot.PrefetchStats()
		got = collect(t, reader)
	}
	require.Positive(t, st.Served, "%+v", st)
	for _, c := range []struct {
		name      string
		fake, hot int64
	}{
		{"redlimit.prefetch.held", 2, int64(st.Held)},
		{"redlimit.prefetch.unused", 30, st.Unused},
		{"redlimit.prefetch.taken", 5, int64(st.Taken)},
		{"redlimit.prefetch.served", 400, int64(st.Served)},
		{"redlimit.prefetch.returned", 11, int64(st.Returned)},
		{"redlimit.prefetch.lost", 3, int64(st.Lost)},
	} {
		want(t, got, c.name, c.fake, lim("fake"))
		want(t, got, c.name, c.hot, lim("hot"))
	}
	want(t, got, "redlimit.decisions", 300, lim("hot"), outcome("allowed"))

	m.UnwatchPrefetch("fake")
	got = collect(t, reader)
	_, ok := sum(t, got, "redlimit.prefetch.taken", lim("fake"))
	assert.False(t, ok, "fake reported after UnwatchPrefetch")
}

// TestSpans checks one span per decision, child of the caller's span, with
// the decision's attributes, its duration, and an error status for an
// error.
func TestSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	mr, rdb, m, _ := setup(t, redlimitotel.WithTracerProvider(tp))
	api, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(1), append(m.Options("api"), redlimit.WithFallback(redlimit.FallbackError))...)
	require.NoError(t, err)
	t.Cleanup(func() { api.Close() })

	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	for range 2 {
		_, err := api.Allow(ctx, "user:1")
		require.NoError(t, err)
	}
	mr.Close() // Redis down and FallbackError: an error, no decision
	_, err = api.Allow(ctx, "user:1")
	require.Error(t, err)
	parent.End()

	var spans []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.Name() == "redlimit.decide" {
			spans = append(spans, s)
		}
	}
	require.Len(t, spans, 3)
	for i, s := range spans {
		assert.Equal(t, parent.SpanContext().SpanID(), s.Parent().SpanID(), "span %d: parent", i)
		assert.Equal(t, parent.SpanContext().TraceID(), s.SpanContext().TraceID(), "span %d: trace", i)
		assert.True(t, s.EndTime().After(s.StartTime()), "span %d: %v to %v", i, s.StartTime(), s.EndTime())
		set := attribute.NewSet(s.Attributes()...)
		v, _ := set.Value(redlimitotel.OutcomeKey)
		assert.Equal(t, []string{"allowed", "denied", "error"}[i], v.AsString(), "span %d: outcome", i)
		for _, kv := range s.Attributes() {
			assert.NotContains(t, kv.Value.String(), "user:", "span %d: the limited key", i)
		}
	}
	assert.Equal(t, codes.Unset, spans[1].Status().Code, "a denial is no error")
	assert.Equal(t, codes.Error, spans[2].Status().Code)
}

// TestNoSpans checks that spans are off without WithTracerProvider.
func TestNoSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	_, rdb, m, _ := setup(t)
	api, err := redlimit.NewTokenBucket(rdb, redlimit.PerSecond(1), m.Options("api")...)
	require.NoError(t, err)
	t.Cleanup(func() { api.Close() })
	ctx, parent := tp.Tracer("test").Start(context.Background(), "request")
	_, err = api.Allow(ctx, "user:1")
	require.NoError(t, err)
	parent.End()
	require.Len(t, rec.Ended(), 1, "only the test's own span")
}

// A call of more events than a rule can ever hold fails with
// redlimit.ErrExceedsLimit: the caller's error, counted with outcome
// exceeds-limit under the rule that cannot hold it, apart from the
// limiter's errors; its span records the error but, as for a 4xx, its
// status is not Error.
func TestExceedsLimit(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	_, rdb, m, reader := setup(t, redlimitotel.WithTracerProvider(tp))
	pol, err := redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "requests", Strategy: redlimit.SlidingCounter, Limit: redlimit.PerSecond(10), PerCall: true},
		{Name: "tokens", Strategy: redlimit.TokenBucket, Limit: redlimit.PerMinute(100)},
	}, m.Options("llm")...)
	require.NoError(t, err)
	t.Cleanup(func() { pol.Close() })
	_, err = pol.Reserve(context.Background(), "tenant:1", 101)
	require.ErrorIs(t, err, redlimit.ErrExceedsLimit)

	got := collect(t, reader)
	want(t, got, "redlimit.decisions", 1, lim("llm"), outcome("exceeds-limit"), redlimitotel.RuleKey.String("tokens"),
		redlimitotel.StrategyKey.String("token-bucket"), redlimitotel.DeniedByKey.String(""))
	want(t, got, "redlimit.decisions", 1)
	spans := rec.Ended()
	require.Len(t, spans, 1)
	assert.Equal(t, codes.Unset, spans[0].Status().Code, "the caller's error")
	require.Len(t, spans[0].Events(), 1)
	assert.Equal(t, "exception", spans[0].Events()[0].Name)
}

// A sub-window counter's decisions carry its strategy's name, as every
// strategy's: 2 allowed and 1 denied of 2 a minute.
func TestSubWindowCounterDecisions(t *testing.T) {
	_, rdb, m, reader := setup(t)
	l, err := redlimit.NewSubWindowCounter(rdb, redlimit.PerMinute(2), m.Options("hour")...)
	require.NoError(t, err)
	t.Cleanup(func() { l.Close() })
	for range 3 {
		_, err := l.Allow(context.Background(), "user:1")
		require.NoError(t, err)
	}
	got := collect(t, reader)
	sw := redlimitotel.StrategyKey.String("sub-window-counter")
	want(t, got, "redlimit.decisions", 2, lim("hour"), sw, outcome("allowed"))
	want(t, got, "redlimit.decisions", 1, lim("hour"), sw, outcome("denied"))
}

// Both limiters that take redlimit.WithRegions are region sources.
var (
	_ redlimitotel.RegionSource = (*redlimit.RateLimiter)(nil)
	_ redlimitotel.RegionSource = (*redlimit.Policy)(nil)
)

type fakeRegions map[string]time.Duration

func (f fakeRegions) PeerAges() map[string]time.Duration { return f }

// peerAges returns the data points of redlimit.region.peer.age, by
// limiter/peer.
func peerAges(t *testing.T, got map[string]metricdata.Aggregation) map[string]float64 {
	t.Helper()
	out := make(map[string]float64)
	a, ok := got["redlimit.region.peer.age"]
	if !ok {
		return out
	}
	g, ok := a.(metricdata.Gauge[float64])
	require.True(t, ok, "redlimit.region.peer.age: %T, want a float64 gauge", a)
	for _, p := range g.DataPoints {
		l, _ := p.Attributes.Value(redlimitotel.LimiterKey)
		peer, _ := p.Attributes.Value(redlimitotel.PeerKey)
		out[l.AsString()+"/"+peer.AsString()] = p.Value
	}
	return out
}

// TestRegions checks redlimit.region.peer.age with known ages, its end at
// UnwatchRegions, and redlimit.region.stale_decisions, which counts the
// decisions whose Stale is set.
func TestRegions(t *testing.T) {
	_, _, m, reader := setup(t)
	m.WatchRegions("eu", fakeRegions{"us": 1500 * time.Millisecond, "ap": 2 * time.Second})
	m.WatchRegions("us", fakeRegions{"eu": 250 * time.Millisecond})
	got := collect(t, reader)
	assert.Equal(t, map[string]float64{"eu/us": 1.5, "eu/ap": 2, "us/eu": 0.25}, peerAges(t, got))

	eu, us := m.Observer("eu"), m.Observer("us")
	for _, stale := range []bool{true, false, true} {
		eu(redlimit.Decision{Strategy: redlimit.TokenBucket, Allowed: true, Stale: stale, Latency: time.Millisecond})
	}
	eu(redlimit.Decision{Strategy: redlimit.TokenBucket, DeniedBy: redlimit.DeniedByLimit, Stale: true, Latency: time.Millisecond})
	us(redlimit.Decision{Strategy: redlimit.TokenBucket, Allowed: true, Latency: time.Millisecond})
	got = collect(t, reader)
	want(t, got, "redlimit.region.stale_decisions", 3, lim("eu"))
	want(t, got, "redlimit.region.stale_decisions", 3)
	_, ok := sum(t, got, "redlimit.region.stale_decisions", lim("us"))
	assert.False(t, ok, "us: stale decisions counted without one")
	want(t, got, "redlimit.decisions", 3, lim("eu"), outcome("allowed"))
	want(t, got, "redlimit.decisions", 1, lim("eu"), outcome("denied"))
	want(t, got, "redlimit.decisions", 1, lim("us"), outcome("allowed"))

	m.UnwatchRegions("eu")
	got = collect(t, reader)
	assert.Equal(t, map[string]float64{"us/eu": 0.25}, peerAges(t, got), "after UnwatchRegions(eu)")
	m.UnwatchRegions("us")
	got = collect(t, reader)
	assert.Empty(t, peerAges(t, got), "after UnwatchRegions(us)")
}
