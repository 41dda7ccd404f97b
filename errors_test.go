package redlimit

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every error message names the package once: a message that wraps a
// sentinel or another of the package's errors does not repeat
// "redlimit:" (it said "redlimit: n = 5000, but policy ... allows at most
// 1000 at once: redlimit: n exceeds the limit"). The sentinels, returned
// alone too, keep their prefix.
func TestErrorMessagesOnePrefix(t *testing.T) {
	b, m := miniBackend(t)
	ctx := context.Background()
	errOf := func(_ any, err error) error { return err }
	one := func(_ any, _ Result, err error) error { return err }

	lim := newLimiter(t, b.rdb, TokenBucket, PerSecond(1000))
	pol := newPolicy(t, b.rdb, []Rule{
		{Name: "second", Strategy: TokenBucket, Limit: PerSecond(1000)},
		{Name: "hour", Strategy: FixedWindow, Limit: PerHour(100_000)},
	})
	dyn := newLimiter(t, b.rdb, TokenBucket, PerSecond(1), WithLimitFunc(func(context.Context, string) (Limit, error) {
		return Limit{Rate: -1, Period: time.Second}, nil
	}))
	closed, err := NewTokenBucket(b.rdb, PerSecond(1))
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	conc := newConc(t, b.rdb, 1, time.Second)
	lease, err := conc.Acquire(ctx, "c")
	require.NoError(t, err)
	require.NoError(t, lease.Release(ctx))
	rv, err := lim.Reserve(ctx, "r", 10)
	require.NoError(t, err)
	settled, err := lim.Reserve(ctx, "s", 1)
	require.NoError(t, err)
	_, err = settled.Settle(ctx, 1)
	require.NoError(t, err)

	errs := map[string]error{
		"invalid limit":          errOf(NewTokenBucket(b.rdb, Limit{Rate: 0, Period: time.Second})),
		"unknown strategy":       errOf(New(b.rdb, Strategy(9), PerSecond(1))),
		"invalid policy rule":    errOf(NewPolicy(b.rdb, []Rule{{Name: "x", Strategy: TokenBucket, Limit: Limit{Rate: 0, Period: time.Second}}})),
		"invalid option":         errOf(NewTokenBucket(b.rdb, PerSecond(1), WithFallbackShare(2))),
		"invalid WithPrefetch":   errOf(NewTokenBucket(b.rdb, PerSecond(1), WithPrefetch(3, time.Second))),
		"refused option":         errOf(NewConcurrency(b.rdb, 1, time.Second, WithBlock(time.Second))),
		"nil client":             errOf(NewTokenBucket(nil, PerSecond(1))),
		"n too large":            errOf(lim.AllowN(ctx, "k", 5000)),
		"policy n too large":     errOf(pol.AllowN(ctx, "k", 5000)),
		"empty key":              errOf(lim.Allow(ctx, "")),
		"invalid dynamic limit":  errOf(dyn.Allow(ctx, "k")),
		"closed limiter":         errOf(closed.Allow(ctx, "k")),
		"settle negative":        errOf(rv.Settle(ctx, -1)),
		"settle too much":        errOf(rv.Settle(ctx, MaxRate+1)),
		"settle twice":           errOf(settled.Settle(ctx, 1)),
		"settle nil reservation": errOf((*Reservation)(nil).Settle(ctx, 1)),
		"extend released lease":  lease.Extend(ctx),
		"acquire empty key":      one(conc.TryAcquire(ctx, "")),
	}

	// Redis down, under FallbackError.
	down := newLimiter(t, b.rdb, TokenBucket, PerSecond(1), WithFallback(FallbackError))
	rvDown, err := down.Reserve(ctx, "d", 1)
	require.NoError(t, err)
	m.Close()
	errs["unavailable"] = errOf(down.Allow(ctx, "k"))
	errs["unavailable again"] = errOf(down.Allow(ctx, "k")) // marked down: the fallback answers
	errs["settle unavailable"] = errOf(rvDown.Settle(ctx, 1))

	for name, err := range errs {
		t.Run(name, func(t *testing.T) {
			require.Error(t, err)
			msg := err.Error()
			t.Log(msg)
			assert.True(t, strings.HasPrefix(msg, "redlimit: "), "%q", msg)
			assert.Equal(t, 1, strings.Count(msg, "redlimit: "), "%q", msg)
		})
	}
}
