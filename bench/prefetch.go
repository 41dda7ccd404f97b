package bench

import (
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

// PrefetchFleet is instances of one token-bucket limiter, each with its own
// go-redis client (as separate processes would have), on one Redis: the
// load of cmd/prefetch. Every client counts the commands it sends.
type PrefetchFleet struct {
	Lims  []*redlimit.RateLimiter
	rdbs  []*redis.Client
	calls []*atomic.Uint64
}

// NewPrefetchFleet makes n limiters of limit with opts, each on its own client
// of the server at addr with opts redistest.TunedOptions-like options.
// Every limiter gets FallbackDeny, so that an outage (a slow reply on a
// busy machine) can only lower what is admitted, never add fallback
// admissions to it.
func NewPrefetchFleet(addr string, clientOpts *redis.Options, n int, limit redlimit.Limit, opts ...redlimit.Option) (*PrefetchFleet, error) {
	f := &PrefetchFleet{}
	opts = append([]redlimit.Option{redlimit.WithFallback(redlimit.FallbackDeny)}, opts...)
	for range n {
		o := *clientOpts
		o.Addr = addr
		rdb := redis.NewClient(&o)
		c := new(atomic.Uint64)
		rdb.AddHook(callCounter{c})
		lim, err := redlimit.NewTokenBucket(rdb, limit, opts...)
		if err != nil {
			rdb.Close()
			f.Close()
			return nil, err
		}
		f.Lims, f.rdbs, f.calls = append(f.Lims, lim), append(f.rdbs, rdb), append(f.calls, c)
	}
	return f, nil
}

// Close closes the limiters (giving back what their prefetches hold) and the
// clients.
func (f *PrefetchFleet) Close() {
	for i := range f.Lims {
		_ = f.Lims[i].Close() // the runs are over: what it could not give back changes no figure
		f.rdbs[i].Close()
	}
}

// RedisCalls is the commands the fleet's clients sent so far.
func (f *PrefetchFleet) RedisCalls() uint64 {
	var n uint64
	for _, c := range f.calls {
		n += c.Load()
	}
	return n
}

// callCounter counts every command a client sends (a pipeline's each).
type callCounter struct{ n *atomic.Uint64 }

func (h callCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h callCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h callCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(uint64(len(cmds)))
		return next(ctx, cmds)
	}
}

// PrefetchLoad is what a fleet is asked.
type PrefetchLoad struct {
	Key string
	// Offered is the calls per second offered to each instance, paced
	// evenly; 0 is a closed loop (each goroutine calls as fast as it can).
	Offered  float64
	Conc     int // goroutines per instance
	Duration time.Duration
}

// PrefetchSample is one run of a fleet.
type PrefetchSample struct {
	Decisions, Allowed, Degraded, Errors uint64
	FirstErr                             string
	RedisCalls                           uint64
	Elapsed                              time.Duration
	// The events the fleet's prefetches held unused (PrefetchStats.Unused summed
	// over the instances), sampled every millisecond: capacity that no
	// other instance could admit at that moment.
	IdleMean   float64
	IdleMax    int64
	Prefetches uint64 // prefetches taken
	Served     uint64 // calls served from a prefetch
}

// PerSec is the decisions per second of the run.
func (s PrefetchSample) PerSec() float64 { return float64(s.Decisions) / s.Elapsed.Seconds() }

// CallsPerDecision is the Redis commands sent per decision (prefetches, their
// settling, and calls decided one by one).
func (s PrefetchSample) CallsPerDecision() float64 {
	if s.Decisions == 0 {
		return 0
	}
	return float64(s.RedisCalls) / float64(s.Decisions)
}

// Run offers the load to every instance of the fleet at once. The prefetches'
// counters are read before and after, so a fleet can run several loads.
func (f *PrefetchFleet) Run(ctx context.Context, load PrefetchLoad) PrefetchSample {
	var s PrefetchSample
	var t prefetchTally
	stats0 := f.prefetchTotals()
	calls0 := f.RedisCalls()
	idle := f.sampleIdle()

	start := time.Now()
	var wg sync.WaitGroup
	perG := load.Offered / float64(load.Conc) / float64(time.Second) // calls per ns
	for _, lim := range f.Lims {
		for range load.Conc {
			wg.Go(func() { t.offer(ctx, lim, load, start, perG) })
		}
	}
	wg.Wait()
	s.Elapsed = time.Since(start)
	s.IdleMean, s.IdleMax = idle.end()
	stats1 := f.prefetchTotals()
	s.Decisions, s.Allowed, s.Degraded, s.Errors = t.decisions.Load(), t.allowed.Load(), t.degraded.Load(), t.errs.Load()
	if e, ok := t.firstErr.Load().(string); ok {
		s.FirstErr = e
	}
	s.RedisCalls = f.RedisCalls() - calls0
	s.Prefetches = stats1.Taken - stats0.Taken
	s.Served = stats1.Served - stats0.Served
	return s
}

