package redlimit

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/outage"
	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/testlane"
)

// Fault tests: real redis-server children, crashed, hung, cut off, slowed,
// loading, read-only, out of memory and busy, under load. The client has
// the options the README recommends (redistest.TunedOptions).

// callRec is one call made by the load.
type callRec struct {
	start, end time.Duration // since the load started
	degraded   bool
	err        error
}

// load calls Allow from many goroutines, with a 1ms pause between calls
// (a service, not a spin loop), and records every call.
type load struct {
	origin time.Time
	stop   atomic.Bool
	wg     sync.WaitGroup
	recs   [][]callRec
}

func startLoad(lim Limiter, goroutines int) *load {
	return startLoadKeys(lim, goroutines, func(g int) string { return "k" + strconv.Itoa(g%8) })
}

// startLoadKeys is startLoad with goroutine g calling for key(g).
func startLoadKeys(lim Limiter, goroutines int, key func(g int) string) *load {
	l := &load{origin: time.Now(), recs: make([][]callRec, goroutines)}
	for g := range goroutines {
		l.wg.Go(func() {
			key := key(g)
			for !l.stop.Load() {
				start := time.Since(l.origin)
				res, err := lim.Allow(context.Background(), key)
				l.recs[g] = append(l.recs[g], callRec{start, time.Since(l.origin), res.Degraded, err})
				time.Sleep(time.Millisecond)
			}
		})
	}
	return l
}

// now is the time since the load started.
func (l *load) now() time.Duration { return time.Since(l.origin) }

// finish stops the load and returns every goroutine's calls.
func (l *load) finish() [][]callRec {
	l.stop.Store(true)
	l.wg.Wait()
	return l.recs
}

// faultReport sums up a load around a fault at faultAt that ended at endAt.
type faultReport struct {
	calls, errors, degraded int
	firstErr                error
	maxCall                 time.Duration
	slowestFallback         time.Duration // the last goroutine's first fallback after faultAt
	back                    time.Duration // from endAt to the first Redis decision after it
	// noise is the longest call that ended before faultAt, with Redis
	// healthy: what the machine adds to a call (a few ms on a quiet one;
	// hundreds under -race on 2 cores shared with other work, where a
	// goroutine waits that long to run). The latency bounds of the fault
	// tests are on what a fault adds to a call, so they add noise.
	noise time.Duration
}

func report(recs [][]callRec, faultAt, endAt time.Duration) faultReport {
	r := faultReport{back: -1}
	firstBack := time.Duration(-1)
	for _, gr := range recs {
		first := time.Duration(-1)
		for _, c := range gr {
			r.calls++
			r.maxCall = max(r.maxCall, c.end-c.start)
			if c.end < faultAt {
				r.noise = max(r.noise, c.end-c.start)
			}
			if c.err != nil {
				r.errors++
				if r.firstErr == nil {
					r.firstErr = c.err
				}
			}
			if c.degraded {
				r.degraded++
				if first < 0 && c.end >= faultAt {
					first = c.end - faultAt
				}
			}
			if !c.degraded && c.err == nil && endAt > 0 && c.start >= endAt && (firstBack < 0 || c.end < firstBack) {
				firstBack = c.end
			}
		}
		if first < 0 {
			first = time.Hour // never fell back
		}
		r.slowestFallback = max(r.slowestFallback, first)
	}
	if firstBack >= 0 {
		r.back = firstBack - endAt
	}
	return r
}

func (r faultReport) String() string {
	return fmt.Sprintf("%d calls, %d errors, %d degraded; longest call %v (%v before the fault); every goroutine fell back within %v of the fault; back on Redis %v after it ended",
		r.calls, r.errors, r.degraded, r.maxCall.Round(time.Millisecond), r.noise.Round(time.Millisecond), r.slowestFallback.Round(time.Millisecond), r.back.Round(time.Millisecond))
}

// faultLimiter is a limiter on a tuned client of addr, for a fault test.
func faultLimiter(t *testing.T, addr string, opts ...Option) (*RateLimiter, *redis.Client, *transitions) {
	t.Helper()
	return faultLimiterWith(t, redistest.TunedOptions(addr), opts...)
}

