// Package bench compares redlimit with other Redis-backed rate limiters and
// with the cost of the plainest Redis round trips, against one Redis server.
//
// It is its own module so that the peers it measures never become
// dependencies of the library. The program is cmd/compare; see README.md for
// the commands and what each figure means.
package bench

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Env is the Redis under test and the clients the contenders share.
type Env struct {
	// Addr is the loopback address of the server.
	Addr string
	// Miniredis says the server is an embedded miniredis: figures then
	// measure the library and the client, not Redis.
	Miniredis bool
	// RDB is the go-redis client every contender that accepts one uses.
	RDB *redis.Client
	// Admin is a client of its own, with 10 s timeouts, for what the harness
	// asks between runs (FLUSHALL, INFO, CONFIG RESETSTAT, SCRIPT LOAD,
	// MEMORY USAGE): on a loaded machine those can take longer than the
	// 100 ms the contenders' client allows.
	Admin *redis.Client
	// AP, when set, is an AutoPipeliner over RDB; contenders built with
	// ViaAutoPipeline use it.
	AP *redis.AutoPipeliner

	gzOnce  sync.Once
	gz      *gozeroStore
	gzErr   error
	closers []func()
}

// NewEnv connects to addr with opts (PoolSize 20 and tuned timeouts, see
// the README) and checks that the server answers.
func NewEnv(addr string, opts *redis.Options, miniredis bool) (*Env, error) {
	o := *opts
	o.Addr = addr
	rdb := redis.NewClient(&o)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, fmt.Errorf("bench: ping %s: %w", addr, err)
	}
	a := o
	a.PoolSize = 2
	a.DialTimeout, a.ReadTimeout, a.WriteTimeout, a.PoolTimeout = 10*time.Second, 10*time.Second, 10*time.Second, 10*time.Second
	return &Env{Addr: addr, Miniredis: miniredis, RDB: rdb, Admin: redis.NewClient(&a)}, nil
}

// Close closes the clients the environment opened.
func (e *Env) Close() {
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
	if e.AP != nil {
		_ = e.AP.Close() // like the clients' Close: nothing lost, nothing to do
	}
	e.RDB.Close()
	e.Admin.Close()
}

// Workload is what the contenders are asked: which keys, and the limit.
type Workload struct {
	Name   string
	Keys   []string      // the limited keys; a decider is handed an index into it
	Rate   int           // events per Period
	Period time.Duration // always a whole number of seconds (go-zero needs it)
}

// Decider makes one decision for Workload.Keys[key]. err is a failure to
// decide, never a denial.
type Decider func(ctx context.Context, key int) (allowed bool, err error)

// Contender is one thing measured.
type Contender struct {
	Name string
	Kind string // "redlimit", "peer" or "floor"
	// Setup prepares the contender for one workload: it returns the
	// decider, and a function to release what it made (or nil).
	Setup func(env *Env, w *Workload) (Decider, func(), error)
	// Errors, when set, returns a count of failures the decider cannot
	// report (go-zero's TokenLimiter answers only a bool); the harness adds
	// its growth during a run to the run's errors.
	Errors func(env *Env) uint64
	// RedisCalls, when set, counts the decisions' commands that reached
	// Redis. Decisions beyond its growth were answered in-process (go-zero's
	// TokenLimiter falls back to a local limiter, silently, when its circuit
	// breaker opens): the harness counts them as errors.
	RedisCalls func(env *Env) uint64
	// Scripted: a decision is one EVALSHA of one of the library's scripts,
	// which a Variant rebuilds from another copy of its scripts/.
	Scripted bool
}

// Config says what to run.
type Config struct {
	Env         *Env
	Contenders  []Contender
	Workloads   []string      // of "one", "keys", "hot"
	Concurrency []int         // goroutines making decisions
	Rounds      int           // interleaved rounds; the table shows the median
	Duration    time.Duration // per contender per round
	Warmup      time.Duration // per contender, before the first round of each block
	NumKeys     int           // keys of the "keys" workload; default 10,000
	// HotRate is the limit per second of the "hot" workload. 0 calibrates
	// it per concurrency: the throughput of EVALSHA `return 1` (the cost of
	// any script) over 300 ms, divided by 100.
	HotRate int
	// Floor names the contender that ratios are taken against; "INCR" by
	// default.
	Floor string
	// Peer names a second base, shown as its own ratio column; "redis_rate
	// (GCRA)" by default.
	Peer string
	Seed uint64
	Log  io.Writer // progress lines; nil for none
}

