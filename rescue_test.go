package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/time/rate"

	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/testlane"
)

// keyHook counts the commands sent to Redis that name a given substring
// (the limited key's hash tag), so a test can tell whether decisions
// touched Redis; the monitor's probes use a key of their own.
type keyHook struct {
	passHooks // only ProcessHook does something
	match     string
	n         atomic.Int64
}

func (h *keyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		for _, a := range cmd.Args() {
			if s, ok := a.(string); ok && strings.Contains(s, h.match) && !strings.HasSuffix(s, probeSuffix) {
				h.n.Add(1)
				break
			}
		}
		return next(ctx, cmd)
	}
}

// recorder keeps what a hook reports (transitions, decisions), safe for
// concurrent use.
type recorder[T any] struct {
	mu  sync.Mutex
	got []T
}

func (r *recorder[T]) record(x T) {
	r.mu.Lock()
	r.got = append(r.got, x)
	r.mu.Unlock()
}

func (r *recorder[T]) list() []T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]T(nil), r.got...)
}

func (r *recorder[T]) last() T {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[len(r.got)-1]
}

// transitions records the switches a limiter reports.
type transitions = recorder[Transition]

// tunedClient is a client with the options the README recommends.
func tunedClient(t testing.TB, addr string) *redis.Client {
	rdb := redis.NewClient(redistest.TunedOptions(addr))
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// verifyNoLeak checks, when the test ends (after its servers and clients
// are closed), that no goroutine started since the call is left, but
// go-redis's dial prober, which sleeps up to a second after Close by design,
// and the waiters of redis-server children shared by the package.
func verifyNoLeak(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() {
		goleak.VerifyNone(t, before,
			goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
			goleak.IgnoreAnyFunction("github.com/redlimit/redlimit/internal/redistest.(*Server).launchLocked.func1"),
			goleak.IgnoreAnyFunction("github.com/redlimit/redlimit/internal/redistest.(*Proxy).serve"),
			goleak.IgnoreAnyFunction("github.com/redlimit/redlimit/internal/redistest.(*Proxy).handle"))
	})
}

func TestFallbackOutageAndRecovery(t *testing.T) {
	verifyNoLeak(t)
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	hook := &keyHook{match: "{user}"}
	rdb.AddHook(hook)
	var tr transitions
	lim, err := NewFixedWindow(rdb, PerMinute(1000), WithOnTransition(tr.record), WithPingInterval(20*time.Millisecond))
	require.NoError(t, err)
	ctx := context.Background()
	res, err := lim.Allow(ctx, "user")
	require.NoError(t, err, "healthy: %+v, %v", res, err)
	require.False(t, res.Degraded, "healthy: %+v, %v", res, err)

	healthy := hook.n.Load() // EVALSHA, and EVAL after NOSCRIPT

	m.Close()
	for i := range 100 {
		res, err := lim.Allow(ctx, "user")
		require.NoError(t, err, "call %d during the outage: %+v, %v; want an allowed, degraded result", i, res, err)
		require.True(t, res.Allowed, "call %d during the outage: %+v, %v; want an allowed, degraded result", i, res, err)
		require.True(t, res.Degraded, "call %d during the outage: %+v, %v; want an allowed, degraded result", i, res, err)
	}
	sent := hook.n.Load() - healthy
	assert.Equal(t, int64(1), sent, "%d commands went to Redis during the outage, want 1 (the one that found it)", sent)
	got := tr.list()
	require.Len(t, got, 1, "transitions = %+v, want one Down with its error", got)
	require.True(t, got[0].Down, "transitions = %+v, want one Down with its error", got)
	require.Error(t, got[0].Err, "transitions = %+v, want one Down with its error", got)
	require.Equal(t, FixedWindow, got[0].Strategy, "transitions = %+v, want one Down with its error", got)

	require.NoError(t, m.Restart())
	deadline := time.Now().Add(3 * time.Second)
	for {
		res, err := lim.Allow(ctx, "user")
		require.NoError(t, err)
		if !res.Degraded {
			break
		}
		require.False(t, time.Now().After(deadline), "still degraded 3s after Redis came back")
		time.Sleep(5 * time.Millisecond)
	}
	got = tr.list()
	require.Len(t, got, 2, "transitions = %+v, want Down then back with the outage's length", got)
	require.False(t, got[1].Down, "transitions = %+v, want Down then back with the outage's length", got)
	require.Greater(t, got[1].Outage, time.Duration(0), "transitions = %+v, want Down then back with the outage's length", got)
	require.NoError(t, lim.Close())
	err = lim.Close()
	require.NoError(t, err, "second Close: %v", err)
	_, err = lim.Allow(ctx, "user")
	require.ErrorIs(t, err, ErrClosed, "Allow after Close = %v, want ErrClosed", err)
	mustErrorIs(t, lim.Wait(ctx, "user"), ErrClosed)
	mustErrorIs(t, lim.Reset(ctx, "user"), ErrClosed)
}

