package redlimit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSlidingLogTable(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, SlidingLog, PerSecond(3))
	ms := time.Millisecond
	run(t, b, lim, "k", []step{
		{n: 0, allowed: true, remaining: 3},
		{n: 1, allowed: true, remaining: 2, reset: time.Second},                    // event at 0
		{advance: 100 * ms, n: 1, allowed: true, remaining: 1, reset: time.Second}, // at 100ms
		{advance: 100 * ms, n: 1, allowed: true, remaining: 0, reset: time.Second}, // at 200ms
		// The event at 0 leaves at 1s.
		{advance: 100 * ms, n: 1, allowed: false, remaining: 0, retry: 700 * ms, reset: 900 * ms},
		// Two more need the events at 0 and 100ms gone: until 1.1s.
		{n: 2, allowed: false, remaining: 0, retry: 800 * ms, reset: 900 * ms},
		{advance: 700 * ms, n: 1, allowed: true, remaining: 0, reset: time.Second}, // at 1s
		{advance: 100 * ms, n: 1, allowed: true, remaining: 0, reset: time.Second}, // at 1.1s
		{n: 1, allowed: false, remaining: 0, retry: 100 * ms, reset: time.Second},
		// Long idle: everything left the window.
		{advance: 5 * time.Second, n: 3, allowed: true, remaining: 0, reset: time.Second},
	})
}

// Two events in the same microsecond are two events.
func TestSlidingLogSameMicrosecond(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, SlidingLog, PerSecond(10))
	ctx := t.Context()
	for range 3 {
		res, err := lim.Allow(ctx, "k")
		require.NoError(t, err, "Allow: %+v, %v", res, err)
		require.True(t, res.Allowed, "Allow: %+v, %v", res, err)
	}
	res, err := lim.AllowN(ctx, "k", 4)
	require.NoError(t, err, "AllowN(4): %+v, %v; want allowed, 3 remaining", res, err)
	require.True(t, res.Allowed, "AllowN(4): %+v, %v; want allowed, 3 remaining", res, err)
	require.Equal(t, 3, res.Remaining, "AllowN(4): %+v, %v; want allowed, 3 remaining", res, err)
	n, err := b.rdb.ZCard(ctx, lim.stateKey("k")).Result()
	require.NoError(t, err)
	require.Equal(t, int64(7), n, "ZCARD = %d, want 7 members for 7 events in one microsecond", n)
	// An AllowN larger than one ZADD chunk (500 events) works too.
	big := newLimiter(t, b.rdb, SlidingLog, PerSecond(2000))
	for range 2 {
		_, err := big.AllowN(ctx, "big", MaxSlidingLogN)
		require.NoError(t, err, "AllowN(%d)", MaxSlidingLogN)
	}
	n, _ = b.rdb.ZCard(ctx, big.stateKey("big")).Result()
	require.Equal(t, int64(2*MaxSlidingLogN), n, "ZCARD = %d, want %d", n, 2*MaxSlidingLogN)
	// More than MaxSlidingLogN in one call is refused, and writes nothing.
	_, err = big.AllowN(ctx, "other", MaxSlidingLogN+1)
	require.ErrorIs(t, err, ErrInvalidArgument)
	n, _ = b.rdb.Exists(ctx, big.stateKey("other")).Result()
	require.Zero(t, n, "a refused AllowN wrote its key")
}