// Sample is one run of one contender.
type Sample struct {
	Ops      uint64
	Allowed  uint64
	Errors   uint64
	FirstErr string
	Elapsed  time.Duration
	P50, P99 time.Duration
	Mallocs  uint64 // runtime.MemStats.Mallocs growth during the run
	// RedisCPU is the server's user+sys CPU seconds per wall second during
	// the run (1 = one core busy); -1 when the server does not say
	// (miniredis).
	RedisCPU float64
	// ClientCPU is this process's CPU time (user+sys) during the run, the
	// library, go-redis and the harness's loop: divided by the decisions,
	// the client's cost of one.
	ClientCPU time.Duration
	// RedisUsec is INFO commandstats usec_per_call of the decision's
	// command (EVALSHA, or INCR for that floor) during the run: the time
	// Redis spent executing one, without reading, parsing and replying;
	// -1 when the server does not say (miniredis).
	RedisUsec float64
}

// OpsPerSec is the throughput of the run: decisions made, failures not
// counted (a limiter that fails fast would otherwise look fast).
func (s Sample) OpsPerSec() float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Ops-min(s.Errors, s.Ops)) / s.Elapsed.Seconds()
}

// ClientCPUPerOp is this process's CPU time per decision made, µs.
func (s Sample) ClientCPUPerOp() float64 {
	ok := s.Ops - min(s.Errors, s.Ops)
	if ok == 0 {
		return 0
	}
	return float64(s.ClientCPU) / 1e3 / float64(ok)
}

// RedisCPUPerOp is Redis's CPU time per decision made, µs, parsing and I/O
// included; -1 when the server does not say. Unlike usec_per_call, a
// wall-clock time, it does not grow when the machine preempts Redis.
func (s Sample) RedisCPUPerOp() float64 {
	ok := s.Ops - min(s.Errors, s.Ops)
	if s.RedisCPU < 0 || ok == 0 {
		return -1
	}
	return s.RedisCPU * s.Elapsed.Seconds() * 1e6 / float64(ok)
}

// AllocsPerOp is the allocations made per decision, by everything in the
// process (the library, go-redis, the harness; miniredis too when embedded).
func (s Sample) AllocsPerOp() float64 {
	if s.Ops == 0 {
		return 0
	}
	return float64(s.Mallocs) / float64(s.Ops)
}

// Row is one contender at one workload and concurrency, over every round.
type Row struct {
	Workload    string
	Concurrency int
	Contender   string
	Kind        string
	HotRate     int       // the hot workload's limit per second
	Samples     []Sample  // one per round
	Ratios      []float64 // throughput / the floor's, per round (empty without a floor)
	// RatiosTo holds, per base contender (Config.Floor, Config.Peer and
	// the token bucket), throughput / the base's, per round.
	RatiosTo map[string][]float64
}

// Median returns the median over rounds of f.
func (r *Row) Median(f func(Sample) float64) float64 {
	v := make([]float64, len(r.Samples))
	for i, s := range r.Samples {
		v[i] = f(s)
	}
	return median(v)
}

// Ratio returns the median ratio to the floor, or NaN-free -1 when none.
func (r *Row) Ratio() float64 {
	if len(r.Ratios) == 0 {
		return -1
	}
	return median(slices.Clone(r.Ratios))
}

// RatioTo returns the median ratio to the named base contender, or -1 when
// it was not measured.
func (r *Row) RatioTo(base string) float64 {
	if len(r.RatiosTo[base]) == 0 {
		return -1
	}
	return median(slices.Clone(r.RatiosTo[base]))
}

// TotalOps returns the decisions made over all rounds.
func (r *Row) TotalOps() (ops, allowed, errs uint64, firstErr string) {
	for _, s := range r.Samples {
		ops += s.Ops
		allowed += s.Allowed
		errs += s.Errors
		if firstErr == "" {
			firstErr = s.FirstErr
		}
	}
	return
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	slices.Sort(v)
	m := len(v) / 2
	if len(v)%2 == 1 {
		return v[m]
	}
	return (v[m-1] + v[m]) / 2
}

// Report is the outcome of Run.
type Report struct {
	Rows      []*Row
	Skipped   []string // contenders that could not be set up, and why
	Miniredis bool
	Config    Config
}

