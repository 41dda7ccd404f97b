package redlimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
)

// decisions records what an observer saw.
type decisions = recorder[Decision]

// Penalty blocking: once denied, a key is denied for the block's length,
// exactly, with RetryAfter the time left; Reset lifts it.
func TestBlock(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			var seen decisions
			lim := newLimiter(t, b.rdb, s, Limit{Rate: 1, Period: time.Second, Burst: 1},
				WithBlock(10*time.Second), WithObserver(seen.record))
			ms := time.Millisecond
			run(t, b, lim, "k", []step{
				{n: 1, allowed: true, remaining: 0, reset: resetAfterOne(s)},
				{n: 1, allowed: false, remaining: 0, retry: 10 * time.Second, reset: 10 * time.Second},
				{advance: 5 * time.Second, n: 1, allowed: false, remaining: 0, retry: 5 * time.Second, reset: 5 * time.Second},
				{advance: 5*time.Second - ms, n: 1, allowed: false, remaining: 0, retry: ms, reset: ms},
				{advance: ms, n: 1, allowed: true, remaining: 0, reset: resetAfterOne(s)},
			})
			if got := seen.list()[2].DeniedBy; got != DeniedByBlock {
				t.Errorf("a call during the block was denied by %v, want block", got)
			}
			if got := seen.list()[1].DeniedBy; got != DeniedByLimit {
				t.Errorf("the first denial was by %v, want limit", got)
			}
			// Reset lifts a block.
			if res, _ := lim.Allow(context.Background(), "k"); res.Allowed {
				t.Fatal("allowed over the limit")
			}
			if err := lim.Reset(context.Background(), "k"); err != nil {
				t.Fatal(err)
			}
			if res, err := lim.Allow(context.Background(), "k"); err != nil || !res.Allowed {
				t.Fatalf("after Reset: %+v, %v", res, err)
			}
		})
	}
}

// resetAfterOne is ResetAfter after one event of a 1-per-second limit at a
// window start.
func resetAfterOne(s Strategy) time.Duration {
	if s == SlidingCounter {
		return 2 * time.Second
	}
	return time.Second
}

// The deny cache answers denials without a round trip until Redis's
// RetryAfter, exactly, and never for fewer events than were denied.
func TestDenyCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rdb := bubbleClient(t)
		var trips atomic.Int64
		rdb.AddHook(countHook{&trips})
		var seen decisions
		lim := newLimiter(t, rdb, FixedWindow, PerSecond(2), WithDenyCache(100), WithObserver(seen.record))
		ctx := context.Background()
		if _, err := lim.AllowN(ctx, "k", 2); err != nil {
			t.Fatal(err)
		}
		res, err := lim.Allow(ctx, "k")
		if err != nil || res.Allowed || res.RetryAfter != time.Second {
			t.Fatalf("over the limit: %+v, %v", res, err)
		}
		before := trips.Load()
		time.Sleep(999 * time.Millisecond)
		for range 100 {
			res, err := lim.Allow(ctx, "k")
			if err != nil || res.Allowed || res.RetryAfter != time.Millisecond || res.Remaining != 0 {
				t.Fatalf("cached denial: %+v, %v; want RetryAfter 1ms", res, err)
			}
		}
		if got := seen.last().DeniedBy; got != DeniedByDenyCache {
			t.Fatalf("denied by %v, want deny-cache", got)
		}
		if got := trips.Load() - before; got != 0 {
			t.Fatalf("%d round trips for cached denials, want 0", got)
		}
		// n = 0 reports from Redis, not from the cache.
		if res, err := lim.AllowN(ctx, "k", 0); err != nil || !res.Allowed || trips.Load() == before {
			t.Fatalf("n=0: %+v, %v", res, err)
		}
		time.Sleep(time.Millisecond)
		if res, err := lim.Allow(ctx, "k"); err != nil || !res.Allowed {
			t.Fatalf("at RetryAfter: %+v, %v; want allowed by Redis", res, err)
		}
		// An entry for n=2 does not deny n=1.
		if res, _ := lim.AllowN(ctx, "k", 2); res.Allowed {
			t.Fatal("allowed 2 with 1 left")
		}
		if res, err := lim.Allow(ctx, "k"); err != nil || !res.Allowed {
			t.Fatalf("n=1 after a denied n=2: %+v, %v; want allowed", res, err)
		}
		// Reset clears this process's entry.
		if res, _ := lim.Allow(ctx, "k"); res.Allowed {
			t.Fatal("allowed over the limit")
		}
		if err := lim.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if res, err := lim.Allow(ctx, "k"); err != nil || !res.Allowed {
			t.Fatalf("after Reset: %+v, %v", res, err)
		}
	})
}

