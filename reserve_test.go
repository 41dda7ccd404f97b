package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/redistest"
)

// remaining is what AllowN(key, 0) reports.
func remaining(t *testing.T, l Limiter, key string) int {
	t.Helper()
	res, err := l.AllowN(context.Background(), key, 0)
	require.NoError(t, err)
	return res.Remaining
}

// A refund gives back exactly the difference, the next calls see exactly
// the refunded events; an overspend is owed; a reservation settles once.
func TestReserveSettleExact(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			lim := newLimiter(t, b.rdb, s, Limit{Rate: 10, Period: time.Minute})
			ctx := t.Context()
			rv, err := lim.Reserve(ctx, "k", 8)
			require.NoError(t, err)
			require.True(t, rv.Result().Allowed)
			assert.Equal(t, 2, remaining(t, lim, "k"))
			res, err := rv.Settle(ctx, 3)
			require.NoError(t, err)
			assert.Equal(t, 7, res.Remaining, "5 refunded")
			assert.Equal(t, 7, remaining(t, lim, "k"))
			for i := range 7 {
				res, err := lim.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, res.Allowed, "refunded event %d", i+1)
			}
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			assert.False(t, res.Allowed, "exactly the refunded events")

			// Settled once: again, or Cancel, is ErrSettled and changes nothing.
			_, err = rv.Settle(ctx, 0)
			require.ErrorIs(t, err, ErrSettled)
			require.ErrorIs(t, rv.Cancel(ctx), ErrSettled)
			assert.Equal(t, 0, remaining(t, lim, "k"))

			// Overspend: 4 reserved, 9 used: 5 owed past the limit.
			require.NoError(t, lim.Reset(ctx, "k"))
			rv, err = lim.Reserve(ctx, "k", 4)
			require.NoError(t, err)
			_, err = rv.Settle(ctx, 9)
			require.NoError(t, err)
			assert.Equal(t, 1, remaining(t, lim, "k"))
			rv, err = lim.Reserve(ctx, "k", 1)
			require.NoError(t, err)
			require.True(t, rv.Result().Allowed)
			_, err = rv.Settle(ctx, 5)
			require.NoError(t, err)
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			assert.False(t, res.Allowed, "in debt: 14 used of 10")
			assert.Equal(t, 0, res.Remaining)
		})
	}
}

// No refund past the full allowance, none of refill that already happened,
// none after the reservation's window passed.
func TestReserveRefundBounds(t *testing.T) {
	t.Run("bucket never above full, never refill again", func(t *testing.T) {
		b, _ := miniBackend(t)
		lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 10, Period: time.Second, Burst: 10})
		ctx := t.Context()
		rv, err := lim.Reserve(ctx, "k", 10)
		require.NoError(t, err)
		b.advance(600 * time.Millisecond) // 6 tokens back by refill
		require.NoError(t, rv.Cancel(ctx))
		assert.Equal(t, 10, remaining(t, lim, "k"), "full, not 16")
		rv, err = lim.Reserve(ctx, "k", 10)
		require.NoError(t, err)
		b.advance(300 * time.Millisecond) // 3 back
		_, err = rv.Settle(ctx, 4)        // 6 refunded: 3 + 6 = 9
		require.NoError(t, err)
		assert.Equal(t, 9, remaining(t, lim, "k"))
	})
	t.Run("fixed window: not after the window", func(t *testing.T) {
		b, _ := miniBackend(t)
		lim := newLimiter(t, b.rdb, FixedWindow, PerSecond(5))
		ctx := t.Context()
		rv, err := lim.Reserve(ctx, "k", 5)
		require.NoError(t, err)
		b.advance(time.Second) // the next window
		_, err = lim.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		require.NoError(t, rv.Cancel(ctx))
		assert.Equal(t, 3, remaining(t, lim, "k"), "nothing given to the new window")
	})
	t.Run("sliding counter: weighted while previous, not after", func(t *testing.T) {
		b, _ := miniBackend(t)
		lim := newLimiter(t, b.rdb, SlidingCounter, PerSecond(10))
		ctx := t.Context()
		rv, err := lim.Reserve(ctx, "k", 10)
		require.NoError(t, err)
		b.advance(1500 * time.Millisecond) // half of the previous window still counts: 5
		assert.Equal(t, 5, remaining(t, lim, "k"))
		_, err = rv.Settle(ctx, 4) // 6 of the previous window refunded: it now weighs 2
		require.NoError(t, err)
		assert.Equal(t, 8, remaining(t, lim, "k"))
		rv, err = lim.Reserve(ctx, "k", 8)
		require.NoError(t, err)
		b.advance(2 * time.Second) // its window has passed entirely
		require.NoError(t, rv.Cancel(ctx))
		assert.Equal(t, 10, remaining(t, lim, "k"))
		_, err = lim.AllowN(ctx, "k", 10)
		require.NoError(t, err)
		assert.Equal(t, 0, remaining(t, lim, "k"), "nothing left over from the old reservation")
	})
	t.Run("sliding log: only its own entries still in the log", func(t *testing.T) {
		b, _ := miniBackend(t)
		lim := newLimiter(t, b.rdb, SlidingLog, PerSecond(10))
		ctx := t.Context()
		_, err := lim.AllowN(ctx, "k", 3) // someone else's, at the same µs
		require.NoError(t, err)
		rv, err := lim.Reserve(ctx, "k", 5)
		require.NoError(t, err)
		require.NoError(t, rv.Cancel(ctx))
		assert.Equal(t, 7, remaining(t, lim, "k"), "the other 3 stay")
		rv, err = lim.Reserve(ctx, "k", 5)
		require.NoError(t, err)
		b.advance(time.Second) // everything left the log
		require.NoError(t, rv.Cancel(ctx))
		assert.Equal(t, 10, remaining(t, lim, "k"))
	})
	t.Run("denied reservation holds nothing", func(t *testing.T) {
		b, _ := miniBackend(t)
		lim := newLimiter(t, b.rdb, TokenBucket, PerSecond(2))
		ctx := t.Context()
		_, err := lim.AllowN(ctx, "k", 2)
		require.NoError(t, err)
		rv, err := lim.Reserve(ctx, "k", 1)
		require.NoError(t, err)
		require.False(t, rv.Result().Allowed)
		_, err = rv.Settle(ctx, 1)
		require.ErrorIs(t, err, ErrInvalidArgument)
		_, err = lim.Reserve(ctx, "k", 0)
		require.ErrorIs(t, err, ErrInvalidArgument)
		_, err = lim.Reserve(ctx, "k", 3)
		require.ErrorIs(t, err, ErrExceedsLimit)
	})
	t.Run("lapsed reservation stands as taken", func(t *testing.T) {
		b, _ := miniBackend(t)
		lim := newLimiter(t, b.rdb, FixedWindow, PerHour(5), WithReservationTTL(time.Minute))
		ctx := t.Context()
		rv, err := lim.Reserve(ctx, "k", 5)
		require.NoError(t, err)
		b.advance(time.Minute)
		_, err = rv.Settle(ctx, 0)
		require.ErrorIs(t, err, ErrSettled)
		assert.Equal(t, 0, remaining(t, lim, "k"))
	})
}

// A Policy's reservation settles every rule.
func TestReservePolicy(t *testing.T) {
	b, _ := miniBackend(t)
	p := newPolicy(t, b.rdb, []Rule{
		{Name: "rps", Strategy: TokenBucket, Limit: PerSecond(100)},
		{Name: "tpm", Strategy: SlidingCounter, Limit: PerMinute(1000)},
		{Name: "log", Strategy: SlidingLog, Limit: PerMinute(500)},
	})
	ctx := t.Context()
	rv, err := p.Reserve(ctx, "k", 80)
	require.NoError(t, err)
	require.True(t, rv.Result().Allowed)
	res, err := rv.Settle(ctx, 30)
	require.NoError(t, err)
	assert.Equal(t, 70, res.Remaining, "rps: 100 - 30")
	tb := newLimiter(t, b.rdb, TokenBucket, PerSecond(100))
	sc := newLimiter(t, b.rdb, SlidingCounter, PerMinute(1000))
	sl := newLimiter(t, b.rdb, SlidingLog, PerMinute(500))
	assert.Equal(t, 70, remaining(t, tb, "k"))
	assert.Equal(t, 970, remaining(t, sc, "k"))
	assert.Equal(t, 470, remaining(t, sl, "k"))
}

