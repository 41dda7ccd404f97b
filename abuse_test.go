package redlimit

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
			got := seen.list()[2].DeniedBy
			assert.Equal(t, DeniedByBlock, got, "a call during the block was denied by %v, want block", got)
			got = seen.list()[1].DeniedBy
			assert.Equal(t, DeniedByLimit, got, "the first denial was by %v, want limit", got)
			// Reset lifts a block.
			res, _ := lim.Allow(context.Background(), "k")
			require.False(t, res.Allowed, "allowed over the limit")
			require.NoError(t, lim.Reset(context.Background(), "k"))
			res, err := lim.Allow(context.Background(), "k")
			require.NoError(t, err, "after Reset: %+v, %v", res, err)
			require.True(t, res.Allowed, "after Reset: %+v, %v", res, err)
		})
	}
}

// A block shorter than the limit's own wait lasts until the limit would
// allow the denied call again: a client that waits each RetryAfter is
// allowed then (it was denied by the limit, and blocked again).
func TestBlockShorterThanLimit(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			var seen decisions
			lim := newLimiter(t, b.rdb, s, Limit{Rate: 1, Period: time.Minute, Burst: 1},
				WithBlock(time.Second), WithObserver(seen.record))
			ctx := t.Context()
			res, err := lim.Allow(ctx, "k")
			require.NoError(t, err)
			require.True(t, res.Allowed, "%+v", res)
			denied, err := lim.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, denied.Allowed, "%+v", denied)
			require.Greater(t, denied.RetryAfter, time.Second, "the limit's own wait: %+v", denied)
			b.advance(500 * time.Millisecond)
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, res.Allowed, "%+v", res)
			assert.Equal(t, DeniedByBlock, seen.last().DeniedBy)
			assert.Equal(t, denied.RetryAfter-500*time.Millisecond, res.RetryAfter, "blocked: %+v", res)
			b.advance(res.RetryAfter) // (a call before it would be denied, and blocked anew)
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			assert.True(t, res.Allowed, "at RetryAfter: %+v", res)
		})
	}
}

// The block lasts d: a large n's denial says nothing of a smaller n,
// which, blocked, is told the block's time left, and once d is over is the
// limit's to decide, with the deny cache too (it denied the small call for
// the large call's 6 minutes); the large n is told its own 6 minutes.
func TestBlockLastsItsLength(t *testing.T) {
	for name, opts := range map[string][]Option{
		"without the deny cache": nil,
		"with the deny cache":    {WithDenyCache(100)},
	} {
		t.Run(name, func(t *testing.T) {
			b, _ := miniBackend(t)
			lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 100, Period: time.Hour, Burst: 100}, append(opts, WithBlock(time.Second))...)
			ctx := t.Context()
			res, err := lim.AllowN(ctx, "k", 50)
			require.NoError(t, err)
			require.True(t, res.Allowed, "%+v", res)
			denied, err := lim.AllowN(ctx, "k", 60)
			require.NoError(t, err)
			require.False(t, denied.Allowed, "%+v", denied)
			require.Equal(t, 6*time.Minute, denied.RetryAfter, "10 tokens more at 100 an hour")
			b.advance(500 * time.Millisecond)
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, res.Allowed, "blocked: %+v", res)
			assert.Equal(t, 500*time.Millisecond, res.RetryAfter, "blocked; 1 fits: the block's time left: %+v", res)
			res, err = lim.AllowN(ctx, "k", 60)
			require.NoError(t, err)
			require.False(t, res.Allowed, "blocked: %+v", res)
			assert.Equal(t, denied.RetryAfter-500*time.Millisecond, res.RetryAfter, "blocked until the 60 would fit: %+v", res)
			if opts != nil {
				time.Sleep(time.Second) // the cache's clock is the process's
			}
			b.advance(500 * time.Millisecond)
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			assert.True(t, res.Allowed, "the block is over, and 50 are left: %+v", res)
		})
	}
}