// Close during an outage stops the monitor.
func TestCloseStopsMonitor(t *testing.T) {
	verifyNoLeak(t)
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	lim, err := NewTokenBucket(rdb, PerSecond(10))
	require.NoError(t, err)
	m.Close()
	res, err := lim.Allow(context.Background(), "k")
	require.NoError(t, err, "%+v, %v", res, err)
	require.True(t, res.Degraded, "%+v, %v", res, err)
	lim.Close()
	rdb.Close()
}

// What is not an outage never switches to the fallback.
func TestNotAnOutage(t *testing.T) {
	m := miniredis.RunT(t)
	m.SetTime(t0) // no refill between the calls, however slow the machine
	// Not the tuned 100 ms timeouts: on a loaded machine a timeout, an
	// outage, would fail the test for nothing the test is about.
	rdb := redis.NewClient(steadyOptions(m.Addr()))
	t.Cleanup(func() { rdb.Close() })
	var tr transitions
	lim := newLimiter(t, rdb, TokenBucket, PerSecond(2), WithOnTransition(tr.record))
	ctx := context.Background()

	// Denials are answers.
	for i := range 50 {
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err, "call %d: %+v, %v", i, res, err)
		require.False(t, res.Degraded, "call %d: %+v, %v", i, res, err)
		require.False(t, i >= 2 && res.Allowed, "call %d: %+v, %v", i, res, err)
	}
	// The caller's context ending is the caller's business.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	_, err := lim.Allow(cancelled, "k")
	require.ErrorIs(t, err, context.Canceled, "cancelled ctx: err = %v", err)
	// A bug (here a key of the wrong type) is an error, loudly.
	require.NoError(t, rdb.HSet(ctx, lim.stateKey("bad"), "x", "1").Err())
	_, err = lim.Allow(ctx, "bad")
	require.ErrorContains(t, err, "WRONGTYPE", "wrong type: err = %v, want the WRONGTYPE error", err)
	got := tr.list()
	require.Empty(t, got, "transitions = %+v, want none", got)
	require.False(t, lim.rescue.anyDown(), "marked down")
}

func TestFallbackPolicies(t *testing.T) {
	tests := []struct {
		policy  FallbackPolicy
		allowed bool
		err     error
	}{
		{FallbackLocal, true, nil},
		{FallbackAllow, true, nil},
		{FallbackDeny, false, nil},
		{FallbackError, false, ErrUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.policy.String(), func(t *testing.T) {
			m := miniredis.RunT(t)
			rdb := tunedClient(t, m.Addr())
			lim := newLimiter(t, rdb, SlidingLog, PerSecond(5), WithFallback(tt.policy))
			m.Close()
			for i := range 3 {
				res, err := lim.Allow(context.Background(), "k")
				if tt.err != nil {
					require.ErrorIs(t, err, tt.err, "call %d: err = %v, want %v", i, err, tt.err)
					assert.Contains(t, err.Error(), "connect", "err %q does not tell the cause", err)
					continue
				}
				require.NoError(t, err, "call %d: %+v, %v; want allowed=%v, degraded", i, res, err, tt.allowed)
				require.Equal(t, tt.allowed, res.Allowed, "call %d: %+v, %v; want allowed=%v, degraded", i, res, err, tt.allowed)
				require.True(t, res.Degraded, "call %d: %+v, %v; want allowed=%v, degraded", i, res, err, tt.allowed)
				if !res.Allowed {
					assert.Greater(t, res.RetryAfter, time.Duration(0), "denied without RetryAfter: %+v", res)
				}
			}
		})
	}
}