// dropReplies proxies to addr and, once armed, lets one command through to
// Redis but swallows its reply and cuts the connection.
type dropReplies struct {
	ln    net.Listener
	armed atomic.Bool
}

func newDropReplies(t *testing.T, addr string) *dropReplies {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	d := &dropReplies{ln: ln}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go d.serve(c, addr)
		}
	}()
	return d
}

func (d *dropReplies) serve(c net.Conn, addr string) {
	defer c.Close()
	up, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer up.Close()
	go func() {
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if err != nil {
				up.Close()
				return
			}
			if _, err := up.Write(buf[:n]); err != nil {
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for {
		n, err := up.Read(buf)
		if err != nil {
			return
		}
		if d.armed.CompareAndSwap(true, false) {
			return // Redis ran the command; its reply is lost
		}
		if _, err := c.Write(buf[:n]); err != nil {
			return
		}
	}
}

// A settle whose reply was lost and that the caller retries changes
// nothing the second time (real Redis, a proxy dropping the reply).
func TestReserveSettleLostReplyRedis(t *testing.T) {
	srv := realServer(t)
	proxy := newDropReplies(t, srv.Addr)
	opts := &redis.Options{Addr: proxy.ln.Addr().String(), MaxRetries: -1, ReadTimeout: time.Second}
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	lim := newLimiter(t, rdb, FixedWindow, PerHour(10), WithPrefix(prefixFor(t)), WithFallback(FallbackError), WithPingInterval(time.Hour))
	ctx := context.Background()
	warm, err := lim.Reserve(ctx, "warm", 1) // loads both scripts: no NOSCRIPT below
	require.NoError(t, err)
	require.NoError(t, warm.Cancel(ctx))
	rv, err := lim.Reserve(ctx, "k", 8)
	require.NoError(t, err)
	proxy.armed.Store(true)
	_, err = rv.Settle(ctx, 2) // Redis refunds 6; the reply is lost
	require.Error(t, err)
	// The caller retries, on a healthy connection.
	direct := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { direct.Close() })
	check := newLimiter(t, direct, FixedWindow, PerHour(10), WithPrefix(prefixFor(t)))
	assert.Equal(t, 8, remaining(t, check, "k"), "the lost settle was applied once")
	rv.e = &check.engine // the retry goes through the healthy client
	_, err = rv.Settle(ctx, 2)
	require.ErrorIs(t, err, ErrSettled)
	assert.Equal(t, 8, remaining(t, check, "k"), "the retried settle changed nothing")
}

// 64 goroutines reserve and settle at random: what the key has charged is
// exactly the sum of what was settled.
func TestReserveConcurrentRedis(t *testing.T) {
	clearOfHourEdge(t, 30*time.Second) // windows of an hour, on a real clock
	opts := redistest.TunedOptions(realServer(t).Addr)
	opts.PoolSize, opts.PoolTimeout = 64, 2*time.Second // one connection per goroutine
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout = time.Second, time.Second, time.Second
	b := &backend{rdb: redis.NewClient(opts)}
	t.Cleanup(func() { b.rdb.Close() })
	for _, s := range []Strategy{FixedWindow, SlidingCounter, TokenBucket, SlidingLog} {
		t.Run(s.String(), func(t *testing.T) {
			limit, capacity := Limit{Rate: 100_000, Period: time.Hour}, 100_000
			switch s {
			case SlidingLog:
				limit.Rate, capacity = 50_000, 50_000
			case TokenBucket: // no refill to speak of while the test runs
				limit, capacity = Limit{Rate: 1, Period: time.Hour, Burst: 100_000}, 100_000
			}
			lim := newLimiter(t, b.rdb, s, limit, WithPrefix(prefixFor(t)))
			ctx := context.Background()
			var settled atomic.Int64
			var wg sync.WaitGroup
			for g := range 64 {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), 1))
					for range 10 {
						n := 1 + rng.IntN(60)
						rv, err := lim.Reserve(ctx, "k", n)
						if !assert.NoError(t, err) || !assert.True(t, rv.Result().Allowed) {
							return
						}
						used := rng.IntN(2 * n)
						_, err = rv.Settle(ctx, used)
						if assert.NoError(t, err) {
							settled.Add(int64(used))
						}
					}
				})
			}
			wg.Wait()
			assert.Equal(t, capacity-int(settled.Load()), remaining(t, lim, "k"), "charged = settled")
		})
	}
}

// A reservation taken by the fallback settles in-process; one taken on
// Redis cannot be settled while Redis is down: its settle is queued, and
// made once Redis is back.
func TestReserveFallback(t *testing.T) {
	b, m := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 1, Period: time.Hour, Burst: 10}, WithPingInterval(10*time.Millisecond))
	ctx := t.Context()
	onRedis, err := lim.Reserve(ctx, "k", 5)
	require.NoError(t, err)
	m.SetError("LOADING Redis is loading the dataset in memory")
	local, err := lim.Reserve(ctx, "j", 6)
	require.NoError(t, err)
	require.True(t, local.Result().Degraded)
	res, err := local.Settle(ctx, 2)
	require.NoError(t, err)
	assert.True(t, res.Degraded)
	assert.Equal(t, 8, res.Remaining, "4 given back in-process")
	_, err = onRedis.Settle(ctx, 1)
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "queued")
	_, err = onRedis.Settle(ctx, 1)
	require.ErrorIs(t, err, ErrSettled, "the queue settles it")
	m.SetError("")
	require.Eventually(t, func() bool { return remaining(t, lim, "k") == 9 }, 5*time.Second, 10*time.Millisecond,
		"settled once Redis is back")
	require.NoError(t, lim.Close())
}

// A reservation that FallbackAllow admitted while Redis was down took
// nothing, and settles at once, then or after Redis is back (it returned
// ErrUnavailable, then ErrSettled).
func TestReserveFallbackAllowSettles(t *testing.T) {
	b, m := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 1, Period: time.Hour, Burst: 10},
		WithFallback(FallbackAllow), WithPingInterval(10*time.Millisecond))
	ctx := t.Context()
	m.SetError("LOADING Redis is loading the dataset in memory")
	var rvs []*Reservation
	for range 2 {
		rv, err := lim.Reserve(ctx, "k", 5)
		require.NoError(t, err)
		require.True(t, rv.Result().Allowed && rv.Result().Degraded, "%+v", rv.Result())
		rvs = append(rvs, rv)
	}
	res, err := rvs[0].Settle(ctx, 2)
	require.NoError(t, err, "settled while Redis is down")
	assert.Equal(t, rvs[0].Result(), res)
	m.SetError("")
	require.Eventually(t, func() bool { return !lim.rescue.anyDown() }, 5*time.Second, 10*time.Millisecond)
	res, err = rvs[1].Settle(ctx, 7)
	require.NoError(t, err, "settled once Redis is back")
	assert.Equal(t, rvs[1].Result(), res)
	_, err = rvs[1].Settle(ctx, 7)
	require.ErrorIs(t, err, ErrSettled)
	assert.Equal(t, 10, remaining(t, lim, "k"), "Redis charged for what it never admitted")
}