// resetAfterOne is ResetAfter after one event of a 1-per-second limit at a
// window start.
func resetAfterOne(s Strategy) time.Duration {
	switch s {
	case SlidingCounter:
		return 2 * time.Second
	case SubWindowCounter: // until a second after its sub-window (1/60 s, rounded up) ends
		return time.Second + 16667*time.Microsecond
	}
	return time.Second
}

// The deny cache answers denials without a round trip until Redis's
// RetryAfter, exactly, and never for fewer events than were denied.
func TestDenyCache(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rdb := bubbleClient(t)
		var trips atomic.Int64
		rdb.AddHook(countHook{n: &trips})
		var seen decisions
		lim := newLimiter(t, rdb, FixedWindow, PerSecond(2), WithDenyCache(100), WithObserver(seen.record))
		ctx := context.Background()
		_, err := lim.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err, "over the limit: %+v, %v", res, err)
		require.False(t, res.Allowed, "over the limit: %+v, %v", res, err)
		require.Equal(t, time.Second, res.RetryAfter, "over the limit: %+v, %v", res, err)
		before := trips.Load()
		time.Sleep(999 * time.Millisecond)
		for range 100 {
			res, err := lim.Allow(ctx, "k")
			require.NoError(t, err, "cached denial: %+v, %v; want RetryAfter 1ms", res, err)
			require.False(t, res.Allowed, "cached denial: %+v, %v; want RetryAfter 1ms", res, err)
			require.Equal(t, time.Millisecond, res.RetryAfter, "cached denial: %+v, %v; want RetryAfter 1ms", res, err)
			require.Zero(t, res.Remaining, "cached denial: %+v, %v; want RetryAfter 1ms", res, err)
		}
		got := seen.last().DeniedBy
		require.Equal(t, DeniedByDenyCache, got, "denied by %v, want deny-cache", got)
		gotTrips := trips.Load() - before
		require.Zero(t, gotTrips, "%d round trips for cached denials, want 0", gotTrips)
		// n = 0 reports from Redis, not from the cache.
		res, err = lim.AllowN(ctx, "k", 0)
		require.NoError(t, err, "n=0: %+v, %v", res, err)
		require.True(t, res.Allowed, "n=0: %+v, %v", res, err)
		require.NotEqual(t, before, trips.Load(), "n=0: %+v, %v", res, err)
		time.Sleep(time.Millisecond)
		res, err = lim.Allow(ctx, "k")
		require.NoError(t, err, "at RetryAfter: %+v, %v; want allowed by Redis", res, err)
		require.True(t, res.Allowed, "at RetryAfter: %+v, %v; want allowed by Redis", res, err)
		// An entry for n=2 does not deny n=1.
		res, _ = lim.AllowN(ctx, "k", 2)
		require.False(t, res.Allowed, "allowed 2 with 1 left")
		res, err = lim.Allow(ctx, "k")
		require.NoError(t, err, "n=1 after a denied n=2: %+v, %v; want allowed", res, err)
		require.True(t, res.Allowed, "n=1 after a denied n=2: %+v, %v; want allowed", res, err)
		// Reset clears this process's entry.
		res, _ = lim.Allow(ctx, "k")
		require.False(t, res.Allowed, "allowed over the limit")
		require.NoError(t, lim.Reset(ctx, "k"))
		res, err = lim.Allow(ctx, "k")
		require.NoError(t, err, "after Reset: %+v, %v", res, err)
		require.True(t, res.Allowed, "after Reset: %+v, %v", res, err)
	})
}

