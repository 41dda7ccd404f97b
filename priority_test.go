package redlimit

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// prioCtx returns a context of priority p.
func prioCtx(p Priority) context.Context {
	return ContextWithPriority(context.Background(), p)
}

// admitUntilDenied calls AllowN(n = 1) for key at priority p, at most
// maxCalls times, until a call is denied, and returns how many were
// admitted and the denial.
func admitUntilDenied(t *testing.T, lim Limiter, key string, p Priority, maxCalls int) (int, Result) {
	t.Helper()
	for i := range maxCalls {
		res, err := lim.AllowN(prioCtx(p), key, 1)
		require.NoError(t, err, "%v call %d", p, i)
		if !res.Allowed {
			return i, res
		}
		assert.False(t, res.ByPriority, "%v call %d: admitted, yet ByPriority", p, i)
	}
	return maxCalls, Result{}
}

// capacity100 are limits of capacity 100 for each strategy, with no refill
// while the clock stands still.
var capacity100 = map[Strategy]Limit{
	FixedWindow:    {Rate: 100, Period: time.Minute},
	SlidingLog:     {Rate: 100, Period: time.Minute},
	SlidingCounter: {Rate: 100, Period: time.Minute},
	TokenBucket:    {Rate: 100, Period: time.Minute, Burst: 100},
	LeakyBucket:    {Rate: 100, Period: time.Minute, Burst: 100},
}

// sharesSplit checks, on a fresh key of lim (capacity 100, shares 0.5 and
// 0.8, time standing still), that Sheddable calls alone get exactly 50,
// Normal calls then exactly 30 more and Critical calls the last 20; each
// lower priority's denial is by its share (ByPriority), the last by the
// limit.
func sharesSplit(t *testing.T, lim Limiter, key string) {
	t.Helper()
	for _, c := range []struct {
		p      Priority
		want   int
		shared bool // the denial after them is the share's
	}{{Sheddable, 50, true}, {Normal, 30, true}, {Critical, 20, false}} {
		got, denial := admitUntilDenied(t, lim, key, c.p, 200)
		assert.Equal(t, c.want, got, "%v calls admitted", c.p)
		assert.False(t, denial.Allowed)
		assert.Equal(t, c.shared, denial.ByPriority, "%v denial: ByPriority", c.p)
		assert.Zero(t, denial.Remaining, "%v denial: Remaining within its share", c.p)
		assert.Positive(t, denial.RetryAfter, "%v denial", c.p)
	}
	// The lower priorities are still denied, by the limit now.
	for _, p := range []Priority{Sheddable, Normal} {
		res, err := lim.Allow(prioCtx(p), key)
		require.NoError(t, err)
		assert.False(t, res.Allowed, "%v after Critical took the rest", p)
	}
}

// With shares 0.5 and 0.8 and capacity 100, each strategy (its rule
// written into the script, and passed as arguments by WithLimitFunc)
// admits exactly 50 Sheddable, then 30 Normal, then 20 Critical calls.
func TestPrioritySharesSplit(t *testing.T) {
	for s, l := range capacity100 {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			lim := newLimiter(t, b.rdb, s, l, WithPriorityShares(0.5, 0.8))
			sharesSplit(t, lim, "written")
			dyn := newLimiter(t, b.rdb, s, Limit{Rate: 1, Period: l.Period},
				WithPriorityShares(0.5, 0.8), WithLimitFunc(func(context.Context, string) (Limit, error) { return l, nil }))
			sharesSplit(t, dyn, "arguments")
		})
	}
}

// A single rule's call with a priority share runs the rule's script with
// the capacity the share leaves written in (bakeShares): every call of
// sharesSplit, Sheddable, Normal or Critical, sends Redis no argument, and
// the shares hold.
func TestPrioritySharesWrittenIn(t *testing.T) {
	for s, l := range capacity100 {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			argv := &argvHook{}
			b.rdb.AddHook(argv)
			lim := newLimiter(t, b.rdb, s, l, WithPriorityShares(0.5, 0.8), withoutFunctions())
			sharesSplit(t, lim, "k")
			argv.mu.Lock()
			defer argv.mu.Unlock()
			require.NotEmpty(t, argv.counts, "no script call seen")
			for i, n := range argv.counts {
				assert.Zero(t, n, "script call %d: arguments sent", i)
			}
		})
	}
}

// argvHook records how many arguments (ARGV) each script call sends.
type argvHook struct {
	passHooks // only ProcessHook does something
	mu        sync.Mutex
	counts    []int
}

