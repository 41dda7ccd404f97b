// Command soak runs many limiters of every kind against a redis-server of
// its own for minutes, restarting that server now and then, and checks what
// an operator checks after a long night: the process's heap levels off at a
// figure that follows the keys, no caller saw an error, every key in Redis
// expires (read before each restart and at the end), and no goroutine is left once the limiters are closed.
//
//	go run ./cmd/soak [-duration 8m] [-keys 1000,20000] [-limiters 12] [-workers 16] [-restart 45s] [-out soak.md]
//
// The run is split into one phase per -keys figure, each the same share of
// -duration: in a phase the workers pick keys among that many per limiter,
// so the heap of the last phase's plateau against the first's shows that
// memory follows the keys. The heap is read after a GC every -sample; a
// phase's plateau is the highest heap of its second half, and the heap
// levels off when the last quarter's highest stays within 10% (and 4 MB) of
// the third quarter's (each restart raises the heap for a while, as the
// fallback makes its stand-ins). Every -restart the server is killed (SIGKILL, by its PID) and
// started again on the same port after a second without persistence: the
// limiters decide from their fallback meanwhile and go back to Redis.
//
// The limiters: one of each strategy (a penalty block on some, a warm-up
// on one, a priority share on one), a Policy with a per-second bucket, a
// per-minute window and a daily calendar quota, a Policy of two leaky
// buckets, and a Concurrency; a tenth of the calls reserve and settle,
// or cancel. It exits 1 when a check fails.
//
// It needs redis-server on the PATH, which it starts on a free loopback
// port and stops by its PID (internal/redistest, as the other commands).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redlimit/redlimit"
	"github.com/redlimit/redlimit/internal/redistest"
)

func main() {
	duration := flag.Duration("duration", 8*time.Minute, "how long to run, all phases together")
	keysFlag := flag.String("keys", "1000,20000", "keys per limiter, one phase each, comma-separated")
	workers := flag.Int("workers", 16, "goroutines making calls")
	restart := flag.Duration("restart", 45*time.Second, "how often to kill and restart redis-server (0: never)")
	sample := flag.Duration("sample", 5*time.Second, "how often to read the heap after a GC")
	out := flag.String("out", "", "also write the report (markdown) to this file")
	flag.Parse()

	var keys []int
	for f := range strings.SplitSeq(*keysFlag, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "soak: -keys: %q is not a positive number\n", f)
			os.Exit(2)
		}
		keys = append(keys, n)
	}
	if *workers < 1 || *duration <= 0 || *sample <= 0 {
		fmt.Fprintln(os.Stderr, "soak: -workers, -duration and -sample must be positive")
		os.Exit(2)
	}
	rep, err := run(config{duration: *duration, keys: keys, workers: *workers, restart: *restart, sample: *sample})
	var w io.Writer = os.Stdout
	var f *os.File
	if *out != "" {
		var ferr error
		if f, ferr = os.Create(*out); ferr != nil {
			fmt.Fprintln(os.Stderr, "soak:", ferr)
			os.Exit(1)
		}
		w = io.MultiWriter(os.Stdout, f)
	}
	if rep != nil {
		rep.markdown(w)
	}
	if f != nil {
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

type config struct {
	duration, restart, sample time.Duration
	keys                      []int
	workers                   int
}

// phase is what one -keys figure measured.
type phase struct {
	keys     int
	heap     []uint64 // after a GC, every sample
	plateau  uint64   // the highest of the second half
	levelled bool     // the last quarter's peak stays near the third's
	calls    uint64
}

type report struct {
	cfg          config
	phases       []phase
	restarts     int
	calls        uint64
	degraded     uint64
	queued       uint64 // settles Redis could not take then, queued
	errs         uint64
	firstErr     string
	noTTL        int
	redisKeys    int // keys read by the scans, all together
	scans        int
	goroutines   [2]int // before the limiters were made, after they were closed
	transitions  uint64
	startVersion string
}

func run(cfg config) (*report, error) {
	redis.SetLogger(quiet{}) // a restart makes every connection complain
	srv, err := redistest.StartServer("--maxmemory", "1gb")
	if err != nil {
		return nil, err
	}
	defer func() { _ = srv.Close() }() // killed if it ignores SIGTERM: the checks are made
	s := &soak{cfg: cfg, rep: &report{cfg: cfg}, srv: srv}
	if v, err := redistest.ServerVersion(); err == nil {
		s.rep.startVersion = "Redis " + v.String()
	}
	s.rep.goroutines[0] = runtime.NumGoroutine()

	s.rdb = redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ReadTimeout: 300 * time.Millisecond, WriteTimeout: 300 * time.Millisecond})
	var transitions atomic.Uint64
	s.lims, s.conc, err = makeLimiters(s.rdb, func(redlimit.Transition) { transitions.Add(1) })
	if err != nil {
		s.rdb.Close()
		return s.rep, err
	}

	ctx, cancel := context.WithCancel(context.Background())
	s.keySpace.Store(int64(cfg.keys[0]))
	var wg sync.WaitGroup
	for w := range cfg.workers {
		wg.Go(func() { s.work(ctx, w) })
	}
	var restarts int
	restartDone := make(chan struct{})
	go func() {
		defer close(restartDone)
		restarts = s.restartEvery(ctx, cfg.restart)
	}()
	s.runPhases()
	cancel()
	wg.Wait()
	<-restartDone
	s.rep.restarts = restarts
	s.end()

	rep := s.rep
	rep.calls, rep.degraded, rep.errs, rep.queued = s.calls.Load(), s.degraded.Load(), s.errCount.Load(), s.queued.Load()
	rep.transitions = transitions.Load()
	if e, ok := s.firstErr.Load().(string); ok {
		rep.firstErr = e
	}
	return rep, rep.check()
}