// A reservation the fallback took settles into the key's stand-ins of the
// same rules, even after the key's rules changed and replaced them (it
// indexed the new ones: a panic with more rules than before).
func TestReserveFallbackRulesChange(t *testing.T) {
	b, m := miniBackend(t)
	hour := Rule{Name: "hour", Strategy: TokenBucket, Limit: Limit{Rate: 1, Period: time.Hour, Burst: 100}}
	minute := Rule{Name: "minute", Strategy: TokenBucket, Limit: Limit{Rate: 1, Period: time.Minute, Burst: 100}}
	var two atomic.Bool
	p := newPolicy(t, b.rdb, []Rule{hour}, WithPingInterval(time.Hour),
		WithRulesFunc(func(context.Context, string) ([]Rule, error) {
			if two.Load() {
				return []Rule{hour, minute}, nil
			}
			return nil, nil // the policy's own
		}))
	ctx := t.Context()
	m.SetError("LOADING Redis is loading the dataset in memory")
	rv, err := p.Reserve(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, rv.Result().Degraded)
	two.Store(true)
	res, err := p.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed && res.Degraded, "%+v", res)
	var settled Result
	require.NotPanics(t, func() { settled, err = rv.Settle(ctx, 1) })
	require.NoError(t, err)
	assert.True(t, settled.Degraded)
	res, err = p.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	assert.Equal(t, 98, res.Remaining, "hour: 10 reserved and carried over, 9 given back, and 1 call; minute: 1 call")
}

// Reset forgets a pending reservation for the rules whose state it resets,
// whichever limiter took it, and for those only: one taken by a policy
// whose first rule is another, or before its rules came in another order,
// no longer gives its events back into the fresh state (10 more in one µs
// on a burst of 10), and one on an unrelated state is still settled.
func TestReserveResetSharedState(t *testing.T) {
	second := Rule{Name: "second", Strategy: TokenBucket, Limit: PerSecond(10)}
	hour := Rule{Name: "hour", Strategy: FixedWindow, Limit: PerHour(1000)}
	t.Run("a bucket that a policy's second rule shares", func(t *testing.T) {
		b, _ := miniBackend(t)
		tb := newLimiter(t, b.rdb, TokenBucket, PerSecond(10))
		p := newPolicy(t, b.rdb, []Rule{hour, second})
		rv, err := p.Reserve(t.Context(), "k", 10)
		require.NoError(t, err)
		require.True(t, rv.Result().Allowed)
		require.NoError(t, tb.Reset(t.Context(), "k"))
		require.Equal(t, 10, allowedOf(t, tb, "k", 20), "a fresh bucket")
		require.NoError(t, rv.Cancel(t.Context()), "the hour's window is settled still")
		assert.Zero(t, allowedOf(t, tb, "k", 20), "admitted after the Cancel, in the same µs")
		rep, err := p.AllowN(t.Context(), "k", 0)
		require.NoError(t, err)
		assert.Equal(t, 0, rep.Remaining, "the bucket, reset and used again: nothing given back to it")
		hourly := newLimiter(t, b.rdb, FixedWindow, PerHour(1000))
		rep, err = hourly.AllowN(t.Context(), "k", 0)
		require.NoError(t, err)
		assert.Equal(t, 1000, rep.Remaining, "the hour: the reservation's 10 given back")
	})
	t.Run("a policy whose rules came in another order", func(t *testing.T) {
		b, _ := miniBackend(t)
		var swapped atomic.Bool
		p := newPolicy(t, b.rdb, []Rule{second, hour}, WithRulesFunc(func(context.Context, string) ([]Rule, error) {
			if swapped.Load() {
				return []Rule{second, hour}, nil
			}
			return []Rule{hour, second}, nil
		}))
		rv, err := p.Reserve(t.Context(), "k", 10)
		require.NoError(t, err)
		require.True(t, rv.Result().Allowed)
		swapped.Store(true)
		require.NoError(t, p.Reset(t.Context(), "k"))
		require.Equal(t, 10, allowedOf(t, p, "k", 20))
		require.ErrorIs(t, rv.Cancel(t.Context()), ErrSettled, "Reset forgot it for every rule")
		assert.Zero(t, allowedOf(t, p, "k", 20), "admitted after the Cancel, in the same µs")
	})
	t.Run("a limiter on another state", func(t *testing.T) {
		b, _ := miniBackend(t)
		perSecond := newLimiter(t, b.rdb, TokenBucket, PerSecond(10))
		daily := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 100, Period: 24 * time.Hour})
		rv, err := daily.Reserve(t.Context(), "k", 10)
		require.NoError(t, err)
		require.NoError(t, perSecond.Reset(t.Context(), "k"))
		res, err := rv.Settle(t.Context(), 50)
		require.NoError(t, err, "another state's Reset does not forget it")
		assert.Equal(t, 50, res.Remaining, "the 40 more charged")
	})
	t.Run("a shorter life does not end a longer one's", func(t *testing.T) {
		b, _ := miniBackend(t)
		long := newLimiter(t, b.rdb, TokenBucket, PerSecond(10), WithReservationTTL(time.Hour))
		short := newLimiter(t, b.rdb, TokenBucket, PerSecond(10), WithReservationTTL(time.Minute)) // the same state
		rv, err := long.Reserve(t.Context(), "k", 5)
		require.NoError(t, err)
		_, err = short.Reserve(t.Context(), "k", 1)
		require.NoError(t, err)
		b.advance(2 * time.Minute)
		_, err = rv.Settle(t.Context(), 5)
		require.NoError(t, err, "the hour-long reservation outlived the minute-long one")
	})
}

// Settle's Result is the key's state as AllowN(ctx, key, 0) reports it, on
// every strategy and a policy, a leaky bucket's Delay (the queue ahead)
// included (it was 0).
func TestSettleResultIsReport(t *testing.T) {
	l := Limit{Rate: 10, Period: time.Second, Burst: 10}
	type limiter interface {
		Limiter
		Reserve(context.Context, string, int) (*Reservation, error)
	}
	cases := map[string]func(*testing.T, redis.UniversalClient) limiter{
		"policy": func(t *testing.T, rdb redis.UniversalClient) limiter {
			return newPolicy(t, rdb, []Rule{{Strategy: LeakyBucket, Limit: l}, {Strategy: FixedWindow, Limit: PerHour(1000)}})
		},
	}
	for _, s := range Strategies() {
		cases[s.String()] = func(t *testing.T, rdb redis.UniversalClient) limiter { return newLimiter(t, rdb, s, l) }
	}
	for name, make := range cases {
		for _, used := range []int{0, 3, 7, 10} {
			t.Run(name+"/used "+strconv.Itoa(used), func(t *testing.T) {
				b, _ := miniBackend(t)
				ctx := t.Context()
				lim := make(t, b.rdb)
				_, err := lim.AllowN(ctx, "k", 2)
				require.NoError(t, err)
				b.advance(150 * time.Millisecond)
				rv, err := lim.Reserve(ctx, "k", 7)
				require.NoError(t, err)
				require.True(t, rv.Result().Allowed)
				b.advance(250 * time.Millisecond)
				got, err := rv.Settle(ctx, used)
				require.NoError(t, err)
				want, err := lim.AllowN(ctx, "k", 0)
				require.NoError(t, err)
				assert.Equal(t, want, got, "Settle's Result against AllowN(0)")
			})
		}
	}
}

