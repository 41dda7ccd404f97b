package redlimit

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/redlimit/redlimit/internal/testlane"
)

// At 1e9 events per second with a burst of 1e6 (a byte-rate limit), the
// bucket is exact to the event: one µs refills 1000.
func TestBucketByteRateExact(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			lim := newLimiter(t, b.rdb, s, Limit{Rate: 1_000_000_000, Period: time.Second, Burst: 1_000_000})
			ctx := t.Context()
			res, err := lim.AllowN(ctx, "k", 1_000_000)
			require.NoError(t, err)
			require.True(t, res.Allowed)
			b.advance(time.Microsecond)
			for i := range 1000 {
				res, err := lim.Allow(ctx, "k")
				require.NoError(t, err)
				require.True(t, res.Allowed, "event %d of the 1000 refilled in 1µs", i+1)
			}
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			require.False(t, res.Allowed, "the 1001st event in 1µs")
			assert.Equal(t, time.Microsecond, res.RetryAfter)

			b.advance(3 * time.Microsecond) // 3000 bytes
			for i := range 2 {
				res, err := lim.AllowN(ctx, "k", 1500)
				require.NoError(t, err)
				require.True(t, res.Allowed, "packet %d of 1500 bytes", i+1)
			}
			res, err = lim.AllowN(ctx, "k", 1500)
			require.NoError(t, err)
			require.False(t, res.Allowed, "a third packet in 3µs")
			assert.Equal(t, 2*time.Microsecond, res.RetryAfter, "1500 bytes at 1e9/s, rounded up to the µs")
		})
	}
}

// A caller that keeps offering more than the limit gets at least 99.9% of
// Burst + Rate·d, and never more, whatever its n.
func TestBucketGreedyCallerGetsTheLimit(t *testing.T) {
	testlane.MarkHeavy(t)
	t.Parallel() // its own miniredis and clock: the heavy lane runs its tests on both cores
	cases := []struct {
		limit Limit
		step  time.Duration // between rounds of calls
		d     time.Duration
		ns    []int
	}{
		{Limit{Rate: 10_000, Period: time.Second, Burst: 100}, time.Millisecond, time.Second, []int{1, 3, 64, 100}},
		{Limit{Rate: 1_000_000_000, Period: time.Second, Burst: 1_000_000}, 10 * time.Microsecond, 10 * time.Millisecond, []int{1500, 65536, 1_000_000}},
		// With n = Burst a caller that comes back only every step loses the
		// refill of up to one step per batch (the bucket is full): 10ms
		// here, 0.02 of a token at this rate (the bound allows 0.03),
		// over 1,000 rounds per n rather than the 10,000 of a 1ms step.
		{Limit{Rate: 7, Period: 3 * time.Second, Burst: 5}, 10 * time.Millisecond, 10 * time.Second, []int{1, 2, 5}},
	}
	for _, c := range cases {
		for _, n := range c.ns {
			// Each n on its own miniredis and clock, in parallel: the
			// heavy lane's longest test shares both cores.
			t.Run(fmt.Sprintf("%v/n=%d", c.limit, n), func(t *testing.T) {
				t.Parallel()
				b, _ := miniBackend(t)
				lim := newLimiter(t, b.rdb, TokenBucket, c.limit)
				ctx := t.Context()
				total := 0
				for elapsed := time.Duration(0); elapsed <= c.d; elapsed += c.step {
					for {
						res, err := lim.AllowN(ctx, "k", n)
						require.NoError(t, err)
						if !res.Allowed {
							break
						}
						total += n
					}
					b.advance(c.step)
				}
				bound := float64(c.limit.Burst) + float64(c.limit.Rate)*c.d.Seconds()/c.limit.Period.Seconds()
				assert.LessOrEqual(t, float64(total), bound, "%v n=%d: admitted past Burst + Rate·d", c.limit, n)
				// n-sized calls can leave less than n unused at the end.
				assert.GreaterOrEqual(t, float64(total), 0.999*bound-float64(n), "%v n=%d: admitted %d of %.0f", c.limit, n, total, bound)
			})
		}
	}
}