// Find returns the row of contender at workload and concurrency, or nil.
func (r *Report) Find(workload string, conc int, contender string) *Row {
	for _, row := range r.Rows {
		if row.Workload == workload && row.Concurrency == conc && row.Contender == contender {
			return row
		}
	}
	return nil
}

func (c *Config) logf(format string, args ...any) {
	if c.Log != nil {
		fmt.Fprintf(c.Log, format+"\n", args...)
	}
}

func (c *Config) defaults() {
	if c.Contenders == nil {
		c.Contenders = Contenders()
	}
	if c.Workloads == nil {
		c.Workloads = []string{"one", "keys", "hot"}
	}
	if c.Concurrency == nil {
		c.Concurrency = []int{1, 8, 64}
	}
	if c.Rounds < 1 {
		c.Rounds = 1
	}
	if c.Duration <= 0 {
		c.Duration = time.Second
	}
	if c.NumKeys <= 0 {
		c.NumKeys = 10_000
	}
	if c.Floor == "" {
		c.Floor = "INCR"
	}
	if c.Peer == "" {
		c.Peer = RedisRate().Name
	}
}

// neverDeny is the limit of the "one" and "keys" workloads, per
// neverDenyPeriod: high enough that nothing is denied, with an interval
// (10µs) that redlimit's buckets accept. SlidingLog, whose Rate is at most
// 100,000, gets 100,000 per second instead (see Redlimit), which this
// machine does not reach.
const (
	neverDeny       = 1_000_000_000
	neverDenyPeriod = 10_000 * time.Second
)

// MakeWorkload returns the named workload; hotRate is the "hot" limit per
// second.
func MakeWorkload(name string, numKeys, hotRate int) (*Workload, error) {
	switch name {
	case "one":
		return &Workload{Name: name, Keys: []string{"one"}, Rate: neverDeny, Period: neverDenyPeriod}, nil
	case "keys":
		keys := make([]string, numKeys)
		for i := range keys {
			keys[i] = "user:" + strconv.Itoa(i)
		}
		return &Workload{Name: name, Keys: keys, Rate: neverDeny, Period: neverDenyPeriod}, nil
	case "hot":
		return &Workload{Name: name, Keys: []string{"hot"}, Rate: max(hotRate, 1), Period: time.Second}, nil
	}
	return nil, fmt.Errorf("bench: unknown workload %q (want one, keys or hot)", name)
}

type setUp struct {
	c       Contender
	dec     Decider
	release func()
}

// Run measures every contender on every workload and concurrency, in
// interleaved rounds: in each round every contender runs once, in a new
// random order, so that drift in the machine's load spreads over all of them.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg.defaults()
	r := &runner{
		cfg:     &cfg,
		env:     cfg.Env,
		rng:     rand.New(rand.NewPCG(cfg.Seed, 0x5eed)),
		rep:     &Report{Miniredis: cfg.Env.Miniredis, Config: cfg},
		skipped: map[string]bool{},
		floor:   findContender(cfg.Contenders, cfg.Floor),
		incr:    findContender(Contenders(), "EVALSHA return 1"),
	}
	for _, wname := range cfg.Workloads {
		for _, conc := range cfg.Concurrency {
			if err := r.run(ctx, wname, conc); err != nil {
				return r.rep, err
			}
		}
	}
	return r.rep, nil
}

// runner is what Run keeps from one workload and concurrency to the next.
type runner struct {
	cfg         *Config
	env         *Env
	rng         *rand.Rand
	rep         *Report
	skipped     map[string]bool // the messages of contenders skipped, once each
	floor, incr *Contender
}

