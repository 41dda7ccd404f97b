// Package redlimitotel records the decisions of redlimit's limiters as
// OpenTelemetry metrics, and optionally as spans, as go-redis's
// extra/redisotel does for Redis commands. It is its own module, so that
// redlimit itself does not depend on OpenTelemetry.
//
// Make one [Metrics] per process and give each limiter its options, under a
// name that says which limiter it is:
//
//	m, err := redlimitotel.New()                      // the global MeterProvider
//	lim, err := redlimit.NewTokenBucket(rdb, limit, m.Options("api")...)
//	m.WatchPrefetch("api", lim)                        // only with redlimit.WithPrefetch
//	m.WatchRegions("api", lim)                         // only with redlimit.WithRegions
//
// The instruments (attributes in braces):
//
//	redlimit.decisions          counter    {redlimit.limiter, redlimit.strategy, redlimit.rule,
//	                                        redlimit.outcome, redlimit.denied_by,
//	                                        redlimit.degraded, redlimit.shadowed}
//	redlimit.decision.duration  histogram  seconds, the same attributes
//	redlimit.fallback.active    gauge      1 while the node is marked down, else 0 {redlimit.limiter, redlimit.node}
//	redlimit.fallback.transitions counter  {redlimit.limiter, redlimit.node, redlimit.to}: to fallback or redis
//	redlimit.evicted_keys       counter    keys the node evicted (redlimit.WithEvictionCheck) {redlimit.limiter, redlimit.node}
//	redlimit.prefetch.held, redlimit.prefetch.unused                     gauges   {redlimit.limiter}
//	redlimit.prefetch.taken, .served, .returned, .lost                   counters {redlimit.limiter}
//	redlimit.region.peer.age    gauge      seconds since the exchange last reached the peer (redlimit.WithRegions) {redlimit.limiter, redlimit.peer}
//	redlimit.region.stale_decisions counter  decisions made while a peer region was silent (Result.Stale) {redlimit.limiter}
//
// redlimit.outcome is allowed, denied, error (no decision: the call
// returned an error, such as Redis down with redlimit.FallbackError) or
// exceeds-limit (the call asked for more events than a rule can ever hold,
// an error wrapping redlimit.ErrExceedsLimit: the caller's error, which
// redlimit.rule names; its span records the error without an Error
// status); redlimit.shadowed is true for a call that shadow mode
// (redlimit.WithShadow) allowed and the limit denied, which counts as
// allowed; redlimit.denied_by is limit, block, deny-cache, deadline or ""
// (see redlimit.DeniedBy). redlimit.strategy is "concurrency" for a
// redlimit.Concurrency, and redlimit.rule is the deciding rule's name of a
// redlimit.Policy ("" otherwise).
//
// No attribute holds the limited key (a user, an IP address, a token): keys
// are chosen by the callers, attackers included, and every distinct value
// is a time series that the metrics backend keeps. Each attribute here takes
// a handful of values: limiter, rule and peer region names are the
// program's, node addresses those of the Redis deployment. Look keys up in logs, or with
// "redlimit inspect", instead. Spans carry no key either.
//
// Options installs redlimit.WithObserver and redlimit.WithOnTransition,
// which replace hooks given before them; a limiter that needs its own hooks
// too calls [Metrics.Observe] and [Metrics.Transition] from them.
package redlimitotel

import (
	"context"
	"errors"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/redlimit/redlimit"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/redlimit/redlimit/extra/redlimitotel"

// Attribute keys.
const (
	LimiterKey  = attribute.Key("redlimit.limiter")
	StrategyKey = attribute.Key("redlimit.strategy")
	RuleKey     = attribute.Key("redlimit.rule")
	OutcomeKey  = attribute.Key("redlimit.outcome")
	DeniedByKey = attribute.Key("redlimit.denied_by")
	DegradedKey = attribute.Key("redlimit.degraded")
	ShadowedKey = attribute.Key("redlimit.shadowed")
	NodeKey     = attribute.Key("redlimit.node")
	ToKey       = attribute.Key("redlimit.to")
	PeerKey     = attribute.Key("redlimit.peer")
)

// Option configures [New].
type Option interface{ apply(*config) }

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

type config struct {
	mp metric.MeterProvider
	tp trace.TracerProvider
}

// WithMeterProvider sets the MeterProvider. The default is the global one
// (otel.GetMeterProvider).
func WithMeterProvider(mp metric.MeterProvider) Option {
	return optionFunc(func(c *config) { c.mp = mp })
}

// WithTracerProvider turns spans on: one span per decision, named
// "redlimit.decide", child of the caller's context, with the decision's
// attributes, its start and end, and an error status when the call
// returned an error. The default is no spans.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return optionFunc(func(c *config) { c.tp = tp })
}

