package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/redlimit/redlimit"
)

var benchCmd = &command{
	name:  "bench",
	args:  "[flags]",
	short: "measure decisions per second and latency of each strategy",
	long: `
Bench calls Allow as fast as -concurrency goroutines can, for -duration per
strategy, and reports decisions per second, the share of them allowed, and
the p50 and p99 latency of a decision.

-workload says what it measures, by the keys and the limit it sets:

	allowed  (the default) 1000 keys at 1000 per second each, far above
	         what bench offers: nearly every call is allowed, and Redis
	         updates the key's state, as for an ordinary limit
	denied   1 key at 1 per hour: every call but the first is denied,
	         the cost of refusing an abuser

-keys, -rate, -period and -burst, when given, change the workload's. The
allowed share of each strategy is in the table, and a line after it says
what the run measured: mostly allowed decisions, mostly denials, or a mix.

With -redis it runs against that Redis server, under keys with the prefix
"redlimit-bench", which it deletes when done. Without -redis it starts an
embedded miniredis: that measures the library and the go-redis client (and
miniredis's Lua interpreter, much slower than Redis), not Redis.

While it runs, it shows its progress on standard error: one line updated in
place on a terminal, else a line every second.`,
	setup: setupBench,
}

// benchFlags are the flags of the bench command.
type benchFlags struct {
	addr        string
	strategy    strategyValue
	duration    time.Duration
	concurrency int
	keys        int
	rate        int
	period      time.Duration
	burst       int
	timeout     time.Duration
	workload    string
}

// workloads are the -workload values: the keys and the limit each sets.
var workloads = map[string]struct {
	keys   int
	limit  redlimit.Limit
	intent string // what it measures
}{
	"allowed": {1000, redlimit.PerSecond(1000), "allowed decisions"},
	"denied":  {1, redlimit.Limit{Rate: 1, Period: time.Hour}, "denials"},
}

// benchPrefix is the prefix of the keys bench writes.
const benchPrefix = "redlimit-bench"

func setupBench(fs *flag.FlagSet) runFunc {
	f := &benchFlags{strategy: strategyValue{all: true, allowAll: true}}
	fs.StringVar(&f.addr, "redis", "", "`address` of the Redis server (host:port); empty starts an embedded miniredis")
	fs.Var(&f.strategy, "strategy", "`strategy` to measure, or all")
	fs.DurationVar(&f.duration, "duration", 3*time.Second, "how long to measure each strategy")
	fs.IntVar(&f.concurrency, "concurrency", 8, fmt.Sprintf("goroutines calling Allow, at most %d", maxBenchConcurrency))
	fs.StringVar(&f.workload, "workload", "allowed", "what to measure: allowed or denied (see above)")
	fs.IntVar(&f.keys, "keys", 0, fmt.Sprintf("distinct keys the calls spread over, at most %d (0 means the workload's)", maxBenchKeys))
	fs.IntVar(&f.rate, "rate", 0, "limit: events allowed per period (0 means the workload's)")
	fs.DurationVar(&f.period, "period", 0, "limit: period (0 means the workload's)")
	fs.IntVar(&f.burst, "burst", 0, "limit: burst of token-bucket and leaky-bucket (0 means -rate)")
	fs.DurationVar(&f.timeout, "timeout", defaultTimeout, fmt.Sprintf("read and write timeout of each Redis command, at most %v; the embedded miniredis gets at least 2s", maxBenchTimeout))
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		if len(args) > 0 {
			return usagef("bench", "unexpected argument %q", args[0])
		}
		w, ok := workloads[f.workload]
		if !ok {
			return usagef("bench", "-workload %q: want allowed or denied", f.workload)
		}
		set := map[string]bool{}
		fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
		if !set["keys"] {
			f.keys = w.keys
		}
		if !set["rate"] {
			f.rate = w.limit.Rate
		}
		if !set["period"] {
			f.period = w.limit.Period
		}
		if err := f.check(); err != nil {
			return err
		}
		return f.run(ctx, stdout, stderr)
	}
}

