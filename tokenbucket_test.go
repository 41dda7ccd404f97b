package redlimit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTokenBucketTable(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 10, Period: time.Second, Burst: 5})
	ms := time.Millisecond
	run(t, b, lim, "k", []step{
		{n: 0, allowed: true, remaining: 5},
		{n: 5, allowed: true, remaining: 0, reset: 500 * ms},
		{n: 1, allowed: false, remaining: 0, retry: 100 * ms, reset: 500 * ms},
		{advance: 100 * ms, n: 1, allowed: true, remaining: 0, reset: 500 * ms},
		// 2.5 tokens after 250ms.
		{advance: 250 * ms, n: 3, allowed: false, remaining: 2, retry: 50 * ms, reset: 250 * ms},
		{n: 2, allowed: true, remaining: 0, reset: 450 * ms},
		// Full again, never more than the burst.
		{advance: time.Hour, n: 0, allowed: true, remaining: 5},
		{n: 5, allowed: true, remaining: 0, reset: 500 * ms},
	})
}

// A period that Rate does not divide: 3 per second, T = 333333.33µs.
func TestTokenBucketFractionalInterval(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, PerSecond(3))
	ctx := t.Context()
	for i := range 3 {
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err, "Allow %d: %+v, %v", i, res, err)
		require.True(t, res.Allowed, "Allow %d: %+v, %v", i, res, err)
		require.Equal(t, 2-i, res.Remaining, "Allow %d: %+v, %v", i, res, err)
	}
	res, err := lim.Allow(ctx, "k")
	// 333333.3µs, rounded up: the refill is exact (see bucket.lua).
	require.NoError(t, err, "4th Allow: %+v, %v; want denied, retry 333334µs", res, err)
	require.False(t, res.Allowed, "4th Allow: %+v, %v; want denied, retry 333334µs", res, err)
	require.Equal(t, 333334*time.Microsecond, res.RetryAfter, "4th Allow: %+v, %v; want denied, retry 333334µs", res, err)
	b.advance(333333 * time.Microsecond)
	res, _ = lim.Allow(ctx, "k")
	require.False(t, res.Allowed, "allowed 1µs before RetryAfter: %+v", res)
	b.advance(time.Microsecond)
	res, _ = lim.Allow(ctx, "k")
	require.True(t, res.Allowed, "denied at RetryAfter: %+v", res)
	b.advance(time.Second)
	res, err = lim.AllowN(ctx, "k", 0)
	require.NoError(t, err, "after 1s: %+v, %v; want 3 remaining (a full refill)", res, err)
	require.Equal(t, 3, res.Remaining, "after 1s: %+v, %v; want 3 remaining (a full refill)", res, err)
}

// At an interval of 10µs the bucket is exact, and its key lives one period
// (never 0, though the bucket is full again in 100µs).
func TestTokenBucketFinestInterval(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, TokenBucket, Limit{Rate: 100_000, Period: time.Second, Burst: 10})
	us := time.Microsecond
	run(t, b, lim, "k", []step{
		{n: 1, allowed: true, remaining: 9, reset: 10 * us},
		{n: 9, allowed: true, remaining: 0, reset: 100 * us},
		{n: 1, allowed: false, remaining: 0, retry: 10 * us, reset: 100 * us},
		{advance: 30 * us, n: 3, allowed: true, remaining: 0, reset: 100 * us},
	})
	checkTTL(t, b.rdb, lim.stateKey("k"), time.Second)
}