// Limiters that differ only in Rate or Burst share state with its meaning
// kept: the number of tokens used (issue: a time-based state scaled it).
func TestBucketRateChangeKeepsTokensUsed(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	fast := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 100, Period: time.Second, Burst: 10})
	slow := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 10, Period: time.Second, Burst: 10})
	res, err := fast.AllowN(ctx, "k", 10)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	// Lowered to 10/s: the user has used 10 of 10, so nothing at once.
	res, err = slow.Allow(ctx, "k")
	require.NoError(t, err)
	assert.False(t, res.Allowed, "lowered rate: %+v", res)
	assert.Equal(t, 100*time.Millisecond, res.RetryAfter, "one token at 10/s")
	b.advance(100 * time.Millisecond)
	res, err = slow.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	assert.Equal(t, 1, res.Remaining, "100ms at 10/s refills one token")

	// Raised from 10/s to 100/s: 10 used, one token back in 10ms.
	_, err = slow.Allow(ctx, "k2")
	require.NoError(t, err)
	_, err = slow.AllowN(ctx, "k2", 9)
	require.NoError(t, err)
	res, err = fast.Allow(ctx, "k2")
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.Equal(t, 10*time.Millisecond, res.RetryAfter, "raised rate: one token at 100/s")

	// A larger burst adds room; a smaller one leaves a debt.
	bigger := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 10, Period: time.Second, Burst: 15})
	res, err = bigger.AllowN(ctx, "k2", 0)
	require.NoError(t, err)
	assert.Equal(t, 5, res.Remaining)
	smaller := newLimiter(t, b.rdb, LeakyBucket, Limit{Rate: 10, Period: time.Second, Burst: 4})
	_, err = newLimiter(t, b.rdb, LeakyBucket, Limit{Rate: 10, Period: time.Second, Burst: 8}).AllowN(ctx, "q", 8)
	require.NoError(t, err)
	res, err = smaller.AllowN(ctx, "q", 1)
	require.NoError(t, err)
	assert.False(t, res.Allowed)
	assert.Equal(t, 500*time.Millisecond, res.RetryAfter, "8 queued, room for 4: wait until 5 have left")
}

// Remaining is never more than what AllowN then admits (a random walk of
// n, time and limits that share state).
func TestBucketRemainingIsAdmitted(t *testing.T) {
	b, _ := miniBackend(t)
	ctx := t.Context()
	limits := []Limit{
		{Rate: 3, Period: time.Second, Burst: 100},
		{Rate: 7, Period: time.Second, Burst: 100},
		{Rate: 1000, Period: time.Second, Burst: 100},
	}
	var lims []*RateLimiter
	for _, l := range limits {
		lims = append(lims, newLimiter(t, b.rdb, TokenBucket, l))
	}
	seed := uint64(7)
	next := func(n uint64) uint64 { seed = seed*6364136223846793005 + 1442695040888963407; return (seed >> 33) % n }
	for i := range 600 {
		lim := lims[next(uint64(len(lims)))]
		b.advance(time.Duration(next(300_000)) * time.Microsecond)
		res, err := lim.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		if res.Remaining > 0 {
			got, err := lim.AllowN(ctx, "k", res.Remaining)
			require.NoError(t, err)
			require.True(t, got.Allowed, "step %d: Remaining %d, then AllowN(%d) denied: %+v", i, res.Remaining, res.Remaining, got)
		}
	}
}

// A lowered rate that keeps a key alive longer than the compact state can
// tell its time (83 minutes) stores it as text: 3 of 16 used at 6 an
// hour, lowered to 2 an hour with Burst 3, AllowN(3) is told to retry in
// about 1h30m, and is allowed then (read as written in the future, the compact
// state gave no refill, and the retry was denied again).
func TestBucketLoweredRateLongKeepAlive(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			lowered := false
			lim := newLimiter(t, b.rdb, s, Limit{Rate: 6, Period: time.Hour, Burst: 16},
				WithLimitFunc(func(context.Context, string) (Limit, error) {
					if lowered {
						return Limit{Rate: 2, Period: time.Hour, Burst: 3}, nil
					}
					return Limit{}, nil
				}))
			ctx := t.Context()
			res, err := lim.AllowN(ctx, "k", 3)
			require.NoError(t, err)
			require.True(t, res.Allowed)
			lowered = true
			b.advance(time.Microsecond) // the key's expiry, in whole ms, then comes after the retry
			res, err = lim.AllowN(ctx, "k", 3)
			require.NoError(t, err)
			require.False(t, res.Allowed)
			assert.Equal(t, 90*time.Minute-time.Microsecond, res.RetryAfter)
			b.advance(res.RetryAfter)
			res, err = lim.AllowN(ctx, "k", 3)
			require.NoError(t, err)
			assert.True(t, res.Allowed, "after its RetryAfter: %+v", res)
		})
	}
}