// The in-process stand-ins keep each strategy's rate and burst.
func TestFallbackMapping(t *testing.T) {
	tests := []struct {
		s          Strategy
		limit      Limit
		admitted   int           // at once, from full
		retryAfter time.Duration // for the next one
	}{
		{FixedWindow, PerSecond(10), 10, 100 * time.Millisecond},
		{SlidingLog, PerMinute(6), 6, 10 * time.Second},
		{SlidingCounter, PerSecond(10), 10, 100 * time.Millisecond},
		{TokenBucket, Limit{Rate: 10, Period: time.Second, Burst: 4}, 4, 100 * time.Millisecond},
		{LeakyBucket, Limit{Rate: 10, Period: time.Second, Burst: 3}, 3, 100 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.s.String(), func(t *testing.T) {
			m := miniredis.RunT(t)
			rdb := tunedClient(t, m.Addr())
			lim := newLimiter(t, rdb, tt.s, tt.limit, WithPingInterval(time.Hour))
			m.Close()
			ctx := context.Background()
			// The fallback runs on this host's clock: the Delay and
			// RetryAfter below shrink by the time since the first call
			// (1 ms or more between calls on a loaded machine). The calls
			// must fit in one interval, or the stand-in refills; on a
			// loaded machine they may not: then again, on a new key.
			var (
				first   time.Time
				results []Result
			)
			for attempt := 1; ; attempt++ {
				key := fmt.Sprint("k", attempt)
				first = time.Now()
				results = results[:0]
				for i := range tt.admitted + 1 {
					res, err := lim.Allow(ctx, key)
					require.NoError(t, err, "call %d: %+v, %v", i, res, err)
					results = append(results, res)
				}
				took := time.Since(first)
				if took < tt.limit.interval() || attempt == 10 {
					break
				}
				t.Logf("attempt %d: the calls took %v, long enough for the stand-in to refill; again on a new key", attempt, took)
			}
			for i, res := range results[:tt.admitted] {
				require.True(t, res.Allowed, "call %d: %+v", i, res)
				require.True(t, res.Degraded, "call %d: %+v", i, res)
				if tt.s == LeakyBucket {
					want := time.Duration(i) * 100 * time.Millisecond
					d := res.Delay
					assert.GreaterOrEqual(t, d, want-time.Millisecond-time.Since(first), "call %d: Delay = %v, want about %v", i, d, want)
					assert.LessOrEqual(t, d, want, "call %d: Delay = %v, want about %v", i, d, want)
				}
			}
			res := results[tt.admitted]
			require.False(t, res.Allowed, "over the burst: %+v", res)
			d := res.RetryAfter
			assert.LessOrEqual(t, d, tt.retryAfter, "RetryAfter = %v, want about %v", d, tt.retryAfter)
			assert.GreaterOrEqual(t, d, tt.retryAfter-5*time.Millisecond-time.Since(first), "RetryAfter = %v, want about %v", d, tt.retryAfter)
		})
	}
}