// A denial from the deny cache is Redis's, counted down: the policy's
// deciding rule and its limit, Remaining, and a ResetAfter that can be
// longer than RetryAfter (a bucket refills for longer than a token takes).
func TestDenyCacheKeepsRedisDenial(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rdb := bubbleClient(t)
		var trips atomic.Int64
		rdb.AddHook(countHook{n: &trips})
		p := newPolicy(t, rdb, []Rule{
			{Name: "second", Strategy: TokenBucket, Limit: PerSecond(10)},
			{Name: "hour", Strategy: FixedWindow, Limit: PerHour(2)},
		}, WithDenyCache(100))
		bucket := newLimiter(t, rdb, TokenBucket, Limit{Rate: 1, Period: time.Second, Burst: 10}, WithDenyCache(100))
		ctx := context.Background()
		for _, c := range []struct {
			name string
			lim  Limiter
			n    int // what the first call takes
		}{{"policy", p, 2}, {"token bucket", bucket, 10}} {
			res, err := c.lim.AllowN(ctx, c.name, c.n)
			require.NoError(t, err, "%s: %+v, %v", c.name, res, err)
			require.True(t, res.Allowed, "%s: %+v, %v", c.name, res, err)
			first, err := c.lim.Allow(ctx, c.name)
			require.NoError(t, err, "%s: %+v, %v", c.name, first, err)
			require.False(t, first.Allowed, "%s: over the limit: %+v", c.name, first)
			before := trips.Load()
			time.Sleep(100 * time.Millisecond)
			cached, err := c.lim.Allow(ctx, c.name)
			require.NoError(t, err, "%s: %+v, %v", c.name, cached, err)
			require.Equal(t, before, trips.Load(), "%s: the second denial went to Redis: %+v", c.name, cached)
			want := first
			want.RetryAfter -= 100 * time.Millisecond
			want.ResetAfter -= 100 * time.Millisecond
			want.RuleResetAfter -= 100 * time.Millisecond
			assert.Equal(t, want, cached, "%s: the cached denial, 100ms after Redis's %+v", c.name, first)
		}
	})
}

// countHook counts the commands sent to Redis, but the eviction
// sampler's INFO (a limiter's start sends one in the background).
type countHook struct {
	passHooks // only ProcessHook does something
	n         *atomic.Int64
}

func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if cmd.Name() != "info" {
			h.n.Add(1)
		}
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
				require.NoError(t, err)
				z, err := shadow.AllowN(ctx, "k", n)
				require.NoError(t, err)
				require.True(t, z.Allowed, "call %d: shadow mode denied", i)
				if !a.Allowed {
					wantDenied = append(wantDenied, i)
				}
				if z.Shadowed {
					gotShadowed = append(gotShadowed, i)
					d := shadowSeen.last()
					require.True(t, d.Shadowed, "call %d: observer saw %+v", i, d)
					require.Equal(t, DeniedByLimit, d.DeniedBy, "call %d: observer saw %+v", i, d)
					require.True(t, d.Allowed, "call %d: observer saw %+v", i, d)
				}
				b.advance(time.Duration(50+(i*37)%200) * time.Millisecond)
			}
			require.NotEmpty(t, wantDenied, "the sequence never reached the limit")
			require.Equal(t, fmt.Sprint(wantDenied), fmt.Sprint(gotShadowed), "shadowed calls %v, want the normal limiter's denials %v", gotShadowed, wantDenied)
		})
	}
}