// countHook counts the commands sent to Redis.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

// Shadow mode admits everything and reports exactly the denials the
// normal limiter makes on the same sequence.
func TestShadow(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			var normalSeen, shadowSeen decisions
			l := Limit{Rate: 3, Period: time.Second, Burst: 3}
			normal := newLimiter(t, b.rdb, s, l, WithPrefix("normal"), WithObserver(normalSeen.record))
			shadow := newLimiter(t, b.rdb, s, l, WithPrefix("shadow"), WithShadow(), WithObserver(shadowSeen.record))
			ctx := context.Background()
			var wantDenied, gotShadowed []int
			for i := range 60 {
				n := 1 + i%2
				a, err := normal.AllowN(ctx, "k", n)
				if err != nil {
					t.Fatal(err)
				}
				z, err := shadow.AllowN(ctx, "k", n)
				if err != nil {
					t.Fatal(err)
				}
				if !z.Allowed {
					t.Fatalf("call %d: shadow mode denied", i)
				}
				if !a.Allowed {
					wantDenied = append(wantDenied, i)
				}
				if z.Shadowed {
					gotShadowed = append(gotShadowed, i)
					if d := shadowSeen.last(); !d.Shadowed || d.DeniedBy != DeniedByLimit || !d.Allowed {
						t.Fatalf("call %d: observer saw %+v", i, d)
					}
				}
				b.advance(time.Duration(50+(i*37)%200) * time.Millisecond)
			}
			if len(wantDenied) == 0 {
				t.Fatal("the sequence never reached the limit")
			}
			if fmt.Sprint(gotShadowed) != fmt.Sprint(wantDenied) {
				t.Fatalf("shadowed calls %v, want the normal limiter's denials %v", gotShadowed, wantDenied)
			}
		})
	}
}

// The three features on a real Redis.
func TestAbuseFeaturesRedis(t *testing.T) {
	b := realBackend(t)
	ctx := context.Background()
	t.Run("block", func(t *testing.T) {
		lim := newLimiter(t, b.rdb, SlidingLog, Limit{Rate: 1, Period: 100 * time.Millisecond}, WithPrefix(prefixFor(t)), WithBlock(300*time.Millisecond))
		lim.Allow(ctx, "k")
		res, err := lim.Allow(ctx, "k")
		if err != nil || res.Allowed || res.RetryAfter < 290*time.Millisecond || res.RetryAfter > 300*time.Millisecond {
			t.Fatalf("denial with a block: %+v, %v; want RetryAfter about 300ms", res, err)
		}
		checkTTL(t, b.rdb, lim.stateKey("k")+blockSuffix, 300*time.Millisecond)
		if err := lim.Reset(ctx, "k"); err != nil {
			t.Fatal(err)
		}
		if n, _ := b.rdb.Exists(ctx, lim.stateKey("k")+blockSuffix).Result(); n != 0 {
			t.Fatal("Reset left the block key")
		}
	})
	t.Run("deny cache", func(t *testing.T) {
		var seen decisions
		lim := newLimiter(t, b.rdb, FixedWindow, PerMinute(1), WithPrefix(prefixFor(t)), WithDenyCache(10), WithObserver(seen.record))
		lim.Allow(ctx, "k")
		lim.Allow(ctx, "k")
		if res, _ := lim.Allow(ctx, "k"); res.Allowed || seen.last().DeniedBy != DeniedByDenyCache {
			t.Fatalf("%+v, denied by %v; want the deny cache", res, seen.last().DeniedBy)
		}
	})
	t.Run("shadow", func(t *testing.T) {
		lim := newLimiter(t, b.rdb, TokenBucket, PerMinute(1), WithPrefix(prefixFor(t)), WithShadow())
		lim.Allow(ctx, "k")
		if res, err := lim.Allow(ctx, "k"); err != nil || !res.Allowed || !res.Shadowed {
			t.Fatalf("%+v, %v; want allowed and shadowed", res, err)
		}
	})
}