// faultLimiterWith is faultLimiter on a client with the options copts.
func faultLimiterWith(t *testing.T, copts *redis.Options, opts ...Option) (*RateLimiter, *redis.Client, *transitions) {
	t.Helper()
	rdb := redis.NewClient(copts)
	tr := &transitions{}
	opts = append([]Option{WithOnTransition(tr.record)}, opts...)
	lim, err := NewTokenBucket(rdb, PerSecond(100_000), opts...)
	require.NoError(t, err)
	t.Cleanup(func() { lim.Close(); rdb.Close() })
	return lim, rdb, tr
}

// T1: crash under load, 2 s down, restart on the same port.
func TestFaultCrash(t *testing.T) {
	testlane.MarkAlone(t)
	srv := redistest.Start(t)
	verifyNoLeak(t)
	lim, rdb, tr := faultLimiter(t, srv.Addr)
	ld := startLoad(lim, 64)
	time.Sleep(time.Second)
	killAt := ld.now()
	require.NoError(t, srv.Kill())
	time.Sleep(2 * time.Second)
	require.NoError(t, srv.Restart())
	upAt := ld.now()
	time.Sleep(2 * time.Second)
	r := report(ld.finish(), killAt, upAt)
	t.Logf("crash: %v; transitions %d", r, len(tr.list()))
	assert.Zero(t, r.errors, "%d errors returned to callers, first %v", r.errors, r.firstErr)
	// Each bound is what the crash may add, plus the noise (see faultReport).
	assert.LessOrEqual(t, r.slowestFallback, 100*time.Millisecond+r.noise, "a goroutine got its first fallback decision %v after the kill, want within 100ms + %v", r.slowestFallback, r.noise)
	assert.LessOrEqual(t, r.maxCall, 250*time.Millisecond+r.noise, "a call took %v, want at most 250ms + %v", r.maxCall, r.noise)
	assert.GreaterOrEqual(t, r.back, time.Duration(0), "decisions came from Redis again %v after the restart, want within 1.5s + %v", r.back, r.noise)
	assert.LessOrEqual(t, r.back, 1500*time.Millisecond+r.noise, "decisions came from Redis again %v after the restart, want within 1.5s + %v", r.back, r.noise)
	lim.Close()
	rdb.Close()
}

// T2: hang (SIGSTOP) under load for 2 s, then SIGCONT.
func TestFaultHang(t *testing.T) {
	testlane.MarkAlone(t)
	srv := redistest.Start(t)
	lim, _, tr := faultLimiter(t, srv.Addr)
	ld := startLoad(lim, 64)
	time.Sleep(time.Second)
	stopAt := ld.now()
	require.NoError(t, srv.Pause())
	time.Sleep(2 * time.Second)
	require.NoError(t, srv.Resume())
	contAt := ld.now()
	time.Sleep(1500 * time.Millisecond)
	r := report(ld.finish(), stopAt, contAt)
	t.Logf("hang: %v; transitions %d", r, len(tr.list()))
	assert.Zero(t, r.errors, "%d errors returned to callers, first %v", r.errors, r.firstErr)
	// Each bound is what the hang may add, plus the noise (see faultReport).
	assert.LessOrEqual(t, r.maxCall, 300*time.Millisecond+r.noise, "a call took %v, want at most 300ms + %v", r.maxCall, r.noise)
	assert.LessOrEqual(t, r.slowestFallback, 300*time.Millisecond+r.noise, "a goroutine fell back %v after the hang began, want within 300ms + %v", r.slowestFallback, r.noise)
	assert.GreaterOrEqual(t, r.back, time.Duration(0), "decisions came from Redis again %v after SIGCONT, want within 500ms + %v", r.back, r.noise)
	assert.LessOrEqual(t, r.back, 500*time.Millisecond+r.noise, "decisions came from Redis again %v after SIGCONT, want within 500ms + %v", r.back, r.noise)
}

// T3: a caller's 50ms deadline while Redis hangs: the call returns in time,
// with the context's error.
func TestFaultCallerDeadline(t *testing.T) {
	testlane.MarkAlone(t)
	srv := redistest.Start(t)
	lim, _, tr := faultLimiter(t, srv.Addr)
	_, err := lim.Allow(context.Background(), "k")
	require.NoError(t, err)
	began := time.Now()
	_, err = lim.Allow(context.Background(), "k")
	require.NoError(t, err)
	noise := time.Since(began) // a healthy call, as the machine runs now
	require.NoError(t, srv.Pause())
	defer func() { _ = srv.Resume() }()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = lim.Allow(ctx, "k")
	took := time.Since(start)
	t.Logf("caller deadline 50ms: returned after %v with %v", took, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded, "err = %v, want the context's DeadlineExceeded", err)
	// Within the deadline and some scheduling slack (a loaded machine woke
	// the caller 32 ms late), and before the client's 100 ms read timeout
	// could have ended it, plus the noise.
	assert.LessOrEqual(t, took, 90*time.Millisecond+noise, "returned after %v, want within 90ms + %v", took, noise)
	assert.Empty(t, tr.list(), "the caller's deadline switched to the fallback: %+v", tr.list())
}