// The three features on a real Redis.
func TestAbuseFeaturesRedis(t *testing.T) {
	b := realBackend(t)
	ctx := context.Background()
	t.Run("block", func(t *testing.T) {
		l := Limit{Rate: 1, Period: 100 * time.Millisecond}
		lim := newLimiter(t, b.rdb, SlidingLog, l, WithPrefix(prefixFor(t)), WithBlock(300*time.Millisecond))
		// The two calls must fall within one period (the block must stay
		// longer than the limit's own retry, so the period stays short);
		// on a loaded machine they may not: then again, on a new key.
		var (
			res Result
			err error
		)
		key := inOneWindow(t, b, SlidingLog, l, func(key string) {
			_, _ = lim.Allow(ctx, key) // the one event; the second call is the denial checked
			res, err = lim.Allow(ctx, key)
		})
		require.NoError(t, err, "denial with a block: %+v, %v; want RetryAfter about 300ms", res, err)
		require.False(t, res.Allowed, "denial with a block: %+v, %v; want RetryAfter about 300ms", res, err)
		require.GreaterOrEqual(t, res.RetryAfter, 290*time.Millisecond, "denial with a block: %+v, %v; want RetryAfter about 300ms", res, err)
		require.LessOrEqual(t, res.RetryAfter, 300*time.Millisecond, "denial with a block: %+v, %v; want RetryAfter about 300ms", res, err)
		checkTTL(t, b.rdb, lim.stateKey(key)+blockSuffix, 300*time.Millisecond)
		require.NoError(t, lim.Reset(ctx, key))
		n, _ := b.rdb.Exists(ctx, lim.stateKey(key)+blockSuffix).Result()
		require.Zero(t, n, "Reset left the block key")
	})
	t.Run("deny cache", func(t *testing.T) {
		var seen decisions
		// An hour: a window edge between the calls would admit the second.
		lim := newLimiter(t, b.rdb, FixedWindow, PerHour(1), WithPrefix(prefixFor(t)), WithDenyCache(10), WithObserver(seen.record))
		for range 2 { // the first allowed, the second denied by Redis (and remembered)
			_, err := lim.Allow(ctx, "k")
			require.NoError(t, err)
		}
		res, _ := lim.Allow(ctx, "k")
		require.False(t, res.Allowed, "%+v, denied by %v; want the deny cache", res, seen.last().DeniedBy)
		require.Equal(t, DeniedByDenyCache, seen.last().DeniedBy, "%+v, denied by %v; want the deny cache", res, seen.last().DeniedBy)
	})
	t.Run("shadow", func(t *testing.T) {
		lim := newLimiter(t, b.rdb, TokenBucket, PerMinute(1), WithPrefix(prefixFor(t)), WithShadow())
		_, err := lim.Allow(ctx, "k")
		require.NoError(t, err)
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err, "%+v, %v; want allowed and shadowed", res, err)
		require.True(t, res.Allowed, "%+v, %v; want allowed and shadowed", res, err)
		require.True(t, res.Shadowed, "%+v, %v; want allowed and shadowed", res, err)
	})
}