// PrefetchSource is what [Metrics.WatchPrefetch] reads: a
// *redlimit.RateLimiter or a *redlimit.Policy.
type PrefetchSource interface {
	PrefetchStats() redlimit.PrefetchStats
}

// RegionSource is what [Metrics.WatchRegions] reads: a
// *redlimit.RateLimiter or a *redlimit.Policy.
type RegionSource interface {
	PeerAges() map[string]time.Duration
}

// Metrics makes the instruments and records what the limiters it is given
// to decide. It is safe for concurrent use.
type Metrics struct {
	decisions   metric.Int64Counter
	duration    metric.Float64Histogram
	transitions metric.Int64Counter
	evicted     metric.Int64Counter
	stale       metric.Int64Counter
	tracer      trace.Tracer // nil: no spans

	mu       sync.Mutex
	down     map[nodeKey]bool // fallback state per limiter and node
	prefetch map[string]PrefetchSource
	regions  map[string]RegionSource
}

type nodeKey struct{ limiter, node string }

// DurationBuckets are the histogram's bucket boundaries in seconds: 25µs to
// about 100ms, doubling. A deny-cache hit takes microseconds, a round trip
// to a nearby Redis a fraction of a millisecond.
var DurationBuckets = []float64{25e-6, 50e-6, 100e-6, 200e-6, 400e-6, 800e-6, 1.6e-3, 3.2e-3, 6.4e-3, 12.8e-3, 25.6e-3, 51.2e-3, 102.4e-3}

// New makes the instruments with the options' MeterProvider.
func New(opts ...Option) (*Metrics, error) {
	var c config
	for _, o := range opts {
		o.apply(&c)
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	meter := c.mp.Meter(ScopeName)
	m := &Metrics{down: make(map[nodeKey]bool), prefetch: make(map[string]PrefetchSource), regions: make(map[string]RegionSource)}
	if c.tp != nil {
		m.tracer = c.tp.Tracer(ScopeName)
	}
	instErr := m.makeInstruments(meter) // first, as the instruments are listed
	obs, obsErr := newObservables(meter)
	if err := errors.Join(instErr, obsErr); err != nil {
		return nil, err
	}
	if _, err := meter.RegisterCallback(m.observe(obs), obs.all()...); err != nil {
		return nil, err
	}
	return m, nil
}

// makeInstruments makes m's synchronous instruments with meter.
func (m *Metrics) makeInstruments(meter metric.Meter) error {
	var errs [5]error
	m.decisions, errs[0] = meter.Int64Counter("redlimit.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Rate-limit decisions, by outcome (allowed, denied, error, exceeds-limit), strategy, rule, reason of a denial, degraded (decided without Redis) and shadowed (allowed by shadow mode, denied by the limit)."))
	m.duration, errs[1] = meter.Float64Histogram("redlimit.decision.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to make a decision: one Redis round trip, or in-process."),
		metric.WithExplicitBucketBoundaries(DurationBuckets...))
	m.transitions, errs[2] = meter.Int64Counter("redlimit.fallback.transitions", metric.WithUnit("{transition}"),
		metric.WithDescription("Switches of a Redis node's keys to the fallback (redlimit.to=fallback) and back (redlimit.to=redis)."))
	m.evicted, errs[3] = meter.Int64Counter("redlimit.evicted_keys", metric.WithUnit("{key}"),
		metric.WithDescription("Keys a Redis node evicted, as redlimit.WithEvictionCheck samples them."))
	m.stale, errs[4] = meter.Int64Counter("redlimit.region.stale_decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions made while a peer region was silent past the staleness bound (redlimit.WithRegions, Result.Stale)."))
	return errors.Join(errs[:]...)
}

// observables are the instruments read at collection time: the fallback's
// state per node, the prefetches' figures and the peer regions' ages.
type observables struct {
	active, held, unused metric.Int64ObservableGauge
	// counters are the prefetches taken, served, returned and lost.
	counters [4]metric.Int64ObservableCounter
	peerAge  metric.Float64ObservableGauge
}

