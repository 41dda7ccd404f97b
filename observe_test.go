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