// Settle's Result is the key's state as AllowN(ctx, key, 0) reports it,
// under the key's rules now, from WithLimitFunc or WithRulesFunc (a lowered
// rate on the same state, another period's state, a warm-up, a calendar
// quota), not the reservation's, and during a penalty block (WithBlock):
// nothing left until it ends. (Settle reported the reservation's rules,
// 11 left where AllowN(0) said 6, and during a block the window's 4 left
// where AllowN(4) was blocked: TestPropertyFoundSettleResultUnderThePlanNow,
// TestPropertyFoundSettleResultDuringBlock.)
func TestSettleResultUnderTheRulesNow(t *testing.T) {
	l := Limit{Rate: 10, Period: time.Second, Burst: 10}
	nows := map[string]Limit{
		"lowered":      {Rate: 6, Period: time.Second},
		"other period": {Rate: 100, Period: time.Minute},
		"warm-up":      {Rate: 10, Period: time.Second, WarmUp: 2 * time.Second},
		"own":          {}, // the reservation's: a block only
	}
	type limiter interface {
		Limiter
		Reserve(context.Context, string, int) (*Reservation, error)
	}
	type plan func(*testing.T, redis.UniversalClient, *atomic.Bool, ...Option) limiter
	cases := map[string]plan{}
	for _, s := range Strategies() {
		for name, now := range nows {
			if now.WarmUp != 0 && s != TokenBucket && s != LeakyBucket {
				continue
			}
			cases[s.String()+"/"+name] = func(t *testing.T, rdb redis.UniversalClient, switched *atomic.Bool, opts ...Option) limiter {
				return newLimiter(t, rdb, s, l, append(opts, WithLimitFunc(func(context.Context, string) (Limit, error) {
					if switched.Load() {
						return now, nil
					}
					return Limit{}, nil
				}))...)
			}
		}
	}
	policies := map[string][2][]Rule{
		"policy": {
			{{Strategy: LeakyBucket, Limit: l}, {Strategy: FixedWindow, Limit: PerHour(1000)}},
			{{Name: "minute", Strategy: FixedWindow, Limit: PerMinute(8)}, {Strategy: SlidingCounter, Limit: PerHour(50)}, {Strategy: TokenBucket, Limit: l}},
		},
		"policy to a calendar": {
			{{Strategy: TokenBucket, Limit: l}, {Strategy: FixedWindow, Limit: PerHour(1000)}},
			{{Strategy: SlidingLog, Limit: PerMinute(9)}, {Name: "daily", Strategy: FixedWindow, Limit: Daily(30, nil)}},
		},
		"policy from a calendar": {
			{{Name: "daily", Strategy: FixedWindow, Limit: Daily(30, nil)}, {Strategy: SubWindowCounter, Limit: l}},
			{{Strategy: TokenBucket, Limit: PerMinute(12)}},
		},
	}
	for name, rules := range policies {
		cases[name] = func(t *testing.T, rdb redis.UniversalClient, switched *atomic.Bool, opts ...Option) limiter {
			return newPolicy(t, rdb, rules[0], append(opts, WithRulesFunc(func(context.Context, string) ([]Rule, error) {
				if switched.Load() {
					return rules[1], nil
				}
				return nil, nil
			}))...)
		}
	}
	for name, make := range cases {
		for _, block := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/block %v", name, block), func(t *testing.T) {
				b, _ := miniBackend(t)
				ctx := t.Context()
				var switched atomic.Bool
				var opts []Option
				if block {
					opts = append(opts, WithBlock(time.Hour))
				}
				lim := make(t, b.rdb, &switched, opts...)
				_, err := lim.AllowN(ctx, "k", 2)
				require.NoError(t, err)
				b.advance(150 * time.Millisecond)
				rv, err := lim.Reserve(ctx, "k", 5)
				require.NoError(t, err)
				require.True(t, rv.Result().Allowed)
				switched.Store(true)
				_, err = lim.AllowN(ctx, "k", 1)
				require.NoError(t, err)
				if block {
					// Use the rules now up: the denial sets the block.
					for i := 0; ; i++ {
						res, err := lim.AllowN(ctx, "k", 1)
						require.NoError(t, err)
						if !res.Allowed {
							break
						}
						require.Less(t, i, 200, "never denied")
					}
				}
				b.advance(250 * time.Millisecond)
				got, err := rv.Settle(ctx, 3)
				require.NoError(t, err)
				want, err := lim.AllowN(ctx, "k", 0)
				require.NoError(t, err)
				assert.Equal(t, want, got, "Settle's Result against AllowN(0)")
				if block {
					assert.Zero(t, got.Remaining, "during the block")
				}
			})
		}
	}
}

// Settle's used is bounded only where the state needs it, on Redis and in
// the fallback: past it the settle is refused, nothing changes, and the
// reservation stays pending, so that a smaller used settles it; the most
// accepted is charged whole. (Unbounded, a used of MaxRate on a bucket of a
// long Period made Redis refuse the write after the reservation was gone,
// and turned RetryAfter negative; in the fallback it looped once per
// event. A sliding log is charged what it takes in one call instead:
// TestSettleSlidingLogOverspend.)
func TestSettleUsedBounded(t *testing.T) {
	year := 365 * 24 * time.Hour
	for _, tc := range []struct {
		s    Strategy
		l    Limit
		used int // refused
		want error
		most int // the most accepted
	}{
		// A bucket's debt must be paid back within MaxPeriod (100 years).
		{TokenBucket, Limit{Rate: 1000, Period: year}, 100_001, ErrExceedsLimit, 100_000},
		{LeakyBucket, Limit{Rate: 10, Period: time.Hour, Burst: 50}, 8_760_001, ErrExceedsLimit, 8_760_000},
		// A window's count: at most MaxRate a settle.
		{FixedWindow, Limit{Rate: 10, Period: time.Hour}, MaxRate + 1, ErrExceedsLimit, MaxRate},
		{SlidingCounter, Limit{Rate: 10, Period: time.Hour}, MaxRate + 1, ErrExceedsLimit, MaxRate},
		{TokenBucket, Limit{Rate: 10, Period: time.Hour}, -1, ErrInvalidArgument, 0},
		{SlidingLog, PerMinute(10), MaxRate + 1, ErrExceedsLimit, MaxRate},
	} {
		t.Run(tc.s.String(), func(t *testing.T) {
			b, m := miniBackend(t)
			lim := newLimiter(t, b.rdb, tc.s, tc.l, WithPingInterval(10*time.Millisecond))
			ctx := t.Context()
			rv, err := lim.Reserve(ctx, "k", 1)
			require.NoError(t, err)
			state := lim.stateKey("k")
			before := []string{snapshot(t, b.rdb, state), snapshot(t, b.rdb, state+reserveSuffix)}
			_, err = rv.Settle(ctx, tc.used)
			require.ErrorIs(t, err, tc.want, "used %d", tc.used)
			assert.Equal(t, before, []string{snapshot(t, b.rdb, state), snapshot(t, b.rdb, state+reserveSuffix)}, "a refused settle wrote nothing")
			res, err := rv.Settle(ctx, tc.most)
			require.NoError(t, err, "the reservation stayed pending")
			assert.GreaterOrEqual(t, res.RetryAfter, time.Duration(0))
			assert.GreaterOrEqual(t, res.ResetAfter, time.Duration(0))
			if tc.most > lim.own.maxN {
				res, err = lim.Allow(ctx, "k")
				require.NoError(t, err)
				assert.False(t, res.Allowed, "in debt after settling %d", tc.most)
			}
			_, err = rv.Settle(ctx, 1)
			require.ErrorIs(t, err, ErrSettled)

			// In the fallback: refused the same, and the most accepted
			// settles at once.
			m.SetError("LOADING Redis is loading the dataset in memory")
			defer m.SetError("")
			local, err := lim.Reserve(ctx, "j", 1)
			require.NoError(t, err)
			require.True(t, local.Result().Degraded)
			_, err = local.Settle(ctx, tc.used)
			require.ErrorIs(t, err, tc.want, "used %d in the fallback", tc.used)
			start := time.Now()
			_, err = local.Settle(ctx, tc.most)
			require.NoError(t, err)
			assert.Less(t, time.Since(start), 100*time.Millisecond, "a settle in the fallback takes constant time")
		})
	}
}