// With a share of 1/4, four instances in fallback admit about the global
// limit, not four times it.
func TestFallbackShare(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			m := miniredis.RunT(t)
			rdb := tunedClient(t, m.Addr())
			m.Close()
			total := 0
			for range 4 {
				lim := newLimiter(t, rdb, s, PerMinute(100), WithFallbackShare(0.25), WithPingInterval(time.Hour))
				for range 200 {
					res, err := lim.Allow(context.Background(), "k")
					require.NoError(t, err)
					if res.Allowed {
						total++
					}
				}
			}
			require.Equal(t, 100, total, "4 instances admitted %d at once, want the global 100", total)
		})
	}
}

// A flood of distinct keys during an outage cannot exhaust memory.
func TestFallbackKeysBounded(t *testing.T) {
	testlane.MarkHeavy(t)
	if testing.Short() {
		t.Skip("a million keys")
	}
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	lim := newLimiter(t, rdb, TokenBucket, PerSecond(10), WithPingInterval(time.Hour))
	m.Close()
	ctx := context.Background()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const keys = 1_000_000
	for i := range keys {
		res, err := lim.Allow(ctx, fmt.Sprintf("ip:10.%d.%d.%d", i>>16, (i>>8)&255, i&255))
		if err != nil || !res.Degraded { // a million testify calls would double the test's time
			require.NoError(t, err, "key %d: %+v, %v", i, res, err)
			require.True(t, res.Degraded, "key %d: %+v, %v", i, res, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := lim.rescue.locals.Len()
	require.LessOrEqual(t, held, 100_000, "the fallback holds %d keys, want at most 100,000", held)
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d keys offered, %d held, heap grew %.1f MB (%d bytes a key)", keys, held, float64(grew)/1e6, grew/int64(held))
	require.LessOrEqual(t, grew, int64(40<<20), "heap grew %d MB, want at most the documented 40 MB", grew>>20)
}

// The transition hook may call Close, even from the monitor's switch back.
func TestCloseFromTransitionHook(t *testing.T) {
	verifyNoLeak(t)
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	var lim *RateLimiter
	closed := make(chan error, 1)
	lim, err := NewTokenBucket(rdb, PerSecond(10), WithPingInterval(10*time.Millisecond),
		WithOnTransition(func(tr Transition) {
			if !tr.Down {
				closed <- lim.Close()
			}
		}))
	require.NoError(t, err)
	m.Close()
	res, err := lim.Allow(context.Background(), "k")
	require.NoError(t, err, "%+v, %v", res, err)
	require.True(t, res.Degraded, "%+v, %v", res, err)
	require.NoError(t, m.Restart())
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(3 * time.Second):
		require.FailNow(t, "Close from the hook did not return")
	}
	_, err = lim.Allow(context.Background(), "k")
	require.ErrorIs(t, err, ErrClosed, "after Close: %v", err)
}

// The first event, then the other k-1 in one reservation (reserveAt), as
// checkQueue takes them, leave the stand-in as k reservations of one would:
// the same tokens at every later time and the same wait for the last
// event, on stand-ins of any burst. On a queue's stand-in (burst 1),
// cancelled as a denied policy cancels them (the last first), the two give
// back every token they took (to a millionth): x/time/rate gave back only
// about one of k reservations of one cancelled in turn (each restores a
// little less than its token, from the rounding of their times to ns, and
// the next then finds a later reservation in the way), which took the
// rest of a denied call's events from the queue.
func TestReserveAtMatchesOneByOne(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for trial := range 300 {
		every, burst := rate.Limit(1+rng.IntN(1000)), 1+rng.IntN(4)
		one, chunk := rate.NewLimiter(every, burst), rate.NewLimiter(every, burst)
		cancels := trial%2 == 1 // else compared with one by one
		if cancels {
			burst = 1 // a queue's stand-in, the one that cancels
			one, chunk = rate.NewLimiter(every, burst), rate.NewLimiter(every, burst)
		}
		now := t0
		for step := range 20 {
			now = now.Add(time.Duration(rng.IntN(5000)) * time.Microsecond)
			k := 1 + rng.IntN(40)
			where := fmt.Sprintf("trial %d step %d: %d events, rate %v, burst %d", trial, step, k, every, burst)
			before := chunk.TokensAt(now)
			first := chunk.ReserveN(now, 1)
			rv := first
			if k > 1 {
				rv = reserveAt(chunk, now, k-1)
			}
			require.True(t, rv.OK(), where)
			assert.Equal(t, burst, chunk.Burst(), "burst restored, %s", where)
			if cancels {
				if k > 1 {
					rv.CancelAt(now)
				}
				first.CancelAt(now)
				assert.InDelta(t, before, chunk.TokensAt(now), 1e-6, "every token given back, %s", where)
				continue
			}
			var last *rate.Reservation
			for range k {
				last = one.ReserveN(now, 1)
			}
			assert.Equal(t, last.DelayFrom(now), rv.DelayFrom(now), "the last event's wait, %s", where)
			later := now.Add(time.Duration(rng.IntN(10000)) * time.Microsecond)
			assert.InDelta(t, one.TokensAt(later), chunk.TokensAt(later), 1e-9, "tokens, %s", where)
		}
	}
}

// A hook that panics on every switch neither reaches the callers nor ends
// the process (a switch back runs it on the monitor's goroutine), and
// every later switch is still reported: a panic used to leave reporting
// stopped for good, its queue growing by one switch per outage.
func TestOnTransitionPanics(t *testing.T) {
	verifyNoLeak(t)
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	var calls atomic.Int32
	lim, err := NewTokenBucket(rdb, PerSecond(1000), WithPingInterval(10*time.Millisecond),
		WithOnTransition(func(tr Transition) {
			calls.Add(1)
			panic("hook: " + fmt.Sprint(tr.Down))
		}))
	require.NoError(t, err)
	defer lim.Close()
	ctx := context.Background()
	for outage := range 2 {
		m.Close()
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Degraded)
		require.NoError(t, m.Restart())
		require.Eventually(t, func() bool {
			res, err := lim.Allow(ctx, "k")
			return err == nil && !res.Degraded
		}, 5*time.Second, 5*time.Millisecond, "outage %d: back on Redis", outage)
		require.Eventually(t, func() bool { return calls.Load() == int32(2*(outage+1)) }, 5*time.Second, 5*time.Millisecond,
			"outage %d: %d hook calls, want %d", outage, calls.Load(), 2*(outage+1))
	}
}

// noScriptTime refuses, as ElastiCache Serverless does, the scripts that
// call TIME: here the probe's (the decision scripts of a client-clock
// limiter never reach their TIME).
type noScriptTime struct{ passHooks }

func (noScriptTime) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if a := cmd.Args(); len(a) > 1 && (cmd.Name() == "evalsha" || cmd.Name() == "eval") {
			if s := fmt.Sprint(a[1]); s == probeScript.Hash() || strings.Contains(s, "redis.call('TIME')") {
				err := redisError("ERR This Redis command is not allowed from script")
				cmd.SetErr(err)
				return err
			}
		}
		return next(ctx, cmd)
	}
}

type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}

// A client-clock limiter comes back from an outage on a server that
// refuses TIME in scripts: its probe does not ask for it. (It probed with
// the server-clock script, which such a server refuses, and stayed on the
// fallback for good.)
func TestClientClockRecovers(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	rdb.AddHook(noScriptTime{})
	var tr transitions
	lim := newLimiter(t, rdb, TokenBucket, PerSecond(100), WithClientClock(),
		WithPingInterval(10*time.Millisecond), WithOnTransition(tr.record))
	ctx := context.Background()
	res, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	require.False(t, res.Degraded, "healthy: %+v", res)

	m.Close()
	res, err = lim.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Degraded, "during the outage: %+v", res)

	require.NoError(t, m.Restart())
	waitBack(t, lim, 3*time.Second)
	got := tr.list()
	require.Len(t, got, 2, "transitions = %+v, want down and back", got)
	require.False(t, got[1].Down, "transitions = %+v, want down and back", got)
}