// run measures every contender on workload wname at conc goroutines, in
// cfg.Rounds interleaved rounds, and adds their rows to the report.
func (r *runner) run(ctx context.Context, wname string, conc int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := r.env.Admin.FlushAll(ctx).Err(); err != nil {
		return fmt.Errorf("bench: flushall: %w", err)
	}
	hot := r.cfg.HotRate
	if wname == "hot" && hot == 0 {
		ops, err := calibrate(ctx, r.env, *r.incr, conc)
		if err != nil {
			return err
		}
		hot = max(int(ops/100), 1)
		r.cfg.logf("hot @%d: EVALSHA return 1 does %.0f/s (at %d goroutines), so the hot key's limit is %d/s", conc, ops, min(conc, 64), hot)
	}
	w, err := MakeWorkload(wname, r.cfg.NumKeys, hot)
	if err != nil {
		return err
	}
	ready := r.setUp(ctx, w)
	rows := make(map[string]*Row, len(ready))
	for _, s := range ready {
		row := &Row{Workload: wname, Concurrency: conc, Contender: s.c.Name, Kind: s.c.Kind}
		if wname == "hot" {
			row.HotRate = hot
		}
		rows[s.c.Name] = row
		r.rep.Rows = append(r.rep.Rows, row)
		if r.cfg.Warmup > 0 {
			measure(ctx, r.env, s.c, s.dec, len(w.Keys), conc, r.cfg.Warmup)
		}
	}
	for round := range r.cfg.Rounds {
		r.round(ctx, ready, rows, len(w.Keys), conc)
		r.cfg.logf("%s @%d round %d/%d done", wname, conc, round+1, r.cfg.Rounds)
	}
	for _, s := range ready {
		if s.release != nil {
			s.release()
		}
	}
	return nil
}

// setUp sets every contender up for w, each with one decision made; those
// that cannot be set up are skipped, and listed in the report once.
func (r *runner) setUp(ctx context.Context, w *Workload) []setUp {
	var ready []setUp
	for _, c := range r.cfg.Contenders {
		dec, release, err := c.Setup(r.env, w)
		if err != nil {
			msg := fmt.Sprintf("%s: %v", c.Name, err)
			if !r.skipped[msg] {
				r.skipped[msg] = true
				r.rep.Skipped = append(r.rep.Skipped, msg)
				r.cfg.logf("skip %s", msg)
			}
			continue
		}
		// One decision, alone, loads the contender's scripts: 64
		// goroutines all getting NOSCRIPT at once would open
		// go-zero's circuit breaker (it counts NOSCRIPT as a failure).
		if _, err := dec(ctx, 0); err != nil {
			r.cfg.logf("%s: first decision: %v", c.Name, err)
		}
		ready = append(ready, setUp{c, dec, release})
	}
	return ready
}

// round measures each contender of ready once, in a new random order, and
// adds the samples and their ratios to the bases' to rows.
func (r *runner) round(ctx context.Context, ready []setUp, rows map[string]*Row, nkeys, conc int) {
	got := make(map[string]Sample, len(ready))
	for _, i := range r.rng.Perm(len(ready)) {
		s := ready[i]
		sm := measure(ctx, r.env, s.c, s.dec, nkeys, conc, r.cfg.Duration)
		got[s.c.Name] = sm
		rows[s.c.Name].Samples = append(rows[s.c.Name].Samples, sm)
	}
	if r.floor != nil {
		if f, ok := got[r.floor.Name]; ok && f.OpsPerSec() > 0 {
			for name, sm := range got {
				rows[name].Ratios = append(rows[name].Ratios, sm.OpsPerSec()/f.OpsPerSec())
			}
		}
	}
	for _, base := range []string{r.cfg.Floor, r.cfg.Peer, tokenBucketName, tokenBucketName + functionsSuffix} {
		b, ok := got[base]
		if !ok || b.OpsPerSec() <= 0 {
			continue
		}
		for name, sm := range got {
			if rows[name].RatiosTo == nil {
				rows[name].RatiosTo = map[string][]float64{}
			}
			rows[name].RatiosTo[base] = append(rows[name].RatiosTo[base], sm.OpsPerSec()/b.OpsPerSec())
		}
	}
}

func findContender(cs []Contender, name string) *Contender {
	for i := range cs {
		if cs[i].Name == name {
			return &cs[i]
		}
	}
	return nil
}

// calibrate returns the throughput of c (EVALSHA `return 1`) on one key at
// conc goroutines, at most 64: more only queue for the pool's connections
// (and time out, past a few hundred), without adding throughput.
func calibrate(ctx context.Context, env *Env, c Contender, conc int) (float64, error) {
	conc = min(conc, 64)
	w := &Workload{Name: "calibrate", Keys: []string{"calibrate"}, Rate: neverDeny, Period: neverDenyPeriod}
	dec, release, err := c.Setup(env, w)
	if err != nil {
		return 0, err
	}
	if release != nil {
		defer release()
	}
	measure(ctx, env, c, dec, 1, conc, 100*time.Millisecond)
	s := measure(ctx, env, c, dec, 1, conc, 300*time.Millisecond)
	if s.Errors*10 > s.Ops {
		return 0, fmt.Errorf("bench: calibrate: %d errors in %d calls: %s", s.Errors, s.Ops, s.FirstErr)
	}
	return float64(s.Ops-s.Errors) / s.Elapsed.Seconds(), nil
}