func (h *argvHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if name := cmd.Name(); name == "evalsha" || name == "eval" {
			args := cmd.Args() // name, script, numkeys, keys, ARGV
			if nk, ok := args[2].(int); ok {
				h.mu.Lock()
				h.counts = append(h.counts, len(args)-3-nk)
				h.mu.Unlock()
			}
		}
		return next(ctx, cmd)
	}
}

// A Sheddable call denied by its share is told to retry when it fits in
// its share, exactly: a µs earlier it is denied again, then admitted. A
// window's share fits again when the window ends; a bucket's when the
// refill brings usage down to the share.
func TestPriorityRetryAfterExact(t *testing.T) {
	for s, l := range capacity100 {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			lim := newLimiter(t, b.rdb, s, l, WithPriorityShares(0.5, 0.8))
			got, denial := admitUntilDenied(t, lim, "k", Sheddable, 200)
			require.Equal(t, 50, got)
			require.True(t, denial.ByPriority)
			want := map[Strategy]time.Duration{
				FixedWindow: time.Minute, // the window's end
				SlidingLog:  time.Minute, // the oldest of the 50 leaves
				// 50 in this window: in the next, they weigh
				// 50 × (1 - e/60s) <= 49 from e = 1.2s on.
				SlidingCounter: time.Minute + 1200*time.Millisecond,
				TokenBucket:    600 * time.Millisecond, // one token's refill
				LeakyBucket:    600 * time.Millisecond,
			}[s]
			assert.Equal(t, want, denial.RetryAfter)
			b.advance(denial.RetryAfter - time.Microsecond)
			res, err := lim.Allow(prioCtx(Sheddable), "k")
			require.NoError(t, err)
			assert.False(t, res.Allowed, "a µs before RetryAfter")
			assert.True(t, res.ByPriority)
			b.advance(time.Microsecond)
			res, err = lim.Allow(prioCtx(Sheddable), "k")
			require.NoError(t, err)
			assert.True(t, res.Allowed, "at RetryAfter")
		})
	}
}

// A Policy applies the shares to every rule, in one script: the rule of
// capacity 100 holds Sheddable at 50 though the other has room, and a
// denied call writes in no rule.
func TestPrioritySharesPolicy(t *testing.T) {
	b, _ := miniBackend(t)
	rules := []Rule{
		{Name: "minute", Strategy: FixedWindow, Limit: PerMinute(100)},
		{Name: "bucket", Strategy: TokenBucket, Limit: Limit{Rate: 1000, Period: time.Hour, Burst: 1000}},
		{Name: "log", Strategy: SlidingLog, Limit: PerHour(1000)},
	}
	p := newPolicy(t, b.rdb, rules, WithPriorityShares(0.5, 0.8))
	sharesSplit(t, p, "k")
	// The other rules counted the 100 admitted, and nothing of the denials.
	for _, r := range rules[1:] {
		lim := newLimiter(t, b.rdb, r.Strategy, r.Limit)
		res, err := lim.AllowN(context.Background(), "k", 0)
		require.NoError(t, err)
		assert.Equal(t, 900, res.Remaining, "rule %s", r.Name)
	}

	// The share of the rule of capacity 1000 binds when it is the lower.
	p2 := newPolicy(t, b.rdb, []Rule{
		{Name: "small", Strategy: TokenBucket, Limit: Limit{Rate: 10, Period: time.Hour, Burst: 10}},
		{Name: "big", Strategy: FixedWindow, Limit: PerHour(1000)},
	}, WithPriorityShares(0.5, 0.8))
	got, denial := admitUntilDenied(t, p2, "k2", Sheddable, 100)
	assert.Equal(t, 5, got)
	assert.Equal(t, "small", denial.Rule)
	assert.True(t, denial.ByPriority)
}

// Concurrency: a Sheddable acquire takes a lease only while fewer than
// floor(0.5 × max) are held; Normal 0.8; Critical all.
func TestPrioritySharesConcurrency(t *testing.T) {
	_, m := miniBackend(t)
	rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
	t.Cleanup(func() { rdb.Close() })
	c := newConc(t, rdb, 100, time.Minute, WithPriorityShares(0.5, 0.8))
	var seen recorder[Decision]
	c.e.cfg.observer = seen.record
	for _, tc := range []struct {
		p      Priority
		want   int
		shared bool
	}{{Sheddable, 50, true}, {Normal, 30, true}, {Critical, 20, false}} {
		got := 0
		for range 200 {
			l, res, err := c.TryAcquire(prioCtx(tc.p), "k")
			require.NoError(t, err)
			if l == nil {
				assert.Equal(t, tc.shared, res.ByPriority, "%v denial", tc.p)
				assert.Equal(t, time.Minute, res.RetryAfter, "%v: until the oldest lease expires", tc.p)
				d := seen.last()
				assert.Equal(t, tc.p, d.Priority)
				if tc.shared {
					assert.Equal(t, DeniedByPriority, d.DeniedBy)
				} else {
					assert.Equal(t, DeniedByLimit, d.DeniedBy)
				}
				break
			}
			got++
		}
		assert.Equal(t, tc.want, got, "%v leases", tc.p)
	}
	// A share that holds no slot is an error, not a denial.
	c1 := newConc(t, rdb, 1, time.Minute, WithPriorityShares(0.5, 0.8))
	_, _, err := c1.TryAcquire(prioCtx(Sheddable), "k")
	mustErrorIs(t, err, ErrExceedsLimit)
}

