package redlimit

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// skewed returns a clock off by d from the real one.
func skewed(d time.Duration) func() time.Time {
	return func() time.Time { return time.Now().Add(d) }
}

// Two limiters whose process clocks differ by 2 s share one key and keep
// the limit exactly: each sends the server's time, measured with TIME.
func TestClientClockSkewRedis(t *testing.T) {
	b := realBackend(t)
	ctx := context.Background()
	for _, s := range []Strategy{FixedWindow, SlidingLog, SlidingCounter, TokenBucket, LeakyBucket} {
		t.Run(s.String(), func(t *testing.T) {
			limit := Limit{Rate: 5, Period: time.Second}
			ahead := newLimiter(t, b.rdb, s, limit, WithPrefix(prefixFor(t)), WithClientClock(), withClock(skewed(time.Second)))
			behind := newLimiter(t, b.rdb, s, limit, WithPrefix(prefixFor(t)), WithClientClock(), withClock(skewed(-time.Second)))
			// Each measures its offset to the server's clock before the run
			// (n = 0 takes nothing), so that a slow first measurement does
			// not fall at the window's start.
			for _, lim := range []*RateLimiter{ahead, behind} {
				_, err := lim.AllowN(ctx, "warm", 0)
				require.NoError(t, err)
			}
			// Start just after a window edge, so that the run fits one
			// window (and one interval of a bucket); on a loaded machine it
			// may not: then again, on a new key.
			admitted := 0
			for attempt := 1; ; attempt++ {
				waitForWindowStart(t, b, limit.Period)
				key := fmt.Sprintf("k%d", attempt)
				began := time.Now()
				admitted = 0
				for i := range 12 {
					lim := ahead
					if i%2 == 1 {
						lim = behind
					}
					res, err := lim.Allow(ctx, key)
					require.NoError(t, err)
					require.False(t, res.Degraded)
					admitted += btoi(res.Allowed)
				}
				took := time.Since(began)
				if !refillsDuring(s, limit, began, took) || attempt == 10 {
					break
				}
				t.Logf("attempt %d: the calls took %v, long enough for the limit to refill; again on a new key", attempt, took)
			}
			assert.Equal(t, 5, admitted, "two instances 2s apart share one limit of 5")
		})
	}
}

// waitForWindowStart sleeps until the server's clock is just past a
// multiple of period.
func waitForWindowStart(t *testing.T, b *backend, period time.Duration) {
	t.Helper()
	now, err := b.rdb.Time(context.Background()).Result()
	require.NoError(t, err)
	left := period - time.Duration(now.UnixNano())%period
	time.Sleep(left + 50*time.Millisecond)
}
