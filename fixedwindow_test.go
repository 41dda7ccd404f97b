package redlimit

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestFixedWindowTable(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, FixedWindow, PerSecond(3))
	ms := time.Millisecond
	run(t, b, lim, "k", []step{
		{n: 1, allowed: true, remaining: 2, reset: time.Second},
		{advance: 100 * ms, n: 1, allowed: true, remaining: 1, reset: 900 * ms},
		{n: 0, allowed: true, remaining: 1, reset: 900 * ms},
		{n: 1, allowed: true, remaining: 0, reset: 900 * ms},
		{n: 1, allowed: false, remaining: 0, retry: 900 * ms, reset: 900 * ms},
		{advance: 899 * ms, n: 1, allowed: false, remaining: 0, retry: ms, reset: ms},
		// The next window starts at t0+1s: the count starts again.
		{advance: ms, n: 2, allowed: true, remaining: 1, reset: time.Second},
		{advance: 500 * ms, n: 2, allowed: false, remaining: 1, retry: 500 * ms, reset: 500 * ms},
		{n: 1, allowed: true, remaining: 0, reset: 500 * ms},
		// Windows are aligned to the epoch, not to the first event.
		{advance: 10*time.Second + 250*ms, n: 3, allowed: true, remaining: 0, reset: 250 * ms},
		{advance: 250 * ms, n: 0, allowed: true, remaining: 3},
	})
}

// The key of the previous window can outlive it by up to 2ms on real Redis
// (expiry is in whole ms); it must count as 0, not as the current window.
func TestFixedWindowStaleKeyFromPreviousWindow(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, FixedWindow, Limit{Rate: 2, Period: 1500 * time.Microsecond})
	ctx := t.Context()
	key := lim.stateKey("k")
	_, err := lim.AllowN(ctx, "k", 2)
	require.NoError(t, err)
	// Put the key back as if it had not expired yet: the first window's
	// count and last digit, with its expiry (t0 + 1.5ms, rounded up to 2ms).
	w0 := t0.UnixMicro() / 1500
	b.advance(1500 * time.Microsecond) // t0+1.5ms: the second window
	require.NoError(t, b.rdb.Set(ctx, key, 2*10+w0%10, 0).Err())
	require.NoError(t, b.rdb.PExpireAt(ctx, key, t0.Add(2*time.Millisecond)).Err())
	res, err := lim.Allow(ctx, "k")
	require.NoError(t, err)
	require.True(t, res.Allowed, "after the window edge: %+v, want allowed with 1 remaining", res)
	require.Equal(t, 1, res.Remaining, "after the window edge: %+v, want allowed with 1 remaining", res)
	v, err := b.rdb.Get(ctx, key).Int64()
	require.NoError(t, err)
	require.Equal(t, 1*10+(w0+1)%10, v, "stored: the second window's count and digit")
	// The second window ends at t0+3ms: 1.5ms from now, rounded up.
	checkTTL(t, b.rdb, key, 2*time.Millisecond)
}

// A period that is not a whole number of milliseconds: RetryAfter is exact
// to the microsecond, though the counter expires in whole milliseconds.
func TestFixedWindowSubMillisecond(t *testing.T) {
	b, _ := miniBackend(t)
	lim := newLimiter(t, b.rdb, FixedWindow, Limit{Rate: 1, Period: 1500 * time.Microsecond})
	us := time.Microsecond
	run(t, b, lim, "k", []step{
		{n: 1, allowed: true, remaining: 0, reset: 1500 * us},
		{advance: 200 * us, n: 1, allowed: false, remaining: 0, retry: 1300 * us, reset: 1300 * us},
		{advance: 1300 * us, n: 1, allowed: true, remaining: 0, reset: 1500 * us},
	})
}