// Without WithPriorityShares a call's priority changes nothing; with it a
// call with no priority is Normal.
func TestPriorityIgnoredWithoutShares(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, FixedWindow, PerMinute(100))
	got, _ := admitUntilDenied(t, lim, "k", Sheddable, 200)
	assert.Equal(t, 100, got)
	assert.Equal(t, Normal, PriorityFromContext(context.Background()))
	assert.Equal(t, Normal, PriorityFromContext(prioCtx(Priority(9))))
	assert.Equal(t, Critical, PriorityFromContext(prioCtx(Critical)))

	shared := newLimiter(t, b.rdb, FixedWindow, PerMinute(100), WithPriorityShares(0.5, 0.8))
	got, _ = admitUntilDenied(t, shared, "k2", Normal, 200)
	assert.Equal(t, 80, got)
	res, err := shared.Allow(context.Background(), "k2")
	require.NoError(t, err)
	assert.False(t, res.Allowed, "no priority: Normal")
	assert.True(t, res.ByPriority)
}

// Bad shares are an error; an n past a call's share can never be admitted.
func TestPrioritySharesValidation(t *testing.T) {
	b, _ := miniBackend(t)
	for _, c := range [][2]float64{{0, 0.5}, {0.6, 0.5}, {0.5, 1.1}, {-1, 1}} {
		_, err := NewFixedWindow(b.rdb, PerMinute(10), WithPriorityShares(c[0], c[1]))
		mustErrorIs(t, err, ErrInvalidArgument)
	}
	lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 100, Period: time.Minute}, WithPriorityShares(0.5, 0.8))
	_, err := lim.AllowN(prioCtx(Sheddable), "k", 51)
	mustErrorIs(t, err, ErrExceedsLimit)
	res, err := lim.AllowN(prioCtx(Normal), "k", 51)
	require.NoError(t, err)
	assert.True(t, res.Allowed)
	// Shares are taken to a millionth, floor(share × capacity) exact:
	// 0.29 × 100 is 28.999… as a float64.
	lim29 := newLimiter(t, b.rdb, FixedWindow, PerMinute(100), WithPriorityShares(0.29, 1))
	got, _ := admitUntilDenied(t, lim29, "k", Sheddable, 200)
	assert.Equal(t, 29, got)
}