// The largest -concurrency and -keys bench takes. Each goroutine has a
// connection in the client's pool (a Redis server takes 10,000 clients by
// default) and each key a string in memory (10,000,000 keys take some
// 250 MB); without a bound, a large value ran out of memory before bench
// measured anything.
const (
	maxBenchConcurrency = 10_000
	maxBenchKeys        = 10_000_000
)

// maxBenchTimeout is the longest -timeout: a decision that takes longer
// measures nothing a rate limiter would wait for (and 1000000h overflowed
// the dial timeout, so that every dial failed at once).
const maxBenchTimeout = time.Minute

// check checks the flags, the limit included, without any network traffic
// or embedded server: a mistake in the command line is a usage error, not
// a failure to reach Redis or to allocate.
func (f *benchFlags) check() error {
	switch {
	case f.duration <= 0:
		return usagef("bench", "-duration %v must be positive", f.duration)
	case f.concurrency < 1:
		return usagef("bench", "-concurrency %d must be at least 1", f.concurrency)
	case f.concurrency > maxBenchConcurrency:
		return usagef("bench", "-concurrency %d must be at most %d", f.concurrency, maxBenchConcurrency)
	case f.timeout <= 0:
		return usagef("bench", "-timeout %v must be positive", f.timeout)
	case f.timeout > maxBenchTimeout:
		return usagef("bench", "-timeout %v must be at most %v", f.timeout, maxBenchTimeout)
	case f.keys < 1:
		return usagef("bench", "-keys %d must be at least 1", f.keys)
	case f.keys > maxBenchKeys:
		return usagef("bench", "-keys %d must be at most %d", f.keys, maxBenchKeys)
	}
	for _, s := range f.strategy.strategies() {
		if err := checkLimit(s, f.limit(), redlimit.WithPrefix(benchPrefix)); err != nil {
			return err // dispatch makes an invalid limit a usage error
		}
	}
	return nil
}

// limit returns the limit the flags give.
func (f *benchFlags) limit() redlimit.Limit {
	return redlimit.Limit{Rate: f.rate, Period: f.period, Burst: f.burst}
}

func (f *benchFlags) run(ctx context.Context, stdout, stderr io.Writer) error {
	addr, target, timeout := f.addr, "Redis at "+f.addr, f.timeout
	if addr == "" {
		// miniredis interprets Lua slowly and shares the CPU with the
		// benchmark: a short timeout would measure only that.
		timeout = max(timeout, 2*time.Second)
		m, err := miniredis.Run()
		if err != nil {
			return fmt.Errorf("start miniredis: %w", err)
		}
		defer m.Close()
		m.ClockTTL(true) // expire keys by the wall clock, as Redis does
		addr = m.Addr()
		target = "embedded miniredis (this measures the library and the go-redis client, not Redis)"
	}
	rdb := newClient(addr, f.concurrency+2, timeout)
	defer rdb.Close()
	if err := ping(ctx, rdb); err != nil {
		return err
	}
	limit := f.limit()
	fmt.Fprintf(stdout, "target: %s\nworkload %s: limit %v, %s, %s, %v per strategy\n\n",
		target, f.workload, limit, plural(f.concurrency, "goroutine"), plural(f.keys, "key"), f.duration)

	keys := make([]string, f.keys)
	for i := range keys {
		keys[i] = "k" + strconv.Itoa(i)
	}
	prog := newProgress(stderr, f.duration)
	var results []benchResult
	for _, s := range f.strategy.strategies() {
		lim, err := newLimiter(rdb, s, limit, redlimit.WithPrefix(benchPrefix))
		if err != nil {
			return err
		}
		r, err := benchStrategy(ctx, rdb, lim, keys, f.concurrency, f.duration, prog)
		if err := errors.Join(err, lim.Close()); err != nil {
			return err
		}
		results = append(results, r)
	}
	printBench(stdout, results)
	fmt.Fprintf(stdout, "\n%s\n", measured(f.workload, results))
	for _, r := range results {
		if r.errors > 0 {
			return fmt.Errorf("bench %v: %d of %d decisions failed, the first with: %w", r.strategy, r.errors, r.ops, r.firstErr)
		}
	}
	return nil
}

