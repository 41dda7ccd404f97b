// Package redlimitprom exports the decisions of redlimit's limiters as
// Prometheus metrics, through a [prometheus.Collector], as go-redis's
// extra/redisprometheus does for its connection pools. It is its own
// module, so that redlimit itself does not depend on Prometheus.
//
// Make one [Collector] per process, register it, and give each limiter its
// options under a name that says which limiter it is:
//
//	c := redlimitprom.NewCollector()
//	prometheus.MustRegister(c)
//	lim, err := redlimit.NewTokenBucket(rdb, limit, c.Options("api")...)
//	c.WatchPrefetch("api", lim) // only with redlimit.WithPrefetch
//	c.WatchRegions("api", lim)  // only with redlimit.WithRegions
//
// The metrics:
//
//	redlimit_decisions_total{limiter,strategy,rule,outcome,denied_by,degraded,shadowed}
//	redlimit_decision_seconds{the same labels}       histogram of the time to decide
//	redlimit_fallback_active{limiter,node}           1 while the node is marked down, else 0
//	redlimit_fallback_transitions_total{limiter,node,to}  to: fallback or redis
//	redlimit_evicted_keys_total{limiter,node}        keys the node evicted (redlimit.WithEvictionCheck)
//	redlimit_prefetch_held{limiter}, redlimit_prefetch_unused{limiter}
//	redlimit_prefetch_taken_total, _served_total, _returned_total, _lost_total{limiter}
//	redlimit_region_peer_age_seconds{limiter,peer}   seconds since the exchange last reached the peer (redlimit.WithRegions)
//	redlimit_region_stale_decisions_total{limiter}   decisions made while a peer region was silent (Result.Stale)
//
// outcome is allowed, denied, error (no decision: the call returned an
// error, such as Redis down with redlimit.FallbackError) or exceeds-limit
// (the call asked for more events than a rule can ever hold, an error
// wrapping redlimit.ErrExceedsLimit: the caller's error, which rule names);
// shadowed is "true" for a call that shadow mode
// (redlimit.WithShadow) allowed and the limit denied, which counts as
// allowed; denied_by is limit, block, deny-cache, deadline or "" (see
// redlimit.DeniedBy). strategy is "concurrency" for a redlimit.Concurrency,
// and rule the deciding rule's name of a redlimit.Policy ("" otherwise).
//
// No label holds the limited key (a user, an IP address, a token): keys
// are chosen by the callers, attackers included, and every distinct label
// value is a series that Prometheus keeps. Each label here takes a handful
// of values: limiter, rule and peer region names are the program's, node
// addresses those of the Redis deployment. Look keys up in logs, or with
// "redlimit inspect", instead.
//
// Options installs redlimit.WithObserver and redlimit.WithOnTransition,
// which replace hooks given before them; a limiter that needs its own hooks
// too calls the functions of [Collector.Observer] and
// [Collector.OnTransition] from them.
package redlimitprom

import (
	"errors"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/redlimit/redlimit"
)

// DurationBuckets are the histogram's buckets in seconds: 25µs to about
// 100ms, doubling. A deny-cache hit takes microseconds, a round trip to a
// nearby Redis a fraction of a millisecond.
var DurationBuckets = prometheus.ExponentialBuckets(25e-6, 2, 13)

// PrefetchSource is what [Collector.WatchPrefetch] reads: a
// *redlimit.RateLimiter or a *redlimit.Policy.
type PrefetchSource interface {
	PrefetchStats() redlimit.PrefetchStats
}

// RegionSource is what [Collector.WatchRegions] reads: a
// *redlimit.RateLimiter or a *redlimit.Policy.
type RegionSource interface {
	PeerAges() map[string]time.Duration
}

// Collector is a prometheus.Collector of the decisions, fallback
// transitions, prefetches and peer regions of the limiters it is given to.
// It is safe for concurrent use.
type Collector struct {
	decisions   *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	active      *prometheus.GaugeVec
	transitions *prometheus.CounterVec
	evicted     *prometheus.CounterVec
	stale       *prometheus.CounterVec

	held, unused, taken, served, returned, lost *prometheus.Desc
	peerAge                                     *prometheus.Desc

	mu       sync.Mutex
	prefetch map[string]PrefetchSource
	regions  map[string]RegionSource
}

var decisionLabels = []string{"limiter", "strategy", "rule", "outcome", "denied_by", "degraded", "shadowed"}