// prefetchTally counts the decisions of a PrefetchFleet's Run, from every
// goroutine.
type prefetchTally struct {
	decisions, allowed, degraded, errs atomic.Uint64
	firstErr                           atomic.Value // string
}

// offer calls lim.Allow for load.Key until load.Duration has passed since
// start, perG calls per ns (paced every 200µs), or as fast as it can when
// perG is 0, and counts the decisions.
func (t *prefetchTally) offer(ctx context.Context, lim *redlimit.RateLimiter, load PrefetchLoad, start time.Time, perG float64) {
	done := 0
	for {
		el := time.Since(start)
		if el >= load.Duration {
			return
		}
		due := done + 256
		if perG > 0 {
			due = int(float64(el) * perG)
		}
		for ; done < due; done++ {
			res, err := lim.Allow(ctx, load.Key)
			t.decisions.Add(1)
			switch {
			case err != nil:
				if t.errs.Add(1) == 1 {
					t.firstErr.Store(err.Error())
				}
			case res.Degraded:
				t.degraded.Add(1)
			case res.Allowed:
				t.allowed.Add(1)
			}
			if done%64 == 63 && time.Since(start) >= load.Duration {
				return
			}
		}
		if perG > 0 {
			time.Sleep(200 * time.Microsecond)
		}
	}
}

// idleSampler sums, every millisecond, the events a fleet's prefetches
// hold unused.
type idleSampler struct {
	sum, n, max int64
	stop        chan struct{}
	wg          sync.WaitGroup
}

// sampleIdle starts sampling the events the fleet's prefetches hold unused,
// until end.
func (f *PrefetchFleet) sampleIdle() *idleSampler {
	is := &idleSampler{stop: make(chan struct{})}
	is.wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-is.stop:
				return
			case <-tick.C:
			}
			var idle int64
			for _, lim := range f.Lims {
				idle += lim.PrefetchStats().Unused
			}
			is.sum += idle
			is.n++
			is.max = max(is.max, idle)
		}
	})
	return is
}

// end stops the sampling, and returns the mean and the most of the
// samples (0 without one).
func (is *idleSampler) end() (mean float64, most int64) {
	close(is.stop)
	is.wg.Wait()
	if is.n > 0 {
		mean = float64(is.sum) / float64(is.n)
	}
	return mean, is.max
}

func (f *PrefetchFleet) prefetchTotals() redlimit.PrefetchStats {
	var t redlimit.PrefetchStats
	for _, lim := range f.Lims {
		s := lim.PrefetchStats()
		t.Taken += s.Taken
		t.Served += s.Served
		t.Returned += s.Returned
		t.Lost += s.Lost
	}
	return t
}

// PrefetchConfig says what cmd/prefetch runs.
type PrefetchConfig struct {
	Addr       string
	ClientOpts *redis.Options
	Size       int           // WithPrefetch size
	MaxAge     time.Duration // WithPrefetch maxAge
	Rounds     int           // interleaved rounds; the median is reported
	Duration   time.Duration // per run
	HotRate    float64       // calls per second offered to the hot key (one instance)
	Conc       int           // goroutines of the closed-loop runs
	Log        io.Writer
}

// PrefetchReport is cmd/prefetch's figures: the medians over the rounds.
type PrefetchReport struct {
	Cfg PrefetchConfig
	// A hot key, one instance, limit far above the load: paced at
	// HotRate, and closed loop, with prefetches and without.
	PacedPrefetch, PacedPlain, LoopPrefetch, LoopPlain []PrefetchSample
	// Four instances on one key: at 4× the limit; and at 50,000/s in all
	// below a high limit.
	FleetOver, FleetUnder []PrefetchSample
	OverLimit             redlimit.Limit
}