// T4: latency above the client's read timeout gives a fallback; below it
// does not.
func TestFaultLatency(t *testing.T) {
	testlane.MarkAlone(t)
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	for _, tc := range []struct {
		delay    time.Duration
		degraded bool
	}{{150 * time.Millisecond, true}, {30 * time.Millisecond, false}} {
		t.Run(tc.delay.String(), func(t *testing.T) {
			proxy.SetDelay(tc.delay)
			lim, _, tr := faultLimiter(t, proxy.Addr)
			for i := range 5 {
				start := time.Now()
				res, err := lim.Allow(context.Background(), "k")
				require.NoError(t, err, "call %d: %v", i, err)
				require.Equal(t, tc.degraded, res.Degraded, "call %d after %v: Degraded = %v, want %v", i, time.Since(start), res.Degraded, tc.degraded)
			}
			if tc.degraded {
				// The transition is recorded once a probe confirms the
				// outage, which may come after the calls' fallback answers.
				got := waitTransitions(t, tr, 1, 2*time.Second)
				assert.NotEmpty(t, got, "no transition after %v of latency", tc.delay)
			} else {
				assert.Empty(t, tr.list(), "transitions with %v of latency", tc.delay)
			}
		})
	}
}

// T5: flapping: the connection is cut and restored every 150ms for 5 s.
func TestFaultFlapping(t *testing.T) {
	testlane.MarkAlone(t)
	srv := redistest.Start(t)
	proxy := redistest.NewProxy(t, srv.Addr)
	verifyNoLeak(t)
	rdb := redis.NewClient(redistest.TunedOptions(proxy.Addr))
	tr := &transitions{}
	lim, err := NewTokenBucket(rdb, PerSecond(100_000), WithOnTransition(tr.record))
	require.NoError(t, err)
	ld := startLoad(lim, 32)
	cuts := 0
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); {
		proxy.Cut()
		cuts++
		time.Sleep(150 * time.Millisecond)
		proxy.Restore()
		time.Sleep(150 * time.Millisecond)
	}
	r := report(ld.finish(), 0, 0)
	switches := len(tr.list())
	t.Logf("flapping: %d cuts, %d mode switches; %v", cuts, switches, r)
	assert.Zero(t, r.errors, "%d errors returned to callers, first %v", r.errors, r.firstErr)
	assert.LessOrEqual(t, switches, 2*cuts, "%d mode switches for %d outages, want at most 2 per outage", switches, cuts)
	lim.Close()
	rdb.Close()
}