// A byte-rate leaky bucket in the fallback takes constant time and memory
// for a call of many events (it made one x/time/rate reservation per
// event: 2^21 events took 144 MB), and a settle's debt the same.
func TestLeakyFallbackLargeN(t *testing.T) {
	b, m := miniBackend(t)
	lim := newLimiter(t, b.rdb, LeakyBucket, PerSecond(1<<30), WithPingInterval(time.Hour))
	ctx := t.Context()
	m.SetError("LOADING Redis is loading the dataset in memory")
	allocs := testing.AllocsPerRun(3, func() {
		res, err := lim.AllowN(ctx, "k", 1<<21)
		require.NoError(t, err)
		require.True(t, res.Degraded)
	})
	assert.Less(t, allocs, 100.0, "allocations for a call of 2^21 events")
	rv, err := lim.Reserve(ctx, "j", 1)
	require.NoError(t, err)
	start := time.Now()
	_, err = rv.Settle(ctx, 1<<30)
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 100*time.Millisecond, "a debt of 2^30 events settles in constant time")
}

// A bucket's refund never gives back refill: the reservation's tokens
// count as paid back by the refill once what was used before it is, so a
// reservation taken from a full bucket and settled after the bucket
// refilled gives nothing back (it gave back all, and with another caller
// draining in between the key admitted twice its Burst at once). Each
// case's Remaining is what the key would hold had the reservation been for
// the used events from the start.
func TestBucketRefundNoRefill(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		for _, tc := range []struct {
			name          string
			before        int           // events used just before the reservation
			wait          time.Duration // between the reservation and its settle
			drain         bool          // another caller takes all there is before the settle
			wantRemaining int           // after Settle(0)
		}{
			{"refilled, then drained", 0, 1100 * time.Millisecond, true, 0},
			{"refilled", 0, 1100 * time.Millisecond, false, 10},
			{"half refilled", 0, 500 * time.Millisecond, false, 10},
			{"half refilled, then drained", 0, 500 * time.Millisecond, true, 5},
			{"behind earlier use", 5, 300 * time.Millisecond, false, 8},
			{"at once", 0, 0, false, 10},
		} {
			t.Run(s.String()+"/"+tc.name, func(t *testing.T) {
				b, _ := miniBackend(t)
				lim := newLimiter(t, b.rdb, s, Limit{Rate: 10, Period: time.Second, Burst: 10})
				ctx := t.Context()
				if tc.before > 0 {
					res, err := lim.AllowN(ctx, "k", tc.before)
					require.NoError(t, err)
					require.True(t, res.Allowed)
				}
				rv, err := lim.Reserve(ctx, "k", 10-tc.before)
				require.NoError(t, err)
				require.True(t, rv.Result().Allowed)
				b.advance(tc.wait)
				if tc.drain {
					res, err := lim.AllowN(ctx, "k", remaining(t, lim, "k"))
					require.NoError(t, err)
					require.True(t, res.Allowed)
				}
				_, err = rv.Settle(ctx, 0)
				require.NoError(t, err)
				assert.Equal(t, tc.wantRemaining, remaining(t, lim, "k"))
			})
		}
	}
	// A policy of two buckets, the same.
	b, _ := miniBackend(t)
	p, err := NewPolicy(b.rdb, []Rule{
		{Strategy: TokenBucket, Limit: Limit{Rate: 10, Period: time.Second, Burst: 10}},
		{Strategy: TokenBucket, Limit: Limit{Rate: 600, Period: time.Minute, Burst: 100}},
	})
	require.NoError(t, err)
	defer p.Close()
	ctx := t.Context()
	rv, err := p.Reserve(ctx, "k", 10)
	require.NoError(t, err)
	b.advance(1100 * time.Millisecond)
	res, err := p.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	require.NoError(t, rv.Cancel(ctx))
	res, err = p.Allow(ctx, "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed, "the refill was not given back again")
}

// Reset forgets the key's pending reservations: settled afterwards, one
// returns ErrSettled and gives nothing back into the fresh state (it gave
// back its events, and the key admitted Rate plus them with no refill).
func TestResetForgetsReservations(t *testing.T) {
	for _, s := range Strategies() {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			lim := newLimiter(t, b.rdb, s, Limit{Rate: 10, Period: time.Hour, Burst: 10})
			ctx := t.Context()
			rv, err := lim.Reserve(ctx, "k", 6)
			require.NoError(t, err)
			require.NoError(t, lim.Reset(ctx, "k"))
			admitted := 0
			for range 20 {
				res, err := lim.Allow(ctx, "k")
				require.NoError(t, err)
				if res.Allowed {
					admitted++
				}
			}
			require.Equal(t, 10, admitted)
			require.ErrorIs(t, rv.Cancel(ctx), ErrSettled)
			res, err := lim.Allow(ctx, "k")
			require.NoError(t, err)
			assert.False(t, res.Allowed, "nothing given back into the fresh state")
		})
	}
}

// In the fallback too, a refund never gives back refill: a reservation
// taken from a full stand-in and cancelled after it refilled (and was
// drained again) gives nothing back.
func TestFallbackRefundNoRefill(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket, FixedWindow} {
		t.Run(s.String(), func(t *testing.T) {
			b, m := miniBackend(t)
			lim := newLimiter(t, b.rdb, s, Limit{Rate: 100, Period: time.Second, Burst: 10}, WithPingInterval(time.Hour))
			ctx := t.Context()
			m.SetError("LOADING Redis is loading the dataset in memory")
			capacity := lim.own.maxN
			rv, err := lim.Reserve(ctx, "k", capacity)
			require.NoError(t, err)
			require.True(t, rv.Result().Degraded)
			require.True(t, rv.Result().Allowed)
			time.Sleep(time.Duration(capacity+5) * 10 * time.Millisecond) // refilled
			drain := func() int {
				admitted := 0
				for range 2 * capacity {
					res, err := lim.Allow(ctx, "k")
					require.NoError(t, err)
					if res.Allowed && res.Delay < 10*time.Millisecond {
						admitted++
					}
				}
				return admitted
			}
			drain()
			drained := time.Now()
			_, err = rv.Settle(ctx, 0)
			require.NoError(t, err)
			got := drain()
			// What refilled since the drain (one event each 10 ms, and one
			// more for the event under way); the defect gave back 10 to 100.
			refilled := 1 + int(time.Since(drained)/(10*time.Millisecond))
			assert.LessOrEqual(t, got, refilled, "events admitted at once after the refund (%d may have refilled meanwhile)", refilled)
		})
	}
}

// A reserve drops at most 16 lapsed reservations, so that one call never
// clears a large backlog at once (360,000 lapsed took one reserve 102 ms);
// lapsed ones still present settle as lapsed.
func TestReserveDropsLapsedGradually(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	lim := newLimiter(t, b.rdb, FixedWindow, PerHour(10_000), WithReservationTTL(time.Minute), WithPrefix("lapsed"))
	var first *Reservation
	for i := range 100 {
		rv, err := lim.Reserve(ctx, "k", 1)
		require.NoError(t, err)
		if i == 0 {
			first = rv
		}
	}
	rkey := lim.stateKey("k") + reserveSuffix
	// One more, 30 s on, keeps the set alive past the first 100's lapse.
	b.advance(30 * time.Second)
	_, err := lim.Reserve(ctx, "k", 1)
	require.NoError(t, err)
	b.advance(45 * time.Second)
	for i, want := range []int64{101 - 16 + 1, 101 - 32 + 2} {
		_, err := lim.Reserve(ctx, "k", 1)
		require.NoError(t, err)
		n, err := b.rdb.ZCard(ctx, rkey).Result()
		require.NoError(t, err)
		assert.Equal(t, want, n, "reservations held after reserve %d past the lapse", i+1)
	}
	_, err = first.Settle(ctx, 0)
	require.ErrorIs(t, err, ErrSettled, "a lapsed reservation settles as lapsed")
}