// RunPrefetch measures prefetches against one round trip per decision; see
// cmd/prefetch.
func RunPrefetch(ctx context.Context, cfg PrefetchConfig) (*PrefetchReport, error) {
	logf := func(format string, args ...any) {
		if cfg.Log != nil {
			fmt.Fprintf(cfg.Log, format+"\n", args...)
		}
	}
	high := redlimit.Limit{Rate: 100_000_000, Period: time.Second} // never reached
	prefetch := redlimit.WithPrefetch(cfg.Size, cfg.MaxAge)
	rep := &PrefetchReport{Cfg: cfg, OverLimit: redlimit.Limit{Rate: 2000, Period: time.Second, Burst: 2000}}
	type run struct {
		name  string
		n     int
		limit redlimit.Limit
		opts  []redlimit.Option
		load  PrefetchLoad
		out   *[]PrefetchSample
	}
	runs := []run{
		{"paced, prefetch", 1, high, []redlimit.Option{prefetch}, PrefetchLoad{Offered: cfg.HotRate, Conc: 8}, &rep.PacedPrefetch},
		{"paced, one round trip", 1, high, nil, PrefetchLoad{Offered: cfg.HotRate, Conc: 8}, &rep.PacedPlain},
		{"closed loop, prefetch", 1, high, []redlimit.Option{prefetch}, PrefetchLoad{Conc: cfg.Conc}, &rep.LoopPrefetch},
		{"closed loop, one round trip", 1, high, nil, PrefetchLoad{Conc: cfg.Conc}, &rep.LoopPlain},
		// 4 instances, each offered the limit's rate: 4× in all.
		{"4 instances at 4× the limit", 4, rep.OverLimit, []redlimit.Option{prefetch},
			PrefetchLoad{Offered: float64(rep.OverLimit.Rate), Conc: 8}, &rep.FleetOver},
		{"4 instances, 50,000/s in all, below the limit", 4, high, []redlimit.Option{prefetch},
			PrefetchLoad{Offered: cfg.HotRate / 4, Conc: 4}, &rep.FleetUnder},
	}
	for r := range cfg.Rounds {
		for i, ru := range runs {
			f, err := NewPrefetchFleet(cfg.Addr, cfg.ClientOpts, ru.n, ru.limit, ru.opts...)
			if err != nil {
				return nil, err
			}
			load := ru.load
			load.Key = fmt.Sprintf("prefetch-bench:%d:%d", r, i) // a fresh key: a full bucket
			load.Duration = cfg.Duration
			s := f.Run(ctx, load)
			f.Close()
			*ru.out = append(*ru.out, s)
			logf("round %d, %s: %.0f decisions/s, %.4f Redis calls per decision, %d admitted, idle mean %.1f max %d, %d degraded, %d errors %s",
				r+1, ru.name, s.PerSec(), s.CallsPerDecision(), s.Allowed, s.IdleMean, s.IdleMax, s.Degraded, s.Errors, s.FirstErr)
		}
	}
	return rep, nil
}

// prefetchMedian returns the sample whose key is the median.
func prefetchMedian(ss []PrefetchSample, key func(PrefetchSample) float64) PrefetchSample {
	s := slices.Clone(ss)
	slices.SortFunc(s, func(a, b PrefetchSample) int {
		ka, kb := key(a), key(b)
		switch {
		case ka < kb:
			return -1
		case ka > kb:
			return 1
		}
		return 0
	})
	return s[len(s)/2]
}

// Markdown writes the report.
func (r *PrefetchReport) Markdown(w io.Writer) {
	c := r.Cfg
	perSec := PrefetchSample.PerSec
	fmt.Fprintf(w, "Prefetch: `WithPrefetch(%d, %v)`, token bucket, real redis-server, %d interleaved rounds of %v, medians.\n\n",
		c.Size, c.MaxAge, c.Rounds, c.Duration)
	fmt.Fprintf(w, "| run | decisions/s | Redis calls per decision | prefetches | served locally | idle capacity mean / max (events) | degraded |\n|---|---:|---:|---:|---:|---:|---:|\n")
	row := func(name string, ss []PrefetchSample) PrefetchSample {
		s := prefetchMedian(ss, perSec)
		fmt.Fprintf(w, "| %s | %.0f | %.4f | %d | %d | %.1f / %d | %d |\n", name, s.PerSec(), s.CallsPerDecision(), s.Prefetches, s.Served, s.IdleMean, s.IdleMax, s.Degraded)
		return s
	}
	row(fmt.Sprintf("hot key, %.0f/s offered, prefetch", c.HotRate), r.PacedPrefetch)
	row(fmt.Sprintf("hot key, %.0f/s offered, one round trip", c.HotRate), r.PacedPlain)
	ll := row(fmt.Sprintf("hot key, closed loop (%d goroutines), prefetch", c.Conc), r.LoopPrefetch)
	lp := row(fmt.Sprintf("hot key, closed loop (%d goroutines), one round trip", c.Conc), r.LoopPlain)
	row("4 instances × 12,500/s on one key, prefetch", r.FleetUnder)
	fmt.Fprintf(w, "\nClosed loop, prefetch / one round trip: **%.1f×** the decisions per second. "+
		"Degraded decisions (FallbackDeny after a client timeout on a busy machine) are counted as decisions.\n\n", ll.PerSec()/lp.PerSec())

	fmt.Fprintf(w, "4 instances (own clients), one key, each offered %d/s, limit %v (4× over):\n\n", r.OverLimit.Rate, r.OverLimit)
	fmt.Fprintf(w, "| round | admitted | Burst + Rate·d | admitted / bound | Redis calls per decision | idle capacity mean / max | degraded |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for i, s := range r.FleetOver {
		bound := float64(r.OverLimit.Burst) + float64(r.OverLimit.Rate)*s.Elapsed.Seconds()
		fmt.Fprintf(w, "| %d | %d | %.0f | %.3f | %.3f | %.1f / %d | %d |\n", i+1, s.Allowed, bound, float64(s.Allowed)/bound,
			s.CallsPerDecision(), s.IdleMean, s.IdleMax, s.Degraded)
	}
}