// newObservables makes the observable instruments with meter.
func newObservables(meter metric.Meter) (*observables, error) {
	var obs observables
	var errs [8]error
	obs.active, errs[0] = meter.Int64ObservableGauge("redlimit.fallback.active", metric.WithUnit("{node}"),
		metric.WithDescription("1 while a limiter decides a Redis node's keys without Redis (the node marked down), 0 once back."))
	obs.held, errs[1] = meter.Int64ObservableGauge("redlimit.prefetch.held", metric.WithUnit("{prefetch}"),
		metric.WithDescription("Prefetches held now, or being taken (redlimit.WithPrefetch)."))
	obs.unused, errs[2] = meter.Int64ObservableGauge("redlimit.prefetch.unused", metric.WithUnit("{event}"),
		metric.WithDescription("Events the held prefetches took in Redis and have not served."))
	for i, c := range []struct{ name, unit, desc string }{
		{"redlimit.prefetch.taken", "{prefetch}", "Prefetches taken."},
		{"redlimit.prefetch.served", "{call}", "Calls served from a prefetch, without a round trip."},
		{"redlimit.prefetch.returned", "{event}", "Unused prefetched events settled back to Redis."},
		{"redlimit.prefetch.lost", "{event}", "Unused prefetched events that could not be settled back: they stand as used."},
	} {
		obs.counters[i], errs[3+i] = meter.Int64ObservableCounter(c.name, metric.WithUnit(c.unit), metric.WithDescription(c.desc))
	}
	obs.peerAge, errs[7] = meter.Float64ObservableGauge("redlimit.region.peer.age", metric.WithUnit("s"),
		metric.WithDescription("Seconds since this instance's exchange last reached the peer region (redlimit.WithRegions)."))
	return &obs, errors.Join(errs[:]...)
}

// all returns the observable instruments, for RegisterCallback.
func (obs *observables) all() []metric.Observable {
	return []metric.Observable{obs.active, obs.held, obs.unused, obs.counters[0], obs.counters[1], obs.counters[2], obs.counters[3], obs.peerAge}
}

// observe returns the callback that reports m's fallback states,
// prefetches' figures and peer regions' ages in obs.
func (m *Metrics) observe(obs *observables) metric.Callback {
	return func(_ context.Context, o metric.Observer) error {
		m.mu.Lock()
		defer m.mu.Unlock()
		for k, down := range m.down {
			v := int64(0)
			if down {
				v = 1
			}
			o.ObserveInt64(obs.active, v, metric.WithAttributes(LimiterKey.String(k.limiter), NodeKey.String(k.node)))
		}
		for name, src := range m.prefetch {
			s := src.PrefetchStats()
			attrs := metric.WithAttributes(LimiterKey.String(name))
			o.ObserveInt64(obs.held, int64(s.Held), attrs)
			o.ObserveInt64(obs.unused, s.Unused, attrs)
			for i, v := range []uint64{s.Taken, s.Served, s.Returned, s.Lost} {
				o.ObserveInt64(obs.counters[i], int64(v), attrs)
			}
		}
		for name, src := range m.regions {
			for peer, age := range src.PeerAges() {
				o.ObserveFloat64(obs.peerAge, age.Seconds(), metric.WithAttributes(LimiterKey.String(name), PeerKey.String(peer)))
			}
		}
		return nil
	}
}

// Options returns the limiter options that record its decisions and
// fallback transitions under the name limiter (the redlimit.limiter
// attribute): redlimit.WithObserver and redlimit.WithOnTransition. Give
// each limiter its own name; a Policy's rules are told apart by
// redlimit.rule.
func (m *Metrics) Options(limiter string) []redlimit.Option {
	return []redlimit.Option{
		redlimit.WithObserver(m.Observer(limiter)),
		redlimit.WithOnTransition(m.OnTransition(limiter)),
	}
}

// Observer returns the decision hook for the limiter named limiter, for
// redlimit.WithObserver. Call it from a hook of your own to chain them.
func (m *Metrics) Observer(limiter string) func(redlimit.Decision) {
	o := &observer{m: m, limiter: limiter,
		stale: []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(LimiterKey.String(limiter)))}}
	return o.observe
}

// OnTransition returns the fallback hook for the limiter named limiter, for
// redlimit.WithOnTransition. Call it from a hook of your own to chain them.
func (m *Metrics) OnTransition(limiter string) func(redlimit.Transition) {
	return func(t redlimit.Transition) { m.transition(limiter, t) }
}

// WatchPrefetch reports src's prefetch statistics (the redlimit.prefetch.*
// instruments) under the name limiter, at each collection, until
// [Metrics.UnwatchPrefetch]. A second call with the same name replaces src.
func (m *Metrics) WatchPrefetch(limiter string, src PrefetchSource) {
	m.mu.Lock()
	m.prefetch[limiter] = src
	m.mu.Unlock()
}

// UnwatchPrefetch stops reporting the prefetch statistics of limiter (for
// one closed).
func (m *Metrics) UnwatchPrefetch(limiter string) {
	m.mu.Lock()
	delete(m.prefetch, limiter)
	m.mu.Unlock()
}