// The Remaining of an allowed call can be taken at once. The reply's
// Remaining came from the exact use, the state stores it rounded up: a
// fresh key's AllowN(n) said Burst - n, and AllowN(Burst - n) right after
// was denied (171 of 200 keys at Limit{11, 1m, Burst 15} on miniredis, 571
// to 989 of 2,000 at Limit{10, 24h, Burst 1000} on real Redis).
func TestBucketRemainingAtOnce(t *testing.T) {
	b, _ := miniBackend(t)
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			for _, l := range []Limit{
				{Rate: 11, Period: time.Minute, Burst: 15},
				{Rate: 1000, Period: 100_003 * time.Microsecond, Burst: 1000}, // an event: 100,003 of D, rounded to tens
			} {
				failures := remainingAtOnce(t, b, s, l, 200)
				assert.Zero(t, failures, "%v: keys of 200 whose Remaining was denied right after", l)
			}
		})
	}
}

func TestBucketRemainingAtOnceRedis(t *testing.T) {
	b := realBackend(t)
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		for _, l := range []Limit{
			{Rate: 10, Period: 24 * time.Hour, Burst: 1000},
			{Rate: 1000, Period: time.Minute, Burst: 1000}, // the compact state, rounded
		} {
			t.Run(fmt.Sprintf("%v/%v", s, l), func(t *testing.T) {
				failures := remainingAtOnce(t, b, s, l, 2000)
				assert.Zero(t, failures, "keys of 2,000 whose Remaining was denied right after")
			})
		}
	}
}

// remainingAtOnce takes, on each of keys fresh keys (on miniredis at a
// random µs of a ms), n events, then the Remaining the answer said, at
// once; then (on miniredis, after an event's refill and a random part of
// another) one more, and again its Remaining at once. It returns on how many keys
// that was denied.
func remainingAtOnce(t *testing.T, b *backend, s Strategy, l Limit, keys int) int {
	lim := newLimiter(t, b.rdb, s, l, WithPrefix(prefixFor(t)))
	ctx := t.Context()
	rng := rand.New(rand.NewPCG(uint64(keys), uint64(l.Rate)))
	failures := 0
	for i := range keys {
		key := strconv.Itoa(i)
		if b.exact {
			b.advance(time.Duration(rng.IntN(1000)) * time.Microsecond)
		}
		res, err := lim.AllowN(ctx, key, 1+rng.IntN(l.Burst-1))
		require.NoError(t, err)
		require.True(t, res.Allowed)
		got, err := lim.AllowN(ctx, key, res.Remaining)
		require.NoError(t, err)
		if !got.Allowed {
			failures++
			continue
		}
		if !b.exact {
			continue // used up: no refill to speak of
		}
		b.advance(l.Period/time.Duration(l.Rate) + time.Duration(rng.Int64N(int64(l.Period/time.Duration(l.Rate)))))
		res, err = lim.Allow(ctx, key)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		got, err = lim.AllowN(ctx, key, res.Remaining)
		require.NoError(t, err)
		if !got.Allowed {
			failures++
		}
	}
	return failures
}

// On real Redis, 16 goroutines sending AllowN(1500) at 1e8 bytes per
// second for 2 s stay within Burst + Rate·d, d the span of the run
// widened by the longest call.
func TestBucketByteRateRedis(t *testing.T) {
	b := realBackend(t)
	limit := Limit{Rate: 100_000_000, Period: time.Second, Burst: 1_000_000}
	lim := newLimiter(t, b.rdb, TokenBucket, limit, WithPrefix(prefixFor(t)))
	ctx := context.Background()
	var admitted atomic.Int64
	var longest atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for time.Since(start) < 2*time.Second {
				t0 := time.Now()
				res, err := lim.AllowN(ctx, "bytes", 1500)
				if !assert.NoError(t, err) {
					return
				}
				if d := time.Since(t0); int64(d) > longest.Load() {
					longest.Store(int64(d))
				}
				assert.False(t, res.Degraded)
				if res.Allowed {
					admitted.Add(1500)
				}
			}
		})
	}
	wg.Wait()
	d := time.Since(start) + time.Duration(longest.Load())
	bound := float64(limit.Burst) + float64(limit.Rate)*d.Seconds()
	t.Logf("admitted %d bytes in %v (bound %.0f: %.1f%%)", admitted.Load(), d, bound, 100*float64(admitted.Load())/bound)
	assert.LessOrEqual(t, float64(admitted.Load()), bound)
}

// A bucket whose Burst × Period passes 2^63 µs keeps its state (the text
// form printed it with %d, which wrapped to a negative number: a full
// bucket again).
func TestBucketHugeState(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: MaxRate, Period: time.Hour})
	ctx := t.Context()
	res, err := lim.AllowN(ctx, "k", MaxRate)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	res, err = lim.AllowN(ctx, "k", MaxRate)
	require.NoError(t, err)
	assert.False(t, res.Allowed, "the second burst: %+v", res)
	assert.Equal(t, time.Hour, res.RetryAfter)
}