// soak is a run: its limiters, what its workers counted, and its report.
type soak struct {
	cfg  config
	rep  *report
	srv  *redistest.Server
	rdb  *redis.Client
	lims []redlimit.Limiter
	conc *redlimit.Concurrency

	calls, degraded, errCount, queued atomic.Uint64
	firstErr                          atomic.Value // string
	keySpace                          atomic.Int64 // keys per limiter now
	scanMu                            sync.Mutex   // guards rep's scan counts
}

// fail counts a failed call or check, and keeps the first's error.
func (s *soak) fail(err error) {
	if s.errCount.Add(1) == 1 {
		s.firstErr.Store(err.Error())
	}
}

// work makes calls on random keys, worker w's, until ctx is done.
func (s *soak) work(ctx context.Context, w int) {
	rng := rand.New(rand.NewPCG(uint64(w), 42))
	for ctx.Err() == nil {
		key := "user:" + strconv.Itoa(rng.IntN(int(s.keySpace.Load())))
		res, err := call(ctx, rng, s.lims, s.conc, key)
		if ctx.Err() != nil {
			return
		}
		s.calls.Add(1)
		if errors.Is(err, errQueued) {
			s.queued.Add(1) // Settle's documented answer in an outage
			continue
		}
		if err != nil {
			s.fail(err)
			continue
		}
		if res.Degraded {
			s.degraded.Add(1)
		}
	}
}

// scanTTL reads every key's TTL in Redis (before each restart and at the
// end), and adds to the report how many there were, and without a TTL.
func (s *soak) scanTTL() error {
	total, noTTL, err := keysWithoutTTL(s.rdb)
	s.scanMu.Lock()
	defer s.scanMu.Unlock()
	s.rep.redisKeys += total
	s.rep.noTTL += noTTL
	s.rep.scans++
	return err
}