// worker is one goroutine's tally, padded so workers do not share a cache
// line.
type worker struct {
	ops, allowed, errs uint64
	firstErr           error
	h                  *hist
	_                  [64]byte
}

// measure runs dec from conc goroutines for d and returns the tally. The
// histograms are allocated before the allocation count starts, and the loop
// itself does not allocate.
func measure(ctx context.Context, env *Env, c Contender, dec Decider, nkeys, conc int, d time.Duration) Sample {
	ws := newWorkers(conc) // before the allocation count starts
	errs0, calls0 := hookCounts(env, c)
	var stop atomic.Bool
	var wg sync.WaitGroup
	begin := make(chan struct{})
	for g := range conc {
		wg.Go(func() { ws[g].run(ctx, dec, g, nkeys, begin, &stop) })
	}
	statErr := error(errMiniredis)
	if !env.Miniredis {
		statErr = env.Admin.ConfigResetStat(ctx).Err()
	}
	cpu0, cpuErr := redisCPU(ctx, env)
	runtime.GC()
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	ru0 := processCPU()
	start := time.Now()
	close(begin)
	timer := time.NewTimer(d)
	select {
	case <-timer.C:
	case <-ctx.Done():
		timer.Stop()
	}
	stop.Store(true)
	wg.Wait()
	elapsed := time.Since(start)
	ru1 := processCPU()
	runtime.ReadMemStats(&m1)
	cpu1, cpuErr1 := redisCPU(ctx, env)

	var s Sample
	s.RedisCPU, s.RedisUsec = -1, -1
	if cpuErr == nil && cpuErr1 == nil && !env.Miniredis {
		s.RedisCPU = (cpu1 - cpu0) / elapsed.Seconds()
	}
	if statErr == nil {
		if u, err := decisionUsec(ctx, env); err == nil {
			s.RedisUsec = u
		}
	}
	s.addWorkers(ws)
	s.addHookCounts(env, c, errs0, calls0)
	s.Elapsed = elapsed
	s.ClientCPU = ru1 - ru0
	s.Mallocs = m1.Mallocs - m0.Mallocs
	return s
}

// newWorkers returns n workers, each with its histogram.
func newWorkers(n int) []worker {
	ws := make([]worker, n)
	for i := range ws {
		ws[i].h = new(hist)
	}
	return ws
}

// run makes decisions with dec, from begin until stop, the g-th worker of
// a measure over nkeys keys: it starts at its own place among the keys,
// then goes round-robin, so that at any moment the workers are on
// different keys.
func (w *worker) run(ctx context.Context, dec Decider, g, nkeys int, begin <-chan struct{}, stop *atomic.Bool) {
	h := w.h
	k := uint64(g) * 7919
	n := uint64(nkeys)
	<-begin
	for !stop.Load() {
		t0 := time.Now()
		ok, err := dec(ctx, int(k%n))
		h.record(time.Since(t0))
		w.ops++
		k++
		if err != nil {
			if w.errs == 0 {
				w.firstErr = err
			}
			w.errs++
		} else if ok {
			w.allowed++
		}
	}
}

// addWorkers adds the workers' tallies to s, and sets its latencies from
// their histograms.
func (s *Sample) addWorkers(ws []worker) {
	all := new(hist)
	for i := range ws {
		w := &ws[i]
		s.Ops += w.ops
		s.Allowed += w.allowed
		s.Errors += w.errs
		if s.FirstErr == "" && w.firstErr != nil {
			s.FirstErr = w.firstErr.Error()
		}
		all.merge(w.h)
	}
	s.P50 = all.quantile(0.50)
	s.P99 = all.quantile(0.99)
}

// hookCounts returns c's counts so far of the errors and the Redis calls of
// env's clients (0 where c has none).
func hookCounts(env *Env, c Contender) (errs, calls uint64) {
	if c.Errors != nil {
		errs = c.Errors(env)
	}
	if c.RedisCalls != nil {
		calls = c.RedisCalls(env)
	}
	return errs, calls
}