// Calls whose clocks take turns, one 5ms ahead of the other (two
// instances with client clocks, or a server clock stepped back and
// forth), get no more than the refill up to the later time: the state
// keeps the later time, so the refill between the two is given once.
// (Written as of the earlier time, each call from the clock ahead was
// refilled 5ms again: every call admitted.)
func TestBucketClocksTakingTurns(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		for _, start := range []time.Duration{0, 300 * time.Microsecond, 999 * time.Microsecond} {
			t.Run(fmt.Sprintf("%v/%v", s, start), func(t *testing.T) {
				b, _ := miniBackend(t)
				lim := newLimiter(t, b.rdb, s, Limit{Rate: 1000, Period: time.Second, Burst: 10})
				ctx := t.Context()
				b.setClock(start)
				res, err := lim.AllowN(ctx, "k", 10)
				require.NoError(t, err)
				require.True(t, res.Allowed)
				admitted := 0
				// (200 calls: miniredis takes each step forward off a key's
				// TTL, and none back, so more would expire the key.)
				for i := range 200 {
					at := start
					if i%2 == 0 {
						at += 5 * time.Millisecond
					}
					b.setClock(at)
					res, err := lim.Allow(ctx, "k")
					require.NoError(t, err)
					if res.Allowed {
						admitted++
					}
				}
				assert.Equal(t, 5, admitted, "5ms of refill at 1000/s, given once")

				// Behind the state, a denial's RetryAfter counts to when the
				// state refills, not from this clock: after it, the call fits.
				b.setClock(start)
				res, err = lim.Allow(ctx, "k")
				require.NoError(t, err)
				require.False(t, res.Allowed)
				b.setClock(start + res.RetryAfter)
				res, err = lim.Allow(ctx, "k")
				require.NoError(t, err)
				assert.True(t, res.Allowed, "after the RetryAfter the clock behind was given")
			})
		}
	}
}

// A clock stepped back by more than a second (the server's, by hand) does
// not stop a bucket's refill until it catches up: the next write is as of
// the new time, and the bucket refills from there.
func TestBucketClockSteppedBack(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			b, _ := miniBackend(t)
			lim := newLimiter(t, b.rdb, s, Limit{Rate: 10, Period: time.Second, Burst: 10})
			ctx := t.Context()
			b.setClock(time.Minute)
			res, err := lim.AllowN(ctx, "k", 5)
			require.NoError(t, err)
			require.True(t, res.Allowed)
			b.setClock(50 * time.Second) // 10s back: no refill
			res, err = lim.Allow(ctx, "k")
			require.NoError(t, err)
			require.True(t, res.Allowed)
			assert.Equal(t, 4, res.Remaining)
			b.setClock(51 * time.Second)
			res, err = lim.AllowN(ctx, "k", 10)
			require.NoError(t, err)
			assert.True(t, res.Allowed, "a second after the step, full again")
		})
	}
}

// A plan's Rate raised on a bucket gives no refill that did not happen.
// bucket.lua stores what is used as of the start of its write's ms, adding
// the refill since at the writer's Rate, which a reader takes away at its
// own: after a raise, the reader is given (new Rate - old Rate) × the µs
// of the write's ms, a free refill. With Period 1 ms that is up to one
// token per unit of Rate raised: Limit{1, 1ms, Burst 12} used up at
// 999 µs into a ms, raised to 12/1ms, admitted 10 more at the same µs, 22
// at once against Burst 12 (TestProperty seeds 883, 988: 13 and 16
// against 12 and 10; at 1 s or 1 min Periods, an event a few hundred µs
// early).
func TestPropertyFoundBucketRateRaiseNoFreeRefill(t *testing.T) {
	for _, s := range []Strategy{TokenBucket, LeakyBucket} {
		b, _ := miniBackend(t)
		raised := false
		lim := newLimiter(t, b.rdb, s, Limit{Rate: 1, Period: time.Millisecond, Burst: 12},
			WithLimitFunc(func(context.Context, string) (Limit, error) {
				if raised {
					return Limit{Rate: 12, Period: time.Millisecond, Burst: 12}, nil
				}
				return Limit{}, nil
			}))
		ctx := context.Background()
		b.advance(999 * time.Microsecond)
		res, err := lim.AllowN(ctx, "k", 12)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		raised = true // the same µs: nothing refilled
		res, err = lim.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, 0, res.Remaining, "%v: Remaining right after the bucket was used up and its Rate raised", s)
		res, err = lim.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		require.False(t, res.Allowed, "%v: a 13th event at the same µs, against Burst 12", s)
	}
}