// TestDenyCacheHotKeyRedis hammers one key at far past its limit from 64
// goroutines on a real Redis, with and without the deny cache, and
// compares Redis round trips per denied call, admissions and throughput.
// The limit is low (5/s) so that the key is hot even when a loaded machine
// makes few calls a second.
func TestDenyCacheHotKeyRedis(t *testing.T) {
	b := realBackend(t)
	const rate, run = 5, 2 * time.Second
	limit := PerSecond(rate)
	type outcome struct {
		calls, admitted, trips int64
		elapsed                time.Duration
		lost                   time.Duration // before the first call returned, and see stalled
	}
	measure := func(cache int) outcome {
		var trips atomic.Int64
		opts := redis.NewClient(b.rdb.(*redis.Client).Options()).Options()
		rdb := redis.NewClient(opts)
		defer rdb.Close()
		rdb.AddHook(countHook{n: &trips})
		lim := newLimiter(t, rdb, TokenBucket, limit, WithPrefix(prefixFor(t)+fmt.Sprint(cache)), WithDenyCache(cache))
		var calls, admitted atomic.Int64
		var mu sync.Mutex
		var done []time.Duration
		var wg sync.WaitGroup
		start := time.Now()
		for range 64 {
			wg.Go(func() {
				var mine []time.Duration
				defer func() { mu.Lock(); done = append(done, mine...); mu.Unlock() }()
				for time.Since(start) < run {
					res, err := lim.Allow(context.Background(), "hot")
					mine = append(mine, time.Since(start))
					if !assert.NoError(t, err, "%+v, %v", res, err) || !assert.False(t, res.Degraded, "%+v, %v", res, err) {
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
		elapsed := time.Since(start)
		slices.Sort(done)
		// The bucket's time starts at the first call, which the first call
		// to return bounds.
		return outcome{calls.Load(), admitted.Load(), trips.Load(), elapsed, done[0] + stalled(done, done[0], run, time.Second)}
	}
	without, with := measure(0), measure(10_000)
	perDenied := func(o outcome) float64 { return float64(o.trips-o.admitted) / float64(o.calls-o.admitted) }
	tput := func(o outcome) float64 { return float64(o.calls) / o.elapsed.Seconds() }
	offered := tput(without) / rate
	t.Logf("without cache: %d calls (%.0f/s, %.0fx the limit), %d admitted, %.3f round trips per denied call",
		without.calls, tput(without), offered, without.admitted, perDenied(without))
	t.Logf("with cache:    %d calls (%.0f/s), %d admitted, %.5f round trips per denied call",
		with.calls, tput(with), with.admitted, perDenied(with))
	t.Logf("round trips per denied call fell %.0fx; throughput rose %.1fx", perDenied(without)/perDenied(with), tput(with)/tput(without))
	assert.GreaterOrEqual(t, offered, 50.0, "offered only %.0fx the limit; the test needs a hot key", offered)
	r := perDenied(without) / perDenied(with)
	assert.GreaterOrEqual(t, r, 10.0, "round trips per denied call fell only %.1fx, want at least 10x", r)
	r = tput(with) / tput(without)
	assert.GreaterOrEqual(t, r, 2.0, "throughput rose only %.1fx", r)
	// Both admit the bucket's burst plus its rate over the run (less the
	// time before the first call returned and what a bucket nobody called
	// for more than the second it takes to fill could not admit: nearly 0 on
	// a quiet machine), and never more than over the time the run took.
	burst := capacity(limit, TokenBucket)
	for _, o := range []outcome{without, with} {
		// Whole events only: a refill of 8.7 tokens admits 8.
		low := float64(burst) + math.Floor(rate*(run-o.lost-run/8).Seconds())
		high := float64(burst) + rate*o.elapsed.Seconds()
		assert.GreaterOrEqual(t, float64(o.admitted), low, "admitted %d in %v, want about %d (%d burst + %d/s), at least %.1f (%v without calls)", o.admitted, run, burst+rate*2, burst, rate, low, o.lost)
		assert.LessOrEqual(t, float64(o.admitted), high, "admitted %d in %v, want about %d (%d burst + %d/s), at most %.1f", o.admitted, o.elapsed, burst+rate*2, burst, rate, high)
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
			_, err := old.AllowN(ctx, "k", 10)
			require.NoError(t, err)
			lowered := newLimiter(t, b.rdb, s, Limit{Rate: 5, Period: time.Second, Burst: 5}, WithBlock(time.Minute))
			res, err := lowered.AllowN(ctx, "k", 0)
			require.NoError(t, err, "n=0 over a lowered limit: %+v, %v; want a report: allowed, 0 remaining", res, err)
			require.True(t, res.Allowed, "n=0 over a lowered limit: %+v, %v; want a report: allowed, 0 remaining", res, err)
			require.Zero(t, res.Remaining, "n=0 over a lowered limit: %+v, %v; want a report: allowed, 0 remaining", res, err)
			require.Zero(t, res.RetryAfter, "n=0 over a lowered limit: %+v, %v; want a report: allowed, 0 remaining", res, err)
			n, _ := b.rdb.Exists(ctx, lowered.stateKey("k")+blockSuffix).Result()
			require.Zero(t, n, "n=0 started a block")
		})
	}
}

// blockScene plays, on lim (WithBlock(2s)) and twin (the same limit, no
// block, another prefix), 10 calls of one a second apart from a window's
// start on a limit of 10 a minute, then a denied AllowN(2) at 10 s, which
// blocks lim's key until 12 s; advance moves the clock.
func blockScene(t *testing.T, advance func(time.Duration), lim, twin Limiter, key string) {
	t.Helper()
	ctx := context.Background()
	for i := range 10 {
		for _, l := range []Limiter{lim, twin} {
			res, err := l.Allow(ctx, key)
			require.NoError(t, err)
			require.True(t, res.Allowed, "call %d: %+v", i, res)
		}
		advance(time.Second)
	}
	for _, l := range []Limiter{lim, twin} {
		res, err := l.AllowN(ctx, key, 2)
		require.NoError(t, err)
		require.False(t, res.Allowed, "AllowN(2) at 10s: %+v", res)
	}
}

// blockLimit is blockScene's limit: 10 a minute (a bucket: 10 at once).
var blockLimit = Limit{Rate: 10, Period: time.Minute, Burst: 10}

// A call denied by a block is told its own RetryAfter: the block's time
// left, or, if later, when the limit would admit this call's n (the
// limit's answer to it, as a limiter without the block gives it), so that
// a client that waits it is not denied again by the limit (and blocked
// again). ResetAfter and a look (n = 0) run to the later of the block's
// end and the limit's reset. The AllowN(2) that set the block said
// nothing about an AllowN(10): it was told 2s (buckets), 50s (sliding
// log) or 61s (sliding counter), and denied and blocked again after
// waiting it. (The fixed window was right: every n waits for its end.)
func TestBlockRetryAfterOwnN(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			ctx := t.Context()
			lim := newLimiter(t, b.rdb, s, blockLimit, WithBlock(2*time.Second))
			twin := newLimiter(t, b.rdb, s, blockLimit, WithPrefix("twin"))
			blockScene(t, b.advance, lim, twin, "k")
			b.advance(time.Second) // 1s of the block left
			const left = time.Second

			own, err := twin.AllowN(ctx, "k", 10)
			require.NoError(t, err)
			require.False(t, own.Allowed, "the limit's answer: %+v", own)
			res, err := lim.AllowN(ctx, "k", 10)
			require.NoError(t, err)
			assert.Equal(t, Result{Limit: res.Limit, RetryAfter: max(left, own.RetryAfter), ResetAfter: max(left, own.ResetAfter), RuleResetAfter: max(left, own.ResetAfter)}, res,
				"blocked AllowN(10); the limit alone answers %+v", own)

			look, err := twin.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			res0, err := lim.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			assert.Equal(t, Result{Allowed: true, Limit: res0.Limit, ResetAfter: max(left, look.ResetAfter), RuleResetAfter: max(left, look.ResetAfter)}, res0,
				"a look during the block; the limit alone reports %+v", look)

			b.advance(res.RetryAfter)
			res, err = lim.AllowN(ctx, "k", 10)
			require.NoError(t, err)
			assert.True(t, res.Allowed, "AllowN(10) after waiting its RetryAfter: %+v", res)
		})
	}
}