// benchResult is the measure of one strategy.
type benchResult struct {
	strategy redlimit.Strategy
	ops      int           // decisions made, failed ones included
	allowed  int           // decisions that allowed
	errors   int           // decisions that failed
	firstErr error         // the first failure
	elapsed  time.Duration // wall time of the run
	p50, p99 time.Duration // latency of a decision
}

// workerStats is what one goroutine of a run measured.
type workerStats struct {
	latencies []time.Duration
	allowed   int
	errors    int
	firstErr  error
}

// benchStrategy runs lim for d with n goroutines, calls spread over keys,
// and deletes the keys' state before and after: after also when ctx is
// done (Ctrl-C), so that bench leaves nothing in the user's Redis.
func benchStrategy(ctx context.Context, rdb *redis.Client, lim *redlimit.RateLimiter, keys []string, n int, d time.Duration, prog *progress) (benchResult, error) {
	if err := resetAll(ctx, rdb, lim, keys); err != nil {
		return benchResult{}, err
	}
	var ops atomic.Int64
	stats := make([]workerStats, n)
	stop := prog.start(lim.Strategy().String(), &ops)
	start := time.Now()
	var wg sync.WaitGroup
	for w := range n {
		wg.Go(func() { stats[w] = benchWorker(ctx, lim, keys, w, start.Add(d), &ops) })
	}
	wg.Wait() // every call has its reply: none writes after the reset
	elapsed := time.Since(start)
	stop()
	cleanCtx, cancel := afterDone(ctx, cleanupGrace)
	defer cancel()
	cleanErr := resetAll(cleanCtx, rdb, lim, keys)
	if err := ctx.Err(); err != nil {
		if cleanErr != nil {
			return benchResult{}, fmt.Errorf("%w, and %w", err, cleanErr)
		}
		return benchResult{}, err
	}
	if cleanErr != nil {
		return benchResult{}, cleanErr
	}
	return summarize(lim.Strategy(), stats, elapsed), nil
}

// cleanupGrace is how long bench goes on deleting its keys once
// interrupted: a few seconds delete millions of keys, and Ctrl-C still
// ends bench soon if Redis is slow.
const cleanupGrace = 5 * time.Second

// afterDone returns a context that is done grace after ctx is, rather
// than with it.
func afterDone(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	c, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(grace, cancel) })
	return c, func() {
		stop()
		cancel()
	}
}

// benchWorker calls Allow until the deadline, starting at key number w.
func benchWorker(ctx context.Context, lim *redlimit.RateLimiter, keys []string, w int, deadline time.Time, ops *atomic.Int64) workerStats {
	var st workerStats
	st.latencies = make([]time.Duration, 0, 1024)
	for i := w; ctx.Err() == nil; i++ {
		t := time.Now()
		if !t.Before(deadline) {
			break
		}
		res, err := lim.Allow(ctx, keys[i%len(keys)])
		st.latencies = append(st.latencies, time.Since(t))
		ops.Add(1)
		switch {
		case err != nil:
			if st.errors == 0 {
				st.firstErr = err
			}
			st.errors++
		case res.Allowed:
			st.allowed++
		}
	}
	return st
}

// summarize merges the workers' measures.
func summarize(s redlimit.Strategy, stats []workerStats, elapsed time.Duration) benchResult {
	r := benchResult{strategy: s, elapsed: elapsed}
	var lat []time.Duration
	for _, st := range stats {
		lat = append(lat, st.latencies...)
		r.allowed += st.allowed
		r.errors += st.errors
		if r.firstErr == nil {
			r.firstErr = st.firstErr
		}
	}
	r.ops = len(lat)
	slices.Sort(lat)
	r.p50, r.p99 = percentile(lat, 50), percentile(lat, 99)
	return r
}

