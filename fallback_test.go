package redlimit

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
	"github.com/redlimit/redlimit/internal/testlane"
)

// fallbackMemoryRules returns a policy of n rules (token buckets of
// different Periods, so that each has its own state and stand-in).
func fallbackMemoryRules(n int) []Rule {
	rules := make([]Rule, n)
	for i := range rules {
		rules[i] = Rule{Strategy: TokenBucket, Limit: Limit{Rate: 10, Period: time.Duration(i+1) * time.Second}}
	}
	return rules
}

// heapInUse returns the heap's live bytes after a collection.
func heapInUse() int64 {
	var ms runtime.MemStats
	runtime.GC()
	runtime.GC() // the second frees what the first's finalizers and sweeps left
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// With Redis down and the default options, a flood of distinct keys grows
// the heap by less than 40 MB however many rules decide each key: the
// fallback bounds its stand-ins (one per rule per key), not only its keys
// (with 16 rules it held 100,000 keys of 16 stand-ins: 251 MB). Each case
// offers more keys than a bound by keys alone would keep under 40 MB (at
// 624 and 2,514 bytes a key), and fewer than 300,000, which took minutes
// under -race; TestFallbackKeysBounded floods a single rule with a million.
// Not parallel: it measures the whole heap.
func TestFallbackMemoryBounded(t *testing.T) {
	testlane.MarkHeavy(t) // as TestFallbackKeysBounded: serial in its lane, so the heap is its own
	if testing.Short() {
		t.Skip("100,000 keys")
	}
	for _, c := range []struct{ rules, keys int }{{3, 100_000}, {MaxRules, 40_000}} {
		rules, keys := c.rules, c.keys
		t.Run(strconv.Itoa(rules)+"rules", func(t *testing.T) {
			m := miniredis.RunT(t)
			rdb := tunedClient(t, m.Addr())
			p := newPolicy(t, rdb, fallbackMemoryRules(rules), WithPingInterval(time.Hour))
			m.Close()
			ctx := context.Background()
			before := heapInUse()
			buf := []byte("ip:10.")
			for i := range keys {
				key := string(strconv.AppendInt(buf[:6], int64(i), 10))
				res, err := p.Allow(ctx, key)
				if err != nil || !res.Degraded { // 300,000 testify calls would double the test's time
					require.NoError(t, err, "key %d: %+v, %v", i, res, err)
					require.True(t, res.Degraded, "key %d: %+v, %v", i, res, err)
				}
			}
			grew := heapInUse() - before
			held := p.rescue.locals.Len()
			t.Logf("%d rules: %d keys offered, %d held, heap grew %.1f MB (%d bytes a key held)",
				rules, keys, held, float64(grew)/1e6, grew/int64(max(held, 1)))
			require.Less(t, grew, int64(40e6), "%d rules: heap grew %.1f MB, want under 40 MB", rules, float64(grew)/1e6)
			runtime.KeepAlive(p)
		})
	}
}

// A key that Redis blocked (WithBlock) stays denied by the fallback until
// the block would end: the stand-in keeps the block from Redis's last
// answer (it admitted the key at once). Other keys, and the key after a
// Reset, are the stand-ins' to decide.
func TestFallbackKeepsBlock(t *testing.T) {
	const block = time.Minute
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			m := miniredis.RunT(t)
			opt := redistest.TunedOptions(m.Addr())
			opt.ReadTimeout, opt.WriteTimeout = 5*time.Second, 5*time.Second // the calls on Redis must reach it, even on a busy machine
			rdb := redis.NewClient(opt)
			t.Cleanup(func() { rdb.Close() })
			lim := newLimiter(t, rdb, s, PerMinute(2), WithBlock(block), WithPingInterval(time.Hour))
			ctx := context.Background()
			for i := range 3 {
				res, err := lim.Allow(ctx, "k")
				require.NoError(t, err)
				require.Equal(t, i < 2, res.Allowed, "call %d on Redis: %+v", i, res)
				require.False(t, res.Degraded, "call %d on Redis: %+v", i, res)
			}
			res, err := lim.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, res.Allowed, "blocked on Redis: %+v", res)
			m.Close()
			start := time.Now()
			for i := range 3 {
				res, err := lim.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, res.Degraded, "call %d in fallback: %+v", i, res)
				require.False(t, res.Allowed, "call %d in fallback: a blocked key admitted: %+v", i, res)
				// The call's own retry, if later than the block's end: at most
				// the Period, and a sub-window counter's one sub-window more.
				require.LessOrEqual(t, res.RetryAfter, block+ownRetryExtra(s, PerMinute(2)), "call %d: RetryAfter", i)
				require.Greater(t, res.RetryAfter, block-time.Since(start)-time.Second, "call %d: RetryAfter", i)
			}
			res, err = lim.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			require.True(t, res.Allowed, "n = 0 only reports: %+v", res)
			require.Zero(t, res.Remaining, "n = 0 while blocked: %+v", res)
			require.Greater(t, res.ResetAfter, block-time.Since(start)-time.Second, "n = 0 while blocked: %+v", res)

			res, err = lim.Allow(ctx, "other")
			require.NoError(t, err)
			require.True(t, res.Allowed && res.Degraded, "another key in fallback: %+v", res)

			require.Error(t, lim.Reset(ctx, "k"), "Reset with Redis down")
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			require.True(t, res.Allowed && res.Degraded, "after Reset, in fallback: %+v", res)
		})
	}
}