// NewCollector returns a Collector; register it with a prometheus.Registerer.
func NewCollector() *Collector {
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, []string{"limiter"}, nil)
	}
	return &Collector{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlimit_decisions_total",
			Help: "Rate-limit decisions, by outcome (allowed, denied, error, exceeds-limit), strategy, rule, reason of a denial, degraded (decided without Redis) and shadowed (allowed by shadow mode, denied by the limit).",
		}, decisionLabels),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "redlimit_decision_seconds",
			Help:    "Time to make a decision: one Redis round trip, or in-process.",
			Buckets: DurationBuckets,
		}, decisionLabels),
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "redlimit_fallback_active",
			Help: "1 while a limiter decides a Redis node's keys without Redis (the node marked down), 0 once back.",
		}, []string{"limiter", "node"}),
		transitions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlimit_fallback_transitions_total",
			Help: "Switches of a Redis node's keys to the fallback (to=fallback) and back (to=redis).",
		}, []string{"limiter", "node", "to"}),
		evicted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlimit_evicted_keys_total",
			Help: "Keys a Redis node evicted, as redlimit.WithEvictionCheck samples them.",
		}, []string{"limiter", "node"}),
		stale: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "redlimit_region_stale_decisions_total",
			Help: "Decisions made while a peer region was silent past the staleness bound (redlimit.WithRegions, Result.Stale).",
		}, []string{"limiter"}),
		held:     desc("redlimit_prefetch_held", "Prefetches held now, or being taken (redlimit.WithPrefetch)."),
		unused:   desc("redlimit_prefetch_unused", "Events the held prefetches took in Redis and have not served."),
		taken:    desc("redlimit_prefetch_taken_total", "Prefetches taken."),
		served:   desc("redlimit_prefetch_served_total", "Calls served from a prefetch, without a round trip."),
		returned: desc("redlimit_prefetch_returned_total", "Unused prefetched events settled back to Redis."),
		lost:     desc("redlimit_prefetch_lost_total", "Unused prefetched events that could not be settled back: they stand as used."),
		peerAge: prometheus.NewDesc("redlimit_region_peer_age_seconds",
			"Seconds since this instance's exchange last reached the peer region (redlimit.WithRegions).",
			[]string{"limiter", "peer"}, nil),
		prefetch: make(map[string]PrefetchSource),
		regions:  make(map[string]RegionSource),
	}
}

// Describe sends the descriptors of every metric to ch.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.decisions.Describe(ch)
	c.duration.Describe(ch)
	c.active.Describe(ch)
	c.transitions.Describe(ch)
	c.evicted.Describe(ch)
	c.stale.Describe(ch)
	for _, d := range []*prometheus.Desc{c.held, c.unused, c.taken, c.served, c.returned, c.lost, c.peerAge} {
		ch <- d
	}
}

// Collect sends the metrics to ch, reading the watched prefetch statistics
// and peer regions' ages.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.decisions.Collect(ch)
	c.duration.Collect(ch)
	c.active.Collect(ch)
	c.transitions.Collect(ch)
	c.evicted.Collect(ch)
	c.stale.Collect(ch)
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, src := range c.prefetch {
		s := src.PrefetchStats()
		ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(s.Held), name)
		ch <- prometheus.MustNewConstMetric(c.unused, prometheus.GaugeValue, float64(s.Unused), name)
		ch <- prometheus.MustNewConstMetric(c.taken, prometheus.CounterValue, float64(s.Taken), name)
		ch <- prometheus.MustNewConstMetric(c.served, prometheus.CounterValue, float64(s.Served), name)
		ch <- prometheus.MustNewConstMetric(c.returned, prometheus.CounterValue, float64(s.Returned), name)
		ch <- prometheus.MustNewConstMetric(c.lost, prometheus.CounterValue, float64(s.Lost), name)
	}
	for name, src := range c.regions {
		for peer, age := range src.PeerAges() {
			ch <- prometheus.MustNewConstMetric(c.peerAge, prometheus.GaugeValue, age.Seconds(), name, peer)
		}
	}
}

// Options returns the limiter options that record its decisions and
// fallback transitions under the name limiter (the limiter label):
// redlimit.WithObserver and redlimit.WithOnTransition. Give each limiter
// its own name; a Policy's rules are told apart by the rule label.
func (c *Collector) Options(limiter string) []redlimit.Option {
	return []redlimit.Option{
		redlimit.WithObserver(c.Observer(limiter)),
		redlimit.WithOnTransition(c.OnTransition(limiter)),
	}
}