// T6: LOADING after a restart with a dataset to load, READONLY on a replica,
// OOM under maxmemory noeviction, MISCONF after a failed save, and BUSY
// while a slow script runs.
func TestFaultServerStates(t *testing.T) {
	testlane.MarkAlone(t)
	t.Run("LOADING", func(t *testing.T) {
		srv, lim, tr := loadingServer(t)
		ctx := context.Background()
		restarted := make(chan error, 1)
		go func() { restarted <- srv.Restart() }() // returns at the first reply, LOADING included
		// Wait for the port to open: from then on Redis answers LOADING.
		for deadline := time.Now().Add(5 * time.Second); ; {
			c, err := net.DialTimeout("tcp", srv.Addr, 100*time.Millisecond)
			if err == nil {
				c.Close()
				break
			}
			require.False(t, time.Now().After(deadline), "the restarted server never listened: %v", err)
			time.Sleep(5 * time.Millisecond)
		}
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err, "while loading: %+v, %v; want a fallback decision", res, err)
		require.True(t, res.Degraded, "while loading: %+v, %v; want a fallback decision", res, err)
		// A stale connection's EOF answers the first call from the
		// fallback; a probe then meets LOADING.
		got := waitTransitions(t, tr, 1, time.Second)
		require.Len(t, got, 1, "transitions = %+v, want one caused by LOADING", got)
		require.True(t, redis.IsLoadingError(got[0].Err), "transitions = %+v, want one caused by LOADING", got)
		require.NoError(t, <-restarted)
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(5 * time.Millisecond) {
			if out, _ := srv.CLI("PING"); out == "PONG" {
				break // loading is over
			}
			require.False(t, time.Now().After(deadline), "still loading after 10s")
		}
		waitBack(t, lim, 1500*time.Millisecond)
	})
	t.Run("READONLY", func(t *testing.T) {
		master := redistest.Start(t)
		replica := redistest.Start(t, "--replicaof", "127.0.0.1", strconv.Itoa(master.Port))
		lim, _, tr := faultLimiter(t, replica.Addr)
		for range 3 {
			res, err := lim.Allow(context.Background(), "k")
			require.NoError(t, err, "on a replica: %+v, %v; want a fallback decision", res, err)
			require.True(t, res.Degraded, "on a replica: %+v, %v; want a fallback decision", res, err)
		}
		got := tr.list()
		require.Len(t, got, 1, "transitions = %+v, want one caused by READONLY", got)
		require.True(t, redis.IsReadOnlyError(got[0].Err), "transitions = %+v, want one caused by READONLY", got)
		// The probe writes, so a replica answering PING does not count as back.
		time.Sleep(500 * time.Millisecond)
		res, _ := lim.Allow(context.Background(), "k")
		require.True(t, res.Degraded, "switched back to a read-only replica")
	})
	t.Run("OOM", func(t *testing.T) {
		srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
		lim, _, tr := faultLimiter(t, srv.Addr)
		_, err := srv.CLI("CONFIG", "SET", "maxmemory", "1")
		require.NoError(t, err)
		res, err := lim.Allow(context.Background(), "k")
		require.NoError(t, err, "out of memory: %+v, %v; want a fallback decision", res, err)
		require.True(t, res.Degraded, "out of memory: %+v, %v; want a fallback decision", res, err)
		got := tr.list()
		require.Len(t, got, 1, "transitions = %+v, want one caused by OOM", got)
		if v := serverVersion(t); v.AtLeast(7, 0) {
			require.True(t, redis.IsOOMError(got[0].Err), "transitions = %+v, want one caused by OOM", got)
		} else {
			// Redis 6 runs the script and refuses its first write: the OOM
			// comes inside the script's error, "ERR Error running script
			// (call to f_...): @user_script:...: -OOM command not allowed ...".
			require.True(t, redis.HasErrorPrefix(got[0].Err, "Error running script"), "%v: transitions = %+v, want one caused by a script's OOM", v, got)
			require.ErrorContains(t, got[0].Err, ": -OOM command not allowed", "%v: transitions = %+v, want one caused by a script's OOM", v, got)
		}
		_, err = srv.CLI("CONFIG", "SET", "maxmemory", "0")
		require.NoError(t, err)
		waitBack(t, lim, 2*time.Second)
	})
	t.Run("MISCONF", func(t *testing.T) {
		// stop-writes-on-bgsave-error (on by default): once a save fails,
		// Redis refuses writes. Here the save fails because its directory
		// is gone.
		rdbDir := filepath.Join(t.TempDir(), "rdb")
		require.NoError(t, os.Mkdir(rdbDir, 0o755))
		srv := redistest.Start(t, "--dir", rdbDir)
		lim, _, tr := faultLimiter(t, srv.Addr)
		res, err := lim.Allow(context.Background(), "k")
		require.NoError(t, err)
		require.False(t, res.Degraded, "before the failed save: %+v", res)
		require.NoError(t, os.Remove(rdbDir))
		_, err = srv.CLI("CONFIG", "SET", "save", "900 1")
		require.NoError(t, err)
		// No save points at the end, or the server would try to save on
		// shutdown, fail and refuse to stop.
		t.Cleanup(func() { _, _ = srv.CLI("CONFIG", "SET", "save", "") })
		_, err = srv.CLI("BGSAVE")
		require.NoError(t, err)
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			out, err := srv.CLI("INFO", "persistence")
			require.NoError(t, err)
			if strings.Contains(out, "rdb_last_bgsave_status:err") && strings.Contains(out, "rdb_bgsave_in_progress:0") {
				break
			}
			require.False(t, time.Now().After(deadline), "the save did not fail: %s", out)
		}
		res, err = lim.Allow(context.Background(), "k")
		require.NoError(t, err, "writes refused after a failed save: %+v, %v; want a fallback decision", res, err)
		require.True(t, res.Degraded, "writes refused after a failed save: %+v, %v; want a fallback decision", res, err)
		got := tr.list()
		require.Len(t, got, 1, "transitions = %+v, want one caused by MISCONF", got)
		// Redis 7 refuses the script with MISCONF; Redis 6 runs it and
		// wraps the refusal of its first write in the script's error.
		require.ErrorContains(t, got[0].Err, "MISCONF", "%v: transitions = %+v, want one caused by MISCONF", serverVersion(t), got)
		_, err = srv.CLI("CONFIG", "SET", "stop-writes-on-bgsave-error", "no")
		require.NoError(t, err)
		waitBack(t, lim, 2*time.Second)
	})
	t.Run("NOREPLICAS", func(t *testing.T) {
		srv := redistest.Start(t, "--min-replicas-to-write", "1")
		lim, _, tr := faultLimiter(t, srv.Addr)
		res, err := lim.Allow(context.Background(), "k")
		if v := serverVersion(t); !v.AtLeast(7, 0) {
			// Redis before 7.0 (6.0.16 here) checks min-replicas-to-write
			// only for commands flagged as writes, which EVALSHA is not,
			// and not for the writes a script makes: the script runs and
			// writes without a replica, and the limiter decides on Redis.
			// Redis 7.0 treats a script without flags as one that may write
			// and refuses it with NOREPLICAS.
			require.NoError(t, err, "%v without replicas: %+v, %v; want a decision from Redis", v, res, err)
			require.False(t, res.Degraded, "%v without replicas: %+v, %v; want a decision from Redis", v, res, err)
			require.True(t, res.Allowed, "%v without replicas: %+v, %v; want a decision from Redis", v, res, err)
			n, err := srv.Client(t).Exists(context.Background(), lim.stateKey("k")).Result()
			require.NoError(t, err)
			require.Equal(t, int64(1), n, "%v without replicas: the script did not write the state", v)
			require.Empty(t, tr.list(), "%v without replicas: transitions %+v, want none", v, tr.list())
			return
		}
		require.NoError(t, err, "writes refused for want of replicas: %+v, %v; want a fallback decision", res, err)
		require.True(t, res.Degraded, "writes refused for want of replicas: %+v, %v; want a fallback decision", res, err)
		got := tr.list()
		require.Len(t, got, 1, "transitions = %+v, want one caused by NOREPLICAS", got)
		require.True(t, redis.HasErrorPrefix(got[0].Err, "NOREPLICAS"), "transitions = %+v, want one caused by NOREPLICAS", got)
	})
	t.Run("BUSY", func(t *testing.T) {
		// lua-time-limit: the name every engine knows (Redis 7 calls it
		// busy-reply-threshold, which Redis 6 refuses).
		srv := redistest.Start(t, "--lua-time-limit", "100")
		lim, _, tr := faultLimiter(t, srv.Addr)
		_, err := lim.Allow(context.Background(), "k")
		require.NoError(t, err)
		slow := srv.Client(t)
		done := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			done <- slow.Eval(ctx, "local t = redis.call('TIME') while true do end", nil).Err()
		}()
		deadline := time.Now().Add(3 * time.Second)
		for {
			res, err := lim.Allow(context.Background(), "k")
			require.NoError(t, err, "while a script is busy: %v", err)
			if res.Degraded {
				break
			}
			require.False(t, time.Now().After(deadline), "no fallback while a script kept Redis busy")
			time.Sleep(10 * time.Millisecond)
		}
		// The first fallback decision may be a timed-out call's own, before
		// a probe confirms that the node is down.
		got := waitTransitions(t, tr, 1, time.Second)
		require.Len(t, got, 1, "transitions = %+v, want one caused by BUSY or a timeout", got)
		require.True(t, redis.HasErrorPrefix(got[0].Err, "BUSY") || outage.Is(got[0].Err), "transitions = %+v, want one caused by BUSY or a timeout", got)
		_, err = srv.CLI("SCRIPT", "KILL")
		require.NoError(t, err)
		assert.Error(t, <-done, "the script, killed")
		waitBack(t, lim, 2*time.Second)
	})
}