// A key that WithRulesFunc gives more rules weighs more in the fallback's
// bound from then on (its stand-ins are counted again), so that changing
// rules cannot take the fallback past its bound.
func TestFallbackRulesChangeReweighs(t *testing.T) {
	m := miniredis.RunT(t)
	rdb := tunedClient(t, m.Addr())
	var many atomic.Bool
	p := newPolicy(t, rdb, fallbackMemoryRules(1), WithPingInterval(time.Hour),
		WithRulesFunc(func(context.Context, string) ([]Rule, error) {
			if many.Load() {
				return fallbackMemoryRules(MaxRules), nil
			}
			return nil, nil
		}))
	m.Close()
	ctx := context.Background()
	for _, tt := range []struct {
		many bool
		want int
	}{{false, 1}, {true, MaxRules}, {false, 1}} {
		many.Store(tt.many)
		res, err := p.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed && res.Degraded, "%+v", res)
		require.Equal(t, tt.want, p.rescue.locals.Held(), "stand-ins counted with %d rules", tt.want)
	}
}

// With prefetching, a denial on Redis through the prefetcher's direct
// call (a key not hot enough for a prefetch) sets the block too, and the
// fallback keeps it: the node going down right after the first denial
// admitted the key at once.
func TestFallbackKeepsBlockPrefetch(t *testing.T) {
	const block = time.Minute
	m := miniredis.RunT(t)
	opt := redistest.TunedOptions(m.Addr())
	opt.ReadTimeout, opt.WriteTimeout = 5*time.Second, 5*time.Second
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	lim := newLimiter(t, rdb, TokenBucket, PerMinute(2), WithBlock(block), WithPingInterval(time.Hour),
		WithPrefetch(16, 100*time.Millisecond))
	ctx := context.Background()
	for i := range 3 {
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err)
		require.Equal(t, i < 2, res.Allowed, "call %d on Redis: %+v", i, res)
		require.False(t, res.Degraded, "call %d on Redis: %+v", i, res)
	}
	m.Close()
	res, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Degraded, "in fallback: %+v", res)
	require.False(t, res.Allowed, "in fallback: a blocked key admitted: %+v", res)
	require.Greater(t, res.RetryAfter, block-2*time.Second, "RetryAfter: %+v", res)
}

// In the fallback too, a call that a block denies is told its own
// RetryAfter: the block's time left, or when the stand-ins would admit
// its n if later (what a limiter without the block answers then), and
// ResetAfter and a look (n = 0) run to the later of the block's end and
// the stand-ins' reset; waiting RetryAfter admits it. (It was told the
// block's time left, 0.5s, of a stand-in 2s from admitting it.) Redis
// answers LOADING throughout: the stand-ins take the calls, and the block
// is given as Redis's answer gives it (rescue.block). On the process's
// clock, which the fallback runs on (a synctest bubble's starts before
// monoBase: its blocks end before they start).
func TestFallbackBlockRetryAfterOwnN(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel()
			m := miniredis.RunT(t)
			m.SetError("LOADING Redis is loading the dataset in memory")
			rdb := patientClient(t, m.Addr())
			l := Limit{Rate: 10, Period: 2 * time.Second, Burst: 10}
			lim := newLimiter(t, rdb, s, l, WithBlock(time.Second), WithPingInterval(time.Hour))
			twin := newLimiter(t, rdb, s, l, WithPrefix("twin"), WithPingInterval(time.Hour))
			ctx := context.Background()
			start := time.Now() // lim and twin differ by at most the time since
			for _, l := range []Limiter{lim, twin} {
				res, err := l.AllowN(ctx, "k", 10)
				require.NoError(t, err)
				require.True(t, res.Degraded && res.Allowed, "%+v", res)
			}
			const block = 500 * time.Millisecond
			lim.rescue.block(lim.stateKey("k"), lim.own, block)

			own, err := twin.AllowN(ctx, "k", 10)
			require.NoError(t, err)
			require.True(t, own.Degraded && !own.Allowed, "the stand-ins' answer: %+v", own)
			require.Greater(t, own.RetryAfter, block+time.Second, "the stand-ins' answer: %+v", own)
			res, err := lim.AllowN(ctx, "k", 10)
			require.NoError(t, err)
			took := time.Since(start)
			require.True(t, res.Degraded && !res.Allowed, "blocked: %+v", res)
			assert.Zero(t, res.Remaining, "blocked: %+v", res)
			assert.InDelta(t, own.RetryAfter, res.RetryAfter, float64(took), "blocked AllowN(10): RetryAfter; the stand-ins alone answer %+v", own)
			assert.InDelta(t, own.ResetAfter, res.ResetAfter, float64(took), "blocked AllowN(10): ResetAfter; the stand-ins alone answer %+v", own)

			look, err := twin.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			res0, err := lim.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			took = time.Since(start)
			assert.True(t, res0.Allowed, "a look: %+v", res0)
			assert.Zero(t, res0.Remaining, "a look during the block: %+v", res0)
			assert.InDelta(t, look.ResetAfter, res0.ResetAfter, float64(took), "a look during the block; the stand-ins alone report %+v", look)

			time.Sleep(res.RetryAfter)
			res, err = lim.AllowN(ctx, "k", 10)
			require.NoError(t, err)
			assert.True(t, res.Degraded && res.Allowed, "AllowN(10) in the fallback after waiting its RetryAfter: %+v", res)
		})
	}
}

