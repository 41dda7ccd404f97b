package redlimit

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestObserverContext checks that the observer gets the caller's context,
// from a RateLimiter, a Policy and a Concurrency: a tracing span's parent
// (extra/redlimitotel).
func TestObserverContext(t *testing.T) {
	b, _ := miniBackend(t)
	type ctxKey struct{}
	var got []any
	observe := WithObserver(func(d Decision) {
		if d.Context == nil {
			got = append(got, nil)
			return
		}
		got = append(got, d.Context.Value(ctxKey{}))
	})
	ctx := context.WithValue(context.Background(), ctxKey{}, "caller")
	lim := newLimiter(t, b.rdb, TokenBucket, PerSecond(1), observe)
	p, err := NewPolicy(b.rdb, []Rule{{Strategy: FixedWindow, Limit: PerSecond(1)}}, observe)
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	c, err := NewConcurrency(b.rdb, 1, time.Second, observe)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })

	_, err = lim.Allow(ctx, "k")
	require.NoError(t, err)
	_, err = p.Allow(ctx, "k")
	require.NoError(t, err)
	_, _, err = c.TryAcquire(ctx, "k")
	require.NoError(t, err)
	assert.Equal(t, []any{"caller", "caller", "caller"}, got)
}

// A call of more events than a rule can ever hold (its capacity) fails
// with ErrExceedsLimit, and the observer sees it: for AllowN, WaitN and
// Reserve, naming the rule that cannot hold it, with the error, the call's
// n and priority, Allowed false and no DeniedBy. A call that fits is
// observed once as before.
func TestObserverExceedsLimit(t *testing.T) {
	b, _ := miniBackend(t)
	var got []Decision
	observe := WithObserver(func(d Decision) { got = append(got, d) })
	p, err := NewPolicy(b.rdb, []Rule{
		{Name: "rps", Strategy: TokenBucket, Limit: Limit{Rate: 100, Period: time.Second, Burst: 200}},
		{Name: "tokens", Strategy: SlidingCounter, Limit: PerMinute(1000)},
	}, observe, WithPriorityShares(0.5, 0.8))
	require.NoError(t, err)
	t.Cleanup(func() { p.Close() })
	ctx := ContextWithPriority(t.Context(), Critical)
	_, err = p.AllowN(ctx, "k", 201)
	require.ErrorIs(t, err, ErrExceedsLimit)
	err = p.WaitN(ctx, "k", 1001)
	require.ErrorIs(t, err, ErrExceedsLimit)
	_, err = p.Reserve(ctx, "k", 5000)
	require.ErrorIs(t, err, ErrExceedsLimit)
	_, err = p.AllowN(ctx, "k", 200)
	require.NoError(t, err)
	require.Len(t, got, 4, "decisions observed")
	for i, n := range []int{201, 1001, 5000} {
		d := got[i]
		assert.ErrorIs(t, d.Err, ErrExceedsLimit, "call %d", i)
		assert.Equal(t, "rps", d.Rule, "call %d: the rule of the smallest capacity", i)
		assert.Equal(t, TokenBucket, d.Strategy, "call %d", i)
		assert.Equal(t, "k", d.Key, "call %d", i)
		assert.Equal(t, n, d.N, "call %d", i)
		assert.False(t, d.Allowed, "call %d", i)
		assert.Equal(t, NotDenied, d.DeniedBy, "call %d", i)
		assert.Equal(t, Critical, d.Priority, "call %d", i)
		assert.Same(t, ctx, d.Context, "call %d", i)
	}
	assert.NoError(t, got[3].Err)
	assert.True(t, got[3].Allowed)
}