// WaitN, Reserve, shadow mode, the deny cache and the observer see a
// call's share.
func TestPriorityEverywhere(t *testing.T) {
	b, _ := miniBackend(t)
	var seen recorder[Decision]
	l := PerMinute(100)
	lim := newLimiter(t, b.rdb, FixedWindow, l, WithPriorityShares(0.5, 0.8), WithDenyCache(64), WithObserver(seen.record))
	got, _ := admitUntilDenied(t, lim, "k", Sheddable, 200)
	require.Equal(t, 50, got)
	d := seen.last()
	assert.Equal(t, DeniedByPriority, d.DeniedBy)
	assert.Equal(t, Sheddable, d.Priority)
	assert.Equal(t, "priority", d.DeniedBy.String())

	// The deny cache remembers the Sheddable denial for Sheddable calls
	// only.
	res, err := lim.Allow(prioCtx(Sheddable), "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.Equal(t, DeniedByDenyCache, seen.last().DeniedBy)
	res, err = lim.Allow(prioCtx(Critical), "k")
	require.NoError(t, err)
	assert.True(t, res.Allowed, "a Sheddable denial in the deny cache must not deny a Critical call")

	// Reserve.
	rv, err := lim.Reserve(prioCtx(Sheddable), "k2", 50)
	require.NoError(t, err)
	require.True(t, rv.Result().Allowed)
	rv, err = lim.Reserve(prioCtx(Sheddable), "k2", 1)
	require.NoError(t, err)
	assert.False(t, rv.Result().Allowed)
	assert.True(t, rv.Result().ByPriority)
	rv, err = lim.Reserve(prioCtx(Normal), "k2", 30)
	require.NoError(t, err)
	assert.True(t, rv.Result().Allowed)

	// WaitN: the Sheddable wait would last until the window's end.
	ctx, cancel := context.WithTimeout(prioCtx(Sheddable), time.Second)
	defer cancel()
	mustErrorIs(t, lim.WaitN(ctx, "k2", 1), context.DeadlineExceeded)
	ctx, cancel = context.WithTimeout(prioCtx(Critical), time.Second)
	defer cancel()
	require.NoError(t, lim.WaitN(ctx, "k2", 20))

	// Shadow mode allows what the share denied, and says so.
	sh := newLimiter(t, b.rdb, FixedWindow, l, WithPriorityShares(0.5, 0.8), WithShadow(), WithObserver(seen.record))
	for range 50 {
		_, err := sh.Allow(prioCtx(Sheddable), "k3")
		require.NoError(t, err)
	}
	res, err = sh.Allow(prioCtx(Sheddable), "k3")
	require.NoError(t, err)
	assert.True(t, res.Allowed)
	assert.True(t, res.Shadowed)
	assert.True(t, res.ByPriority)
	d = seen.last()
	assert.True(t, d.Shadowed)
	assert.Equal(t, DeniedByPriority, d.DeniedBy)
}

// The in-process fallback keeps the shares: with Redis down, Sheddable
// gets 50 of a fresh stand-in's 100, Normal 30 more, Critical the last 20.
func TestPrioritySharesFallback(t *testing.T) {
	for _, s := range []Strategy{FixedWindow, TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			m := miniredis.RunT(t)
			rdb := tunedClient(t, m.Addr())
			// An hour: the stand-ins refill one event in 36 s.
			l := Limit{Rate: 100, Period: time.Hour}
			lim := newLimiter(t, rdb, s, l, WithPriorityShares(0.5, 0.8), WithPingInterval(time.Hour))
			m.Close()
			for _, c := range []struct {
				p    Priority
				want int
			}{{Sheddable, 50}, {Normal, 30}, {Critical, 20}} {
				got := 0
				for range 200 {
					res, err := lim.Allow(prioCtx(c.p), "k")
					require.NoError(t, err)
					require.True(t, res.Degraded)
					if !res.Allowed {
						assert.Equal(t, c.p != Critical, res.ByPriority, "%v denial", c.p)
						break
					}
					got++
				}
				assert.Equal(t, c.want, got, "%v admitted by the fallback", c.p)
			}
		})
	}
}

// Prefetched events never serve a call past its share: with a hot key
// served from prefetches by Critical calls, Sheddable calls are decided
// by Redis, which counts the prefetched events as used.
func TestPrioritySharesPrefetch(t *testing.T) {
	b, _ := miniBackend(t)
	l := Limit{Rate: 100, Period: time.Hour, Burst: 100}
	lim := newLimiter(t, b.rdb, TokenBucket, l, WithPriorityShares(0.5, 0.8), WithPrefetch(16, time.Second))
	for i := range 20 {
		res, err := lim.Allow(prioCtx(Critical), "k")
		require.NoError(t, err)
		require.True(t, res.Allowed, "critical %d", i)
	}
	st := lim.PrefetchStats()
	require.Positive(t, st.Served, "the key is hot: %+v", st)
	got, denial := admitUntilDenied(t, lim, "k", Sheddable, 200)
	used := 20 + int(lim.PrefetchStats().Unused) // what Redis counts before the Sheddable calls
	assert.Equal(t, 50-used, got, "Sheddable calls up to 50 used in Redis, the prefetched events counted")
	assert.True(t, denial.ByPriority)
	assert.Equal(t, uint64(0), lim.PrefetchStats().Served-st.Served, "no Sheddable call served from a prefetch")
}