// Memory per pending reservation, measured with MEMORY USAGE of the
// reservations' key on a real redis-server, at 1 to 100,000 pending: each
// must stay within what WithReservationTTL and docs/reservations.md say
// (the set, about 120 bytes, with the first; about 26 bytes each up to 128
// pending on a key, about 104 past that).
func TestReservationMemoryRedis(t *testing.T) {
	t.Parallel() // no clock, keys of its own: beside the lane's other parallel tests
	opts := redistest.TunedOptions(realServer(t).Addr)
	opts.PoolSize = 32
	opts.DialTimeout, opts.ReadTimeout, opts.WriteTimeout, opts.PoolTimeout = 5*time.Second, 5*time.Second, 5*time.Second, 5*time.Second
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	lim := newLimiter(t, rdb, FixedWindow, Limit{Rate: MaxRate, Period: time.Hour},
		WithPrefix(prefixFor(t)), WithFallback(FallbackError)) // every reservation on Redis
	ctx := context.Background()
	for _, tc := range []struct {
		pending int
		most    float64 // bytes per pending reservation
	}{
		// One: the key itself. Up to 128 (zset-max-listpack-entries) the
		// set is a listpack, then a skiplist and a hash table. Measured on
		// Redis 7.0.15: 136, 26.6, 101.7 and 103.8 bytes (with ids of two
		// numbers, 26 bytes: 152, 42.0, 118.8 and 119.9).
		{1, 150}, {100, 32}, {1000, 112}, {100_000, 112},
	} {
		key := "k" + strconv.Itoa(tc.pending)
		var wg sync.WaitGroup
		var next atomic.Int64
		for range 32 {
			wg.Go(func() {
				for next.Add(1) <= int64(tc.pending) {
					rv, err := lim.Reserve(ctx, key, 1)
					if !assert.NoError(t, err) || !assert.True(t, rv.Result().Allowed) {
						return
					}
				}
			})
		}
		wg.Wait()
		set := lim.stateKey(key) + reserveSuffix
		require.Equal(t, int64(tc.pending), rdb.ZCard(ctx, set).Val())
		usage, err := rdb.MemoryUsage(ctx, set, 0).Result() // SAMPLES 0: every member
		require.NoError(t, err)
		per := float64(usage) / float64(tc.pending)
		t.Logf("%d pending: %d bytes, %.1f each", tc.pending, usage, per)
		assert.LessOrEqual(t, per, tc.most, "%d pending", tc.pending)
	}
}

// What pending reservations cost per rule, by MEMORY USAGE on a real
// redis-server, for key names as short as the docs' example
// (redlimit:{user:10001}:tb60000000:r): a 3-rule Policy's first pending
// reservation makes a sorted set beside each rule's state, at most
// reservationSetMost bytes per rule (the key and its name: 120 B on Redis
// 7.0.15, so 264 B of states become 624 B), and each further one is a
// member of each rule's set, at most reservationMemberMost bytes per
// rule while a key has at most 128 pending (26.6 B on Redis 7.0.15), the
// figures that WithReservationTTL and docs/reservations.md state.
func TestReservationMemoryPerRuleRedis(t *testing.T) {
	const (
		reservationSetMost    = 128
		reservationMemberMost = 30
	)
	rdb := redis.NewClient(redistest.TunedOptions(realServer(t).Addr))
	t.Cleanup(func() { rdb.Close() })
	ctx := t.Context()
	rules := []Rule{
		{Name: "rps", Strategy: TokenBucket, Limit: PerSecond(1000)},
		{Name: "rpm", Strategy: FixedWindow, Limit: PerMinute(100_000)},
		{Name: "rpd", Strategy: FixedWindow, Limit: Limit{Rate: 1_000_000, Period: 24 * time.Hour}},
	}
	// The library's default prefix, and a key as long as user:10001 that
	// no other test writes.
	p := newPolicy(t, rdb, rules, WithPrefix("redlimit"), WithFallback(FallbackError))
	key := fmt.Sprintf("mem%07d", testRun.Add(1)%10_000_000)
	first := p.stateKey(key, &p.own.rules[0])
	usage := func(suffix string) (total int64) {
		t.Helper()
		for i := range p.own.rules {
			n, err := rdb.MemoryUsage(ctx, ruleKey(first, p.own, i)+suffix, 0).Result()
			require.NoError(t, err)
			total += n
		}
		return total
	}
	res, err := p.Allow(ctx, key)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	states := usage("")
	rv, err := p.Reserve(ctx, key, 1)
	require.NoError(t, err)
	require.True(t, rv.Result().Allowed)
	one := usage(reserveSuffix)
	t.Logf("3 rules: states %d B, with one pending reservation %d B (%.1f B per rule for the sets)", states, states+one, float64(one)/3)
	assert.LessOrEqual(t, float64(one)/3, float64(reservationSetMost), "the first pending reservation, per rule")
	for range 99 {
		_, err := p.Reserve(ctx, key, 1)
		require.NoError(t, err)
	}
	hundred := usage(reserveSuffix)
	per := float64(hundred-one) / 99 / 3
	t.Logf("100 pending: %d B for the sets, %.1f B per further reservation and rule", hundred, per)
	assert.LessOrEqual(t, per, float64(reservationMemberMost), "each further pending reservation, per rule")
}

// A settle past the capacity is charged whole: 12 used of a reservation of
// 10 at 10 a minute. Later calls are denied exactly until the debt is paid
// back, with exact RetryAfters: a bucket by its refill (2 owed: 3 tokens
// for the next call, 18 s); a fixed window by its end (the count past
// Rate goes with the window); a sliding counter as the window's weight
// falls in the next one (12 of 10 weigh less than 9 only 45 s into it);
// a sliding log when its entries leave (it holds at most Rate, at the
// settle's time).
func TestSettlePastCapacity(t *testing.T) {
	per := Limit{Rate: 10, Period: time.Minute, Burst: 10}
	for _, tc := range []struct {
		s      Strategy
		settle time.Duration // after the reservation, at t0
		used   int
		steps  []step // from the settle
	}{
		{TokenBucket, 0, 12, []step{
			{n: 1, retry: 18 * time.Second, reset: 72 * time.Second},
			{advance: 18*time.Second - time.Microsecond, n: 1, retry: time.Microsecond, reset: 54*time.Second + time.Microsecond},
			{advance: time.Microsecond, n: 1, allowed: true, remaining: 0, reset: 60 * time.Second},
			{n: 1, retry: 6 * time.Second, reset: 60 * time.Second},
		}},
		{LeakyBucket, 0, 12, []step{
			{n: 1, retry: 18 * time.Second, reset: 72 * time.Second},
			{advance: 18*time.Second - time.Microsecond, n: 1, retry: time.Microsecond, reset: 54*time.Second + time.Microsecond},
			{advance: time.Microsecond, n: 1, allowed: true, remaining: 0, delay: 54 * time.Second, reset: 60 * time.Second},
		}},
		{FixedWindow, 10 * time.Second, 12, []step{
			{n: 1, retry: 50 * time.Second, reset: 50 * time.Second},
			{advance: 50*time.Second - time.Microsecond, n: 1, retry: time.Microsecond, reset: time.Microsecond},
			{advance: time.Microsecond, n: 1, allowed: true, remaining: 9, reset: time.Minute},
		}},
		{SlidingCounter, 0, 12, []step{
			{n: 1, retry: 75 * time.Second, reset: 2 * time.Minute},
			{advance: 75*time.Second - time.Microsecond, n: 1, retry: time.Microsecond, reset: 45*time.Second + time.Microsecond},
			{advance: time.Microsecond, n: 1, allowed: true, remaining: 0, reset: 105 * time.Second},
		}},
		{SlidingLog, 10 * time.Second, 25, []step{ // 15 owed, at most 10 kept: the window from the settle
			{n: 1, retry: time.Minute, reset: time.Minute},
			{advance: time.Minute - time.Microsecond, n: 1, retry: time.Microsecond, reset: time.Microsecond},
			{advance: time.Microsecond, n: 1, allowed: true, remaining: 9, reset: time.Minute},
		}},
	} {
		t.Run(tc.s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			lim := newLimiter(t, b.rdb, tc.s, per)
			ctx := t.Context()
			rv, err := lim.Reserve(ctx, "k", 10)
			require.NoError(t, err)
			require.True(t, rv.Result().Allowed)
			b.advance(tc.settle)
			res, err := rv.Settle(ctx, tc.used)
			require.NoError(t, err, "settle %d of a reservation of 10 at %v", tc.used, per)
			assert.Equal(t, 0, res.Remaining)
			run(t, b, lim, "k", tc.steps)
		})
	}
}