// loadingServer starts a server, gives it a dataset that takes it about
// 1.5 s to load, stops it with SIGKILL and returns it, with a limiter on it
// whose client is tuned but for 1 s read and write timeouts: Redis answers
// LOADING only between chunks of the load, and on 2 busy cores a chunk can
// take longer than the tuned 100 ms, which would turn the LOADING reply the
// subtest is about into a timeout.
//
// Redis 7.0 and later (Valkey too) load a big RDB slowly with
// key-load-delay and answer between chunks of 1024 bytes
// (loading-process-events-interval-bytes). Redis 6 refuses that option at
// startup (it answers every 2 MB of RDB, a fixed interval, so an RDB would
// need 50 MB a second of loading to answer within 40 ms). There the dataset
// is an append-only file of one script that runs for 1.5 s: with
// lua-time-limit 10, Redis 6 serves clients (and answers them LOADING)
// every 100,000 Lua instructions once the script has run 10 ms.
func loadingServer(t *testing.T) (*redistest.Server, *RateLimiter, *transitions) {
	t.Helper()
	v := serverVersion(t)
	ctx := context.Background()
	var srv *redistest.Server
	if v.AtLeast(7, 0) {
		// key-load-delay makes loading slow enough to see (20,000 keys at
		// 50µs each take about 1-2 s).
		srv = redistest.Start(t, "--key-load-delay", "50", "--loading-process-events-interval-bytes", "1024")
		admin := srv.Client(t)
		pipe := admin.Pipeline()
		for i := range 20000 {
			pipe.Set(ctx, "fill:"+strconv.Itoa(i), "x", 0)
		}
		_, err := pipe.Exec(ctx)
		require.NoError(t, err)
		require.NoError(t, admin.Save(ctx).Err())
	} else {
		srv = redistest.Start(t, "--appendonly", "yes", "--lua-time-limit", "10")
	}
	copts := redistest.TunedOptions(srv.Addr)
	copts.ReadTimeout, copts.WriteTimeout = time.Second, time.Second
	lim, _, tr := faultLimiterWith(t, copts)
	require.NoError(t, srv.Kill())
	if !v.AtLeast(7, 0) {
		const script = `local function us() local t = redis.call('TIME') return t[1] * 1000000 + t[2] end
local s = us()
while us() - s < 1500000 do end`
		aof := fmt.Sprintf("*3\r\n$4\r\nEVAL\r\n$%d\r\n%s\r\n$1\r\n0\r\n", len(script), script)
		require.NoError(t, os.WriteFile(filepath.Join(srv.Dir, "appendonly.aof"), []byte(aof), 0o600))
	}
	return srv, lim, tr
}