// On real Redis, each strategy, a Policy and a Concurrency of capacity 100
// (shares 0.5 and 0.8) split as on miniredis, one call at a time; then 64
// goroutines hammer a fresh key, Sheddable calls alone, then Sheddable and
// Normal, then all three: Sheddable calls get exactly 50, then only Normal
// calls get anything, exactly 30, then only Critical calls, exactly 20.
func TestPrioritySharesRedis(t *testing.T) {
	clearOfHourEdge(t, time.Minute)
	rdb := redis.NewClient(steadyOptions(realServer(t).Addr))
	t.Cleanup(func() { rdb.Close() })
	hour := Limit{Rate: 100, Period: time.Hour, Burst: 100} // no refill to speak of within the test
	type allower func(ctx context.Context, key string) (bool, error)
	cases := map[string]allower{}
	for _, s := range Strategies() {
		lim := newLimiter(t, rdb, s, hour, WithPriorityShares(0.5, 0.8))
		sharesSplit(t, lim, "split-"+s.String()+time.Now().Format("150405.000000"))
		cases[s.String()] = func(ctx context.Context, key string) (bool, error) {
			res, err := lim.Allow(ctx, key)
			return res.Allowed, err
		}
	}
	p := newPolicy(t, rdb, []Rule{
		{Strategy: SlidingCounter, Limit: PerHour(100)},
		{Strategy: TokenBucket, Limit: hour},
	}, WithPriorityShares(0.5, 0.8))
	sharesSplit(t, p, "split-policy"+time.Now().Format("150405.000000"))
	cases["policy"] = func(ctx context.Context, key string) (bool, error) {
		res, err := p.Allow(ctx, key)
		return res.Allowed, err
	}
	c := newConc(t, rdb, 100, time.Hour, WithPriorityShares(0.5, 0.8))
	cases["concurrency"] = func(ctx context.Context, key string) (bool, error) {
		l, _, err := c.TryAcquire(ctx, key)
		return l != nil, err
	}
	for name, allow := range cases {
		key := "prio-" + name + time.Now().Format("150405.000000")
		t.Run(name, func(t *testing.T) {
			var admitted [Critical + 1]atomic.Int64
			hammer := func(prios []Priority) {
				var wg sync.WaitGroup
				for g := range 64 {
					p := prios[g%len(prios)]
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx := prioCtx(p)
						for range 20 {
							ok, err := allow(ctx, key)
							if !assert.NoError(t, err) {
								return
							}
							if ok {
								admitted[p].Add(1)
							}
						}
					}()
				}
				wg.Wait()
			}
			// Each phase adds its priorities to the mix; only the new one
			// gets anything, exactly up to its share.
			for i, want := range [][3]int64{{50, 0, 0}, {0, 30, 0}, {0, 0, 20}} {
				prios := []Priority{Sheddable, Normal, Critical}[:i+1]
				var before [3]int64
				for j := range before {
					before[j] = admitted[j+1].Load()
				}
				hammer(prios)
				var got [3]int64
				for j := range got {
					got[j] = admitted[j+1].Load() - before[j]
				}
				t.Logf("%s, 64 goroutines of %v: admitted sheddable %d, normal %d, critical %d", name, prios, got[0], got[1], got[2])
				assert.Equal(t, want, got, "phase %v: admitted by priority", prios)
			}
		})
	}
}

// A bucket with a warm-up takes no share (its capacity is time, not
// events), in the script and before it: a Sheddable AllowN(6) on a cold
// 10/s bucket is the script's to decide (admitted: a cold bucket pays
// forward), not an ErrExceedsLimit for passing floor(0.5 × 10). Its rule
// written in, passed as arguments (WithLimitFunc), and beside a rule that
// does take the share in a Policy (whose share still binds).
func TestPrioritySharesWarmUp(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			l := Limit{Rate: 10, Period: time.Second, WarmUp: 4 * time.Second}
			if s == LeakyBucket {
				l.Burst = 10
			}
			shares := WithPriorityShares(0.5, 0.8)
			lims := map[string]Limiter{
				"written": newLimiter(t, b.rdb, s, l, shares),
				"arguments": newLimiter(t, b.rdb, s, Limit{Rate: 1, Period: l.Period}, shares,
					WithLimitFunc(func(context.Context, string) (Limit, error) { return l, nil })),
				"policy": newPolicy(t, b.rdb, []Rule{
					{Name: "warm", Strategy: s, Limit: l},
					{Name: "minute", Strategy: FixedWindow, Limit: PerMinute(100)},
				}, shares),
			}
			for name, lim := range lims {
				res, err := lim.AllowN(prioCtx(Sheddable), name, 6)
				require.NoError(t, err, "%s: a Sheddable AllowN(6) on a warming bucket of 10", name)
				assert.True(t, res.Allowed, "%s: %+v", name, res)
			}
			// A rule that takes the share still binds: a window of 10
			// leaves a Sheddable call 5.
			small := newPolicy(t, b.rdb, []Rule{
				{Name: "warm", Strategy: s, Limit: l},
				{Name: "minute", Strategy: FixedWindow, Limit: PerMinute(10)},
			}, shares)
			_, err := small.AllowN(prioCtx(Sheddable), "small", 6)
			require.ErrorIs(t, err, ErrExceedsLimit, "6 Sheddable events past the window's share of 5")
		})
	}
}