// A call a block denies writes nothing, also one the limit would admit
// (the checks run for its RetryAfter), and is told the block's time left.
func TestBlockedCallWritesNothing(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			ctx := t.Context()
			lim := newLimiter(t, b.rdb, s, blockLimit, WithBlock(2*time.Second))
			res, err := lim.AllowN(ctx, "k", 5)
			require.NoError(t, err)
			require.True(t, res.Allowed, "%+v", res)
			res, err = lim.AllowN(ctx, "k", 6)
			require.NoError(t, err)
			require.False(t, res.Allowed, "6 of 5 left: %+v", res)
			b.advance(500 * time.Millisecond)
			before := snapshot(t, b.rdb, lim.stateKey("k"))
			for _, n := range []int{1, 2, 5} {
				res, err = lim.AllowN(ctx, "k", n)
				require.NoError(t, err)
				assert.False(t, res.Allowed, "AllowN(%d) during the block: %+v", n, res)
				assert.Equal(t, 1500*time.Millisecond, res.RetryAfter, "AllowN(%d): the block's time left", n)
				assert.Equal(t, before, snapshot(t, b.rdb, lim.stateKey("k")), "AllowN(%d) during the block wrote", n)
			}
		})
	}
}

// A Policy's blocked call is told its own RetryAfter too, its Rule the
// rule that decides it (the block's, the first rule, when the block's
// time left is the longer), and writes in no rule.
func TestPolicyBlockRetryAfterOwnN(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	rules := []Rule{
		{Name: "sec", Strategy: TokenBucket, Limit: PerSecond(10)},
		{Name: "min", Strategy: SlidingLog, Limit: PerMinute(20)},
	}
	p := newPolicy(t, b.rdb, rules, WithBlock(2*time.Second))
	twin := newPolicy(t, b.rdb, rules, WithPrefix("twin"))
	for range 3 { // at 0, 1 and 2s: "min" has 5 left until 60s
		for _, l := range []Limiter{p, twin} {
			res, err := l.AllowN(ctx, "k", 5)
			require.NoError(t, err)
			require.True(t, res.Allowed, "%+v", res)
		}
		b.advance(time.Second)
	}
	for _, l := range []Limiter{p, twin} {
		res, err := l.AllowN(ctx, "k", 6)
		require.NoError(t, err)
		require.False(t, res.Allowed, "6 of 5 left at 3s: %+v", res)
	}
	b.advance(time.Second) // p's block: 1s left
	state := func() []string {
		return []string{snapshot(t, b.rdb, p.stateKey("k", &p.own.rules[0])), snapshot(t, b.rdb, p.stateKey("k", &p.own.rules[1]))}
	}
	before := state()
	res, err := p.AllowN(ctx, "k", 5)
	require.NoError(t, err)
	assert.False(t, res.Allowed, "blocked: %+v", res)
	assert.Equal(t, time.Second, res.RetryAfter, "5 fit: the block's time left")
	assert.Equal(t, "sec", res.Rule, "the block decided")
	own, err := twin.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	require.False(t, own.Allowed, "%+v", own)
	require.Equal(t, 56*time.Second, own.RetryAfter, "10 fit once the calls at 0s leave \"min\", at 60s")
	res, err = p.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	assert.False(t, res.Allowed, "blocked: %+v", res)
	assert.Equal(t, own.RetryAfter, res.RetryAfter, "the limit's answer: %+v", own)
	assert.Equal(t, "min", res.Rule, "\"min\" decided")
	assert.Equal(t, before, state(), "a blocked call wrote")
}