// A block that another instance set reaches this one's fallback for as
// long as it lasts in Redis, from the reply of a call it denied here: its
// time left, not the block's whole length from then (nor that call's
// RetryAfter), which the fallback kept (1s from the denied call, 0.3s too
// long).
func TestFallbackKeepsAnotherInstancesBlock(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			t.Parallel()
			m := miniredis.RunT(t)
			rdb := patientClient(t, m.Addr())
			const block = time.Second
			setter := newLimiter(t, rdb, s, blockLimit, WithBlock(block), WithPingInterval(time.Hour))
			lim := newLimiter(t, rdb, s, blockLimit, WithBlock(block), WithPingInterval(time.Hour))
			ctx := context.Background()
			res, err := setter.AllowN(ctx, "k", 10)
			require.NoError(t, err)
			require.True(t, res.Allowed, "%+v", res)
			res, err = setter.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, res.Allowed, "%+v", res)
			set := time.Now() // the block ends by set + block
			time.Sleep(300 * time.Millisecond)
			asked := time.Now()
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, res.Allowed, "blocked by the other instance: %+v", res)
			reply := time.Since(asked) // the time left comes back this late at most
			m.SetError("LOADING Redis is loading the dataset in memory")
			// The fallback reads its clock after this: a bound taken after
			// the call would shrink by the call's own time, which a busy
			// machine can make longer than the reply's margin.
			look := time.Now()
			res, err = lim.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			require.True(t, res.Degraded, "%+v", res)
			assert.LessOrEqual(t, res.ResetAfter, block-look.Sub(set)+reply, "a look in the fallback: the block's time left")
			time.Sleep(res.ResetAfter)
			res, err = lim.AllowN(ctx, "k", 0)
			require.NoError(t, err)
			assert.Positive(t, res.Remaining, "the block is over: %+v", res)
		})
	}
}

// patientClient is a client whose calls reach a miniredis even on a busy
// machine (5s timeouts): a call that times out is decided by the fallback.
func patientClient(t *testing.T, addr string) *redis.Client {
	opt := redistest.TunedOptions(addr)
	opt.ReadTimeout, opt.WriteTimeout = 5*time.Second, 5*time.Second
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// ownRetryExtra is how much longer than its Period a call of strategy s
// under limit may be told to wait: one sub-window for a sub-window
// counter (an event counts until its whole sub-window has left the
// window), else nothing.
func ownRetryExtra(s Strategy, limit Limit) time.Duration {
	if s != SubWindowCounter {
		return 0
	}
	return limit.Period / 60
}

// Issue 10, item 6: 20 instances sharing PerHour(5) with a fallback share of
// 1/20 admit about 5 at once between them during an outage, not 20 (each
// instance's burst used to floor at 1, and a leaky bucket's queue kept at
// 1 slot after that). Real Redis, killed.
func TestFallbackShareSmallLimitRedis(t *testing.T) {
	srv, err := redistest.StartServer()
	redistest.SkipOrFail(t, err)
	t.Cleanup(func() { srv.Close() })
	const instances, keys = 20, 60
	clients := make([]*redis.Client, instances)
	for i := range clients {
		clients[i] = redis.NewClient(redistest.TunedOptions(srv.Addr))
		t.Cleanup(func() { clients[i].Close() })
	}
	require.NoError(t, srv.Kill())
	for _, s := range []Strategy{SlidingLog, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			lims := make([]*RateLimiter, instances)
			for i := range lims {
				lims[i] = newLimiter(t, clients[i], s, PerHour(5), WithFallbackShare(1.0/instances), WithPingInterval(time.Hour))
			}
			ctx := context.Background()
			total, most := 0, 0
			for k := range keys {
				key := "login:" + string(rune('a'+k%26)) + string(rune('a'+k/26))
				admitted := 0
				for _, lim := range lims {
					for range 3 { // every instance tries three times
						res, err := lim.Allow(ctx, key)
						require.NoError(t, err)
						require.True(t, res.Degraded)
						admitted += btoi(res.Allowed)
					}
				}
				total += admitted
				most = max(most, admitted)
			}
			mean := float64(total) / keys
			t.Logf("%v: 20 instances, share 1/20, PerHour(5): %.2f admitted per key on average, %d at most (was 20)", s, mean, most)
			// Binomial(20, 1/4) per key: mean 5, standard deviation 1.9;
			// over 60 keys the mean is within 1 of 5 but for a 1-in-10^4
			// chance.
			assert.InDelta(t, 5, mean, 1)
			assert.Less(t, most, 20)
		})
	}
}