// A policy's settle past a rule's capacity charges every rule, the daily
// one included: 12,000 tokens used of 10,000 reserved against 10,000 a
// minute and 200,000 a day.
func TestSettlePastCapacityPolicy(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	p := newPolicy(t, b.rdb, []Rule{
		{Name: "rps", Strategy: TokenBucket, Limit: PerSecond(5), PerCall: true},
		{Name: "tpm", Strategy: TokenBucket, Limit: PerMinute(10_000)},
		{Name: "tpd", Strategy: SlidingCounter, Limit: Limit{Rate: 200_000, Period: 24 * time.Hour}},
	})
	day := newLimiter(t, b.rdb, SlidingCounter, Limit{Rate: 200_000, Period: 24 * time.Hour}) // the tpd rule's state
	rv, err := p.Reserve(ctx, "k", 10_000)
	require.NoError(t, err)
	require.True(t, rv.Result().Allowed)
	_, err = rv.Settle(ctx, 12_000)
	require.NoError(t, err)
	assert.Equal(t, 188_000, remaining(t, day, "k"), "the daily rule charged 12,000")
	run(t, b, p, "k", []step{
		// 2,000 owed, and the call's token: 2,001 × 6 ms.
		// ResetAfter: the daily counter's, until its next window ends.
		{n: 1, retry: 12006 * time.Millisecond, reset: 48 * time.Hour},
		{advance: 12006*time.Millisecond - time.Microsecond, n: 1, retry: time.Microsecond, reset: 48*time.Hour - 12006*time.Millisecond + time.Microsecond},
		{advance: time.Microsecond, n: 1, allowed: true, remaining: 0, reset: 48*time.Hour - 12006*time.Millisecond},
	})
}

// The same on a real redis-server, whose clock runs: a token bucket owes
// its debt, and a policy charges every rule.
func TestSettlePastCapacityRedis(t *testing.T) {
	rdb := redis.NewClient(redistest.TunedOptions(realServer(t).Addr))
	t.Cleanup(func() { rdb.Close() })
	ctx := context.Background()
	prefix := WithPrefix(prefixFor(t))
	lim := newLimiter(t, rdb, TokenBucket, PerMinute(10), prefix, WithFallback(FallbackError))
	start := time.Now()
	rv, err := lim.Reserve(ctx, "k", 10)
	require.NoError(t, err)
	_, err = rv.Settle(ctx, 12)
	require.NoError(t, err)
	res, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	// 3 tokens at 6 s each, less the refill since the reservation.
	assert.InDelta(t, 18*time.Second, res.RetryAfter, float64(time.Since(start)+time.Millisecond))

	p := newPolicy(t, rdb, []Rule{
		{Name: "tpm", Strategy: TokenBucket, Limit: PerMinute(10_000)},
		{Name: "tpd", Strategy: SlidingCounter, Limit: Limit{Rate: 200_000, Period: 24 * time.Hour}},
	}, prefix, WithFallback(FallbackError))
	clearOfHourEdge(t, 10*time.Second) // the day's window must not end in between
	rv, err = p.Reserve(ctx, "p", 10_000)
	require.NoError(t, err)
	_, err = rv.Settle(ctx, 12_000)
	require.NoError(t, err)
	day := newLimiter(t, rdb, SlidingCounter, Limit{Rate: 200_000, Period: 24 * time.Hour}, prefix)
	assert.Equal(t, 188_000, remaining(t, day, "p"))
	res, err = p.Allow(ctx, "p")
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.Equal(t, "tpm", res.Rule)
}

// A settle's overspend on a sliding log is charged as far as the log takes
// it in one call: min(used-n, Rate) entries, MaxSlidingLogN at most
// between a policy's logs (each its share), the rest not; a bucket beside
// them is charged it all. (A report of 1,200 on a reservation of 10, at
// 5,000 an hour, was refused with ErrInvalidArgument, and the key stood
// charged 10: less than for a report of 1,000.)
func TestSettleSlidingLogOverspend(t *testing.T) {
	log := Rule{Name: "log", Strategy: SlidingLog, Limit: PerHour(5000)}
	log2 := Rule{Name: "log2", Strategy: SlidingLog, Limit: Limit{Rate: 5000, Period: 2 * time.Hour}}
	bucket := Rule{Name: "bucket", Strategy: TokenBucket, Limit: Limit{Rate: 5000, Period: time.Hour, Burst: 5000}}
	for _, tc := range []struct {
		name  string
		rules []Rule
		used  int
		want  []int // each rule's Remaining after the settle
	}{
		{"a log charged 990", []Rule{log}, 1000, []int{4000}},
		{"a log charged 1,190 takes 1,000", []Rule{log}, 1200, []int{3990}},
		{"two logs take 500 each", []Rule{log, log2}, 1200, []int{4490, 4490}},
		{"a bucket beside a log takes it all", []Rule{log, bucket}, 1200, []int{3990, 3800}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := miniBackend(t)
			ctx := t.Context()
			var lim interface {
				Reserve(context.Context, string, int) (*Reservation, error)
			}
			if len(tc.rules) == 1 {
				lim = newLimiter(t, b.rdb, tc.rules[0].Strategy, tc.rules[0].Limit)
			} else {
				lim = newPolicy(t, b.rdb, tc.rules)
			}
			rv, err := lim.Reserve(ctx, "k", 10)
			require.NoError(t, err)
			require.True(t, rv.Result().Allowed)
			res, err := rv.Settle(ctx, tc.used)
			require.NoError(t, err, "settle %d of a reservation of 10", tc.used)
			assert.Equal(t, slices.Min(tc.want), res.Remaining, "the settle's Result")
			for i, r := range tc.rules {
				got := remaining(t, newLimiter(t, b.rdb, r.Strategy, r.Limit), "k")
				assert.Equal(t, tc.want[i], got, "rule %s: Remaining after a settle of %d", r.Name, tc.used)
			}
			_, err = rv.Settle(ctx, 10)
			require.ErrorIs(t, err, ErrSettled, "settled once")
		})
	}
}

// A refund after an earlier one gives back no refill that happened. Reserve
// 5, Reserve 3, Cancel the first: the second's events move up to the front
// of the queue and are refilled by 300 ms, not 800 ms as their tag said.
// At 450 ms the bucket is full and used up; the second's Cancel gave back
// its 3 all the same: 11 admitted at one instant against Burst 8. The same
// through a prefetch (WithPrefetch), whose give-back is such a refund.
func TestBucketRefundAfterRefund(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			refundAfterRefund(t, b, s)
		})
	}
	t.Run("prefetch", func(t *testing.T) {
		b, _ := miniBackend(t)
		prefetchRefundAfterRefund(t, b)
	})
	// What was not refilled still comes back: both cancelled at once, in
	// either order, give back all 8; the second cancelled 150 ms after the
	// first (its 3 events then at the front, 1.5 refilled) gives back 1.5.
	for _, tc := range []struct {
		name   string
		wait   time.Duration
		second bool // cancel the second reservation first
	}{
		{"at once", 0, false},
		{"at once, newest first", 0, true},
		{"150ms apart", 150 * time.Millisecond, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, _ := miniBackend(t)
			lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 8, Period: 800 * time.Millisecond, Burst: 8})
			ctx := t.Context()
			first, err := lim.Reserve(ctx, "k", 5)
			require.NoError(t, err)
			second, err := lim.Reserve(ctx, "k", 3)
			require.NoError(t, err)
			if tc.second {
				first, second = second, first
			}
			require.NoError(t, first.Cancel(ctx))
			b.advance(tc.wait)
			require.NoError(t, second.Cancel(ctx))
			assert.Equal(t, 8, remaining(t, lim, "k"))
			res, err := lim.AllowN(ctx, "k", 8)
			require.NoError(t, err)
			require.True(t, res.Allowed)
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			assert.False(t, res.Allowed, "a 9th at once")
		})
	}
}