// addHookCounts adds to s's errors those that c's client hook counted
// since errs0, and the decisions made without a Redis call since calls0
// (c's counts of env, where c has them).
func (s *Sample) addHookCounts(env *Env, c Contender, errs0, calls0 uint64) {
	if c.Errors != nil {
		if e := c.Errors(env) - errs0; e > 0 {
			s.Errors += e
			if s.FirstErr == "" {
				s.FirstErr = "errors counted by a client hook"
			}
		}
	}
	if c.RedisCalls != nil {
		if calls := c.RedisCalls(env) - calls0; calls < s.Ops {
			s.Errors += s.Ops - calls
			if s.FirstErr == "" {
				s.FirstErr = fmt.Sprintf("%d decisions answered in-process, without Redis", s.Ops-calls)
			}
		}
	}
}

var errMiniredis = errors.New("bench: miniredis has no command statistics")

// processCPU returns this process's user+sys CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// decisionUsec returns usec_per_call of EVALSHA, or of FCALL when no
// script ran, or of INCR when neither did: what one decision cost inside
// Redis.
func decisionUsec(ctx context.Context, env *Env) (float64, error) {
	var err error
	for _, cmd := range []string{"evalsha", "fcall", "incr"} {
		var u float64
		if u, err = usecPerCall(ctx, env, cmd); err == nil {
			return u, nil
		}
	}
	return 0, err
}

// Markdown writes the report as Markdown tables, one per workload.
func (r *Report) Markdown(w io.Writer) {
	cfg := r.Config
	fmt.Fprintf(w, "Median over %d interleaved round(s) of %v per contender; concurrency %v; GOMAXPROCS %d; %s.\n\n",
		cfg.Rounds, cfg.Duration, cfg.Concurrency, runtime.GOMAXPROCS(0), runtime.Version())
	if r.Miniredis {
		fmt.Fprintf(w, "**Embedded miniredis, not Redis: these figures measure the library and the go-redis client "+
			"(plus miniredis's own Go and Lua interpreter, sharing the CPU and counted in allocs/op), not Redis.**\n\n")
	}
	fmt.Fprintf(w, "ops/s: decisions per second. ×%s: throughput over the %s floor's in the same round (median of per-round ratios); "+
		"×%s: the same against %s. "+
		"p50/p99: latency of one decision. allocs/op: runtime Mallocs per decision, go-redis's included. "+
		"Redis CPU: the server's CPU seconds per second during the run (1.00 = one core). "+
		"Redis µs: INFO commandstats usec_per_call of the decision's EVALSHA (INCR for that floor), the time Redis spent executing one, "+
		"without reading, parsing and replying (wall-clock: it grows when the machine preempts Redis). "+
		"Redis CPU µs/op: Redis's CPU time per decision, reading, parsing and replying included; client CPU µs/op: this process's "+
		"(library, go-redis, the loop). Unlike throughput and Redis µs, the CPU times per decision hardly move when other jobs "+
		"take the cores. "+
		"allowed: share of decisions allowed. errors: failed decisions over all rounds.\n\n", cfg.Floor, cfg.Floor, shortName(cfg.Peer), cfg.Peer)
	for _, wname := range cfg.Workloads {
		r.workloadMarkdown(w, wname)
	}
	r.notesMarkdown(w)
}

// workloadMarkdown writes the table of workload wname, if it has rows, and
// the ratios of the policies to their bases.
func (r *Report) workloadMarkdown(w io.Writer, wname string) {
	cfg := r.Config
	var rows []*Row
	for _, row := range r.Rows {
		if row.Workload == wname {
			rows = append(rows, row)
		}
	}
	if len(rows) == 0 {
		return
	}
	desc := map[string]string{
		"one":  "one key, limit never reached",
		"keys": fmt.Sprintf("%d keys round-robin, limit never reached", cfg.NumKeys),
		"hot":  "one key offered ~100× its limit, mostly denied",
	}[wname]
	fmt.Fprintf(w, "### Workload `%s`: %s\n\n", wname, desc)
	fmt.Fprintf(w, "| conc | contender | ops/s | ×%s | ×%s | p50 | p99 | allocs/op | Redis CPU | Redis µs | Redis CPU µs/op | client CPU µs/op | allowed | errors |\n", cfg.Floor, shortName(cfg.Peer))
	fmt.Fprintf(w, "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	slices.SortStableFunc(rows, func(a, b *Row) int {
		if c := cmp.Compare(a.Concurrency, b.Concurrency); c != 0 {
			return c
		}
		return cmp.Compare(kindOrder(a.Kind), kindOrder(b.Kind))
	})
	for _, row := range rows {
		fmt.Fprintln(w, row.markdown(cfg.Peer))
	}
	fmt.Fprintln(w)
	for _, row := range rows {
		if base, ok := policyBases[row.Contender]; ok {
			if x := row.RatioTo(base); x >= 0 {
				fmt.Fprintf(w, "%s @%d / %s: **%.2f** (median of per-round ratios: %s).\n\n",
					row.Contender, row.Concurrency, base, x, fmtRatios(row.RatiosTo[base]))
			}
		}
	}
}

