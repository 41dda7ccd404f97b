package redlimit

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/redlimit/redlimit/internal/redistest"
)

// keyHook counts the commands sent to Redis that name a given substring
// (the limited key's hash tag), so a test can tell whether decisions
// touched Redis; the monitor's probes use a key of their own.
type keyHook struct {
	match string
	n     atomic.Int64
}

func (h *keyHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *keyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
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
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if res, err := lim.Allow(ctx, "user"); err != nil || res.Degraded {
		t.Fatalf("healthy: %+v, %v", res, err)
	}

	healthy := hook.n.Load() // EVALSHA, and EVAL after NOSCRIPT

	m.Close()
	for i := range 100 {
		res, err := lim.Allow(ctx, "user")
		if err != nil || !res.Allowed || !res.Degraded {
			t.Fatalf("call %d during the outage: %+v, %v; want an allowed, degraded result", i, res, err)
		}
	}
	if got := hook.n.Load() - healthy; got != 1 {
		t.Errorf("%d commands went to Redis during the outage, want 1 (the one that found it)", got)
	}
	if got := tr.list(); len(got) != 1 || !got[0].Down || got[0].Err == nil || got[0].Strategy != FixedWindow {
		t.Fatalf("transitions = %+v, want one Down with its error", got)
	}

	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for {
		res, err := lim.Allow(ctx, "user")
		if err != nil {
			t.Fatal(err)
		}
		if !res.Degraded {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still degraded 3s after Redis came back")
		}
		time.Sleep(5 * time.Millisecond)
	}
	got := tr.list()
	if len(got) != 2 || got[1].Down || got[1].Outage <= 0 {
		t.Fatalf("transitions = %+v, want Down then back with the outage's length", got)
	}
	if err := lim.Close(); err != nil {
		t.Fatal(err)
	}
	if err := lim.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := lim.Allow(ctx, "user"); !errors.Is(err, ErrClosed) {
		t.Fatalf("Allow after Close = %v, want ErrClosed", err)
	}
	mustErrorIs(t, lim.Wait(ctx, "user"), ErrClosed)
	mustErrorIs(t, lim.Reset(ctx, "user"), ErrClosed)
}

// Close during an outage stops the monitor.
func TestCloseStopsMonitor(t *testing.T) {
	verifyNoLeak(t)
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	lim, err := NewTokenBucket(rdb, PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if res, err := lim.Allow(context.Background(), "k"); err != nil || !res.Degraded {
		t.Fatalf("%+v, %v", res, err)
	}
	lim.Close()
	rdb.Close()
}

// What is not an outage never switches to the fallback.
func TestNotAnOutage(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	var tr transitions
	lim := newLimiter(t, rdb, TokenBucket, PerSecond(2), WithOnTransition(tr.record))
	ctx := context.Background()

	// Denials are answers.
	for i := range 50 {
		res, err := lim.Allow(ctx, "k")
		if err != nil || res.Degraded || (i >= 2 && res.Allowed) {
			t.Fatalf("call %d: %+v, %v", i, res, err)
		}
	}
	// The caller's context ending is the caller's business.
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := lim.Allow(cancelled, "k"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled ctx: err = %v", err)
	}
	// A bug (here a key of the wrong type) is an error, loudly.
	if err := rdb.HSet(ctx, lim.stateKey("bad"), "x", "1").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := lim.Allow(ctx, "bad")
	if err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("wrong type: err = %v, want the WRONGTYPE error", err)
	}
	if got := tr.list(); len(got) != 0 {
		t.Fatalf("transitions = %+v, want none", got)
	}
	if lim.rescue.anyDown() {
		t.Fatal("marked down")
	}
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
					if !errors.Is(err, tt.err) {
						t.Fatalf("call %d: err = %v, want %v", i, err, tt.err)
					}
					if !strings.Contains(err.Error(), "connect") {
						t.Errorf("err %q does not tell the cause", err)
					}
					continue
				}
				if err != nil || res.Allowed != tt.allowed || !res.Degraded {
					t.Fatalf("call %d: %+v, %v; want allowed=%v, degraded", i, res, err, tt.allowed)
				}
				if !res.Allowed && res.RetryAfter <= 0 {
					t.Errorf("denied without RetryAfter: %+v", res)
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
			for i := range tt.admitted {
				res, err := lim.Allow(ctx, "k")
				if err != nil || !res.Allowed || !res.Degraded {
					t.Fatalf("call %d: %+v, %v", i, res, err)
				}
				if tt.s == LeakyBucket {
					want := time.Duration(i) * 100 * time.Millisecond
					if d := res.Delay; d < want-time.Millisecond || d > want {
						t.Errorf("call %d: Delay = %v, want about %v", i, d, want)
					}
				}
			}
			res, err := lim.Allow(ctx, "k")
			if err != nil || res.Allowed {
				t.Fatalf("over the burst: %+v, %v", res, err)
			}
			if d := res.RetryAfter; d > tt.retryAfter || d < tt.retryAfter-5*time.Millisecond {
				t.Errorf("RetryAfter = %v, want about %v", d, tt.retryAfter)
			}
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
					if err != nil {
						t.Fatal(err)
					}
					if res.Allowed {
						total++
					}
				}
			}
			if total != 100 {
				t.Fatalf("4 instances admitted %d at once, want the global 100", total)
			}
		})
	}
}

// A flood of distinct keys during an outage cannot exhaust memory.
func TestFallbackKeysBounded(t *testing.T) {
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
		if res, err := lim.Allow(ctx, fmt.Sprintf("ip:10.%d.%d.%d", i>>16, (i>>8)&255, i&255)); err != nil || !res.Degraded {
			t.Fatalf("key %d: %+v, %v", i, res, err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	held := lim.rescue.locals.len()
	if held > 100_000 {
		t.Fatalf("the fallback holds %d keys, want at most 100,000", held)
	}
	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d keys offered, %d held, heap grew %.1f MB (%d bytes a key)", keys, held, float64(grew)/1e6, grew/int64(held))
	if grew > 40<<20 {
		t.Fatalf("heap grew %d MB, want at most the documented 40 MB", grew>>20)
	}
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
	if err != nil {
		t.Fatal(err)
	}
	m.Close()
	if res, err := lim.Allow(context.Background(), "k"); err != nil || !res.Degraded {
		t.Fatalf("%+v, %v", res, err)
	}
	if err := m.Restart(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("Close from the hook did not return")
	}
	if _, err := lim.Allow(context.Background(), "k"); !errors.Is(err, ErrClosed) {
		t.Fatalf("after Close: %v", err)
	}
}