// TestDenyCacheHotKeyRedis hammers one key at far past its limit from 64
// goroutines on a real Redis, with and without the deny cache, and
// compares Redis round trips per denied call, admissions and throughput.
func TestDenyCacheHotKeyRedis(t *testing.T) {
	b := realBackend(t)
	type outcome struct {
		calls, admitted, trips int64
		elapsed                time.Duration
	}
	measure := func(cache int) outcome {
		var trips atomic.Int64
		opts := redis.NewClient(b.rdb.(*redis.Client).Options()).Options()
		rdb := redis.NewClient(opts)
		defer rdb.Close()
		rdb.AddHook(countHook{&trips})
		limit := PerSecond(20)
		lim := newLimiter(t, rdb, TokenBucket, limit, WithPrefix(prefixFor(t)+fmt.Sprint(cache)), WithDenyCache(cache))
		var calls, admitted atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range 64 {
			wg.Go(func() {
				for time.Since(start) < 2*time.Second {
					res, err := lim.Allow(context.Background(), "hot")
					if err != nil || res.Degraded {
						t.Errorf("%+v, %v", res, err)
						return
					}
					calls.Add(1)
					if res.Allowed {
						admitted.Add(1)
					}
				}
			})
		}
		wg.Wait()
		return outcome{calls.Load(), admitted.Load(), trips.Load(), time.Since(start)}
	}
	without, with := measure(0), measure(10_000)
	perDenied := func(o outcome) float64 { return float64(o.trips-o.admitted) / float64(o.calls-o.admitted) }
	tput := func(o outcome) float64 { return float64(o.calls) / o.elapsed.Seconds() }
	offered := tput(without) / 20
	t.Logf("without cache: %d calls (%.0f/s, %.0fx the limit), %d admitted, %.3f round trips per denied call",
		without.calls, tput(without), offered, without.admitted, perDenied(without))
	t.Logf("with cache:    %d calls (%.0f/s), %d admitted, %.5f round trips per denied call",
		with.calls, tput(with), with.admitted, perDenied(with))
	t.Logf("round trips per denied call fell %.0fx; throughput rose %.1fx", perDenied(without)/perDenied(with), tput(with)/tput(without))
	if offered < 50 {
		t.Errorf("offered only %.0fx the limit; the test needs a hot key", offered)
	}
	if r := perDenied(without) / perDenied(with); r < 10 {
		t.Errorf("round trips per denied call fell only %.1fx, want at least 10x", r)
	}
	if r := tput(with) / tput(without); r < 2 {
		t.Errorf("throughput rose only %.1fx", r)
	}
	// Both admit the bucket's burst plus its rate over the run.
	for _, o := range []outcome{without, with} {
		if o.admitted < 55 || o.admitted > 62 {
			t.Errorf("admitted %d in 2s, want about 60 (20 burst + 20/s)", o.admitted)
		}
	}
}

// n = 0 only reports: after a limit was lowered (state is shared across
// Rate changes) it reports 0 remaining, and never starts a block.
func TestReportNeverBlocks(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			ctx := context.Background()
			old := newLimiter(t, b.rdb, s, Limit{Rate: 10, Period: time.Second, Burst: 10})
			if _, err := old.AllowN(ctx, "k", 10); err != nil {
				t.Fatal(err)
			}
			lowered := newLimiter(t, b.rdb, s, Limit{Rate: 5, Period: time.Second, Burst: 5}, WithBlock(time.Minute))
			res, err := lowered.AllowN(ctx, "k", 0)
			if err != nil || !res.Allowed || res.Remaining != 0 || res.RetryAfter != 0 {
				t.Fatalf("n=0 over a lowered limit: %+v, %v; want a report: allowed, 0 remaining", res, err)
			}
			if n, _ := b.rdb.Exists(ctx, lowered.stateKey("k")+blockSuffix).Result(); n != 0 {
				t.Fatal("n=0 started a block")
			}
		})
	}
}

// The deny cache stays within its size under a flood of denied keys.
func TestDenyCacheBounded(t *testing.T) {
	c := newDenyCache(lruShards * 10)
	for i := range 10_000 {
		c.remember(fmt.Sprint("k", i), 1, 0, time.Hour, 0)
	}
	n := 0
	for i := range c.shards {
		if got := len(c.shards[i].until); got > 10 {
			t.Fatalf("shard %d holds %d entries, want at most 10", i, got)
		}
		n += len(c.shards[i].until)
	}
	if n == 0 {
		t.Fatal("the cache holds nothing")
	}
}