// restartEvery kills and restarts redis-server every period (never when
// period is 0), its keys' TTLs read first, until ctx is done, and returns
// how many times it did.
func (s *soak) restartEvery(ctx context.Context, period time.Duration) int {
	if period <= 0 {
		return 0
	}
	restarts := 0
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return restarts
		case <-t.C:
		}
		// Every key must expire: read them before the restart empties
		// Redis.
		if err := s.scanTTL(); err != nil {
			s.fail(err)
		}
		if err := restart(s.srv); err != nil {
			s.fail(fmt.Errorf("restarting redis-server: %w", err))
			return restarts
		}
		restarts++
	}
}

// runPhases runs a phase per -keys figure, the same share of -duration
// each, the heap sampled every -sample.
func (s *soak) runPhases() {
	cfg := s.cfg
	per := cfg.duration / time.Duration(len(cfg.keys))
	for i, k := range cfg.keys {
		s.keySpace.Store(int64(k))
		p := phase{keys: k}
		before := s.calls.Load()
		end := time.Now().Add(per)
		for time.Now().Before(end) {
			time.Sleep(min(cfg.sample, time.Until(end)))
			p.heap = append(p.heap, heapAfterGC())
		}
		p.calls = s.calls.Load() - before
		p.plateau, p.levelled = levelled(p.heap)
		s.rep.phases = append(s.rep.phases, p)
		fmt.Fprintf(os.Stderr, "soak: phase %d/%d (%d keys per limiter): %d calls, heap %s, %s\n",
			i+1, len(cfg.keys), k, p.calls, mb(p.plateau), map[bool]string{true: "levelled off", false: "still moving"}[p.levelled])
	}
}

// end lets the limiters go back to Redis (a restart may have just
// happened), reads every key's TTL, closes the limiters and the client,
// and counts the goroutines left.
func (s *soak) end() {
	if err := waitRedis(s.rdb); err != nil {
		s.fail(err)
	}
	time.Sleep(2 * time.Second)
	if err := s.scanTTL(); err != nil {
		s.fail(err)
	}
	for _, l := range s.lims {
		if err := l.Close(); err != nil {
			s.fail(fmt.Errorf("a limiter's Close: %w", err))
		}
	}
	if err := s.conc.Close(); err != nil {
		s.fail(fmt.Errorf("the Concurrency's Close: %w", err))
	}
	s.rdb.Close()
	s.rep.goroutines[1] = goroutinesSettle(s.rep.goroutines[0])
}

// check says which promise did not hold.
func (r *report) check() error {
	var errs []error
	if r.errs > 0 {
		errs = append(errs, fmt.Errorf("%d calls failed, the first: %s", r.errs, r.firstErr))
	}
	if r.noTTL > 0 {
		errs = append(errs, fmt.Errorf("%d of %d keys in Redis have no TTL", r.noTTL, r.redisKeys))
	}
	if r.goroutines[1] > r.goroutines[0] {
		errs = append(errs, fmt.Errorf("%d goroutines left after Close (%d before the limiters were made)", r.goroutines[1]-r.goroutines[0], r.goroutines[0]))
	}
	for _, p := range r.phases {
		if !p.levelled {
			errs = append(errs, fmt.Errorf("the heap at %d keys per limiter did not level off: %s", p.keys, mbs(p.heap)))
		}
	}
	if r.cfg.restart > 0 && r.restarts > 0 && r.degraded == 0 {
		errs = append(errs, errors.New("redis-server was restarted but no decision came from the fallback"))
	}
	return errors.Join(errs...)
}