// Observer returns the decision hook for the limiter named limiter, for
// redlimit.WithObserver. Call it from a hook of your own to chain them.
func (c *Collector) Observer(limiter string) func(redlimit.Decision) {
	o := &observer{c: c, limiter: limiter}
	o.stale = sync.OnceValue(func() prometheus.Counter { return c.stale.WithLabelValues(limiter) })
	return o.observe
}

// OnTransition returns the fallback hook for the limiter named limiter,
// for redlimit.WithOnTransition. Call it from a hook of your own to chain
// them.
func (c *Collector) OnTransition(limiter string) func(redlimit.Transition) {
	return func(t redlimit.Transition) {
		if t.Evicted > 0 { // a notice, not a switch
			c.evicted.WithLabelValues(limiter, t.Node).Add(float64(t.Evicted))
			return
		}
		if t.Down {
			c.active.WithLabelValues(limiter, t.Node).Set(1)
			c.transitions.WithLabelValues(limiter, t.Node, "fallback").Inc()
			return
		}
		c.active.WithLabelValues(limiter, t.Node).Set(0)
		c.transitions.WithLabelValues(limiter, t.Node, "redis").Inc()
	}
}

// WatchPrefetch reports src's prefetch statistics (the redlimit_prefetch_*
// metrics) under the name limiter, at each collection, until
// [Collector.UnwatchPrefetch]. A second call with the same name replaces
// src.
func (c *Collector) WatchPrefetch(limiter string, src PrefetchSource) {
	c.mu.Lock()
	c.prefetch[limiter] = src
	c.mu.Unlock()
}

// UnwatchPrefetch stops reporting the prefetch statistics of limiter (for
// one closed).
func (c *Collector) UnwatchPrefetch(limiter string) {
	c.mu.Lock()
	delete(c.prefetch, limiter)
	c.mu.Unlock()
}

// WatchRegions reports the ages of src's peer regions (the
// redlimit_region_peer_age_seconds metric, one series per peer) under the
// name limiter, at each collection, until [Collector.UnwatchRegions]. A
// second call with the same name replaces src.
func (c *Collector) WatchRegions(limiter string, src RegionSource) {
	c.mu.Lock()
	c.regions[limiter] = src
	c.mu.Unlock()
}

// UnwatchRegions stops reporting the peer regions' ages of limiter (for
// one closed).
func (c *Collector) UnwatchRegions(limiter string) {
	c.mu.Lock()
	delete(c.regions, limiter)
	c.mu.Unlock()
}

// Strategy returns the strategy label of a decision's strategy: its
// String, or "concurrency" for a redlimit.Concurrency (strategy 0).
func Strategy(s redlimit.Strategy) string {
	if s == 0 {
		return "concurrency"
	}
	return s.String()
}

// observer is one limiter's decision hook. Each distinct combination of
// labels is looked up once and kept: a decision then allocates nothing.
type observer struct {
	c       *Collector
	limiter string
	series  sync.Map                  // seriesKey → *series
	stale   func() prometheus.Counter // its series, made at the first stale decision
}

type seriesKey struct {
	strategy redlimit.Strategy
	rule     string
	outcome  string
	deniedBy redlimit.DeniedBy
	degraded bool
	shadowed bool
}

type series struct {
	decisions prometheus.Counter
	duration  prometheus.Observer
}

func (o *observer) observe(d redlimit.Decision) {
	outcome := "denied"
	switch {
	case errors.Is(d.Err, redlimit.ErrExceedsLimit):
		outcome = "exceeds-limit"
	case d.Err != nil:
		outcome = "error"
	case d.Allowed:
		outcome = "allowed"
	}
	k := seriesKey{d.Strategy, d.Rule, outcome, d.DeniedBy, d.Degraded, d.Shadowed}
	v, ok := o.series.Load(k)
	if !ok {
		labels := []string{o.limiter, Strategy(k.strategy), k.rule, k.outcome, k.deniedBy.String(),
			strconv.FormatBool(k.degraded), strconv.FormatBool(k.shadowed)}
		v, _ = o.series.LoadOrStore(k, &series{
			decisions: o.c.decisions.WithLabelValues(labels...),
			duration:  o.c.duration.WithLabelValues(labels...),
		})
	}
	s := v.(*series)
	s.decisions.Inc()
	s.duration.Observe(d.Latency.Seconds())
	if d.Stale {
		o.stale().Inc()
	}
}