// percentile returns the p-th percentile of sorted, by the nearest rank.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p/100*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// resetAll deletes the state of every key, the Redis keys that lim.Reset
// deletes (see stateKeys), with UNLINK in pipelines: one Reset at a time
// took minutes for 10,000,000 keys, and UNLINK frees a large sliding log
// without holding up Redis. A command may name keys of any slot, as the
// client bench makes is for a standalone server.
func resetAll(ctx context.Context, rdb *redis.Client, lim *redlimit.RateLimiter, keys []string) error {
	// 100 keys (300 Redis keys) a command, 10 commands a round trip: each
	// round trip well within the client's read timeout.
	const perCmd, perTrip = 100, 10
	pipe := rdb.Pipeline()
	names := make([]string, 0, 3*perCmd)
	for i, k := range keys {
		names = append(names, stateKeys(benchPrefix, lim.Strategy(), lim.Limit(), k)...)
		last := i == len(keys)-1
		if len(names) < cap(names) && !last {
			continue
		}
		pipe.Unlink(ctx, names...) // copies the names
		names = names[:0]
		if pipe.Len() < perTrip && !last {
			continue
		}
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("delete the keys of bench (prefix %q): %w", benchPrefix, err)
		}
	}
	return nil
}

func printBench(w io.Writer, results []benchResult) {
	const row = "%-16s %10v %12v %8v %9v %9v %7v\n"
	fmt.Fprintf(w, row, "strategy", "decisions", "decisions/s", "allowed", "p50", "p99", "errors")
	for _, r := range results {
		perSec, allowed := 0.0, 0.0
		if r.elapsed > 0 {
			perSec = float64(r.ops) / r.elapsed.Seconds()
		}
		if r.ops > 0 {
			allowed = 100 * float64(r.allowed) / float64(r.ops)
		}
		fmt.Fprintf(w, row, r.strategy, r.ops, fmt.Sprintf("%.0f", perSec), fmt.Sprintf("%.1f%%", allowed),
			roundLatency(r.p50), roundLatency(r.p99), r.errors)
	}
}

// measured says what a run measured, by its allowed share: mostly (90% or
// more) allowed decisions, mostly denials (10% or less allowed), or a mix;
// and whether that is what the workload is for.
func measured(workload string, results []benchResult) string {
	ops, allowed := 0, 0
	for _, r := range results {
		ops += r.ops
		allowed += r.allowed
	}
	if ops == 0 {
		return "measured: no decisions"
	}
	share := 100 * float64(allowed) / float64(ops)
	what := "a mix of allowed decisions and denials"
	switch {
	case share >= 90:
		what = "mostly allowed decisions"
	case share <= 10:
		what = "mostly denials"
	}
	line := fmt.Sprintf("measured: %s (%.1f%% of %d decisions allowed)", what, share, ops)
	if w := workloads[workload]; what != "mostly "+w.intent {
		line += fmt.Sprintf("; workload %s is meant to measure %s: -keys, -rate or -period changed it", workload, w.intent)
	}
	return line
}

// roundLatency keeps three significant digits or so of a latency.
func roundLatency(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// progress shows how far a run is on a writer: one line rewritten in place
// on a terminal, else a plain line every plainEvery.
type progress struct {
	w          io.Writer
	tty        bool
	total      time.Duration // length of one run
	ttyEvery   time.Duration
	plainEvery time.Duration
}

func newProgress(w io.Writer, total time.Duration) *progress {
	return &progress{w: w, tty: isTerminal(w), total: total, ttyEvery: 100 * time.Millisecond, plainEvery: time.Second}
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// start shows the progress of the run named name, whose count of decisions
// is ops, until the returned function is called.
func (p *progress) start(name string, ops *atomic.Int64) (stop func()) {
	every := p.plainEvery
	if p.tty {
		every = p.ttyEvery
	}
	begin := time.Now()
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			select {
			case <-done:
				if p.tty {
					fmt.Fprint(p.w, "\r\033[K") // clear the line
				}
				return
			case <-tick.C:
				p.show(name, time.Since(begin), ops.Load())
			}
		}
	}()
	return func() {
		close(done)
		<-finished
	}
}

// show writes one progress report.
func (p *progress) show(name string, elapsed time.Duration, ops int64) {
	line := fmt.Sprintf("bench %s: %.1fs of %v, %d decisions", name, min(elapsed, p.total).Seconds(), p.total, ops)
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K"+line)
	} else {
		fmt.Fprintln(p.w, line)
	}
}

// plural returns "1 key", "2 keys".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}