func (r *report) markdown(w io.Writer) {
	fmt.Fprintf(w, "Soak: %v, %d workers, %s, redis-server restarted every %v (%d times)\n\n", r.cfg.duration, r.cfg.workers, r.startVersion, r.cfg.restart, r.restarts)
	fmt.Fprintln(w, "| keys per limiter | calls | heap plateau (after GC) | levelled off | heap samples |")
	fmt.Fprintln(w, "|---:|---:|---:|:--|:--|")
	for _, p := range r.phases {
		fmt.Fprintf(w, "| %d | %d | %s | %v | %s |\n", p.keys, p.calls, mb(p.plateau), p.levelled, mbs(p.heap))
	}
	fmt.Fprintf(w, "\ncalls %d, from the fallback %d, errors %d, settles queued in an outage %d, switches reported %d\n", r.calls, r.degraded, r.errs, r.queued, r.transitions)
	fmt.Fprintf(w, "keys read in Redis (%d scans: before each restart and at the end) %d, without a TTL %d\n", r.scans, r.redisKeys, r.noTTL)
	fmt.Fprintf(w, "goroutines before the limiters %d, after Close %d\n", r.goroutines[0], r.goroutines[1])
}

// makeLimiters returns the limiters the workers call, all on rdb.
func makeLimiters(rdb *redis.Client, onTransition func(redlimit.Transition)) ([]redlimit.Limiter, *redlimit.Concurrency, error) {
	common := func(prefix string, more ...redlimit.Option) []redlimit.Option {
		return append([]redlimit.Option{redlimit.WithPrefix("soak:" + prefix), redlimit.WithOnTransition(onTransition), redlimit.WithPingInterval(50 * time.Millisecond)}, more...)
	}
	type made struct {
		l   redlimit.Limiter
		err error
	}
	var all []made
	add := func(l redlimit.Limiter, err error) { all = append(all, made{l, err}) }
	add(redlimit.NewFixedWindow(rdb, redlimit.PerSecond(20), common("fw", redlimit.WithBlock(2*time.Second))...))
	add(redlimit.NewSlidingLog(rdb, redlimit.PerSecond(20), common("sl")...))
	add(redlimit.NewSlidingCounter(rdb, redlimit.PerMinute(300), common("sc", redlimit.WithBlock(time.Second))...))
	add(redlimit.NewTokenBucket(rdb, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 20}, common("tb", redlimit.WithPriorityShares(0.5, 0.8))...))
	add(redlimit.NewTokenBucket(rdb, redlimit.Limit{Rate: 10, Period: time.Second, WarmUp: 5 * time.Second}, common("warm")...))
	add(redlimit.NewLeakyBucket(rdb, redlimit.Limit{Rate: 10, Period: time.Second, Burst: 5}, common("lb")...))
	add(redlimit.NewSubWindowCounter(rdb, redlimit.PerMinute(300), common("sw")...))
	add(redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "rps", Strategy: redlimit.TokenBucket, Limit: redlimit.PerSecond(5)},
		{Name: "rpm", Strategy: redlimit.FixedWindow, Limit: redlimit.PerMinute(100)},
		{Name: "daily", Strategy: redlimit.FixedWindow, Limit: redlimit.Daily(2000, time.UTC)},
	}, common("policy")...))
	add(redlimit.NewPolicy(rdb, []redlimit.Rule{
		{Name: "fast", Strategy: redlimit.LeakyBucket, Limit: redlimit.Limit{Rate: 10, Period: 100 * time.Millisecond}},
		{Name: "slow", Strategy: redlimit.LeakyBucket, Limit: redlimit.PerSecond(5)},
	}, common("leaky2")...))
	var lims []redlimit.Limiter
	var errs []error
	for _, m := range all {
		if m.err != nil {
			errs = append(errs, m.err)
			continue
		}
		lims = append(lims, m.l)
	}
	conc, err := redlimit.NewConcurrency(rdb, 3, 10*time.Second, common("conc")...)
	if err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		for _, l := range lims {
			_ = l.Close() // unused: err says why they are closed
		}
		if conc != nil {
			_ = conc.Close()
		}
		return nil, nil, err
	}
	return lims, conc, nil
}

// reserver is what RateLimiter and Policy offer beyond Limiter.
type reserver interface {
	Reserve(ctx context.Context, key string, n int) (*redlimit.Reservation, error)
}