// markdown returns r's line of its workload's table; peer names the peer
// of the ×peer column.
func (r *Row) markdown(peer string) string {
	ops, allowed, errs, _ := r.TotalOps()
	ratio, toPeer := "–", "–"
	if x := r.Ratio(); x >= 0 {
		ratio = fmt.Sprintf("%.2f", x)
	}
	if x := r.RatioTo(peer); x >= 0 {
		toPeer = fmt.Sprintf("%.2f", x)
	}
	allowedPct := "–"
	if ops > 0 {
		allowedPct = fmt.Sprintf("%.1f%%", 100*float64(allowed)/float64(ops))
	}
	name := r.Contender
	if r.HotRate > 0 && r.Kind != "floor" {
		name += fmt.Sprintf(" (limit %d/s)", r.HotRate)
	}
	cpu, usec, cpuOp := "–", "–", "–"
	if c := r.Median(Sample.RedisCPUPerOp); c >= 0 {
		cpuOp = fmt.Sprintf("%.1f", c)
	}
	if c := r.Median(func(s Sample) float64 { return s.RedisCPU }); c >= 0 {
		cpu = fmt.Sprintf("%.2f", c)
	}
	if u := r.Median(func(s Sample) float64 { return s.RedisUsec }); u >= 0 {
		usec = fmt.Sprintf("%.2f", u)
	}
	return fmt.Sprintf("| %d | %s | %.0f | %s | %s | %s | %s | %.1f | %s | %s | %s | %.1f | %s | %d |",
		r.Concurrency, name,
		r.Median(Sample.OpsPerSec), ratio, toPeer,
		fmtDur(time.Duration(r.Median(func(s Sample) float64 { return float64(s.P50) }))),
		fmtDur(time.Duration(r.Median(func(s Sample) float64 { return float64(s.P99) }))),
		r.Median(Sample.AllocsPerOp), cpu, usec, cpuOp, r.Median(Sample.ClientCPUPerOp), allowedPct, errs)
}

// notesMarkdown writes the rows' errors and the contenders not measured.
func (r *Report) notesMarkdown(w io.Writer) {
	var errRows []string
	for _, row := range r.Rows {
		if _, _, errs, first := row.TotalOps(); errs > 0 {
			errRows = append(errRows, fmt.Sprintf("- %s %s @%d: %d errors, first: %s", row.Workload, row.Contender, row.Concurrency, errs, first))
		}
	}
	if len(errRows) > 0 {
		fmt.Fprintf(w, "Errors:\n\n")
		for _, e := range errRows {
			fmt.Fprintln(w, e)
		}
		fmt.Fprintln(w)
	}
	if len(r.Skipped) > 0 {
		fmt.Fprintf(w, "Not measured:\n\n")
		for _, s := range r.Skipped {
			fmt.Fprintf(w, "- %s\n", s)
		}
		fmt.Fprintln(w)
	}
}

// shortName is a contender's name without its parenthesis: "redis_rate"
// for "redis_rate (GCRA)".
func shortName(name string) string {
	if i := strings.Index(name, " ("); i > 0 {
		return name[:i]
	}
	return name
}

func fmtRatios(v []float64) string {
	out := make([]string, len(v))
	for i, x := range v {
		out[i] = fmt.Sprintf("%.2f", x)
	}
	return strings.Join(out, ", ")
}

func kindOrder(k string) int {
	switch k {
	case "redlimit":
		return 0
	case "peer":
		return 1
	}
	return 2
}

func fmtDur(d time.Duration) string {
	switch {
	case d < 10*time.Microsecond:
		return fmt.Sprintf("%.1fµs", float64(d)/1e3)
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fµs", float64(d)/1e3)
	case d < 10*time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.1fms", float64(d)/1e6)
	}
}
