package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The bugs TestProperty found besides issue 36's, each as a focused test.

// A sliding log's expiry covers every event of the millisecond that set it:
// an event admitted later in that millisecond skips PEXPIRE (the expiry
// is "the same, to the ms"), so the key must live until that millisecond's
// end plus Period, also where a key expires at exactly its write time plus
// PX, as miniredis does (Redis expires it at the end of that ms). A key
// that expired at its first write's time plus Period lost the events
// admitted after it in the same ms while they still counted: 11 admitted
// in 100 ms at 10/100ms (TestProperty seed 613).
func TestPropertyFoundSlidingLogExpiryCoversItsMs(t *testing.T) {
	for _, policy := range []bool{false, true} {
		b, _ := miniBackend(t)
		l := Limit{Rate: 10, Period: 100 * time.Millisecond}
		var lim Limiter = newLimiter(t, b.rdb, SlidingLog, l)
		if policy { // the rules passed as arguments: another path to the PX
			p, err := NewPolicy(b.rdb, []Rule{{Strategy: SlidingLog, Limit: l}, {Strategy: FixedWindow, Limit: PerHour(1000)}}, WithPrefix("p"))
			require.NoError(t, err)
			t.Cleanup(func() { p.Close() })
			lim = p
		}
		ctx := context.Background()
		res, err := lim.AllowN(ctx, "k", 8)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		b.advance(999 * time.Microsecond) // the same ms
		res, err = lim.AllowN(ctx, "k", 1)
		require.NoError(t, err)
		require.True(t, res.Allowed)
		// At 100 ms the 8 events of t=0 have left; the one of t=999µs
		// counts until 100.999 ms.
		b.advance(l.Period - 999*time.Microsecond)
		res, err = lim.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, 9, res.Remaining, "policy %v: Remaining at 100 ms, with the event of 999 µs in the window", policy)
		b.advance(999 * time.Microsecond)
		res, err = lim.AllowN(ctx, "k", 0)
		require.NoError(t, err)
		require.Equal(t, 10, res.Remaining, "policy %v: Remaining at 100.999 ms", policy)
	}
}

// The same where an overspend's entries set the expiry (settle.lua).
func TestPropertyFoundSlidingLogSettleExpiryCoversItsMs(t *testing.T) {
	b, _ := miniBackend(t)
	l := Limit{Rate: 10, Period: 100 * time.Millisecond}
	lim := newLimiter(t, b.rdb, SlidingLog, l)
	ctx := context.Background()
	rv, err := lim.Reserve(ctx, "k", 1) // t=0: the key expires at 100 ms
	require.NoError(t, err)
	b.advance(50*time.Millisecond + 500*time.Microsecond)
	_, err = rv.Settle(ctx, 3) // 2 more entries, at 50.5 ms, and the key's expiry moved to 150.5 ms
	require.NoError(t, err)
	b.advance(499 * time.Microsecond) // the same ms: the expiry stays
	res, err := lim.AllowN(ctx, "k", 1)
	require.NoError(t, err)
	require.True(t, res.Allowed)
	b.advance(l.Period - 499*time.Microsecond) // 150.5 ms: the entries of 50.5 ms have left
	res, err = lim.AllowN(ctx, "k", 0)
	require.NoError(t, err)
	require.Equal(t, 9, res.Remaining, "Remaining at 150.5 ms, with the event of 50.999 ms in the window")
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