// Four reservations of 10 fill a bucket of 40; the third is cancelled (a
// gap in the middle of the queue), then the first (a gap at its front),
// then the second. With no time passed, the second gets all 10 back:
// taking every gap as passed once the first is gave it none (the failure
// TestReserveConcurrentRedis found). Half a second on (5 events
// refilled, the first reservation's), it gets back at least what the
// refill since its call cannot have paid back of its own (10 - 5), and
// never more than was not refilled (10: the key as if it had never been
// taken).
func TestBucketRefundBehindGaps(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		for _, tc := range []struct {
			wait     time.Duration
			min, max int // remaining after the three cancels
		}{
			{0, 30, 30},
			{500 * time.Millisecond, 25, 30},
		} {
			t.Run(fmt.Sprintf("%v/%v", s, tc.wait), func(t *testing.T) {
				b, _ := miniBackend(t)
				lim := newLimiter(t, b.rdb, s, Limit{Rate: 10, Period: time.Second, Burst: 40})
				ctx := t.Context()
				var rv [4]*Reservation
				for i := range rv {
					var err error
					rv[i], err = lim.Reserve(ctx, "k", 10)
					require.NoError(t, err)
					require.True(t, rv[i].Result().Allowed)
				}
				b.advance(tc.wait)
				for _, i := range []int{2, 0, 1} {
					require.NoError(t, rv[i].Cancel(ctx))
				}
				got := remaining(t, lim, "k")
				assert.GreaterOrEqual(t, got, tc.min, "the second reservation's own events not refilled come back")
				assert.LessOrEqual(t, got, tc.max, "no refill given back")
			})
		}
	}
}

func TestBucketRefundAfterRefundRedis(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			refundAfterRefund(t, realBackend(t), s)
		})
	}
	t.Run("prefetch", func(t *testing.T) {
		prefetchRefundAfterRefund(t, realBackend(t))
	})
}

// useUp takes all that lim has for key now, then cancels the reservation
// rv and takes what is left after it; it returns how many events it took
// in all, and how long that took (real Redis refills meanwhile).
func useUp(t *testing.T, lim Limiter, key string, giveBack func()) (int, time.Duration) {
	t.Helper()
	ctx := t.Context()
	start := time.Now()
	n := remaining(t, lim, key)
	res, err := lim.AllowN(ctx, key, n)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	giveBack()
	for {
		res, err := lim.Allow(ctx, key)
		require.NoError(t, err)
		if !res.Allowed {
			break
		}
		n++
	}
	return n, time.Since(start)
}

func refundAfterRefund(t *testing.T, b *backend, s Strategy) {
	l := Limit{Rate: 8, Period: 800 * time.Millisecond, Burst: 8}
	lim := newLimiter(t, b.rdb, s, l, WithPrefix(prefixFor(t)))
	ctx := t.Context()
	first, err := lim.Reserve(ctx, "k", 5)
	require.NoError(t, err)
	require.True(t, first.Result().Allowed)
	second, err := lim.Reserve(ctx, "k", 3)
	require.NoError(t, err)
	require.True(t, second.Result().Allowed)
	require.NoError(t, first.Cancel(ctx))
	b.advance(450 * time.Millisecond)
	n, took := useUp(t, lim, "k", func() { require.NoError(t, second.Cancel(ctx)) })
	refilled := int(took / (l.Period / time.Duration(l.Rate)))
	t.Logf("admitted %d at one instant (%v), against Burst %d", n, took, l.Burst)
	assert.LessOrEqual(t, n, l.Burst+refilled, "admitted at one instant (%v), against Burst %d", took, l.Burst)
}

func prefetchRefundAfterRefund(t *testing.T, b *backend) {
	l := Limit{Rate: 800, Period: 8 * time.Second, Burst: 800} // one event per 10 ms
	prefix := WithPrefix(prefixFor(t))
	lim := newLimiter(t, b.rdb, TokenBucket, l, prefix)
	hot := newLimiter(t, b.rdb, TokenBucket, l, prefix, WithPrefetch(100, time.Minute))
	ctx := t.Context()
	first, err := lim.Reserve(ctx, "k", 500)
	require.NoError(t, err)
	require.True(t, first.Result().Allowed)
	for i := 0; hot.PrefetchStats().Held == 0; i++ {
		require.Less(t, i, 1000, "no prefetch taken")
		res, err := hot.Allow(ctx, "k")
		require.NoError(t, err)
		require.True(t, res.Allowed)
	}
	require.Positive(t, hot.PrefetchStats().Unused)
	require.NoError(t, first.Cancel(ctx)) // the prefetch's events move up
	b.advance(3 * time.Second)            // full again
	n, took := useUp(t, lim, "k", func() { require.NoError(t, hot.Close()) })
	refilled := int(took / (l.Period / time.Duration(l.Rate)))
	t.Logf("admitted %d at one instant (%v), against Burst %d", n, took, l.Burst)
	assert.LessOrEqual(t, n, l.Burst+refilled, "admitted at one instant (%v), against Burst %d", took, l.Burst)
}

// Settle's Result is the key's state "as AllowN(ctx, key, 0) reports it"
// (Reservation.Settle): under the key's limit now, as AllowN decides, not
// under the one the reservation was taken with. After a plan's Rate
// lowered from 11 to 6 between Reserve(9) and its Cancel, Settle said
// Remaining 11, and AllowN(11) is an error (ErrExceedsLimit: 6 at most at
// once); AllowN(0) says 6 (TestProperty seeds 12, 76, 87).
func TestPropertyFoundSettleResultUnderThePlanNow(t *testing.T) {
	b, _ := miniBackend(t)
	lowered := false
	lim := newLimiter(t, b.rdb, FixedWindow, Limit{Rate: 11, Period: 800 * time.Millisecond},
		WithLimitFunc(func(context.Context, string) (Limit, error) {
			if lowered {
				return Limit{Rate: 6, Period: 800 * time.Millisecond}, nil
			}
			return Limit{}, nil
		}))
	ctx := context.Background()
	rv, err := lim.Reserve(ctx, "k", 9)
	require.NoError(t, err)
	require.True(t, rv.Result().Allowed)
	lowered = true
	res, err := rv.Settle(ctx, 0)
	require.NoError(t, err)
	look, err := lim.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	require.Equal(t, look.Remaining, res.Remaining, "Settle's Remaining, against AllowN(0)'s right after")
}

// Settle's Result during a penalty block is the key's state as AllowN(0)
// reports it then: nothing left until the block ends. A Cancel during a
// block said Remaining 4 (the window's), and AllowN(4) right after was
// blocked (TestProperty seeds 6, 21, 31, 53, 63 and others: the settle
// script does not read the block).
func TestPropertyFoundSettleResultDuringBlock(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, FixedWindow, Limit{Rate: 4, Period: time.Millisecond}, WithBlock(time.Second))
	ctx := context.Background()
	rv, err := lim.Reserve(ctx, "k", 3)
	require.NoError(t, err)
	require.True(t, rv.Result().Allowed)
	res, err := lim.AllowN(ctx, "k", 3) // denied: sets the block
	require.NoError(t, err)
	require.False(t, res.Allowed)
	res, err = rv.Settle(ctx, 0)
	require.NoError(t, err)
	look, err := lim.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	require.Equal(t, look.Remaining, res.Remaining, "Settle's Remaining during the block, against AllowN(0)'s right after")
	if res.Remaining > 0 {
		take, err := lim.AllowN(ctx, "k", res.Remaining)
		require.NoError(t, err)
		require.True(t, take.Allowed, "AllowN(%d), Settle's Remaining, during the block: %+v", res.Remaining, take)
	}
}