// The deny cache keeps a blocked call's denial until its own RetryAfter,
// and answers the same n with it counted down: Redis's answer. (It kept
// the block's time left, the AllowN(2)'s, for an AllowN(10).)
func TestBlockDenyCache(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				rdb := bubbleClient(t)
				var trips atomic.Int64
				rdb.AddHook(countHook{n: &trips})
				var seen decisions
				lim := newLimiter(t, rdb, s, blockLimit, WithBlock(2*time.Second), WithDenyCache(100), WithObserver(seen.record))
				twin := newLimiter(t, rdb, s, blockLimit, WithPrefix("twin"))
				blockScene(t, time.Sleep, lim, twin, "k")
				time.Sleep(time.Second) // 1s of the block left
				ctx := context.Background()
				own, err := twin.AllowN(ctx, "k", 10)
				require.NoError(t, err)
				first, err := lim.AllowN(ctx, "k", 10)
				require.NoError(t, err)
				require.False(t, first.Allowed)
				assert.Equal(t, max(time.Second, own.RetryAfter), first.RetryAfter, "blocked AllowN(10); the limit alone answers %+v", own)
				before := trips.Load()
				time.Sleep(100 * time.Millisecond)
				cached, err := lim.AllowN(ctx, "k", 10)
				require.NoError(t, err)
				require.Equal(t, DeniedByDenyCache, seen.last().DeniedBy, "%+v", cached)
				require.Equal(t, before, trips.Load(), "the cached denial went to Redis")
				want := first
				want.RetryAfter -= 100 * time.Millisecond
				want.ResetAfter -= 100 * time.Millisecond
				want.RuleResetAfter -= 100 * time.Millisecond
				assert.Equal(t, want, cached, "100ms after Redis's %+v", first)
				time.Sleep(cached.RetryAfter)
				res, err := lim.AllowN(ctx, "k", 10)
				require.NoError(t, err)
				assert.True(t, res.Allowed, "AllowN(10) after waiting its RetryAfter: %+v", res)
			})
		})
	}
}

// Issue 10, item 9: AllowN(0) on a blocked key reports, never denies.
func TestBlockedKeyReportsWithZero(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, PerSecond(1), WithBlock(time.Minute))
	ctx := t.Context()
	for range 2 {
		_, err := lim.Allow(ctx, "k")
		require.NoError(t, err)
	}
	res, err := lim.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	assert.True(t, res.Allowed, "n = 0 on a blocked key: %+v", res)
	assert.Equal(t, 0, res.Remaining)
	assert.Equal(t, time.Minute, res.ResetAfter, "the block's time left")
	res, err = lim.Allow(ctx, "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed, "still blocked for n = 1")
}