// call makes one call of a kind the soak mixes: mostly AllowN, a tenth
// reserve and settle (or cancel), and now and then a concurrency lease.
func call(ctx context.Context, rng *rand.Rand, lims []redlimit.Limiter, conc *redlimit.Concurrency, key string) (redlimit.Result, error) {
	switch r := rng.IntN(100); {
	case r < 5:
		lease, res, err := conc.TryAcquire(ctx, key)
		if err != nil || lease == nil {
			return res, err
		}
		return res, lease.Release(ctx)
	case r < 15:
		rv, err := lims[rng.IntN(len(lims))].(reserver).Reserve(ctx, key, 1+rng.IntN(3))
		if err != nil {
			return redlimit.Result{}, err
		}
		if !rv.Result().Allowed {
			return rv.Result(), nil
		}
		if rng.IntN(3) == 0 {
			return rv.Result(), queuedSettle(rv.Cancel(ctx))
		}
		res, err := rv.Settle(ctx, rng.IntN(4))
		return res, queuedSettle(err)
	default:
		l := lims[rng.IntN(len(lims))]
		prio := []redlimit.Priority{redlimit.Critical, redlimit.Normal, redlimit.Sheddable}[rng.IntN(3)]
		return l.AllowN(redlimit.ContextWithPriority(ctx, prio), key, 1+rng.IntN(2))
	}
}

// errQueued marks a settle that Redis, unavailable, could not take: the
// limiter queued it and makes it once Redis is back, as Settle documents.
var errQueued = errors.New("settle queued")

func queuedSettle(err error) error {
	if errors.Is(err, redlimit.ErrUnavailable) && strings.Contains(err.Error(), "(queued: made again once Redis is back)") {
		return fmt.Errorf("%w: %w", errQueued, err)
	}
	return err
}

// levelled returns the highest heap of the second half (each restart of
// Redis raises the heap for a while, as the fallback's stand-ins are made)
// and whether the last quarter's highest stays within 10% (and 4 MB) of
// the third quarter's: the peaks stopped growing.
func levelled(heap []uint64) (uint64, bool) {
	if len(heap) < 8 {
		return 0, false
	}
	third, last := heap[len(heap)/2:len(heap)*3/4], heap[len(heap)*3/4:]
	plateau := max(slices.Max(third), slices.Max(last))
	return plateau, slices.Max(last) <= slices.Max(third)+max(slices.Max(third)/10, 4<<20)
}

func heapAfterGC() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// goroutinesSettle waits up to 10 s for the goroutines to come down to
// want and returns how many there are.
func goroutinesSettle(want int) int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		n := runtime.NumGoroutine()
		if n <= want || time.Now().After(deadline) {
			return n
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// keysWithoutTTL scans every key and counts those that never expire.
func keysWithoutTTL(rdb *redis.Client) (total, noTTL int, err error) {
	ctx := context.Background()
	iter := rdb.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		total++
		ttl, err := rdb.PTTL(ctx, iter.Val()).Result()
		if err != nil {
			return total, noTTL, err
		}
		if ttl == -1 { // -2: gone since the scan
			noTTL++
		}
	}
	return total, noTTL, iter.Err()
}

func waitRedis(rdb *redis.Client) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := rdb.Ping(context.Background()).Err()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// restart kills the server (SIGKILL, by its PID), waits a second and
// starts it again on the same port, empty (no persistence).
func restart(srv *redistest.Server) error {
	if err := srv.Kill(); err != nil {
		return err
	}
	time.Sleep(time.Second)
	return srv.Restart()
}

func mb(b uint64) string { return fmt.Sprintf("%.1f MB", float64(b)/(1<<20)) }

func mbs(v []uint64) string {
	parts := make([]string, len(v))
	for i, b := range v {
		parts[i] = fmt.Sprintf("%.1f", float64(b)/(1<<20))
	}
	return strings.Join(parts, " ")
}

// quiet drops go-redis's log lines.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}