// waitBack waits until lim decides on Redis again.
func waitBack(t *testing.T, lim *RateLimiter, within time.Duration) {
	t.Helper()
	start := time.Now()
	for {
		res, err := lim.Allow(context.Background(), "k")
		require.NoError(t, err)
		if !res.Degraded {
			t.Logf("back on Redis after %v", time.Since(start).Round(time.Millisecond))
			return
		}
		require.LessOrEqual(t, time.Since(start), within, "still degraded after %v", within)
		time.Sleep(10 * time.Millisecond)
	}
}

// T8 on real Redis: each policy during a crash.
func TestFaultPolicies(t *testing.T) {
	testlane.MarkAlone(t)
	for _, p := range []FallbackPolicy{FallbackLocal, FallbackAllow, FallbackDeny, FallbackError} {
		t.Run(p.String(), func(t *testing.T) {
			srv := redistest.Start(t)
			lim, _, _ := faultLimiter(t, srv.Addr, WithFallback(p))
			require.NoError(t, srv.Kill())
			var outcomes []string
			for range 3 {
				res, err := lim.Allow(context.Background(), "k")
				switch {
				case err != nil && errors.Is(err, ErrUnavailable):
					outcomes = append(outcomes, "unavailable")
				case err != nil:
					require.NoError(t, err, "unexpected error %v", err)
				case !res.Degraded:
					require.True(t, res.Degraded, "a result without Degraded while Redis is down")
				case res.Allowed:
					outcomes = append(outcomes, "allowed")
				default:
					outcomes = append(outcomes, "denied")
				}
			}
			sort.Strings(outcomes)
			want := map[FallbackPolicy]string{
				FallbackLocal: "[allowed allowed allowed]",
				FallbackAllow: "[allowed allowed allowed]",
				FallbackDeny:  "[denied denied denied]",
				FallbackError: "[unavailable unavailable unavailable]",
			}[p]
			got := fmt.Sprint(outcomes)
			assert.Equal(t, want, got, "outcomes %s, want %s", got, want)
		})
	}
}