// WatchRegions reports the ages of src's peer regions (the
// redlimit.region.peer.age instrument, one data point per peer) under the
// name limiter, at each collection, until [Metrics.UnwatchRegions]. A
// second call with the same name replaces src.
func (m *Metrics) WatchRegions(limiter string, src RegionSource) {
	m.mu.Lock()
	m.regions[limiter] = src
	m.mu.Unlock()
}

// UnwatchRegions stops reporting the peer regions' ages of limiter (for
// one closed).
func (m *Metrics) UnwatchRegions(limiter string) {
	m.mu.Lock()
	delete(m.regions, limiter)
	m.mu.Unlock()
}

func (m *Metrics) transition(limiter string, t redlimit.Transition) {
	ctx := context.Background()
	nodeAttrs := []attribute.KeyValue{LimiterKey.String(limiter), NodeKey.String(t.Node)}
	if t.Evicted > 0 { // a notice, not a switch
		m.evicted.Add(ctx, t.Evicted, metric.WithAttributes(nodeAttrs...))
		return
	}
	to := "redis"
	if t.Down {
		to = "fallback"
	}
	m.mu.Lock()
	m.down[nodeKey{limiter, t.Node}] = t.Down
	m.mu.Unlock()
	m.transitions.Add(ctx, 1, metric.WithAttributes(append(nodeAttrs, ToKey.String(to))...))
}

// observer is one limiter's decision hook. Each distinct combination of
// attributes is made once and kept: a decision then allocates nothing.
type observer struct {
	m       *Metrics
	limiter string
	sets    sync.Map           // attrsKey → *attrs
	stale   []metric.AddOption // redlimit.region.stale_decisions' attributes
}

type attrsKey struct {
	strategy redlimit.Strategy
	rule     string
	outcome  string
	deniedBy redlimit.DeniedBy
	degraded bool
	shadowed bool
}

type attrs struct {
	add  []metric.AddOption
	rec  []metric.RecordOption
	span []attribute.KeyValue
}

// outcome returns what the caller was told: allowed, denied, error or
// exceeds-limit.
func outcome(d redlimit.Decision) string {
	switch {
	case errors.Is(d.Err, redlimit.ErrExceedsLimit):
		return "exceeds-limit"
	case d.Err != nil:
		return "error"
	case d.Allowed:
		return "allowed"
	}
	return "denied"
}

// Strategy returns the redlimit.strategy value of a decision's strategy:
// its String, or "concurrency" for a redlimit.Concurrency (strategy 0).
func Strategy(s redlimit.Strategy) string {
	if s == 0 {
		return "concurrency"
	}
	return s.String()
}

func (o *observer) attrs(d redlimit.Decision) *attrs {
	k := attrsKey{d.Strategy, d.Rule, outcome(d), d.DeniedBy, d.Degraded, d.Shadowed}
	if a, ok := o.sets.Load(k); ok {
		return a.(*attrs)
	}
	kv := []attribute.KeyValue{
		LimiterKey.String(o.limiter),
		StrategyKey.String(Strategy(k.strategy)),
		RuleKey.String(k.rule),
		OutcomeKey.String(k.outcome),
		DeniedByKey.String(k.deniedBy.String()),
		DegradedKey.Bool(k.degraded),
		ShadowedKey.Bool(k.shadowed),
	}
	set := metric.WithAttributeSet(attribute.NewSet(kv...))
	a, _ := o.sets.LoadOrStore(k, &attrs{add: []metric.AddOption{set}, rec: []metric.RecordOption{set}, span: kv})
	return a.(*attrs)
}

func (o *observer) observe(d redlimit.Decision) {
	a := o.attrs(d)
	ctx := d.Context
	if ctx == nil {
		ctx = context.Background()
	}
	o.m.decisions.Add(ctx, 1, a.add...)
	o.m.duration.Record(ctx, d.Latency.Seconds(), a.rec...)
	if d.Stale {
		o.m.stale.Add(ctx, 1, o.stale...)
	}
	if o.m.tracer == nil {
		return
	}
	end := time.Now()
	_, span := o.m.tracer.Start(ctx, "redlimit.decide", trace.WithTimestamp(end.Add(-d.Latency)),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(a.span...))
	if d.Err != nil {
		span.RecordError(d.Err)
		if !errors.Is(d.Err, redlimit.ErrExceedsLimit) { // the caller's error is not the limiter's, as a 4xx is not
			span.SetStatus(codes.Error, d.Err.Error())
		}
	}
	span.End(trace.WithTimestamp(end))
}
